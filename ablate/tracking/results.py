"""Read a study's results back from the tracking store as pandas frames.

``load_results`` is the public entry point (also ``ablate.load_results``); the report is
built from what it returns and nothing else.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ablate import stopping
from ablate.errors import AblateError
from ablate.stats import ReportSettings
from ablate.tasks import BASELINES_ARTIFACT
from ablate.tracking.names import OLDER_KINDS_TAG, REUSED_TAG
from ablate.tracking.provenance import described
from ablate.tracking.store import Tracker, read_units, trial_metrics
from ablate.training.trainer import PRECISION_TAG

COST_KEYS = (
    "params",
    "tokens_per_s",
    "peak_memory_mb",
    "wall_s",
    "cpu_s",
    "train_gflop",
    "epochs",
    "best_epoch",
)
# How the report's cost columns were measured (stores written before CPU time was: wall time only).
WALL_NOTE = "wall time is elapsed time on a possibly shared machine"
CPU_NOTE = (
    "CPU time is the process's CPU seconds (all its threads) — compare CPU time across variants "
    "trained at different loads"
)
# Trials that recorded OpenMP's passive wait policy (ablate.tracking.provenance): how their CPU time
# holds under load.
PASSIVE_CPU_NOTE = (
    "CPU s is the trial's process CPU time (all its threads: set-up, training, evaluation) with OpenMP's "
    "waiting threads asleep (OMP_WAIT_POLICY=PASSIVE, set by ablate before torch loads), so time spent "
    "waiting for a core is not counted, though contention for caches on a loaded machine still is (the "
    "README's 'Costs under load' measures it) — compare CPU time across variants trained at different loads"
)
# Trials that counted their training FLOPs (ablate.training.flops).
FLOP_NOTE = (
    "train GFLOP is the floating-point work of the trial's training steps — matrix products and "
    "attention, forward and backward, counted over one step by torch's FlopCounterMode, per token, "
    "times the tokens it trained on; elementwise work, the optimiser and evaluation left out — which no "
    "machine load changes: the cost to compare across variants, runs and machines"
)


@dataclass
class Results:
    results: pd.DataFrame  # one row per finished trial
    units: pd.DataFrame  # test metrics per evaluation unit: variant, seed, unit, <metric>...
    curves: pd.DataFrame  # validation per epoch: variant, seed, epoch, metric, value
    settings: ReportSettings | None  # report settings stored with the study (None: none stored)
    failures: pd.DataFrame = None  # failed trials: variant, seed, reason (interrupted ones left out)
    # How the study was made (those recorded): ablate_version, git_commit, git_dirty, data_summary
    # (label → value), resolved_study (YAML text), cost_note (how costs were measured).
    meta: dict = field(default_factory=dict)
    # The verdicts, every metric (comparisons.csv's rows: variant, metric, verdict, interval, …), where
    # a report was written from these results (ablate.run); None otherwise.
    comparisons: pd.DataFrame | None = None

    def of_variants(self, names: list[str]) -> Results:
        """These results restricted to the trials of ``names`` (a study's variants: a variant left
        out of the study, e.g. ``ablate report STUDY ~variants.x``, is not reported)."""
        frames = {
            "results": self.results,
            "units": self.units,
            "curves": self.curves,
            "failures": self.failures,
        }
        kept = {
            key: frame[frame["variant"].isin(names)].reset_index(drop=True)
            for key, frame in frames.items()
            if frame is not None and "variant" in frame
        }
        return replace(self, **kept)


def load_results(tracking_uri: str, experiment: str, curves: bool = True) -> Results:
    """All finished trials of the study ``experiment`` in the store at ``tracking_uri``."""
    tracker = _open(tracking_uri, experiment)
    runs = tracker.trial_runs(status="FINISHED")
    rows, unit_frames, curve_rows = [], [], []
    seen: dict[tuple[str, int], int] = {}
    # Each trial's conditions, as its run recorded them (a copied trial's: its source's).
    conditions: dict[tuple[str, int], tuple] = {}
    for run in runs:
        stopping.check()  # a safe point per trial: hundreds of them read took 30 s deaf to SIGTERM
        tags = run.data.tags
        # The best state's validation metrics, test metrics and costs; the curves of valid.*, train.loss
        # and the gradient norms.
        keys = ("valid.", "train.loss", "train.grad_norm") if curves else ()
        metrics, trial_curves = trial_metrics(tracker.client, run, keys)
        variant, seed = tags.get("variant"), int(tags.get("seed", -1))
        row = {
            "variant": variant,
            "seed": seed,
            "trial": int(tags.get("trial", -1)),
            "run_id": run.info.run_id,
            "differs": tags.get("differs", ""),
            **{k: v for k, v in tags.items() if k.startswith("component.")},
            **{k: metrics[k] for k in COST_KEYS if k in metrics},
            # Searched parameters and parameter matching (match_params), as logged.
            **{k: _number(v) for k, v in run.data.params.items() if k.startswith(("search.", "match."))},
            **{k: v for k, v in metrics.items() if k.startswith(("test.", "valid."))},
            **({"reused_from": tags[REUSED_TAG]} if REUSED_TAG in tags else {}),
            **({"trained_under": tags[OLDER_KINDS_TAG]} if OLDER_KINDS_TAG in tags else {}),
            **({"precision": tags[PRECISION_TAG]} if PRECISION_TAG in tags else {}),
        }
        if (variant, seed) in seen:  # should not happen; keep the newest, say so
            warnings.warn(f"two finished runs for {variant} seed {seed}; using the newest", stacklevel=2)
            rows[seen[(variant, seed)]] = row
            continue
        seen[(variant, seed)] = len(rows)
        rows.append(row)
        conditions[(variant, seed)] = tuple(described(tags))
        try:
            units = read_units(tracker.client, run)
            units.insert(0, "seed", seed)
            units.insert(0, "variant", variant)
            unit_frames.append(units)
        except Exception:  # noqa: BLE001 - a run without unit metrics still reports
            pass
        curve_rows += [(variant, seed, epoch, key, value) for epoch, key, value in trial_curves]
    results = pd.DataFrame(rows)
    if not results.empty:
        results = results.sort_values(["variant", "seed"], kind="stable").reset_index(drop=True)
        for key in ("params", "epochs", "best_epoch"):
            if key in results:
                results[key] = results[key].astype("Int64")
    failed = [
        {
            "variant": r.data.tags.get("variant"),
            "seed": int(r.data.tags.get("seed", -1)),
            "reason": r.data.tags.get("ablate.failure", ""),
        }
        for r in tracker.trial_runs(status="FAILED")
    ]
    return Results(
        failures=pd.DataFrame(failed, columns=["variant", "seed", "reason"]),
        results=results,
        units=pd.concat(unit_frames, ignore_index=True) if unit_frames else pd.DataFrame(),
        curves=pd.DataFrame(curve_rows, columns=["variant", "seed", "epoch", "metric", "value"]),
        settings=_stored_settings(tracker),
        meta=_meta(tracker, results, conditions),
    )


def _meta(tracker: Tracker, results: pd.DataFrame, conditions: dict[tuple[str, int], tuple]) -> dict:
    meta = tracker.study_meta()
    if "reused_from" in results:
        copied = results[results["reused_from"].notna()]
        meta["reused"] = list(zip(copied["variant"], copied["seed"], copied["reused_from"], strict=True))
        meta["trained_here"] = len(results) - len(copied)  # the conditions (ablate.env.*) are theirs
        # The copies' own, grouped: [count, [[label, value], ...]], most trials first.
        copied_keys = set(zip(copied["variant"], copied["seed"], strict=True))
        meta["copied_conditions"] = _grouped(c for key, c in conditions.items() if key in copied_keys)
        conditions = {key: c for key, c in conditions.items() if key not in copied_keys}
    # The trained trials' own (their runs'; runs from before trial runs carried them: none). One set:
    # what the Methods lists, whatever the study run says (its tags are the last process's, which may
    # have trained nothing); several (a study resumed on another machine, workers on several hosts):
    # each group with its count.
    trained = _grouped(c for c in conditions.values() if c)
    if len(trained) == 1:
        meta["conditions"] = [tuple(item) for item in trained[0][1]]
    elif trained:
        meta["trained_conditions"] = trained
    measured_cpu = "cpu_s" in results and results["cpu_s"].notna().any()
    sets = [group for _, group in trained] or [meta.get("conditions", [])]
    passive = all(any("OMP_WAIT_POLICY=PASSIVE" in value for _, value in group) for group in sets)
    cpu_note = PASSIVE_CPU_NOTE if passive else CPU_NOTE
    meta["cost_note"] = f"{WALL_NOTE}; {cpu_note}" if measured_cpu else WALL_NOTE
    if "train_gflop" in results and results["train_gflop"].notna().any():
        meta["cost_note"] += f"; {FLOP_NOTE}"
    if "trained_under" in results:  # copied under --reuse-older-kinds
        older = results[results["trained_under"].notna()]
        meta["older_kinds"] = list(zip(older["variant"], older["seed"], older["trained_under"], strict=True))
    parent = tracker.parent_run()
    if parent is not None:  # where the study's records are, and what the report places them against
        run = parent.info
        meta["tracking"] = {"uri": tracker.uri, "experiment": run.experiment_id, "run": run.run_id}
        with tempfile.TemporaryDirectory() as tmp, suppress(Exception):  # none: a store from before
            local = tracker.client.download_artifacts(parent.info.run_id, BASELINES_ARTIFACT, tmp)
            meta["reference"] = json.loads(Path(local).read_text(encoding="utf-8"))
    return meta


def _grouped(conditions) -> list:
    """Conditions grouped: [count, [[label, value], ...]], most trials first."""
    return [[n, [list(item) for item in group]] for group, n in Counter(conditions).most_common()]


def _stored_settings(tracker: Tracker) -> ReportSettings | None:
    text = tracker.report_settings_json()
    return ReportSettings.from_json(text) if text is not None else None


def _number(text: str):
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _open(tracking_uri: str, experiment: str) -> Tracker:
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise AblateError(f"no tracking store at {db} (has the study been run?)")
    return Tracker(tracking_uri, experiment, create=False)


__all__ = ["Results", "load_results"]
