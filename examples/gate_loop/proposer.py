"""A scripted proposer driving the gate through its Python calls, as an agent's loop would: a mix
of real changes and pure-noise ones (a changed seed, a no-op refactor, tiny lr jitters). Writes the
loop under runs/gate_loop/ and its history report to reports/gate_loop/.

    nice python examples/gate_loop/proposer.py
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import ablate
from ablate.report.gate import write_history

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHANGES = [  # (what a proposer would say, the overrides)
    ("change the seed", ["seeds=[3,4,5]"]),
    ("wider hidden layer (8 → 32)", ["model.config.width=32"]),
    ("no-op refactor of train.py", [f"task.callable={HERE / 'refactor' / 'train.py'}:train"]),
    ("tiny lr jitter (0.05 → 0.0505)", ["model.config.lr=0.0505"]),
    ("narrow hidden layer (→ 2)", ["model.config.width=2"]),
    ("train longer (10 → 30 epochs)", ["model.config.epochs=30"]),
    ("tiny lr jitter (0.05 → 0.0495)", ["model.config.lr=0.0495"]),
    ("much smaller lr (0.005)", ["model.config.lr=0.005"]),
    ("change the seed again", ["seeds=[100]"]),
    ("smaller batches (32 → 8)", ["model.config.batch_size=8"]),
    ("larger initial weights (0.5 → 3)", ["model.config.init_scale=3.0"]),
    ("tiny init jitter (0.5 → 0.501)", ["model.config.init_scale=0.501"]),
]


def main() -> None:
    folder = REPO / "runs" / "gate_loop"
    shutil.rmtree(folder, ignore_errors=True)
    rules = {"margin": 0.01, "alpha": 0.1, "initial": 3, "max": 12, "step": 3, "horizon": len(CHANGES)}
    loop = ablate.Loop.init(folder, HERE / "study.yaml", **rules)
    started = time.perf_counter()
    for description, overrides in CHANGES:
        for decision in loop.try_change(description, overrides):
            print(decision.line(), flush=True)
    gate = loop.gate()
    paths = write_history(
        gate.history,
        loop.spec.gate,
        REPO / "reports" / "gate_loop",
        "Research loop: gate_loop example",
        gate.start,
    )
    print(f"{time.perf_counter() - started:.0f} s; {paths['md']}")


if __name__ == "__main__":
    main()
