"""What one take costs as the study grows: a worker's ``_next`` (the claim of the next waiting trial
and the checks around it) and its ``tell``, against a queue of 100 to 10,000 waiting trials, beside
Optuna's own ``ask`` (every waiting trial read, then claimed in turn) on the same queue.

Usage: nice -n 19 python benchmarks/store_take.py [--trials 100 1000 10000] [--stores journal postgres]
       [--takes 40] [--json out.json]

One process, one worker, no training: the queue is filled once through ablate's own sync (a
``function`` study of one variant and ``--trials`` seeds), then ``--takes`` trials are taken and told
one after the other, each timed; then as many through ``optuna.Study.ask``. PostgreSQL: the local
server as .ci/run starts it (role ablate/ablate), a fresh database per size.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from store_scale import PG, fresh_databases, said

from ablate.drive import Driver, Stores, prepare
from ablate.study.load import load_study

TRAIN = """
def train(config, seed, reporter):
    return {"acc": 0.5}
"""


def timed(function, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return times


def one(store: str, size: int, takes: int, root: Path) -> dict:
    folder = root / f"{store}-{size}"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    spec = {
        "name": f"take-{store}-{size}",
        "task": {"kind": "function", "callable": "train.py:train"},
        "seeds": list(range(size + 2 * takes)),
        "metrics": {"primary": "acc"},
        "report": {"margin": 0.01},
        "output": str(folder / "runs"),
    }
    (folder / "study.yaml").write_text(yaml.safe_dump(spec))
    study = load_study(folder / "study.yaml")
    if store == "postgres":
        fresh_databases(["ablate_take_optuna"])
        stores = Stores.for_study(study, None, None, PG.format("ablate_take_optuna"))
    else:
        stores = Stores.for_study(study)
    began = time.perf_counter()
    prepare(study, stores)
    filled = time.perf_counter() - began
    driver = Driver(study, stores, worker_id="bench")
    began = time.perf_counter()
    driver.sync()
    sync_s = time.perf_counter() - began

    def ablate_take() -> None:
        queue, trial = driver._next()
        queue.study.tell(trial, 0.5)

    def optuna_ask() -> None:
        trial = driver.final.ask()
        driver.final.study.tell(trial, 0.5)

    ours = timed(ablate_take, takes)
    theirs = timed(optuna_ask, takes)
    return {
        "store": store,
        "waiting": size + takes,
        "fill_s": round(filled, 1),
        "sync_s": round(sync_s, 3),
        "take_ms_median": round(1000 * statistics.median(ours), 2),
        "take_ms_p90": round(1000 * statistics.quantiles(ours, n=10)[8], 2),
        "optuna_ask_ms_median": round(1000 * statistics.median(theirs), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[100, 1000, 10000])
    stores = ["journal", "postgres"]
    parser.add_argument("--stores", nargs="+", default=stores, choices=stores)
    parser.add_argument("--takes", type=int, default=40)
    parser.add_argument("--json", type=Path, default=None, help="Append each result as a JSON line.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="store-take-") as tmp:
        for store in args.stores:
            for size in args.trials:
                said(one(store, size, args.takes, Path(tmp)), args.json)


if __name__ == "__main__":
    main()
