"""Where a study stands: per variant, trials done / running / failed / left and search trials
finished (``ablate status``, the progress bar of ``ablate run --workers N``), and an ETA."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..search import search_budget
from ..study import Study
from .ledger import Key, elapsed, failure_of, key_of, plan, search_name, settled
from .stores import Stores


@dataclass
class VariantStatus:
    done: int = 0
    running: int = 0
    failed: int = 0
    left: int = 0
    searched: int = 0  # finished search trials
    search_budget: int = 0
    final_running: int = 0
    failures: list[tuple[int, str]] = field(default_factory=list)  # (seed, reason)
    walls: list[float] = field(default_factory=list)


def progress(study: Study, stores: Stores, storage: Any = None) -> dict[str, VariantStatus]:
    """Per variant: final trials done / running / failed / left, search trials finished."""
    storage = storage or stores.storage()
    rows = {v: VariantStatus(search_budget=search_budget(study)) for v in study.variants}
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if study.name in names:
        final = optuna.load_study(study_name=study.name, storage=storage)
        planned = set(plan(study))
        # One state per key, however many trials it took: complete > running > queued > failed.
        by_key: dict[Key, list[FrozenTrial]] = {}
        for t in final.get_trials(deepcopy=False):
            key = key_of(t)
            if key is not None and key[0] in rows and key in planned:
                by_key.setdefault(key, []).append(t)
        for key, trials in by_key.items():
            row = rows[key[0]]
            states = {t.state for t in trials}
            if TrialState.COMPLETE in states:
                row.done += 1
                t = next(t for t in trials if t.state == TrialState.COMPLETE)
                wall = t.user_attrs.get("wall_s") or elapsed(t)
                if wall:
                    row.walls.append(wall)
            elif any(t.state == TrialState.RUNNING and stores.is_live(t) for t in trials):
                row.running += 1
                row.final_running += 1
            elif TrialState.WAITING not in states:
                reasons = [failure_of(t) for t in trials if t.state == TrialState.FAIL and failure_of(t)]
                if reasons:
                    row.failed += 1
                    row.failures.append((key[1], reasons[-1]))
    for variant, row in rows.items():
        name = search_name(study, variant)
        if name in names:
            for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False):
                if settled(t):
                    row.searched += 1
                    if elapsed(t):
                        row.walls.append(elapsed(t))
                elif t.state == TrialState.RUNNING and stores.is_live(t):
                    row.running += 1
        row.left = max(len(study.spec.seeds) - row.done - row.failed - row.final_running, 0)
    return rows


def eta_seconds(
    rows: dict[str, VariantStatus], checkpointed: dict[str, list[float]] | None = None
) -> float | None:
    """Remaining trials × mean wall time of finished trials ÷ trials running now (≥ 1).
    ``checkpointed[variant]`` lists the done fraction (epoch / epochs) of that variant's trials
    with a checkpoint: they count as that much less left; other running trials as half left."""
    walls = [w for r in rows.values() for w in r.walls]
    if not walls:
        return None
    checkpointed = checkpointed or {}
    remaining = 0.0
    for name, r in rows.items():
        done = checkpointed.get(name, [])
        unsaved_running = max(r.running - len(done), 0)
        remaining += (
            r.left
            + r.running
            - sum(done)
            - 0.5 * unsaved_running
            + max(r.search_budget - r.searched - r.running + r.final_running, 0)
        )
    parallel = max(1, sum(r.running for r in rows.values()))
    return max(remaining, 0.0) * (sum(walls) / len(walls)) / parallel


def checkpointed_fractions(summaries: dict[str, dict[str, float]]) -> dict[str, list[float]]:
    """``{variant: [epoch / epochs, …]}`` from :func:`ablate.train.checkpoint_summaries`
    (files named ``<variant>-seed<k>`` or ``<variant>-search<slot>``)."""
    found: dict[str, list[float]] = {}
    for stem, saved in summaries.items():
        named = re.fullmatch(r"(.+)-(?:seed|search)\d+", stem)
        if named:
            found.setdefault(named.group(1), []).append(min(saved["epoch"] / saved["epochs"], 1.0))
    return found
