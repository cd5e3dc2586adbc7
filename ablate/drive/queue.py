"""One Optuna study used as a queue of planned trials: a key is enqueued once as a fixed trial,
taken by one worker, and settled with ``tell``.

A take costs the same whatever the study's size: the claim is one conditional row update
(WAITING → RUNNING, so two workers never hold one trial), and on a database the first waiting
trial is found by one query that skips rows other workers are claiming
(:func:`.optuna_private.claim_first_waiting`) instead of reading every queued trial as Optuna's
``ask`` does.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from enum import Enum
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.storages import JournalStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from ablate.drive.ledger import INTERRUPTED, direction, search_name
from ablate.drive.optuna_private import claim_first_waiting, set_user_attrs, storage_id
from ablate.study.tuning import make_pruner, make_sampler

if TYPE_CHECKING:  # pragma: no cover
    from ablate.study.load import Study


class Phase(Enum):
    """Which queue a trial is in: one variant's search, or the study's final (variant, seed) trials."""

    SEARCH = "search"
    FINAL = "final"


class Queue:
    """One Optuna study used as a queue of planned trials, read and written through the storage
    the stores opened (its public API: trials are addressed by study and number)."""

    def __init__(self, ostudy: optuna.Study, storage: optuna.storages.BaseStorage, phase: Phase):
        self.study, self.storage, self.phase = ostudy, storage, phase
        self._study_id = storage.get_study_id_from_name(ostudy.study_name)
        self._variants: BaseDistribution | None = None  # the variant parameter's choices, once seen
        self._ids: dict[int, int] = {}  # trial number → storage id, of the trials read or claimed here

    @classmethod
    def final(cls, study: Study, storage: optuna.storages.BaseStorage) -> Queue:
        ostudy = optuna.create_study(
            storage=storage, study_name=study.name, direction=direction(study), load_if_exists=True
        )
        return cls(ostudy, storage, Phase.FINAL)

    @classmethod
    def search(cls, study: Study, variant: str, storage: optuna.storages.BaseStorage) -> Queue:
        ostudy = optuna.create_study(
            storage=storage,
            study_name=search_name(study, variant),
            direction=direction(study),
            sampler=make_sampler(study),
            pruner=make_pruner(study),
            load_if_exists=True,
        )
        return cls(ostudy, storage, Phase.SEARCH)

    @property
    def study_id(self) -> int:
        return self._study_id

    @property
    def name(self) -> str:
        return self.study.study_name

    def trials(self, *states: TrialState) -> list[FrozenTrial]:
        """The queue's trials (only those in ``states`` if given), not copied: do not modify."""
        trials = self.study.get_trials(deepcopy=False, states=states or None)
        self._ids.update((t.number, storage_id(t)) for t in trials)
        if not states and self._variants is None:
            labelled = (t.distributions["variant"] for t in trials if "variant" in t.distributions)
            self._variants = next(labelled, None)
        return trials

    def trial_id(self, number: int) -> int:
        if number in self._ids:  # read or claimed here: no query
            return self._ids[number]
        return self.storage.get_trial_id_from_study_id_trial_number(self._study_id, number)

    def stored(self, number: int) -> FrozenTrial:
        """Trial ``number`` as the storage has it now."""
        return self.storage.get_trial(self.trial_id(number))

    def enqueue(self, params: dict[str, Any], attrs: dict[str, Any]) -> None:
        self.study.enqueue_trial(params, user_attrs=attrs)

    def enqueue_key(self, variant: str, seed: int, attrs: dict[str, Any], variants: Collection[str]) -> None:
        """Queue a final trial with its (variant, seed) as its Optuna parameters already (what
        :meth:`show_key` records after a claim, in two calls: through the gRPC proxy, two round
        trips a trial), where the study's choices allow; otherwise as :meth:`enqueue` does."""
        label = self._label(variant, seed, variants)
        if label is not None:
            waiting = optuna.trial.create_trial(
                state=TrialState.WAITING,
                params={"variant": variant, "seed": seed},
                distributions=label,
                user_attrs=attrs,
                system_attrs={"fixed_params": {}},  # as enqueue_trial writes it
            )
            try:
                self.study.add_trial(waiting)
                self._variants = label["variant"]
                return
            except Exception:  # noqa: BLE001 - a store refused the labels (ValueError; through the proxy its
                pass  # RpcError): the trial is queued unlabelled, as show_key leaves one
        self.enqueue({}, attrs)

    def _label(self, variant: str, seed: int, choices: Collection[str]) -> dict[str, BaseDistribution] | None:
        """The distributions of a final trial's (variant, seed) as parameters, or None where
        ``variant`` is not among the variant parameter's choices. A categorical's choices are fixed
        for the study once set (as the last full read of the queue, or this worker's first label,
        found them); an int's range may differ from trial to trial."""
        kinds = self._variants or CategoricalDistribution(list(choices))
        if not isinstance(kinds, CategoricalDistribution) or variant not in kinds.choices:
            return None
        return {"variant": kinds, "seed": IntDistribution(seed, seed)}

    def ask(self) -> optuna.Trial:
        """The first queued trial (or, if another worker took it meanwhile, a fresh one with no key)."""
        with warnings.catch_warnings():  # the stores beat the heart themselves (Stores.heartbeat)
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            return self.study.ask()

    def take(self, first: list[int], waiting: list[int]) -> optuna.Trial | None:
        """A waiting trial claimed for this worker, or None when none is left to try: those numbered
        in ``first`` before any other, then the lowest-numbered. On a database one query finds it;
        a journal (read incrementally, held under the queue lock) has its waiting trials in its
        replay; elsewhere (the gRPC proxy, whose read of the queue costs every waiting trial)
        ``waiting`` says which to try: the numbers the worker's last read found waiting, in its
        own order, so that workers with the same read try different trials first. Both lists are
        popped as they are tried."""
        while first:
            if (trial := self._claim(self.trial_id(first.pop(0)))) is not None:
                return trial
        if isinstance(self.storage, RDBStorage):
            trial_id = claim_first_waiting(self.storage, self._study_id)
            return None if trial_id is None else self._claimed(trial_id)
        if isinstance(self.storage, JournalStorage):
            queued = self.storage.get_all_trials(self._study_id, deepcopy=False, states=(TrialState.WAITING,))
            waiting[:] = [t.number for t in queued]
        while waiting:
            if (trial := self._claim(self.trial_id(waiting.pop(0)))) is not None:
                return trial
        return None

    def claim(self, trial: FrozenTrial) -> optuna.Trial | None:
        """Take the queued ``trial`` as ``ask`` takes one, or None if another worker took it."""
        return self._claim(self.trial_id(trial.number))

    def _claim(self, trial_id: int) -> optuna.Trial | None:
        try:
            if self.storage.set_trial_state_values(trial_id, state=TrialState.RUNNING):
                return self._claimed(trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker took and finished it meanwhile
        return None

    def _claimed(self, trial_id: int) -> optuna.Trial:
        trial = optuna.Trial(self.study, trial_id)
        self._ids[trial.number] = trial_id
        return trial

    def set_attrs(self, trial: optuna.Trial, attrs: dict[str, Any]) -> None:
        """User attributes of a trial this worker holds, in one write where the store allows."""
        if isinstance(self.storage, RDBStorage):
            set_user_attrs(self.storage, self.trial_id(trial.number), attrs)
        else:
            for key, value in attrs.items():
                trial.set_user_attr(key, value)

    def fail(self, trial: optuna.Trial, reason: str, skip_if_finished: bool = False) -> None:
        """Settle a trial this worker holds as failed, for ``reason``."""
        trial.set_user_attr("failure", reason)
        self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=skip_if_finished)

    def interrupt(self, number: int) -> None:
        """Fail a RUNNING trial whose worker is gone, as interrupted (unless it finished meanwhile)."""
        try:
            self.storage.set_trial_user_attr(self.trial_id(number), "failure", INTERRUPTED)
            self.study.tell(number, state=TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError):
            pass  # finished meanwhile

    def running(self, trial: optuna.Trial) -> bool:
        return self.stored(trial.number).state == TrialState.RUNNING

    def show_key(self, trial: optuna.Trial, variant: str, seed: int, variants: Collection[str]) -> None:
        """Record a final trial's (variant, seed) as its Optuna parameters too, so optuna-dashboard's
        views show them (the ledger reads the user attributes; nothing samples these), where it was
        queued without them (:meth:`enqueue_key`; a study queued before it labelled trials at
        enqueueing). Where ``variant`` is not among the choices (:meth:`_label`: a variant added to a
        started study), or the trial has them already, nothing is recorded."""
        if "variant" in trial.params:  # as the claim read it
            return
        label = self._label(variant, seed, variants)
        if label is None:
            return
        trial_id = self.trial_id(trial.number)
        try:
            for name, value in (("variant", variant), ("seed", seed)):
                self.storage.set_trial_param(trial_id, name, label[name].to_internal_repr(value), label[name])
            self._variants = label["variant"]
        except Exception:  # noqa: BLE001 - another worker fixed other choices first (ValueError, or
            pass  # through the gRPC proxy its RpcError): the trial goes unlabelled, a label is worth no trial
