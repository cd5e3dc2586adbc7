"""The shared store at scale: K workers on one study's queue, against a journal file and against
PostgreSQL, each trial a fixed sleep (a ``function`` task), for trials per minute, the queue lock's
wait and hold (median, p99), heartbeats, and the CPU the workers and the database spend per trial.

Usage: nice -n 19 python benchmarks/store_scale.py [--workers 8 32 128] [--stores journal postgres]
       [--trial-s 10] [--warmup-s 20] [--window-s 60] [--json out.json]

Each worker is ablate's own loop (``run_study``: sync, take, train, record, under the queue lock
the driver takes), in a process forked from this one after it imported ablate once: K light
processes instead of K interpreters importing torch and MLflow. The queue lock's wait and hold are
timed inside ``Stores.queue_lock`` (``ABLATE_QUEUE_TIMINGS``; a journal's is a file lock, a
database's takes none: its hold is the sync and take alone) and so is each heartbeat (PostgreSQL
only: on one host a worker is alive while it holds its lock file). Trials per minute count the
trials completed within the window after the warm-up; the workers are then stopped (SIGTERM).

PostgreSQL: the local server started as .ci/run starts it (``service postgresql start``, role
ablate/ablate), two fresh databases per run (Optuna's queue, MLflow's runs; as the README's many
machines keep them). The journal's MLflow store is the study's SQLite file, as on one machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ablate import stopping
from ablate.drive import Reporter, Stores, prepare, run_study
from ablate.drive.stores import TIMINGS_ENV
from ablate.study.load import load_study

TRAIN = """
import random
import time


def train(config, seed, reporter):
    time.sleep(config["sleep"])
    return {"acc": random.Random(seed).random()}
