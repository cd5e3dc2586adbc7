"""ablate: comparative ablation studies of transformer-style sequence models.

The core's rooms in data-flow order, and what each may import, are mapped in ``ablate/README.md``
(checked by ``tests/test_layout.py``): study file → study → model and training → driver → results
and report → command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .results import Results

__version__ = "0.1.0"


def load_results(
    tracking_uri: str, experiment: str, *, full: bool = False, curves: bool = True
) -> pd.DataFrame | Results:
    """A study's finished trials, read back from the MLflow tracking store.

    Returns the per-trial pandas DataFrame the report is built from (one row per finished trial:
    ``variant``, ``seed``, ``differs``, ``component.*``, cost columns, ``test.*`` and ``valid.*``
    metrics). With ``full=True`` returns the whole :class:`ablate.results.Results` instead:
    ``results`` (that frame), ``units`` (per evaluation unit metrics), ``curves`` (validation
    metrics per epoch; skipped with ``curves=False``) and ``settings`` (the stored report settings),
    which is what ``ablate report`` passes to :func:`ablate.report.write_report`.

    ``ablate.load_results("sqlite:///runs/my_study/mlflow.db", "my_study")``
    """
    from .results import load_results as _load  # MLflow loads on first use, not on ``import ablate``

    loaded = _load(tracking_uri, experiment, curves=curves and full)
    return loaded if full else loaded.results


__all__ = ["__version__", "load_results"]
