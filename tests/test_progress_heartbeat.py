"""The parent of ``ablate run --workers N`` beats in a log as a single-process run does: a line per
running trial (its last epoch and validation value, read from the shared store) once the heartbeat
interval has passed without a line, and none while lines come often enough or with bars drawn."""

from __future__ import annotations

import io
import re

import optuna
import pytest
from rich.console import Console

from ablate.commands import console
from ablate.commands import progress as progress_module
from ablate.commands.progress import StoreWatch
from ablate.drive import Stores
from ablate.study.load import load_study


@pytest.fixture
def shown(monkeypatch):
    text = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=text, force_terminal=False, width=200))
    return text


def _queue(study) -> Stores:
    """The study's Optuna queue with its final trials enqueued as the driver keys them (no MLflow
    store: the parent's watch reads the queue only)."""
    stores = Stores.for_study(study)
    queue = optuna.create_study(study_name=study.name, storage=stores.storage())
    for variant in study.variants:
        for seed in study.spec.seed_list:
            queue.enqueue_trial({}, user_attrs={"variant": variant, "seed": seed})
    return stores


def _take(study, stores, worker: str, epochs: dict[int, float]) -> optuna.Trial:
    """The queue's next final trial, taken as a worker takes it, with ``epochs`` reported."""
    queue = optuna.load_study(study_name=study.name, storage=stores.storage())
    trial = queue.ask()
    trial.set_user_attr("worker", worker)
    for epoch, value in epochs.items():
        trial.report(value, epoch)
    return trial


def test_the_parent_of_workers_beats_with_each_running_trial(write_study, tmp_path, monkeypatch, shown):
    study = load_study(write_study({"train": {"epochs": 3}}))
    stores = _queue(study)
    with console.progress_bars(quiet=False) as bars, stores.worker() as one, stores.worker() as two:
        watch = StoreWatch(study, stores, bars, quiet=False, workers=2)
        first = _take(study, stores, one, {1: 0.25, 2: 0.3125})
        second = _take(study, stores, two, {})
        watch.poll()  # within the interval (the watch just started): no heartbeat yet
        assert shown.getvalue() == ""
        monkeypatch.setattr(progress_module, "HEARTBEAT_S", 0.0)
        watch.poll()
    lines = shown.getvalue().splitlines()
    keys = [(t.user_attrs["variant"], t.user_attrs["seed"]) for t in (first, second)]
    assert len(lines) == 2, lines
    assert re.fullmatch(
        rf"running {keys[0][0]} · seed {keys[0][1]}: epoch 2/3 done, valid ndcg@10 0\.3125 "
        r"\(0m0\ds into the trial\)",
        lines[0],
    ), lines
    assert lines[1].startswith(f"running {keys[1][0]} · seed {keys[1][1]}: in epoch 1/3 ("), lines


def test_a_dead_workers_trial_is_not_running_and_bars_draw_no_heartbeat(
    write_study, tmp_path, monkeypatch, shown
):
    study = load_study(write_study())
    stores = _queue(study)
    monkeypatch.setattr(progress_module, "HEARTBEAT_S", 0.0)
    with console.progress_bars(quiet=False) as bars:
        watch = StoreWatch(study, stores, bars, quiet=False, workers=2)
        _take(study, stores, "gone-1234-abcdef", {1: 0.5})  # no lock file: its worker is dead
        watch.poll()
    assert shown.getvalue().splitlines() == [
        "waiting: 0/4 trials done, no final trial in flight (workers starting or searching)"
    ]
    shown.truncate(0), shown.seek(0)
    with console.progress_bars(quiet=True) as bars, stores.worker() as one:
        watch = StoreWatch(study, stores, bars, quiet=True, workers=2)
        _take(study, stores, one, {1: 0.5})
        watch.poll()
    assert shown.getvalue() == ""
