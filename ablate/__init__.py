"""ablate: comparative ablation studies of transformer-style sequence models.

The core's rooms in data-flow order, and what each may import, are mapped in ``ablate/README.md``
(checked by ``tests/test_layout.py``): study file → study → model and training → driver → results
and report → command line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate_namesake import stop_if_clashing

# Before anything else of ours: with the unrelated PyPI `ablate` in this environment, one line
# naming both (exit status 2), not an ImportError from a package half made of the other's files.
stop_if_clashing()

from ablate.cache import cache_dir  # noqa: E402

# OpenMP threads that wait at a barrier sleep instead of spinning (libgomp reads this once, when torch
# loads it): spinning burns a core's time while a partner thread waits for a core on a loaded machine,
# so CPU seconds grew 4-10x with the load and training slowed; passive, both hold (README, "Costs
# under load"). Too late once torch is imported: the conditions' tags (ablate.tracking.provenance) say so.
WAIT_POLICY_SET = "torch" not in sys.modules
if WAIT_POLICY_SET:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# torch's compiler caches (torch._dynamo, imported by torch itself on first use of some features,
# makes its folder at import) go with ablate's own cache, not a torchinductor_<user> in the temp folder.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "torchinductor"))

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ablate.study.load import Study
    from ablate.tracking.results import Results

# The name on PyPI, where `ablate` is an unrelated project; the command and the package keep the short one.
DISTRIBUTION = "ablate-studies"
try:
    __version__ = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"


def load_results(
    tracking_uri: str, experiment: str, *, full: bool = False, curves: bool = True
) -> pd.DataFrame | Results:
    """A study's finished trials, read back from the MLflow tracking store.

    Returns the per-trial pandas DataFrame the report is built from (one row per finished trial:
    ``variant``, ``seed``, ``differs``, ``component.*``, cost columns, ``test.*`` and ``valid.*``
    metrics). With ``full=True`` returns the whole :class:`ablate.tracking.results.Results` instead:
    ``results`` (that frame), ``units`` (per evaluation unit metrics), ``curves`` (validation
    metrics per epoch; skipped with ``curves=False``) and ``settings`` (the stored report settings),
    which is what ``ablate report`` passes to :func:`ablate.report.write_report`.

    ``ablate.load_results("sqlite:///runs/my_study/mlflow.db", "my_study")``
    """
    from ablate.tracking.results import (
        load_results as _load,  # MLflow loads on first use, not on ``import ablate``
    )

    loaded = _load(tracking_uri, experiment, curves=curves and full)
    return loaded if full else loaded.results


def run(
    study: str | Path | Study,
    overrides: Iterable[str] | Mapping[str, Any] | None = None,
    *,
    output: str | Path | None = None,
    reports: str | Path | None = None,
    quiet: bool = False,
    retry_failed: bool = False,
    workers: int = 1,
    storage: str | None = None,
    tracking_uri: str | None = None,
    reuse: Iterable[str | Path] = (),
) -> Results:
    """Run a study as ``ablate run`` does — train what is not trained yet, write the report — and
    return its results as ``load_results(..., full=True)`` does (:class:`ablate.tracking.results.Results`),
    with the verdicts as ``comparisons``: comparisons.csv's frame, one row per variant and metric
    (``variant``, ``metric``, ``verdict``, the interval …). ``quiet=True`` prints nothing.

    ``study`` is a study file or a loaded :class:`ablate.study.load.Study`; ``overrides`` are the
    command line's ``key=value`` strings, or a mapping of dotted keys to values::

        results = ablate.run("studies/quickstart.yaml", {"train.lr": 1e-3, "seeds": [0, 1]})
        results.results.groupby("variant")["test.ndcg@10"].mean()
        results.comparisons.query("metric == 'ndcg@10'")[["variant", "verdict"]]

    Failed trials are listed on stderr and in ``results.failures``; a stop (Ctrl-C) raises
    ``KeyboardInterrupt`` once the trials in flight are recorded, and running again resumes.
    ``reuse`` names other studies' output folders, tracking URIs or folders of trial files
    (``--reuse``): their finished trials with the same fingerprint and seed are copied, not trained."""
    from ablate import stopping
    from ablate.commands.running import run_and_report
    from ablate.study.load import Study, load_study

    if isinstance(overrides, Mapping):  # JSON is YAML: each value reads back as given
        overrides = [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    given = list(overrides or ())
    if not isinstance(study, Study):
        study = load_study(study, overrides=given)
    elif given:
        study = load_study(study.path, overrides=[*study.overrides, *given])
    if study.dataset is not None and len(study.dataset.entries) > 1:  # ablate.commands.across runs them all
        from ablate.errors import AblateError

        raise AblateError(f"{study.path}: task.data lists data sets: ablate.run takes one (task.data=NAME)")
    with stopping.stop_signals():
        ran = run_and_report(
            study,
            Path(output) if output is not None else None,
            Path(reports) if reports is not None else None,
            quiet,
            retry_failed,
            workers,
            storage,
            tracking_uri,
            reuse=list(reuse),
            silent=quiet,
        )
    return ran.results


def __getattr__(name: str) -> Any:
    """``ablate.Loop``: the research loop's gate (:class:`ablate.drive.loop.Loop`), loaded on first use."""
    if name == "Loop":
        from ablate.drive.loop import Loop

        return Loop
    raise AttributeError(f"module 'ablate' has no attribute {name!r}")


__all__ = ["Loop", "__version__", "load_results", "run"]
