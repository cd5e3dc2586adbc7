"""The ledger of planned trials: every (variant, seed) of the study and every search slot of a
variant, what each was trained with (its fingerprint), and what state it is in.

Each ledger is an Optuna study used as a queue (:class:`~.queue.Queue`). Trials failed for bookkeeping
(interrupted, duplicate, …) carry their reason and never count as failures.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Collection, Iterable
from typing import Any, get_args

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel

from ablate.components import Component
from ablate.errors import AblateError
from ablate.registry import COMPONENT_SLOTS
from ablate.stats import ReportSettings
from ablate.stats.sequential import SequentialDecision, seeds_wanted
from ablate.study.load import Study
from ablate.study.spec import Precision
from ablate.study.tuning import search_budget
from ablate.tasks import Task

Key = tuple[str, int]  # (variant, seed) of a final trial, (variant, slot) of a search trial

# Failure reasons of trials failed for bookkeeping, not because training failed.
INTERRUPTED = "interrupted"  # its worker stopped or died; enqueued again
DUPLICATE = "duplicate"  # another trial has the same key
NOTHING_QUEUED = "nothing queued"  # another worker took the last queued trial first
UNPLANNED = "no longer in the study file"
UNWANTED = "not wanted by the sequential design now"  # queued for a look its comparison no longer needs
BOOKKEEPING = frozenset({INTERRUPTED, DUPLICATE, NOTHING_QUEUED, UNPLANNED, UNWANTED})


def plan(
    study: Study, trials: Iterable[FrozenTrial] = (), settings: ReportSettings | None = None
) -> list[Key]:
    """The (variant, seed) keys to train: every seed of every variant for a list of seeds; for a
    sequential design, those each variant's standing wants now (:func:`standing`) given the final
    queue's ``trials`` — a function of the store alone, so every worker plans the same."""
    design = study.spec.sequential
    if design is None:
        return [(v, s) for v in study.variants for s in study.spec.seed_list]
    wanted = seeds_wanted(standing(study, trials, settings), study.spec.report.baseline, design)
    seeds = design.seeds()
    return [(v, s) for v in study.variants for s in seeds[: wanted.get(v, design.initial)]]


def standing(
    study: Study, trials: Iterable[FrozenTrial], settings: ReportSettings | None = None
) -> dict[str, SequentialDecision]:
    """A sequential study's variants where they stand (decided, inconclusive, waiting for a look),
    from the primary test metric its finished final trials carry (``test.<metric>``)."""
    design = study.spec.sequential
    if design is None:
        return {}
    settings = settings or study.report_settings()
    metric = f"test.{settings.primary}"
    values: dict[Key, float] = {}
    for t in sorted(trials, key=lambda t: t.number):  # the first of duplicates, as every worker sees it
        key = key_of(t)
        if t.state == TrialState.COMPLETE and key is not None and "seed" in t.user_attrs:
            values.setdefault(key, float(t.user_attrs.get(metric, math.nan)))
    per_seed = pd.DataFrame(
        [[values.get((v, s), math.nan) for v in study.variants] for s in design.seeds()],
        index=design.seeds(),
        columns=list(study.variants),
    )
    return settings.sequential_standing(per_seed)


def direction(study: Study) -> str:
    return "maximize" if study.task.metric_higher_is_better(study.metrics[0]) else "minimize"


def search_name(study: Study, variant: str) -> str:
    return f"{study.name}.search.{variant}"


# Training settings that do not change what a trial trains (the device and the thread count move only
# float rounding: the conditions its tags record), left out of its fingerprint.
UNTRAINED = frozenset({"device", "eval_batch_size", "threads", "pack", "compile"})


def fingerprint(study: Study, variant: str) -> str:
    """What a trial's numbers depend on, as the study resolves it (:func:`trained_with`): one
    model spelt three ways is one fingerprint, and a changed default or a kind's new
    ``version`` is another. Adding a variant or a seed keeps existing trials valid; changing
    what they were trained with does not."""
    return fingerprint_of(trained_with(study, variant))


def trained_with(study: Study, variant: str) -> dict[str, Any]:
    """The settings a trial of ``variant`` trains with: every component's kind, version and
    options with their defaults filled in, the model's settings, the training settings (its
    loss resolved by the task; not the device or the evaluation batch size), the task's kind,
    version and options, the metrics, and the task's own code (:meth:`~ablate.tasks.Task.code_digest`)
    where it has some."""
    resolved = study.variants[variant]
    model = _settings(resolved.spec, exclude=COMPONENT_SLOTS)
    model["placement"] = resolved.spec.norm.placement  # a block option held in the norm's mapping
    for slot in COMPONENT_SLOTS:
        model[slot] = [_kind(part.cls, part.options) for part in resolved.parts(slot)]
    train = _settings(study.spec.train, exclude=UNTRAINED)
    train["loss"] = _settings(study.loss)
    task = _kind(type(study.task), study.task.options)
    if study.dataset is not None:  # data by name: the name, not where its files sit on this machine
        task["options"] = study.dataset.spelt_by_name(task["options"])
    content = {
        "model": model,
        "train": train,
        "task": task,
        "metrics": study.metrics,
    }
    code = study.task.code_digest()  # e.g. a training script's source: changed, it trains again
    return content if code is None else {**content, "code": code}


