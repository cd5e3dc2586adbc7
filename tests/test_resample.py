"""``report.resample_units``: each seed's test metric over a bootstrap resample of the test units
drawn with that seed, the same draw for every variant (``ablate.stats.resample``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ablate.stats import ReportSettings
from ablate.stats.resample import resample_units, resampled_for_report, unit_mean_metrics
from ablate.study.load import load_study

UNITS = ["u1", "u2", "u3", "u4", "u5", "u6"]


def _frames(shift: float = 0.1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two variants × three seeds × six units; ``b`` is ``a`` + ``shift`` on every unit. ``rmse`` is
    the root of its units' mean, as a tabular task records it."""
    rng = np.random.default_rng(7)
    units, rows = [], []
    for seed in (0, 1, 5):
        base = rng.uniform(0, 1, len(UNITS))
        for variant, values in (("a", base), ("b", base + shift)):
            squared = values**2
            key = {"variant": variant, "seed": seed}
            units.append(pd.DataFrame({**key, "unit": UNITS, "ndcg": values, "rmse": squared}))
            rows.append({**key, "test.ndcg": values.mean(), "test.rmse": np.sqrt(squared.mean())})
    # Units in another order than sorted, as a task may write them.
    frame = pd.concat(units, ignore_index=True).sample(frac=1.0, random_state=3).reset_index(drop=True)
    return pd.DataFrame(rows), frame


def _by_hand(units: pd.DataFrame, variant: str, seed: int) -> float:
    rng = np.random.default_rng(seed)
    drawn = [sorted(UNITS)[i] for i in rng.integers(0, len(UNITS), size=len(UNITS))]
    values = units[(units.variant == variant) & (units.seed == seed)].set_index("unit")["ndcg"]
    return float(np.mean([values[u] for u in drawn]))


def test_each_seed_gets_its_own_draw_and_the_mean_over_it():
    results, units = _frames()
    out = resample_units(results, units, ["ndcg", "rmse"])
    for _, row in out.iterrows():
        assert row["test.ndcg"] == pytest.approx(_by_hand(units, row["variant"], row["seed"]), abs=1e-12)
    assert not np.allclose(out["test.ndcg"], results["test.ndcg"])
    assert list(out.columns) == list(results.columns) and len(out) == len(results)


def test_the_draw_is_shared_by_the_variants_so_pairs_stay_paired():
    results, units = _frames(shift=0.1)
    out = resample_units(results, units, ["ndcg"]).set_index(["seed", "variant"])["test.ndcg"].unstack()
    assert np.allclose(out["b"] - out["a"], 0.1)


def test_a_metric_that_is_not_a_mean_over_units_is_left_alone():
    results, units = _frames()
    assert unit_mean_metrics(results, units, ["ndcg", "rmse", "absent"]) == ["ndcg"]
    out = resample_units(results, units, ["ndcg", "rmse"])
    assert out["test.rmse"].tolist() == results["test.rmse"].tolist()


def test_without_unit_values_nothing_changes():
    results, _ = _frames()
    assert resample_units(results, pd.DataFrame(), ["ndcg"]).equals(results)
    assert resample_units(results, None, ["ndcg"]).equals(results)


def test_report_settings_switch_it_on_with_a_note():
    results, units = _frames()
    settings = ReportSettings(primary="ndcg", metrics=["ndcg", "rmse"], baseline="a")
    same, noted = resampled_for_report(results, units, settings)
    assert same is results and noted.notes == [*settings.notes, noted.notes[-1]]
    assert noted.notes[-1].startswith("variance: seeds only")
    on = settings.model_copy(update={"resample_units": True})
    out, noted = resampled_for_report(results, units, on)
    assert out["test.ndcg"].tolist() == resample_units(results, units, ["ndcg"])["test.ndcg"].tolist()
    assert "bootstrap resample of the test units" in noted.notes[-1]
    assert "not resampled (not a mean over units): rmse" in noted.notes[-1]


def test_a_study_file_sets_it(write_study):
    study = load_study(write_study({"report": {"resample_units": True}}))
    assert study.report_settings().resample_units is True
    assert load_study(write_study(name="plain.yaml")).report_settings().resample_units is False


def test_sequential_seeds_refuse_it(write_study):
    """The driver decides where to add seeds on the trials' own metric: resampling in the report
    would read other numbers, so the combination is one line at validation."""
    from ablate.errors import StudyError
    from ablate.study.load import load_study

    path = write_study({"seeds": {"initial": 3, "max": 7, "step": 2}, "report": {"resample_units": True}})
    with pytest.raises(StudyError, match=r"study\.yaml:\d+: report\.resample_units: cannot be combined"):
        load_study(path)
