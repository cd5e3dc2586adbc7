"""Fingerprints are computed from the resolved study: one model spelt several ways is one
fingerprint, a changed default or a kind's new version is another; stores and trial files made
with the old text-based fingerprint (``legacy_fingerprint``) still resume and are still reused."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from ablate import registry
from ablate.drive.execution import Execution, Job
from ablate.drive.ledger import (
    check_changed,
    fingerprint,
    fingerprints,
    legacy_fingerprint,
    search_fingerprint,
    search_fingerprints,
)
from ablate.drive.older import older_fingerprints
from ablate.drive.reuse import TRIAL_FORMAT, TRIAL_SUFFIX, Donors, StoredTrial
from ablate.errors import AblateError
from ablate.study.ladder import laddered, per_rung
from ablate.study.load import load_study
from ablate.study.several import per_dataset, several
from ablate.study.spec import TrainSpec
from ablate.tracking.names import REUSED_TAG
from ablate.training.trainer import Checkpoint

REPO = Path(__file__).resolve().parents[1]
# The studies whose finished trials are committed beside their reports, named by fingerprint.
COMMITTED = sorted({p.parent.parent.name for p in REPO.glob(f"reports/*/trials/*{TRIAL_SUFFIX}")})
NAMED = rf"(.+)-seed(\d+)-([0-9a-f]{{16}}){re.escape(TRIAL_SUFFIX)}"  # variant, seed, fingerprint


def _load(write_study, name: str, **changes):
    return load_study(write_study(name=f"{name}.yaml", **changes), check_files=False)


def test_one_model_spelt_three_ways_is_one_fingerprint(write_study):
    spellings = [
        {"kind": "softmax"},
        {"kind": "softmax", "heads": 1},
        {"kind": "softmax", "heads": 1, "bias": True, "dropout": None, "init": "torch"},
    ]
    studies = [_load(write_study, f"s{i}", replace={"model.attention": a}) for i, a in enumerate(spellings)]
    assert len({fingerprint(s, "base") for s in studies}) == 1
    assert len({legacy_fingerprint(s, "base") for s in studies}) == 3  # what the text-based one did


def test_a_changed_default_or_version_changes_it(write_study, monkeypatch):
    before = _load(write_study, "before")
    current, legacy = fingerprint(before, "base"), legacy_fingerprint(before, "base")
    assert fingerprints(before, "base")[0] == current and legacy in fingerprints(before, "base")
    softmax = registry.get("attention", "softmax")

    class Unbiased(softmax.Options):
        bias: bool = False

    monkeypatch.setattr(softmax, "Options", Unbiased)
    unbiased = _load(write_study, "unbiased")
    assert fingerprint(unbiased, "base") != current
    # The text-based one cannot see a default: why a version-1 kind's first changed default wants a bump.
    assert legacy_fingerprint(unbiased, "base") == legacy
    monkeypatch.undo()

    for cls in (softmax, registry.get("task", "seqrec")):
        with monkeypatch.context() as patched:
            patched.setattr(cls, "version", cls.version + 1)
            bumped = fingerprints(_load(write_study, f"bumped-{cls.kind_name()}"), "base")
        assert current not in bumped and legacy not in bumped  # neither the new records nor the old


@pytest.mark.parametrize(
    "patch",
    [
        {"model": {"attention": {"heads": 2}}},
        {"model": {"norm": {"placement": "post"}}},
        {"train": {"lr": 0.001}},
        {"train": {"micro_batches": 2}},
        {"train": {"loss": {"kind": "softmax"}}},
        {"task": {"max_len": 12}},
        {"metrics": {"also": []}},
    ],
    ids=lambda patch: json.dumps(patch),
)
def test_a_changed_value_changes_it(write_study, patch):
    before = _load(write_study, "before")
    after = _load(write_study, "after", patch=patch)
    assert fingerprint(after, "base") != fingerprint(before, "base")


def test_device_evaluation_batch_size_and_compiling_leave_it_alone(write_study):
    before = _load(write_study, "before")
    patch = {"train": {"device": "cpu", "eval_batch_size": 7, "compile": "default"}}
    after = _load(write_study, "after", patch=patch)
    assert fingerprints(after, "base") == fingerprints(before, "base")
    assert fingerprint(before, "mlp") != fingerprint(before, "base")


def _trial(variant: str, seed: int, fingerprint: str):
    return create_trial(
        state=TrialState.COMPLETE,
        value=0.5,
        params={"x": 0.0},
        distributions={"x": FloatDistribution(0.0, 1.0)},
        user_attrs={"variant": variant, "seed": seed, "fingerprint": fingerprint},
    )


def test_a_store_of_legacy_fingerprints_resumes(write_study):
    study = _load(write_study, "study")
    accepted = fingerprints(study, "base")  # auto's written-out precisions between (test_precision_record)
    assert (accepted[0], accepted[-1]) == (fingerprint(study, "base"), legacy_fingerprint(study, "base"))
    expected = {v: fingerprints(study, v) for v in study.variants}
    trials = [_trial(v, s, legacy_fingerprint(study, v)) for v in study.variants for s in (0, 1)]
    trials.append(_trial("base", 2, fingerprint(study, "base")))
    check_changed(trials, expected, "the store")  # old and new records alike: nothing raised
    with pytest.raises(AblateError, match="variant\\(s\\) mlp trained with different settings"):
        check_changed([*trials, _trial("mlp", 3, "0123456789abcdef")], expected, "the store")

    search = search_fingerprints(study, "base")
    assert len(search) == len(accepted) and search[0] == search_fingerprint(study, "base")


def test_a_checkpoint_signed_with_the_legacy_fingerprint_resumes(write_study, tmp_path):
    study = _load(write_study, "study")
    place = SimpleNamespace(output_dir=tmp_path / "out", checkpoint_s=0.0)
    checkpoint = Execution.checkpoint(place, Job("base", 1), study)
    assert checkpoint.signature == f"{fingerprint(study, 'base')}/seed1/batch64"
    old = Checkpoint(checkpoint.path, f"{legacy_fingerprint(study, 'base')}/seed1/batch64", every_s=0)
    old.save({"epoch": 1, "epochs": 2, "weights": torch.ones(3)})
    state = checkpoint.load()
    assert state is not None and torch.equal(state["weights"], torch.ones(3))
    Checkpoint(checkpoint.path, "another trial/seed1/batch64", every_s=0).save({"epoch": 1, "epochs": 2})
    assert checkpoint.load() is None


def _trial_file(folder: Path, variant: str, seed: int, fingerprint: str, run_id: str) -> Path:
    path = folder / f"{variant}-seed{seed}-{fingerprint}{TRIAL_SUFFIX}"
    record = {
        "format": TRIAL_FORMAT,
        "study": "old",
        "run_id": run_id,
        "fingerprint": fingerprint,
        "seed": seed,
    }
    path.write_bytes(gzip.compress(json.dumps(record).encode()))
    return path


def test_reuse_finds_trial_files_named_with_the_legacy_fingerprint(write_study, tmp_path):
    study = _load(write_study, "study")
    folder = tmp_path / "trials"
    folder.mkdir()
    legacy = _trial_file(folder, "base", 0, legacy_fingerprint(study, "base"), "old-run")
    donors = Donors([folder])
    assert donors.find(fingerprints(study, "base"), 0).path == legacy
    assert donors.find(fingerprints(study, "base"), 1) is None
    assert donors.find(fingerprints(study, "mlp"), 0) is None
    # The trial copied from that file into a store, written back into the folder, is not filed
    # again under the current fingerprint: the donor's file keeps naming the run that trained it.
    tags = {"variant": "base", "seed": "0", "ablate.fingerprint": fingerprint(study, "base")}
    tags[REUSED_TAG] = donors.find(fingerprints(study, "base"), 0).source
    copy = SimpleNamespace(info=SimpleNamespace(run_id="copy"), data=SimpleNamespace(tags=tags))
    assert StoredTrial(None, "store", "new", copy).write(folder) is None
    assert sorted(folder.iterdir()) == [legacy]
    current = _trial_file(folder, "base", 0, fingerprint(study, "base"), "new-run")
    assert donors.find(fingerprints(study, "base"), 0).path == current  # the current one first


def _as_today(study_file: Path, folder: Path) -> Path:
    """``study_file`` copied into ``folder`` (where its relative data paths lead nowhere), with a
    ``task.micro_batches`` moved to ``train.micro_batches`` where the file still has it there."""
    raw = yaml.safe_load(study_file.read_text())
    if "micro_batches" in raw["task"] and "micro_batches" in TrainSpec.model_fields:
        raw.setdefault("train", {})["micro_batches"] = raw["task"].pop("micro_batches")
    copy = folder / study_file.name
    copy.write_text(yaml.safe_dump(raw, sort_keys=False))
    return copy


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_trial_files_carry_a_fingerprint_of_their_study(name, tmp_path):
    """The trials committed under reports/<study>/trials are named by the text-based (legacy)
    fingerprint, those written before fingerprints by meaning, by the current one, or by one it had
    with a kind at an earlier version: computed from the study file as it is now, without its data,
    one of them names each; the reuse lookup finds every one, those of an earlier kind version only
    with --reuse-older-kinds."""
    whole = load_study(_as_today(REPO / "studies" / f"{name}.yaml", tmp_path), check_files=False)
    # No data read: a copy's relative path leads nowhere; data by name is named, not read.
    assert whole.dataset is not None or whole.task.data_path() is None or not whole.task.data_path().exists()
    # a study over several data sets, or a ladder's rungs, keeps all its sub-studies' trials in one folder
    studies = list(per_dataset(whole, False).values()) if several(whole) else [whole]
    studies = list(per_rung(whole, False).values()) if laddered(whole) else studies
    folder = REPO / "reports" / name / "trials"
    donors = Donors([folder])
    found = refused = 0
    for path in sorted(folder.glob(f"*{TRIAL_SUFFIX}")):
        variant, seed, named = re.fullmatch(NAMED, path.name).groups()
        if variant not in whole.variants:  # a trial copied in from another study, under its name
            continue
        names = {
            s.name: (
                legacy_fingerprint(s, variant),
                *fingerprints(s, variant),
                *older_fingerprints(s, variant),
            )
            for s in studies
        }
        study = next((s for s in studies if named in names[s.name]), None)
        assert study is not None, path.name
        reused = donors.find(fingerprints(study, variant), int(seed))
        if named in older_fingerprints(study, variant):
            # trained while one of its kinds was at an earlier version (before float64 times, or
            # before the version said so): refused, but copied as it is where a report is written
            # again from it (--reuse-older-kinds)
            assert reused is None, path.name
            older = Donors([folder], older_kinds=True).find_for(study, variant, int(seed))
            assert older.filed_as == named and " (now v" in older.versions, path.name
            refused += 1
        else:
            assert reused.path == path
            found += 1
    assert found or refused


def test_an_option_added_later_keeps_fingerprints_at_its_neutral_value(write_study, monkeypatch):
    """A kind's new option declared in ``ADDED_LATER`` (the value that trains as before) leaves old
    fingerprints as they were at that value, whatever its default, and changes them elsewhere."""
    before = fingerprint(_load(write_study, "before"), "base")
    softmax = registry.get("attention", "softmax")

    class WithGate(softmax.Options):
        gate: float = 0.0
        ADDED_LATER = {"gate": 0.0}

    monkeypatch.setattr(softmax, "Options", WithGate)
    assert fingerprint(_load(write_study, "neutral"), "base") == before
    gated = {"model.attention": {"kind": "softmax", "gate": 0.5}}
    assert fingerprint(_load(write_study, "gated", replace=gated), "base") != before

    class GatedByDefault(WithGate):
        gate: float = 0.5  # the default changed later: trials trained at 0.0 are not these

    monkeypatch.setattr(softmax, "Options", GatedByDefault)
    assert fingerprint(_load(write_study, "default"), "base") != before