def _kind(cls: type[Component] | type[Task], options: BaseModel) -> dict[str, Any]:
    return {"kind": cls.kind_name(), "version": cls.version, "options": _settings(options)}


def _settings(settings: BaseModel, exclude: Collection[str] = ()) -> dict[str, Any]:
    """``settings`` with every default filled in, less ``exclude`` and the options added later
    that sit at the value which trains as before they existed (``ADDED_LATER``)."""
    neutral = getattr(type(settings), "ADDED_LATER", {})
    dumped = settings.model_dump(mode="json", exclude=set(exclude))
    return {k: v for k, v in dumped.items() if not (k in neutral and getattr(settings, k) == neutral[k])}


def legacy_fingerprint(study: Study, variant: str) -> str:
    """The fingerprint stores and trial files were made with before :func:`fingerprint`: a hash
    of the study file's text as parsed (options as written), read so that they still resume.
    Its bytes are kept exactly: options added since (``TrainSpec.LATER_OPTIONS``,
    ``ModelSpec.LATER_OPTIONS``, ``vary``) are left out at their defaults, and
    ``train.micro_batches`` other than 1 goes in the task's mapping, where it was written then."""
    train_spec = study.spec.train
    skip = set(UNTRAINED) | ({"vary"} if train_spec.vary.everything else set())
    skip |= train_spec.later_options_at_default() | {"micro_batches"}
    task = study.spec.task.model_dump()
    if study.dataset is not None:  # data by name: as the study files spelt it before names
        task = study.dataset.spelt_as_before(task)
    micro_batches = getattr(train_spec, "micro_batches", 1)
    if micro_batches != 1:
        task["micro_batches"] = micro_batches
    model = study.variants[variant].spec
    content = {
        "model": model.model_dump(exclude=model.later_options_at_default()),
        "train": train_spec.model_dump(exclude=skip),
        "task": task,
        "metrics": study.metrics,
    }
    return fingerprint_of(content)


# The version every kind had when legacy fingerprints were made (before kinds had versions).
LEGACY_VERSION = 1


def fingerprints(study: Study, variant: str) -> tuple[str, ...]:
    """Every fingerprint a finished trial of ``variant`` may carry and still count as trained
    with these settings: :func:`fingerprint` first (the one new records get), those with the
    precision written out where it is ``auto`` (:func:`_resolved_precisions`), then
    :func:`legacy_fingerprint` while every kind the trial uses is at :data:`LEGACY_VERSION`
    (a kind bumped since no longer trains as the legacy records did)."""
    current = (fingerprint(study, variant), *_resolved_precisions(study, variant))
    if any(cls.version != LEGACY_VERSION for cls in _kinds_used(study, variant)):
        return current
    return tuple(dict.fromkeys((*current, legacy_fingerprint(study, variant))))


def _resolved_precisions(study: Study, variant: str) -> list[str]:
    """Under ``train.precision: auto`` (bf16 on CUDA, fp32 elsewhere), the fingerprints of the same
    settings with the precision written out: a trial trained with ``fp32`` or ``bf16`` trained as one
    of auto's, so it counts (an fp32 run on a GPU continues a study begun on CPUs). Which precision
    each trial trained in is its tag; a report over more than one says so (``precision_warnings``)."""
    if study.spec.train.precision != "auto":
        return []
    settings = trained_with(study, variant)
    return [
        fingerprint_of({**settings, "train": {**settings["train"], "precision": written}})
        for written in get_args(Precision)
        if written != "auto"
    ]


def _kinds_used(study: Study, variant: str) -> list[type[Component] | type[Task]]:
    resolved = study.variants[variant]
    return [type(study.task), *(part.cls for slot in COMPONENT_SLOTS for part in resolved.parts(slot))]


def search_fingerprint(study: Study, variant: str) -> str:
    return search_fingerprints(study, variant)[0]


def search_fingerprints(study: Study, variant: str) -> tuple[str, ...]:
    """:func:`fingerprints` for a search trial: what its variant trains with, and the search."""
    search = {"search": study.spec.search.model_dump(), "match": study.spec.match_params}
    bases = fingerprints(study, variant)
    return tuple(dict.fromkeys(fingerprint_of({"base": base, **search}) for base in bases))


