"""Spread over seeds: mean, sample standard deviation, a t-based 95% interval and n; chance levels of tasks.

The interval is mean ± t(0.975, n - 1) x s.d. / sqrt(n), Student's t because a sweep has few seeds (with 3 seeds
t is 4.30, not 1.96). No scipy: the quantiles for small n are tabulated, larger n use a Cornish-Fisher expansion
(within 1e-3 of the exact quantile from 30 degrees of freedom on).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

# t(0.975, df) for df = 1..30.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
_Z975 = 1.959964

# Chance accuracy (in [0, 1]) of the data sets whose class count the report knows; others have none.
CHANCE: dict[str, float] = {
    "pathfinder": 0.5, "pathfinder_scaled": 0.5, "reach": 0.5, "cifar10": 0.1, "cifar100": 0.01,
}


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (NaN for df < 1)."""
    if df < 1:
        return math.nan
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def seed_stats(values: pd.Series | np.ndarray) -> dict[str, float]:
    """Mean, s.d. (n - 1), half-width and bounds of the 95% t interval, and n of the finite values.

    With one value the s.d. and the interval are NaN: one seed says nothing about the spread.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    sd = float(x.std(ddof=1)) if n > 1 else math.nan
    half = t975(n - 1) * sd / math.sqrt(n) if n > 1 else math.nan
    return {"mean": mean, "sd": sd, "ci_half": half, "ci_low": mean - half, "ci_high": mean + half, "n": n}


def chance(dataset: str) -> float | None:
    """The chance accuracy of `dataset` in [0, 1], or None when the report does not know its classes."""
    return CHANCE.get(dataset)


def above_chance(ci_low: float, n: int, level: float | None) -> bool:
    """True when the interval lies wholly above chance; with one seed (no interval) never, as nothing shows it.

    With no known chance level, any point with an interval qualifies.
    """
    if n < 2 or not math.isfinite(ci_low):
        return False
    return level is None or ci_low > level
