"""The take at cluster scale (issue 56): a take costs the same number of statements whatever the
study's size, two workers never hold one trial, checkpointed trials go first, and Optuna's gRPC
storage proxy serves workers — a killed one's trial queued again by its mark of life."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import yaml

from ablate.drive import Driver, Stores, prepare
from ablate.drive.ledger import key_of
from ablate.study.load import load_study

COMPLETE = optuna.trial.TrialState.COMPLETE
TRAIN = """
import time


def train(config, seed, reporter):
    time.sleep(config["sleep"])
    return {"acc": 0.5 + seed / 1000}
"""


def _study(folder: Path, seeds: int, sleep: float = 0.0, **changes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(TRAIN)
    spec = {
        "name": "take",
        "task": {"kind": "function", "callable": "train.py:train"},
        "model": {"config": {"sleep": sleep}},
        "variants": {"other": {"config": {"sleep": sleep}}},
        "seeds": list(range(seeds)),
        "metrics": {"primary": "acc"},
        "report": {"margin": 0.01},
        **changes,
    }
    (folder / "study.yaml").write_text(yaml.safe_dump(spec))
    return folder / "study.yaml"


def _statements_per_take(folder: Path, seeds: int) -> list[int]:
    """The SQL statements each of 6 takes (and tells) sends, on an SQLite store of 2 × ``seeds`` trials."""
    study = load_study(_study(folder, seeds))
    stores = Stores.for_study(study, storage=f"sqlite:///{folder / 'optuna.db'}")
    prepare(study, stores)
    driver = Driver(study, stores, worker_id="counted")
    driver.sync()
    sent = []
    sqlalchemy.event.listen(driver.final.storage.engine, "before_cursor_execute", lambda *_: sent.append(1))
    counts = []
    for _ in range(6):
        before = len(sent)
        queue, trial = driver._next()
        queue.study.tell(trial, 0.5)
        counts.append(len(sent) - before)
    return counts


def test_a_take_sends_as_many_statements_at_160_trials_as_at_16(tmp_path):
    small, large = _statements_per_take(tmp_path / "small", 8), _statements_per_take(tmp_path / "large", 80)
    assert small == large, (small, large)  # no statement per queued trial: the same work at any size
    assert max(large) < 60, large


def test_two_workers_take_each_trial_once_lowest_first(tmp_path):
    study = load_study(_study(tmp_path, 5))
    stores = Stores.for_study(study, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    prepare(study, stores)
    workers = [Driver(study, stores, worker_id=f"w{i}") for i in range(2)]
    numbers, taken = [], []
    while popped := workers[len(taken) % 2]._next():
        queue, trial = popped
        numbers.append(trial.number)
        taken.append(key_of(trial))
        queue.study.tell(trial, 0.5)
    assert numbers == sorted(numbers) and len(taken) == 10
    assert collections.Counter(taken) == {(v, s): 1 for v in ("base", "other") for s in range(5)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.heavy
def test_workers_share_a_queue_through_the_grpc_proxy_and_a_killed_ones_trial_is_queued_again(tmp_path):
    pytest.importorskip("grpc", reason="grpcio is in the test extra; install '.[test]'")
    port = _free_port()
    database = f"sqlite:///{tmp_path / 'optuna.db'}"
    ablate = [sys.executable, "-m", "ablate.commands.cli"]
    proxy = subprocess.Popen(
        [*ablate, "proxy", "--storage", database, "--host", "127.0.0.1", "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        study = _study(tmp_path, 2, sleep=1.0)
        url = f"grpc://127.0.0.1:{port}"
        tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
        worker = [*ablate, "worker", str(study), "--storage", url, "--tracking-uri", tracking, "--quiet"]
        worker += ["--heartbeat", "1", "--grace", "4"]
        victim = subprocess.Popen(worker, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        storage = optuna.storages.RDBStorage(database)

        def running() -> list:
            try:
                trials = optuna.load_study(study_name="take", storage=storage).get_trials(deepcopy=False)
            except KeyError:  # not made yet
                return []
            return [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]

        _wait_for(lambda: running(), 120, "the first worker's first trial")
        held = key_of(running()[0])
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        survivor = subprocess.run(worker, cwd=tmp_path, capture_output=True, text=True, timeout=240)
        assert survivor.returncode == 0, survivor.stderr
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=30)
    trials = optuna.load_study(study_name="take", storage=storage).get_trials(deepcopy=False)
    complete = collections.Counter(key_of(t) for t in trials if t.state == COMPLETE)
    assert complete == {(v, s): 1 for v in ("base", "other") for s in range(2)}, complete
    failed = [t.user_attrs.get("failure") for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed == ["interrupted"] and held in complete  # the killed worker's, queued again and trained
    assert "Optuna storage proxy on 127.0.0.1" in proxy.stderr.read()


def test_one_worker_of_a_study_looks_for_dead_workers_trials_through_the_proxy(tmp_path, monkeypatch):
    """Through the proxy a look for dead workers' trials reads every unfinished trial (its API has
    no read by state): of three workers whose look is due at once one looks, the others skip, and
    a trial whose mark lapsed later is found by the next look once it is due again."""
    from ablate.drive import stores as kinds
    from ablate.drive.proxy import BEAT, REAPED

    study = load_study(_study(tmp_path, 3))
    stores = Stores.for_study(study, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    prepare(study, stores)
    driver = Driver(study, stores, worker_id="w")
    queue = driver.final
    proxied = kinds.ProxyStores(tmp_path, "grpc://127.0.0.1:1", stores.tracking_uri, heartbeat_s=1, grace_s=4)
    reads, read = [], kinds.unmarked_trials  # a read of every unfinished trial through the proxy
    monkeypatch.setattr(kinds, "unmarked_trials", lambda *args: reads.append(1) or read(*args))
    lapsed = []
    for _ in range(2):
        _, trial = driver._next()
        queue.storage.set_trial_system_attr(queue.trial_id(trial.number), BEAT, time.time() - 10)
        lapsed.append(trial.number)
    assert [proxied.reap(queue) for _ in range(3)] == [2, 0, 0] and len(reads) == 1
    states = {t.number: t.state for t in queue.trials()}
    assert [states[n] for n in lapsed] == [optuna.trial.TrialState.FAIL] * 2
    _, trial = driver._next()
    queue.storage.set_trial_system_attr(queue.trial_id(trial.number), BEAT, time.time() - 10)
    assert proxied.reap(queue) == 0 and len(reads) == 1  # looked 0 s ago: not due (every 2 s)
    queue.storage.set_study_system_attr(queue.study_id, REAPED, time.time() - 3)
    assert proxied.reap(queue) == 1 and len(reads) == 2
    # A mark from a host whose clock is ahead is no reason to wait.
    queue.storage.set_study_system_attr(queue.study_id, REAPED, time.time() + 3600)
    assert proxied.reap(queue) == 0 and len(reads) == 3


def test_final_trials_are_queued_with_their_keys_as_optuna_parameters(tmp_path):
    """optuna-dashboard shows a final trial's (variant, seed) as its parameters: written when the
    trial is queued (one call, not two more after each claim); a trial queued without them (by an
    older ablate) is labelled when it is taken; a variant outside the fixed choices goes unlabelled."""
    study = load_study(_study(tmp_path, 2))
    stores = Stores.for_study(study, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    prepare(study, stores)
    queue = Driver(study, stores, worker_id="w").final
    waiting = queue.trials()
    assert len(waiting) == 4
    assert all(
        t.params == {"variant": t.user_attrs["variant"], "seed": t.user_attrs["seed"]} for t in waiting
    )
    assert {t.distributions["variant"].choices for t in waiting} == {("base", "other")}
    queue.enqueue({}, {"variant": "other", "seed": 7})  # as an older ablate queued it
    queue.enqueue_key("added", 0, {"variant": "added", "seed": 0}, ["base", "other", "added"])
    old, added = queue.trials()[-2:]
    assert old.params == added.params == {}  # "added" is not among the study's choices
    trial = queue.claim(old)
    queue.show_key(trial, "other", 7, list(study.variants))
    assert queue.stored(old.number).params == {"variant": "other", "seed": 7}


def test_a_take_through_the_proxy_asks_it_nothing_its_read_answered(tmp_path):
    """Through Optuna's gRPC proxy every call is a round trip to one process all workers share:
    a take and tell of a queued trial make no call for the trial's id (the read of the queue has
    it) nor for its labels (queued with them): 6 calls a trial, where they were 9."""
    pytest.importorskip("grpc", reason="grpcio is in the test extra; install '.[test]'")
    port = _free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "ablate.commands.cli", "proxy", "--storage", f"sqlite:///{tmp_path / 'o.db'}"]
        + ["--host", "127.0.0.1", "--port", str(port)],
        stderr=subprocess.DEVNULL,
    )
    try:
        study = load_study(_study(tmp_path, 3))
        stores = Stores.for_study(study, storage=f"grpc://127.0.0.1:{port}")
        _wait_for(lambda: _answers(stores), 60, "the proxy")
        prepare(study, stores)
        driver = Driver(study, stores, worker_id="w")
        driver.sync()
        calls = collections.Counter()
        storage = driver.final.storage
        for name in [n for n in dir(storage) if not n.startswith("_") and callable(getattr(storage, n))]:
            real = getattr(storage, name)  # every call the storage takes, counted
            setattr(
                storage, name, lambda *a, _real=real, _name=name, **k: calls.update([_name]) or _real(*a, **k)
            )
        for _ in range(6):
            queue, trial = driver._next()
            queue.show_key(trial, *key_of(trial), list(study.variants))
            queue.study.tell(trial, 0.5)
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    # A take: the claim, its read, the worker's mark; a tell: its state and two reads.
    assert calls == {"set_trial_state_values": 12, "get_trial": 18, "set_trial_user_attr": 6}, calls


def _answers(stores: Stores) -> bool:
    try:
        stores.storage()
        return True
    except Exception:  # noqa: BLE001 - not listening yet
        return False


def test_a_proxy_that_is_not_there_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.setattr("ablate.drive.proxy.READY_S", 1.0)  # the wait is not under test: the line after it is
    code, _, err = cli("worker", _study(tmp_path, 1), "--storage", f"grpc://127.0.0.1:{_free_port()}")
    assert code == 2 and "cannot reach the Optuna storage proxy grpc://127.0.0.1:" in err
    assert "ablate proxy --storage" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "url, said",
    [("grpc://host:port", "not a proxy address"), ("grpc:///path", "not a proxy address")],
)
def test_a_proxy_address_that_is_no_address_is_one_line(cli, tmp_path, url, said):
    code, _, err = cli("worker", _study(tmp_path, 1), "--storage", url)
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("storage", ["runs/optuna.journal", "grpc://127.0.0.1:13000"])
def test_the_proxy_fronts_only_a_database(cli, storage):
    code, _, err = cli("proxy", "--storage", storage)
    assert code == 2 and "the proxy fronts a database" in err and len(err.strip().splitlines()) == 1


def test_a_held_trials_attributes_are_one_write_and_a_finished_trial_refuses_them(tmp_path):
    study = load_study(_study(tmp_path, 2))
    stores = Stores.for_study(study, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    prepare(study, stores)
    queue, trial = Driver(study, stores, worker_id="w")._next()
    sent = []
    sqlalchemy.event.listen(queue.storage.engine, "before_cursor_execute", lambda *_: sent.append(1))
    queue.set_attrs(trial, {"valid.acc": 0.75, "wall_s": 1.5, "worker": "w2"})
    assert len(sent) == 2  # the state checked, every attribute upserted (Optuna: 3 statements each)
    stored = queue.stored(trial.number).user_attrs
    assert (stored["valid.acc"], stored["wall_s"], stored["worker"]) == (0.75, 1.5, "w2")
    queue.study.tell(trial, 0.5)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        queue.set_attrs(trial, {"wall_s": 2.0})


def test_only_a_key_that_never_ran_skips_the_search_for_runs_to_supersede(tmp_path):
    """A trial whose key had no other trial in the queue cannot have left an MLflow run, so its
    worker does not look for one; a key queued again after a failure is looked up as before."""
    study = load_study(_study(tmp_path, 2))
    stores = Stores.for_study(study, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    prepare(study, stores)
    first = Driver(study, stores, worker_id="w1")
    queue, trial = first._next()
    assert first._fresh == {trial.number}
    queue.fail(trial, "boom")
    retrying = Driver(study, stores, worker_id="w2", retry_failed=True)
    fresh = {}
    while popped := retrying._next():
        queue, taken_trial = popped
        fresh[key_of(taken_trial)] = taken_trial.number in retrying._fresh
        queue.study.tell(taken_trial, 0.5)
    assert fresh == {("base", 0): False, ("base", 1): True, ("other", 0): True, ("other", 1): True}
