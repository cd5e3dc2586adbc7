"""Wall time of one 12-trial study (4 variants × 3 seeds) run with 1 and with 2 worker processes.

Usage: python benchmarks/workers.py [--workers 1 2] [--epochs 3]
Each configuration starts from an empty output folder; torch gets one thread per worker
(OMP_NUM_THREADS=1) so both configurations use the same per-process settings. Prints one line
per configuration and the ratio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

STUDY = {
    "name": "workers-bench",
    "task": {
        "kind": "seqrec",
        "data": {"format": "synthetic", "users": 600, "items": 300, "seed": 0},
        "max_len": 30,
    },
    "model": {
        "dim": 32,
        "blocks": 2,
        "dropout": 0.2,
        "attention": {"kind": "softmax", "heads": 1},
        "ffn": {"kind": "pointwise"},
        "norm": {"kind": "layernorm", "placement": "pre"},
        "connection": {"kind": "residual"},
        "bias": [{"kind": "abs_pos"}],
    },
    "variants": {
        "two-heads": {"attention": {"heads": 2}},
        "gelu-mlp": {"ffn": {"kind": "mlp", "mult": 2}},
        "post-norm": {"norm": {"placement": "post"}},
    },
    "train": {"epochs": 3, "batch_size": 64, "lr": 0.003, "loss": {"kind": "bce"}},
    "seeds": [0, 1, 2],
    "metrics": {"primary": "ndcg@10"},
    "report": {"calibration": 0, "bootstrap": 1000},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    study = {**STUDY, "train": {**STUDY["train"], "epochs": args.epochs}}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    timings = {}
    for workers in args.workers:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "study.yaml"
            path.write_text(yaml.safe_dump({**study, "output": str(Path(tmp) / "runs")}))
            start = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ablate.commands.cli",
                    "run",
                    str(path),
                    "--quiet",
                    "--workers",
                    str(workers),
                    "--reports",
                    str(Path(tmp) / "reports"),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            timings[workers] = time.perf_counter() - start
            if proc.returncode != 0:
                sys.exit(f"--workers {workers} failed: {proc.stderr[-2000:]}")
        print(f"12 trials, --workers {workers}: {timings[workers]:.1f} s wall (report included)", flush=True)
    if 1 in timings:
        for workers, t in timings.items():
            if workers != 1:
                print(f"speed-up with {workers} workers: {timings[1] / t:.2f}x")


if __name__ == "__main__":
    main()
