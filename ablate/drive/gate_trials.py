"""A research loop's configurations and their trials: what a configuration is (its key, blind to a
reformatted file or a changed seed), and its seeds trained through the driver, each configuration a
one-variant study with its own stores in the loop folder (resumed, never trained twice)."""

from __future__ import annotations

import ast
import hashlib
import json
import math
from collections.abc import Sequence
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np

from ablate.drive.ledger import fingerprint_of, trained_with
from ablate.drive.start import run_study
from ablate.drive.status import progress
from ablate.drive.stores import Stores
from ablate.errors import AblateError
from ablate.stats.gate import CandidateFailed
from ablate.study.load import Study, load_study


def resolve(study_file: Path, overrides: Sequence[str], seeds: Sequence[int] = (0,)) -> Study:
    """The configuration's study: the loop's study file with its overrides and these seeds (a
    problem is the loader's one line)."""
    return load_study(study_file, overrides=[*overrides, f"seeds={json.dumps(list(seeds))}"])


def configuration_key(study: Study) -> str:
    """What a configuration trains, as a key: the driver's fingerprint content (:func:`.ledger.trained_with`:
    every resolved setting, seeds excluded) with the training code read as the syntax tree of the
    callable's file (not its name or layout), so a reformatted copy or a changed comment is the same
    configuration. (The driver's own fingerprint, which also covers local modules beside it, still
    decides which trials a configuration may reuse.)"""
    variant = next(iter(study.variants))
    content = trained_with(study, variant)
    source = getattr(study.task, "source_file", None)  # a task running the user's own code
    if "code" in content and source is not None:
        try:
            content["code"] = _syntax_digest(source())
        except LookupError:
            pass
        else:
            options = content["task"]["options"]
            options["callable"] = str(options.get("callable", "")).rpartition(":")[2]
    return fingerprint_of(content)


def _syntax_digest(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.dump(ast.parse(text), annotate_fields=False)
    except SyntaxError:
        tree = text
    return hashlib.sha256(tree.encode()).hexdigest()[:16]


class LoopTrainer:
    """``trainer(key, seeds)`` for :class:`ablate.stats.gate.Gate`: each configuration's seeds
    trained (or read back) through the driver, in ``runs/<key>/`` of the loop folder."""

    def __init__(self, folder: Path, study_file: Path, metric: str, configurations: dict[str, list[str]]):
        self.folder, self.study_file, self.metric = folder, study_file, metric
        self.configurations = configurations  # key → its overrides

    def __call__(self, key: str, seeds: list[int]) -> np.ndarray:
        try:
            study = resolve(self.study_file, [*self.configurations[key], f"name=gate-{key[:12]}"], seeds)
        except AblateError as exc:
            raise CandidateFailed(f"does not validate: {exc}") from None
        stores = Stores.for_study(study, self.folder / "runs" / key)
        try:
            with redirect_stdout(None):  # the driver's own lines: the loop reports the decision
                summary = run_study(study, stores)
        except AblateError as exc:  # its store refused it: a failed candidate, the incumbent kept
            raise CandidateFailed(str(exc)) from None
        values = self._values(study, stores)
        missing = [s for s in seeds if s not in values]
        if missing:
            failed = [*summary.failed, *self._standing(study, stores)]
            why = "; ".join(sorted({reason for _v, seed, reason in failed if seed in missing or seed < 0}))
            raise CandidateFailed(
                f"seed(s) {', '.join(map(str, missing))} did not train: {why or 'no result'}"
            )
        return np.array([values[s] for s in seeds])

    def _values(self, study: Study, stores: Stores) -> dict[int, float]:
        """Seed → the primary test metric of its finished trial, from the queue's records."""
        import optuna
        from optuna.trial import TrialState

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        queue = optuna.load_study(study_name=study.name, storage=stores.storage())
        found: dict[int, float] = {}
        for trial in sorted(queue.get_trials(deepcopy=False), key=lambda t: t.number):
            attrs = trial.user_attrs
            if trial.state == TrialState.COMPLETE and "seed" in attrs:
                found.setdefault(int(attrs["seed"]), float(attrs.get(f"test.{self.metric}", math.nan)))
        return found

    @staticmethod
    def _standing(study: Study, stores: Stores) -> list[tuple[str, int, str]]:
        return [(v, seed, reason) for v, r in progress(study, stores).items() for seed, reason in r.failures]
