"""`validate` (and every command reading a study file) reports every problem of the file's keys
and types in one call, one line each in file order, and a misspelt key gets a did-you-mean."""

from __future__ import annotations

import pytest

from ablate.errors import StudyError
from ablate.study.load import load_study

TWO_TYPOS = """\
name: typos
task:
  kind: seqrec
  data: {format: synthetic, users: 100, items: 50}
  max_len: 20
model:
  dim: 16
  blokcs: 2
train: {epochz: 3, lr: abc}
seeds: [0]
metrics: {primary: ndcg@10}
sedes: [1]
"""


def test_every_key_and_type_problem_in_one_call(tmp_path, cli):
    path = tmp_path / "typos.yaml"
    path.write_text(TWO_TYPOS)
    code, out, err = cli("validate", str(path))
    assert code == 2
    assert err.splitlines() == [
        f"error: {path}:8: model.blokcs: unknown key; did you mean 'blocks'?",
        f"error: {path}:9: train.lr: Input should be a valid number, unable to parse string as a number"
        " (got 'abc')",
        f"error: {path}:9: train.epochz: unknown key; did you mean 'epochs'?",
        f"error: {path}:12: sedes: unknown key; did you mean 'seeds'?",
    ]


def test_a_key_nothing_resembles_gets_no_guess(write_study):
    with pytest.raises(StudyError, match=r"train.zzz: unknown key$"):
        load_study(write_study({"train": {"zzz": 1}}))
    with pytest.raises(StudyError, match=r"model.attention.heds: .*did you mean 'heads'"):
        load_study(write_study({"model": {"attention": {"heds": 2}}}))
