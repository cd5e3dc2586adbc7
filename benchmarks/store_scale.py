"""The shared store at scale: K workers on one study's queue, each trial a fixed sleep, for trials
per minute in the steady state, beside plain Optuna on the same server: ablate on a journal file,
on PostgreSQL, and through Optuna's gRPC storage proxy in front of PostgreSQL; Optuna's own
``study.optimize`` on PostgreSQL and through the proxy. Also the queue lock's wait and hold
(median, p99), heartbeats, the database connections, and the CPU the workers and the database
spend per trial.

Usage: nice -n 19 python benchmarks/store_scale.py [--workers 8 32 64 128]
       [--systems journal postgres grpc optuna-rdb optuna-grpc] [--tracking server|database]
       [--trial-s 10] [--warmup-s 10] [--window-s 60] [--json out.json]

Each ablate worker is ablate's own loop (``run_study``: sync, take, train, record, under the queue
lock the driver takes), an Optuna worker ``study.optimize`` with an objective that sleeps; each in
a process forked from this one after it imported ablate, Optuna's database and gRPC modules and
MLflow's stores once: K light processes instead of K interpreters importing torch and MLflow, and
no worker still importing when the window opens. Start-up (fork to a worker's first trial) is
reported apart; the window opens ``--warmup-s`` after the last worker's first trial. MLflow (ablate
only): a tracking server in front of PostgreSQL (``--tracking server``, as a cluster runs it) or
the database itself (``--tracking database``). The queue lock's wait and hold are
timed inside ``Stores.queue_lock`` (``ABLATE_QUEUE_TIMINGS``; a journal's is a file lock, a
database's takes none: its hold is the sync and take alone) and so is each heartbeat (PostgreSQL
only: on one host a worker is alive while it holds its lock file). Trials per minute count the
trials completed within the window after the warm-up, and, since K workers started together finish
their trials in step (a count in a 60-s window jumps by K), also K / the mean cycle: a worker's time
from one trial's end to its next's, for the cycles ending in the window (ablate's from the trials'
``worker`` attribute, Optuna's from a line each objective writes to a local file). The workers are
then stopped (SIGTERM).

PostgreSQL: the local server started as .ci/run starts it (``service postgresql start``, role
ablate/ablate), two fresh databases per run (Optuna's queue, MLflow's runs; as the README's many
machines keep them). The journal's MLflow store is the study's SQLite file, as on one machine.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - imported once, before the workers fork
import optuna
import psycopg  # noqa: F401
import yaml
from optuna.storages import GrpcStorageProxy, RDBStorage, run_grpc_proxy_server

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
SYSTEMS = ["journal", "postgres", "grpc", "optuna-rdb", "optuna-grpc"]
GRPC_PORT, MLFLOW_PORT = 13571, 15571
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


def psql_in(database: str, sql: str) -> str:
    done = subprocess.run(
        ["runuser", "-u", "postgres", "--", "psql", "-d", database, "-qAt", "-c", sql],
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


def family_cpu_s(roots: list[int]) -> float:
    """CPU seconds so far of the processes ``roots`` and all their descendants (the proxy, the
    MLflow server and its uvicorn workers): what a cluster's central hosts spend."""
    parent = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    family, grew = set(roots), True
    while grew:
        grown = {pid for pid, up in parent.items() if up in family} - family
        family |= grown
        grew = bool(grown)
    total = 0
    for pid in family:
        try:
            fields = (Path(f"/proc/{pid}/stat")).read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15])  # utime, stime, and of reaped children
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


def connections() -> dict[str, int]:
    """Connections open to each of the run's databases (Optuna's queue, MLflow's runs)."""
    query = "SELECT datname, count(*) FROM pg_stat_activity WHERE datname LIKE 'ablate_scale%' GROUP BY 1"
    rows = (line.split("|") for line in psql(query).splitlines())
    return {name.removeprefix("ablate_scale_"): int(n) for name, n in rows}


def ablate_worker(study, stores: Stores) -> None:
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


