"""Spread over seeds: mean, sample standard deviation, a t-based 95% interval and n; the test that says whether
two mixers differ; chance levels of tasks.

The interval is mean ± t(0.975, n - 1) x s.d. / sqrt(n), Student's t because a sweep has few seeds (with 3 seeds
t is 4.30, not 1.96). An accuracy's interval is clipped to [0, 100]% (`ACCURACY_BOUNDS`, `INTERVAL_NOTE`): with 3
seeds one of which stays at chance the t interval runs past 100%, which no accuracy can reach. Clipping keeps the
t interval where it is meaningful and says nothing new where it is not; an interval made for proportions (Wilson's)
would treat the seeds as Bernoulli trials, which they are not. Quantiles and tests come from scipy.stats, a
maintained library, not from tables typed here.
Two mixers differ when Welch's t-test (`scipy.stats.ttest_ind(equal_var=False)`: unequal variances, as two mixers'
seeds have) rejects equal means at `ALPHA`; the report names the test wherever it says so.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

ALPHA = 0.05  # level of the tests: two-sided between two mixers, one-sided against chance (`beats_chance`)
TEST_NAME = "Welch's t-test (scipy.stats.ttest_ind, equal_var=False), two-sided, p < 0.05"

# Chance accuracy (in [0, 1]) of the data sets whose class count the report knows; others have none.
CHANCE: dict[str, float] = {
    "pathfinder": 0.5, "pathfinder_scaled": 0.5, "reach": 0.5, "cifar10": 0.1, "cifar100": 0.01,
}


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (NaN for df < 1), from scipy.stats."""
    if df < 1:
        return math.nan
    return float(scipy_stats.t.ppf(0.975, df))


def welch_p(a: pd.Series | np.ndarray, b: pd.Series | np.ndarray) -> float:
    """Two-sided p-value of Welch's t-test that `a` and `b` share a mean; NaN with fewer than 2 finite values
    in either, or with no spread on either side (scipy's answer: the test is undefined there)."""
    x, y = (np.asarray(v, dtype=float) for v in (a, b))
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if len(x) < 2 or len(y) < 2:
        return math.nan
    with warnings.catch_warnings():  # nearly equal seeds make scipy warn about precision; the p-value stands
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(scipy_stats.ttest_ind(x, y, equal_var=False).pvalue)


# The range an accuracy in percent lives in: its interval never leaves it.
ACCURACY_BOUNDS: tuple[float, float] = (0.0, 100.0)
# The footnote of every table that shows an accuracy interval.
INTERVAL_NOTE = ("95% interval: Student's t over seeds (mean ± t(0.975, n - 1) x s.d. / sqrt(n)), clipped to "
                 "[0, 100]%; none with one seed.")


def seed_stats(values: pd.Series | np.ndarray, bounds: tuple[float, float] | None = None) -> dict[str, float]:
    """Mean, s.d. (n - 1), half-width and bounds of the 95% t interval, and n of the finite values.

    With one value the s.d. and the interval are NaN: one seed says nothing about the spread.

    Args:
        values: one value per seed.
        bounds: the range the quantity lives in (`ACCURACY_BOUNDS` for an accuracy in percent): the interval's
            bounds are clipped to it; `ci_half` stays the unclipped half-width.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    sd = float(x.std(ddof=1)) if n > 1 else math.nan
    half = t975(n - 1) * sd / math.sqrt(n) if n > 1 else math.nan
    low, high = mean - half, mean + half
    if bounds is not None and n > 1:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return {"mean": mean, "sd": sd, "ci_half": half, "ci_low": low, "ci_high": high, "n": n}


def chance(dataset: str) -> float | None:
    """The chance accuracy of `dataset` in [0, 1], or None when the report does not know its classes."""
    return CHANCE.get(dataset)


def beats_chance(accuracy: float, n: int, level: float) -> bool:
    """True when `accuracy` on `n` images is above chance `level` by a one-sided exact binomial test at `ALPHA`
    (`scipy.stats.binomtest`): one model's validation accuracy, where no seeds give an interval."""
    if n < 1 or not math.isfinite(accuracy):
        return False
    correct = round(accuracy * n)
    return float(scipy_stats.binomtest(correct, n, level, alternative="greater").pvalue) < ALPHA


def above_chance(ci_low: float, n: int, level: float | None) -> bool:
    """True when the interval lies wholly above chance; with one seed (no interval) never, as nothing shows it.

    With no known chance level, any point with an interval qualifies.
    """
    if n < 2 or not math.isfinite(ci_low):
        return False
    return level is None or ci_low > level