def fingerprint_of(content: dict[str, Any]) -> str:
    """The fingerprint of settings as :func:`trained_with` gives them (or a trial record keeps them)."""
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def key_of(trial: FrozenTrial | optuna.Trial) -> Key | None:
    """(variant, seed) of a final trial, (variant, slot) of a search trial."""
    attrs = trial.user_attrs
    for index in ("seed", "slot"):
        if "variant" in attrs and index in attrs:
            return attrs["variant"], int(attrs[index])
    return None


def failure_of(trial: FrozenTrial) -> str | None:
    """Why a FAIL trial failed; None for bookkeeping (interrupted, duplicate, …).
    A FAIL with no reason recorded was failed by Optuna's heartbeat: its worker died."""
    reason = trial.user_attrs.get("failure")
    return None if reason is None or reason in BOOKKEEPING else reason


def settled(trial: FrozenTrial) -> bool:
    """A search trial that used up its slot: complete, pruned, or failed for a reason."""
    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
        trial.state == TrialState.FAIL and bool(failure_of(trial))
    )


def elapsed(trial: FrozenTrial) -> float | None:
    if trial.datetime_start and trial.datetime_complete:
        return (trial.datetime_complete - trial.datetime_start).total_seconds()
    return None


def search_done(study: Study, variant: str, trials: list[FrozenTrial]) -> bool:
    """Whether every search slot of ``variant`` is settled."""
    finished = {key[1] for t in trials if (key := key_of(t)) and key[0] == variant and settled(t)}
    return all(slot in finished for slot in range(search_budget(study)))


def taken(trials: list[FrozenTrial], retry_failed: bool) -> set[Key]:
    """Keys that need no enqueue: complete, waiting, running, or failed for good."""
    keys = set()
    for t in trials:
        key = key_of(t)
        if key is None:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING, TrialState.RUNNING):
            keys.add(key)
        elif t.state == TrialState.FAIL and failure_of(t) and not retry_failed:
            keys.add(key)
    return keys


def failed_for_good(trials: list[FrozenTrial], keys: Collection[Key]) -> set[Key]:
    """Keys among ``keys`` whose trials failed for a reason and never completed (read when no
    trial is queued or running, as the study ends)."""
    complete = {key_of(t) for t in trials if t.state == TrialState.COMPLETE}
    return {
        key
        for t in trials
        if t.state == TrialState.FAIL and failure_of(t) and (key := key_of(t)) in keys and key not in complete
    }


# The Optuna user attribute (and, as ``ablate.data_digest``, the MLflow tag) naming the content of
# the data a trial was trained on (:meth:`~ablate.tasks.Task.data_digest`; checked by :mod:`.identity`).
DATA_DIGEST = "data_digest"


def check_changed(trials: list[FrozenTrial], expected: dict[str, Collection[str]], place: str) -> None:
    """Stop when finished trials of a variant were trained with other settings than ``expected``
    (variant → the fingerprints its trials may carry, :func:`fingerprints`) gives; ``place``
    names where they are."""
    changed = sorted(
        {
            t.user_attrs["variant"]
            for t in trials
            if t.state == TrialState.COMPLETE
            and key_of(t)
            and t.user_attrs.get("variant") in expected
            and t.user_attrs.get("fingerprint") is not None
            and t.user_attrs["fingerprint"] not in expected[t.user_attrs["variant"]]
        }
    )
    if changed:
        raise AblateError(
            f"{place} holds finished trials of variant(s) {', '.join(changed)} trained with different "
            f"settings than the study file has now (model, train, task, metrics or search changed); "
            f"give a new --output folder, or delete that one"
        )


def drop_reason(
    trials: list[FrozenTrial],
    number: int,
    key: Key | None,
    planned: Collection[Key] | None,
    possible: Collection[Key] | None = None,
    stored: Callable[[int], FrozenTrial] | None = None,
) -> str | None:
    """Why the popped trial ``number`` (of ``key``) must not be trained, or None. ``planned``:
    the keys planned now (None: any key is, as every search slot within the budget);
    ``possible``: the keys the study file may plan (a sequential design's beyond ``planned``);
    ``stored``: trial ``n`` as the store has it now, where ``trials`` is an earlier read (a
    trial of the key it saw waiting or running may have been interrupted since, and re-queued
    as this one: asked before this one is called its duplicate)."""
    if key is None:  # another worker took the last queued trial; ask() made a fresh one
        return NOTHING_QUEUED
    if planned is not None and key not in planned:
        return UNWANTED if possible is not None and key in possible else UNPLANNED
    for t in trials:
        if t.number == number or key_of(t) != key:
            continue
        # Two hosts sharing a database may both enqueue a key: the higher number steps aside.
        if stored is not None and t.state in (TrialState.WAITING, TrialState.RUNNING):
            t = stored(t.number)  # noqa: PLW2901 - the same trial, read again
        if t.state == TrialState.COMPLETE or (
            t.state in (TrialState.WAITING, TrialState.RUNNING) and t.number < number
        ):
            return DUPLICATE
    return None
