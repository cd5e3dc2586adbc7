"""Where a study stands: per variant, trials done / running / failed / left and search trials
finished (``ablate status``, the progress bar of ``ablate run --workers N``), and an ETA."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ablate.drive.ledger import Key, elapsed, failure_of, key_of, plan, search_name, settled, standing
from ablate.drive.stores import Stores
from ablate.study.load import Study
from ablate.study.tuning import search_budget


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
    walls: list[float] = field(default_factory=list)  # of trials trained in this study
    copied_walls: list[float] = field(default_factory=list)  # the donors' (``--reuse``), trained elsewhere
    wanted: int = 0  # seeds planned now (a sequential design's grow as its looks need them)
    standing: str = ""  # a sequential design's: why the variant stopped, or what it waits for

    @property
    def planned(self) -> int:
        """Final trials done, running, failed or left: the variant's share of the progress total."""
        return self.done + self.final_running + self.failed + self.left


def progress(study: Study, stores: Stores, storage: Any = None) -> dict[str, VariantStatus]:
    """Per variant: final trials done / running / failed / left, search trials finished; for a
    sequential design also the seeds wanted now and the variant's standing."""
    storage = storage or stores.storage()
    rows = {v: VariantStatus(search_budget=search_budget(study)) for v in study.variants}
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    trials = (
        optuna.load_study(study_name=study.name, storage=storage).get_trials(deepcopy=False)
        if study.name in names
        else []
    )
    settings = study.report_settings() if study.spec.sequential else None
    planned = plan(study, trials, settings)
    possible = {(v, s) for v in study.variants for s in study.spec.seed_list}
    # One state per key, however many trials it took: complete > running > queued > failed.
    by_key: dict[Key, list[FrozenTrial]] = {}
    for t in trials:
        key = key_of(t)
        if key is not None and key in possible:
            by_key.setdefault(key, []).append(t)
    counted: set[Key] = set()  # keys done, running or failed
    for key, key_trials in by_key.items():
        row = rows[key[0]]
        states = {t.state for t in key_trials}
        if TrialState.COMPLETE in states:
            row.done += 1
            t = next(t for t in key_trials if t.state == TrialState.COMPLETE)
            wall = t.user_attrs.get("wall_s") or elapsed(t)
            if wall:
                (row.copied_walls if "reused_from" in t.user_attrs else row.walls).append(wall)
        elif any(t.state == TrialState.RUNNING and stores.is_live(t) for t in key_trials):
            row.running += 1
            row.final_running += 1
        elif TrialState.WAITING not in states:
            reasons = [failure_of(t) for t in key_trials if t.state == TrialState.FAIL and failure_of(t)]
            if not reasons:
                continue
            row.failed += 1
            row.failures.append((key[1], reasons[-1]))
        else:
            continue
        counted.add(key)
    for variant, seed in planned:
        rows[variant].wanted += 1
        rows[variant].left += (variant, seed) not in counted
    if settings is not None:
        rows[settings.baseline].standing = "baseline: as many seeds as any variant needs"
        for variant, first in settings.duplicates.items():
            rows[variant].standing = f"not tested: configured exactly like '{first}'"
    for variant, decision in standing(study, trials, settings).items():
        rows[variant].standing = decision.reason
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
    return rows


def status_table(study: Study, rows: dict[str, VariantStatus]) -> tuple[list[str], list[list[str]]]:
    """``ablate status``'s columns and rows: the counts per variant, the search's progress, and a
    sequential design's seeds wanted (of its maximum) and standing."""
    searching, design = study.spec.search.enabled, study.spec.sequential
    headers = ["variant", *(["search"] if searching else []), "done", "running", "failed", "left"]
    headers += ["wanted", "standing"] if design else []
    cells = []
    for name, r in rows.items():
        search = [f"{r.searched}/{r.search_budget}"] if searching else []
        counts = [str(n) for n in (r.done, r.running, r.failed, r.left)]
        wanted = [f"{r.wanted}/{design.max}", r.standing] if design else []
        cells.append([name, *search, *counts, *wanted])
    return headers, cells


def eta_seconds(
    rows: dict[str, VariantStatus],
    checkpointed: dict[str, list[float]] | None = None,
    projected: list[float] | None = None,
) -> float | None:
    """Remaining trials × mean wall time of finished trials ÷ trials running now (≥ 1).
    ``checkpointed[variant]`` lists the done fraction (epoch / epochs) of that variant's trials
    with a checkpoint: they count as that much less left; other running trials as half left.
    Copied trials' wall times (another machine's, another day's) count only until one is trained;
    before any trial has finished, running trials' ``projected`` wall times stand in (their
    checkpoints' seconds so far ÷ the share of epochs done: :func:`projected_walls`)."""
    walls = [w for r in rows.values() for w in r.walls] or [w for r in rows.values() for w in r.copied_walls]
    walls = walls or list(projected or ())
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
    """``{variant: [epoch / epochs, …]}`` from :func:`ablate.training.trainer.checkpoint_summaries`
    (files named ``<variant>-seed<k>`` or ``<variant>-search<slot>``)."""
    found: dict[str, list[float]] = {}
    for stem, saved in summaries.items():
        named = re.fullmatch(r"(.+)-(?:seed|search)\d+", stem)
        if named:
            found.setdefault(named.group(1), []).append(min(saved["epoch"] / saved["epochs"], 1.0))
    return found


def projected_walls(summaries: dict[str, dict[str, float]]) -> list[float]:
    """A running trial's whole wall time, projected from its checkpoint: seconds so far ÷ (epoch /
    epochs). Checkpoints without the seconds (a task's own training) project nothing."""
    return [
        saved["wall_s"] * saved["epochs"] / saved["epoch"]
        for saved in summaries.values()
        if saved.get("wall_s") and saved.get("epoch") and saved.get("epochs")
    ]