def optuna_worker(name: str, storage_of, trial_s: float, timings: Path) -> None:
    """One forked worker: plain Optuna's ``optimize`` until stopped (SIGTERM ends it after its trial)."""
    code = 0
    try:
        study = optuna.load_study(study_name=name, storage=storage_of())
        signal.signal(signal.SIGTERM, lambda *_: study.stop())
        first = []

        def objective(trial: optuna.Trial) -> float:
            if not first:
                first.append((timings / f"{os.getpid()}.txt").write_text(f"lock {time.time():.3f} 0 0\n"))
            time.sleep(trial_s)
            with open(timings / f"{os.getpid()}.txt", "a") as own:  # a local file: no call to the store
                own.write(f"done {time.time():.3f}\n")
            return random.random()

        study.optimize(objective)
    except BaseException as exc:  # noqa: BLE001
        print(f"worker {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    os._exit(code)


def forked(function, *args) -> int:
    pid = os.fork()
    if pid == 0:
        function(*args)
        os._exit(0)
    return pid


def quantiles(values: list[float], upper: int = 99) -> tuple[float, float]:
    """The median and the ``upper`` percentile."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return statistics.median(values), cuts[upper - 1]


def serve_proxy(url: str) -> None:
    """Optuna's gRPC storage proxy in front of ``url`` (its cached storage, as Optuna's docs advise)."""
    run_grpc_proxy_server(optuna.storages.get_storage(url), host="127.0.0.1", port=GRPC_PORT)


def database_storage() -> RDBStorage:
    return RDBStorage(PG.format("ablate_scale_optuna"))


def proxy_storage() -> GrpcStorageProxy:
    storage = GrpcStorageProxy(host="127.0.0.1", port=GRPC_PORT)
    storage.wait_server_ready(timeout=60)
    return storage


def mlflow_server(folder: Path) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        PG.format("ablate_scale_mlflow"),
    ]
    command += ["--default-artifact-root", str(folder / "artifacts"), "--host", "127.0.0.1"]
    command += ["--port", str(MLFLOW_PORT), "--workers", "2"]
    # MLflow 3's server also starts 7 job processes (its GenAI scorers): none wanted on a tracking host.
    quiet = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(folder / "mlflow.log", "w")
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=quiet)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{MLFLOW_PORT}/health", timeout=2)
            return server
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"mlflow server did not start: {(folder / 'mlflow.log').read_text()[-2000:]}")


def one(system: str, k: int, args: argparse.Namespace, root: Path) -> dict:
    folder = root / f"{system}-{k}"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    trials = int(k * (args.warmup_s + args.window_s + 60) / args.trial_s * args.planned_share) + k
    spec = {
        "name": f"scale-{system}-{k}",
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
    on_database = system != "journal"
    helpers: list = []  # the proxy and the MLflow server, stopped at the end
    if on_database:
        fresh_databases(["ablate_scale_optuna", "ablate_scale_mlflow"])
        RDBStorage(PG.format("ablate_scale_optuna"))  # Optuna's tables made once, before anyone races
    if system.endswith("grpc"):
        helpers.append(forked(serve_proxy, PG.format("ablate_scale_optuna")))
        proxy_storage()
    tracking = None
    if on_database and not system.startswith("optuna"):
        if args.tracking == "server":
            helpers.append(mlflow_server(folder))
            tracking = f"http://127.0.0.1:{MLFLOW_PORT}"
        else:
            tracking = PG.format("ablate_scale_mlflow")
    storage_url = {
        "journal": None,
        "postgres": PG.format("ablate_scale_optuna"),
        "grpc": f"grpc://127.0.0.1:{GRPC_PORT}",
    }
    began = time.time()
    if system.startswith("optuna"):
        storage_of = (
            proxy_storage if system == "optuna-grpc" else lambda: RDBStorage(PG.format("ablate_scale_optuna"))
        )
        optuna.create_study(study_name=study.name, storage=storage_of(), direction="maximize")
        work = (optuna_worker, study.name, storage_of, args.trial_s, timings)
    else:
        stores = Stores.for_study(study, None, tracking, storage_url[system])
        pid = forked(prepare, study, stores)  # the stores made and the queue filled, in a child
        _, status = os.waitpid(pid, 0)
        assert status == 0, f"prepare failed ({status})"
        work = (ablate_worker, study, stores)
    prepared = time.time() - began
    os.environ[TIMINGS_ENV] = str(timings)
    gc.collect()
    gc.freeze()  # the children do not copy the parent's objects when the collector walks them
    start = time.time()
    pids = [forked(*work) for _ in range(k)]
    del os.environ[TIMINGS_ENV]
    firsts: dict[str, float] = {}
    while len(firsts) < k and time.time() < start + args.ready_s:
        time.sleep(1)
        for path in timings.iterdir():
            if path.stem not in firsts and (text := path.read_text()):
                firsts[path.stem] = float(text.split()[1])
    startup = sorted(t - start for t in firsts.values())
    # Steady state: a worker's first trial also starts its trials' fork server (torch imported
    # there, seconds each on shared cores), so the window waits for K trials finished, then warms up.
    journal = None if on_database else stores.storage()

    def finished() -> int:
        if on_database:
            sql = "SELECT count(*) FROM trials WHERE state = 'COMPLETE'"
            return int(psql_in("ablate_scale_optuna", sql))
        done = (optuna.trial.TrialState.COMPLETE,)
        return len(optuna.load_study(study_name=study.name, storage=journal).get_trials(states=done))

    while finished() < k and time.time() < start + args.ready_s:
        time.sleep(1)
    warm_s = time.time() - start
    time.sleep(args.warmup_s)
    central = [h if isinstance(h, int) else h.pid for h in helpers]
    t0, cpu0, central0 = time.time(), server_cpu_s(), family_cpu_s(central)
    c0 = commits() if on_database else 0
    time.sleep(args.window_s / 2)
    held = connections() if on_database else None
    time.sleep(args.window_s / 2)
    t1, cpu1, central1 = time.time(), server_cpu_s(), family_cpu_s(central)
    c1 = commits() if on_database else 0
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
    storage = RDBStorage(PG.format("ablate_scale_optuna")) if on_database else stores.storage()
    frozen = optuna.load_study(study_name=study.name, storage=storage).get_trials(deepcopy=False)
    for helper in helpers:
        if isinstance(helper, int):
            os.kill(helper, signal.SIGKILL)
            os.waitpid(helper, 0)
        else:
            helper.terminate()
            helper.wait()
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
    complete_keys = [
        (t.user_attrs.get("variant"), t.user_attrs.get("seed"))
        for t in frozen
        if t.state == optuna.trial.TrialState.COMPLETE and "seed" in t.user_attrs
    ]
    locks, beats = [], []
    ends: dict[str, list[float]] = {}  # each worker's trials' ends, for its cycle
    for path in timings.iterdir():
        for line in path.read_text().splitlines():
            kind, when, *seconds = line.split()
            if kind == "done":
                ends.setdefault(path.stem, []).append(float(when))
            elif t0 <= float(when) <= t1:
                (locks if kind == "lock" else beats).append([float(s) for s in seconds])
    for t in frozen:
        if t.state == optuna.trial.TrialState.COMPLETE and "worker" in t.user_attrs:
            ends.setdefault(str(t.user_attrs["worker"]), []).append(t.datetime_complete.timestamp())
    # A worker's cycle: from one trial's end to its next's, the later in the window. Counting the
    # window's trials is quantised (K workers started together finish 5 or 6 10-s trials in 60 s
    # each, together), so trials per minute are also given as K / the mean cycle.
    cycles = [b - a for times in ends.values() for a, b in itertools.pairwise(sorted(times)) if t0 <= b <= t1]
    wait = quantiles([w for w, _ in locks])
    hold = quantiles([h for _, h in locks])
    beat = quantiles([b for (b,) in beats])
    completed = sum(t.state == optuna.trial.TrialState.COMPLETE for t in frozen)
    minutes = (t1 - t0) / 60
    return {
        "system": system,
        "tracking": (args.tracking if tracking else "sqlite file")
        if not system.startswith("optuna")
        else None,
        "workers": k,
        "trial_s": args.trial_s,
        "planned": trials if not system.startswith("optuna") else None,
        "prepare_s": round(prepared, 1),
        "startup_s_median_max": [round(statistics.median(startup), 1), round(startup[-1], 1)]
        if startup
        else None,
        "started": len(firsts),
        "k_finished_after_s": round(warm_s, 1),
        "trials_per_min": round(len(window) / minutes, 1),
        "trials_per_min_by_cycle": round(k * 60 / statistics.fmean(cycles), 1) if cycles else None,
        "cycle_s_median_p90": [round(statistics.median(cycles), 3), round(quantiles(cycles, 90)[1], 3)]
        if cycles
        else None,
        "ideal_per_min": round(k * 60 / args.trial_s, 1),
        "lock_wait_median_s": wait[0],
        "lock_wait_p99_s": wait[1],
        "lock_hold_median_s": hold[0],
        "lock_hold_p99_s": hold[1],
        "lock_events": len(locks),
        "beats_per_s": round(len(beats) / (t1 - t0), 2),
        "beat_median_s": beat[0],
        "beat_p99_s": beat[1],
        "db_connections": held,
        "db_commits_per_s": round((c1 - c0) / (t1 - t0), 1) if on_database else None,
        "db_cpu_s_per_trial": round((cpu1 - cpu0) / max(len(window), 1), 4) if on_database else None,
        # The proxy's and the MLflow server's CPU (their processes and descendants) in the window.
        "central_cpu_s_per_trial": round((central1 - central0) / max(len(window), 1), 4) if central else None,
        "client_cpu_s_per_trial": round(client_cpu / max(completed, 1), 4),
        "worker_pss_mb": round(memory / k, 1),
        "completed": completed,
        "keys_trained_twice": len(complete_keys) - len(set(complete_keys)),
        "failed": failures,
        "crashed_workers": crashed,
        "load_1min": os.getloadavg()[0],
        "wall_s": round(ended - start, 1),
    }


def said(result: dict, sink: Path | None) -> None:
    """One result as a JSON line: printed, and appended to ``sink`` where given."""
    print(json.dumps(result), flush=True)
    if sink:
        with open(sink, "a") as lines:
            lines.write(json.dumps(result) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32, 64, 128])
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument("--tracking", default="server", choices=["server", "database"])
    parser.add_argument("--trial-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument(
        "--ready-s", type=float, default=300.0, help="The longest wait for every first trial."
    )
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
        for system in args.systems:
            for k in args.workers:
                said(one(system, k, args, Path(tmp)), args.json)


if __name__ == "__main__":
    main()