"""
PG = "postgresql+psycopg://ablate:ablate@127.0.0.1:5432/{}"
TICKS = os.sysconf("SC_CLK_TCK")


def psql(sql: str) -> str:
    done = subprocess.run(
        ["runuser", "-u", "postgres", "--", "psql", "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def fresh_databases(names: list[str]) -> None:
    subprocess.run(["service", "postgresql", "start"], capture_output=True, check=True)
    if not psql("SELECT 1 FROM pg_roles WHERE rolname = 'ablate'"):
        psql("CREATE ROLE ablate LOGIN PASSWORD 'ablate'")
    for name in names:
        psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        psql(f"CREATE DATABASE {name} OWNER ablate")


def server_cpu_s() -> float:
    """CPU seconds of every PostgreSQL process so far (the server's share of the work)."""
    total = 0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().startswith("postgres"):
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            continue
    return total / TICKS


def pss_mb(pids: list[int]) -> float:
    """The workers' proportional set size (shared pages split among the processes sharing them), MB."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def commits() -> int:
    return int(psql("SELECT sum(xact_commit) FROM pg_stat_database"))


def worker(study, stores: Stores) -> None:
    """One forked worker: ablate's loop until stopped."""
    code = 0
    try:
        with stopping.stop_signals():
            run_study(study, stores, Reporter())
    except KeyboardInterrupt:
        pass
    except BaseException as exc:  # noqa: BLE001 - said in the log, counted by the parent
        print(f"worker {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    os._exit(code)


def forked(function, *args) -> int:
    pid = os.fork()
    if pid == 0:
        function(*args)
        os._exit(0)
    return pid


def quantiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return statistics.median(values), cuts[98]


def one(store: str, k: int, args: argparse.Namespace, root: Path) -> dict:
    folder = root / f"{store}-{k}"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    trials = int(k * (args.warmup_s + args.window_s) / args.trial_s * args.planned_share) + k
    spec = {
        "name": f"scale-{store}-{k}",
        "task": {"kind": "function", "callable": "train.py:train"},
        "model": {"config": {"sleep": args.trial_s}},
        "seeds": list(range(trials)),
        "metrics": {"primary": "acc"},
        "report": {"margin": 0.01},
        "output": str(folder / "runs"),
    }
    (folder / "study.yaml").write_text(yaml.safe_dump(spec))
    timings = folder / "timings"
    timings.mkdir()
    study = load_study(folder / "study.yaml")
    if store == "postgres":
        fresh_databases(["ablate_scale_optuna", "ablate_scale_mlflow"])
        stores = Stores.for_study(
            study, None, PG.format("ablate_scale_mlflow"), PG.format("ablate_scale_optuna")
        )
    else:
        stores = Stores.for_study(study)
    began = time.time()
    pid = forked(prepare, study, stores)  # the stores made and the queue filled, in a child
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"prepare failed ({status})"
    prepared = time.time() - began
    os.environ[TIMINGS_ENV] = str(timings)
    gc.collect()
    gc.freeze()  # the children do not copy the parent's objects when the collector walks them
    start = time.time()
    pids = [forked(worker, study, stores) for _ in range(k)]
    del os.environ[TIMINGS_ENV]
    time.sleep(args.warmup_s)
    t0, cpu0 = time.time(), server_cpu_s()
    c0 = commits() if store == "postgres" else 0
    time.sleep(args.window_s)
    t1, cpu1 = time.time(), server_cpu_s()
    c1 = commits() if store == "postgres" else 0
    memory = pss_mb(pids)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    client_cpu, crashed, deadline = 0.0, 0, time.time() + args.trial_s + 120
    for pid in pids:
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.time() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        client_cpu += usage.ru_utime + usage.ru_stime
        crashed += status != 0
    ended = time.time()
    gc.unfreeze()
    storage = stores.storage()
    import optuna

    frozen = optuna.load_study(study_name=study.name, storage=storage).get_trials(deepcopy=False)
    window = [
        t
        for t in frozen
        if t.state == optuna.trial.TrialState.COMPLETE and t0 <= t.datetime_complete.timestamp() <= t1
    ]
    failures: dict[str, int] = {}
    for t in frozen:
        if t.state == optuna.trial.TrialState.FAIL:
            reason = str(t.user_attrs.get("failure", "heartbeat"))[:80]
            failures[reason] = failures.get(reason, 0) + 1
    locks, beats = [], []
    for path in timings.iterdir():
        for line in path.read_text().splitlines():
            kind, when, *seconds = line.split()
            if t0 <= float(when) <= t1:
                (locks if kind == "lock" else beats).append([float(s) for s in seconds])
    wait = quantiles([w for w, _ in locks])
    hold = quantiles([h for _, h in locks])
    beat = quantiles([b for (b,) in beats])
    completed = sum(t.state == optuna.trial.TrialState.COMPLETE for t in frozen)
    minutes = (t1 - t0) / 60
    return {
        "store": store,
        "workers": k,
        "trial_s": args.trial_s,
        "planned": trials,
        "prepare_s": round(prepared, 1),
        "trials_per_min": round(len(window) / minutes, 1),
        "ideal_per_min": round(k * 60 / args.trial_s, 1),
        "lock_wait_median_s": wait[0],
        "lock_wait_p99_s": wait[1],
        "lock_hold_median_s": hold[0],
        "lock_hold_p99_s": hold[1],
        "lock_events": len(locks),
        "beats_per_s": round(len(beats) / (t1 - t0), 2),
        "beat_median_s": beat[0],
        "beat_p99_s": beat[1],
        "db_commits_per_s": round((c1 - c0) / (t1 - t0), 1) if store == "postgres" else None,
        "db_cpu_s_per_trial": round((cpu1 - cpu0) / max(len(window), 1), 4) if store == "postgres" else None,
        "client_cpu_s_per_trial": round(client_cpu / max(completed, 1), 4),
        "worker_pss_mb": round(memory / k, 1),
        "completed": completed,
        "failed": failures,
        "crashed_workers": crashed,
        "wall_s": round(ended - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32, 128])
    stores = ["journal", "postgres"]
    parser.add_argument("--stores", nargs="+", default=stores, choices=stores)
    parser.add_argument("--trial-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument(
        "--planned-share",
        type=float,
        default=1.3,
        help="Trials planned, as a share of what K workers finish at full speed (fewer: a faster start).",
    )
    parser.add_argument("--json", type=Path, default=None, help="Append each result as a JSON line.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="store-scale-") as tmp:
        for store in args.stores:
            for k in args.workers:
                result = one(store, k, args, Path(tmp))
                print(json.dumps(result), flush=True)
                if args.json:
                    with open(args.json, "a") as sink:
                        sink.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
