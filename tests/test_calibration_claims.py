"""The calibration section's claims against α are binomial tests of the simulated rates, not bare
comparisons: 9.0 % of 67 simulated studies is consistent with a rate of 5 %."""

from __future__ import annotations

from scipy.stats import binom

from ablate.report.cells import against
from ablate.stats import ReportSettings
from ablate.stats.calibration import calibrate
from ablate.stats.sequential import SequentialSeeds


def test_a_rate_above_alpha_in_few_draws_is_consistent_with_alpha():
    # 6 of 67 studies (the quickstart's 9.0 %): P(X ≥ 6 | n = 67, p = .05), computed independently
    assert (
        against(6 / 67, 67, 0.05)
        == f"consistent with ≤ 5% (one-sided binomial test p = {binom.sf(5, 67, 0.05):.2g})"
    )
    assert against(40 / 400, 400, 0.05).startswith("above 5% (one-sided binomial test p = ")
    assert against(0.0, 100, 0.05).startswith("consistent with ≤ 5%")
    assert against(float("nan"), 100, 0.05) == "n/a"


def test_default_simulation_sizes():
    fixed = ReportSettings(primary="x", metrics=["x"], variants=["base", "a", "b", "c"])
    assert fixed.calibration == 1000
    out = calibrate(fixed, 3, 3, mean=1.0, sd=0.01)
    assert out["comparisons"] == 1002 and out["studies"] == 334
    sequential = fixed.model_copy(update={"sequential": SequentialSeeds(initial=3, max=5, step=2)})
    assert calibrate(sequential, 5, 3, mean=1.0, sd=0.01)["comparisons"] == 201  # a fifth as many
