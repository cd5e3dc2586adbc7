"""``ablate plan --pilot``: what an earlier study's finished trials say of the noise — the pooled
sd of the paired differences with its degrees of freedom (and the effective ones: differences that
share the baseline's seeds are correlated, :func:`.stats.planned.pilot_df`), the baseline's mean
and a trial's wall time — read from a report's results.csv or an output folder's tracking store."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.errors import AblateError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


@dataclass(frozen=True)
class Pilot:
    """What an earlier study's trials say: the pooled sd of the paired differences (``df`` its
    degrees of freedom), the baseline's mean, the mean wall time of a trial (None: not recorded)."""

    source: str
    sd: float
    df: int
    how: str
    mean: float
    wall_s: float | None
    effective_df: float = math.nan  # Satterthwaite's, the differences sharing the baseline's seeds


def read_pilot(path: Path, study_name: str, baseline: str, metric: str) -> Pilot:
    """The noise, mean and wall time of ``path``'s finished trials on ``metric``."""
    results = _pilot_results(path, study_name)
    column = f"test.{metric}"
    for needed in ("variant", "seed", column):
        if needed not in results.columns:
            raise AblateError(f"--pilot {path}: no column {needed!r} in its finished trials")
    from ablate.stats.paired import per_seed

    table = per_seed(results, metric)
    if baseline not in table.columns:
        known = ", ".join(map(str, table.columns))
        raise AblateError(f"--pilot {path}: no trials of the baseline {baseline!r} (variants: {known})")
    base = table[baseline]
    squares, df, pairs = 0.0, 0, 0
    for variant in table.columns.drop(baseline):
        d = (table[variant] - base).dropna().to_numpy()
        if len(d) >= 2:
            squares += float(((d - d.mean()) ** 2).sum())
            df, pairs = df + len(d) - 1, pairs + 1
    if df:
        from ablate.stats.planned import pilot_df

        effective = pilot_df(table, baseline)
        how = f"pooled sd of the paired differences of {pairs} variant(s) against {baseline}, df {df}"
        how += f" ({effective:.3g} effective: they share {baseline}'s seeds)" * (pairs > 1)
        sd = math.sqrt(squares / df)
    else:  # the baseline alone: a paired difference of two independent seeds
        x = base.dropna().to_numpy()
        if len(x) < 2:
            raise AblateError(f"--pilot {path}: fewer than 2 finished seeds of {baseline}: no noise to read")
        df, sd = len(x) - 1, math.sqrt(2.0) * float(x.std(ddof=1))
        effective = float(df)
        how = f"√2 × the sd of {baseline} over {len(x)} seeds (no variant paired with it), df {df}"
    if not sd > 0:
        raise AblateError(f"--pilot {path}: its paired differences do not vary: no noise to read")
    wall = results["wall_s"].dropna() if "wall_s" in results.columns else ()
    wall_s = float(wall.mean()) if len(wall) else None
    return Pilot(str(path), sd, df, how, float(base.mean()), wall_s, effective)


def _pilot_results(path: Path, study_name: str) -> pd.DataFrame:
    """Finished trials, one row each: from results.csv (a file, or a report folder holding one) or
    from an output folder's tracking store (the experiment of the study's name, or its only one)."""
    import pandas as pd

    csv = path / "results.csv" if path.is_dir() else path
    if path.is_dir() and (path / "mlflow.db").is_file():
        return _store_results(path, study_name)
    if not csv.is_file():
        raise AblateError(
            f"--pilot {path}: neither a results.csv nor a folder holding one or a tracking store"
        )
    try:
        return pd.read_csv(csv)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise AblateError(f"--pilot {csv}: not a readable CSV: {str(exc).splitlines()[0]}") from None


def _store_results(folder: Path, study_name: str) -> pd.DataFrame:
    from ablate.tracking.results import load_results
    from ablate.tracking.store import default_uri, open_client

    uri = default_uri(folder)
    names = [e.name for e in open_client(uri).search_experiments() if e.name != "Default"]
    if study_name not in names and len(names) != 1:
        raise AblateError(f"--pilot {folder}: which study? its store holds {', '.join(names) or 'none'}")
    return load_results(uri, study_name if study_name in names else names[0], curves=False).results


def pilot_of(pilot: Path, label: str, name: str) -> Path:
    """A data set's pilot in a ``--pilot`` folder of a study over several data sets: its output
    folder (``<output>/<data set>``) or its report (``<reports>/<study>/<study>.<data set>``);
    else the pilot given, for every data set."""
    for inside in (pilot / label, pilot / name):
        if inside.is_dir():
            return inside
    return pilot
