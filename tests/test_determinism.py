"""Same seed, same weights: two processes training the same trial at the same time, with 2 intra-op
threads each, end bit-identical. (Advanced indexing's CPU backward accumulates with atomics across
threads; the seqrec losses gather item rows through ``F.embedding`` instead — see ``losses.lookup``.)"""

from __future__ import annotations

import os
import subprocess
import sys

HASH = """
import hashlib, sys, torch
from ablate.model.build import build_backbone
from ablate.study.load import load_study
from ablate.training.trainer import seed_everything
study = load_study(sys.argv[1])
task, variant = study.task, study.variants["base"]
data = task.load()
seed_everything(2)
generator = torch.Generator().manual_seed(2)
ctx = study.build_context(variant, task.max_len(data))
model = task.build_model(build_backbone(variant, ctx), ctx, data)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for epoch in range(3):
    for batch in task.train_batches(data, 64, generator):
        loss = task.loss(model, batch, study.loss, generator)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
digest = hashlib.sha256()
for value in model.state_dict().values():
    digest.update(value.detach().numpy().tobytes())
print(digest.hexdigest())
"""


def test_two_threaded_runs_at_once_train_identical_weights(write_study, tmp_path):
    path = write_study(
        {
            "task": {"data": {"users": 400, "items": 40, "min_len": 20, "max_len": 40}, "max_len": 40},
            "train": {"loss": {"kind": "bce", "negatives": 4}},
        }
    )
    script = tmp_path / "hash.py"
    script.write_text(HASH)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    first, second = (out.strip() for out, _ in outputs)
    assert len(first) == 64 and first == second
