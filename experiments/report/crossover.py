"""Scaling analysis of cost-vs-token-count curves: fitted exponents and crossover token counts.

A *curve* is the cost of one mixer as the token count N grows with everything else held fixed. This module
decides which key columns separate curves (only the keys a cost depends on, `COST_KEYS`: a training row and a
cost-only row of one configuration are one point), fits the scaling exponent of each curve, and finds the N
where one mixer becomes cheaper than a reference. It reads tidy `runs.csv` frames only (no plotting, no torch).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..schema import KEY_COLUMNS
from .mixer_order import mixer_rank
from .rates import at_chosen_rates

# The exponent is the slope over the largest sizes only: at small N the linear parts of the model (patch
# embedding, MLPs, projections) dominate and would pull every mixer's slope towards 1.
FIT_POINTS = 3

# Costs whose ratio is within this of 1 (in log) at every point are equal, not "never cheaper".
EQUAL_TOLERANCE = 1e-6

# Mixers that the others are compared against.
REFERENCES: tuple[str, ...] = ("attention", "attention_naive")

# Cost columns analysed, in display order, with the short name used in table headers.
COST_METRICS: dict[str, str] = {
    "latency_ms": "latency",
    "peak_mem_mb": "peak memory",
    "gmacs": "MACs",
    "train_step_ms": "train step",
    "train_peak_mem_mb": "train peak memory",
}

# The keys a point's cost depends on. The others (data set, epochs, training recipe, seed) change what is learnt,
# not what a forward pass or a training step costs: cost curves never split on them.
COST_KEYS: tuple[str, ...] = (
    "mixer", "preset", "overrides", "img_size", "patch_size", "batch_size", "device", "dtype", "compile",
    "timing_mode",
)

# The keys that say what was learnt: accuracy figures and tables split on them (with the cost keys).
RECIPE_KEYS: tuple[str, ...] = ("dataset", "epochs", "train")

# Replicates, not settings: a curve takes the median over them instead of splitting on them.
REPLICATE_KEYS: tuple[str, ...] = ("seed",)

# Columns that place a point along a curve rather than pick the curve.
AXIS_KEYS: tuple[str, ...] = ("mixer", "img_size", "patch_size")

# Costs measured by the training step, whose outcome is `train_status` rather than `status`.
TRAIN_STEP_METRICS: tuple[str, ...] = ("train_step_ms", "train_peak_mem_mb")


@dataclass(frozen=True)
class Crossover:
    """Where a mixer's cost ratio to a reference falls below 1 within the measured token counts.

    Attributes:
        kind: "crosses" (more expensive at small N, cheaper from `tokens` on), "only_below" (cheaper at small N,
            more expensive from `tokens` on), "always" (cheaper at every common N), "never" (cheaper at none),
            "equal" (the same cost at every common N, as MACs of two implementations of one function),
            "one_point" (one N in common, as in a budgeted sweep's first rows or curves on different token counts:
            no range to speak of), or
            "no_data" (no token count where both were measured).
        tokens: the interpolated token count of the crossing, for "crosses" and "only_below".
    """

    kind: str
    tokens: float | None = None

    def describe(self) -> str:
        """A short phrase for tables, e.g. "N ≈ 1,234" or "never in range"."""
        if self.kind == "crosses":
            return f"N ≈ {self.tokens:,.0f}"
        if self.kind == "only_below":
            return f"only below N ≈ {self.tokens:,.0f}"
        return {"always": "always cheaper", "never": "never in range", "equal": "equal cost",
                "one_point": "one common point", "no_data": "no common points"}[self.kind]


def fit_exponent(tokens: np.ndarray, cost: np.ndarray, n_points: int = FIT_POINTS) -> tuple[float, np.ndarray]:
    """Slope of log(cost) against log(N) over the `n_points` largest token counts.

    Args:
        tokens: token counts N, any order.
        cost: the cost at each N; non-positive and missing values are ignored.
        n_points: how many of the largest N enter the least-squares fit.

    Returns:
        The exponent (NaN with fewer than two usable points) and the token counts that entered the fit.
    """
    tokens = np.asarray(tokens, dtype=float)
    cost = np.asarray(cost, dtype=float)
    usable = np.isfinite(tokens) & np.isfinite(cost) & (tokens > 0) & (cost > 0)
    order = np.argsort(tokens[usable])
    n_used, c_used = tokens[usable][order][-n_points:], cost[usable][order][-n_points:]
    if np.unique(n_used).size < 2:
        return math.nan, n_used
    slope = np.polyfit(np.log(n_used), np.log(c_used), 1)[0]
    return float(slope), n_used


def find_crossover(tokens: np.ndarray, cost: np.ndarray, ref_cost: np.ndarray) -> Crossover:
    """Token count where `cost` falls below `ref_cost`, interpolated linearly in log-log space.

    Between two adjacent measured N the log of the cost ratio is taken as linear in log N (exact when both costs
    are power laws), and the crossing is where it reaches 0. When the ratio crosses more than once (noisy
    latencies), the crossing reported is the last one, after which the ordering holds to the largest N.

    Args:
        tokens: token counts measured for both mixers.
        cost: the mixer's cost at each N.
        ref_cost: the reference's cost at each N.

    Returns:
        The crossover; a ratio of exactly 1 counts as not cheaper.
    """
    tokens, cost, ref_cost = (np.asarray(a, dtype=float) for a in (tokens, cost, ref_cost))
    usable = np.isfinite(tokens) & (tokens > 0) & (cost > 0) & (ref_cost > 0)
    usable &= np.isfinite(cost) & np.isfinite(ref_cost)
    if not usable.any():
        return Crossover("no_data")
    if np.unique(tokens[usable]).size < 2:
        return Crossover("one_point")
    order = np.argsort(tokens[usable])
    log_n = np.log(tokens[usable][order])
    log_ratio = np.log(cost[usable][order] / ref_cost[usable][order])
    if np.allclose(log_ratio, 0, atol=EQUAL_TOLERANCE):
        return Crossover("equal")
    cheaper = log_ratio < 0
    if cheaper.all():
        return Crossover("always")
    if not cheaper.any():
        return Crossover("never")
    # The last index before the final change of ordering: the segment (i, i + 1) holds the last crossing.
    i = int(np.flatnonzero(cheaper[:-1] != cheaper[1:])[-1])
    t = log_ratio[i] / (log_ratio[i] - log_ratio[i + 1])
    crossing = float(np.exp(log_n[i] + t * (log_n[i + 1] - log_n[i])))
    return Crossover("crosses" if cheaper[-1] else "only_below", crossing)


def varying_keys(runs: pd.DataFrame, keys: tuple[str, ...] = KEY_COLUMNS) -> list[str]:
    """Columns of `keys` that take more than one value in `runs`, in the order given."""
    return [c for c in keys if runs[c].nunique(dropna=False) > 1]


def facet_keys(runs: pd.DataFrame) -> list[str]:
    """Cost keys that vary and pick a curve: neither a point's place on a curve, nor a recipe, nor a replicate.

    Overrides that differ only between mixers (one value per mixer, e.g. a parameter-matched mamba) belong to
    the mixer, not to a separate figure.
    """
    return [c for c in varying_keys(runs, COST_KEYS) if c not in AXIS_KEYS and not _per_mixer(runs, c)]


def _per_mixer(runs: pd.DataFrame, key: str) -> bool:
    """True when `key` is an override that takes one value per mixer."""
    return key == "overrides" and bool((runs.groupby("mixer")[key].nunique() <= 1).all())


def accuracy_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows that trained for accuracy and have one: ok, with a non-empty `accuracy`; where a learning-rate
    grid ran, only those at each setting's rate chosen on validation (`rates.at_chosen_rates`)."""
    runs = at_chosen_rates(runs)
    return runs[(runs["status"] == "ok") & runs["accuracy"].notna()]


def accuracy_facet_keys(runs: pd.DataFrame) -> list[str]:
    """Cost and recipe keys that vary among the accuracy rows and pick a figure (not the mixer or the size)."""
    rows = accuracy_rows(runs)
    return [c for c in varying_keys(rows, COST_KEYS + RECIPE_KEYS) if c not in AXIS_KEYS and not _per_mixer(rows, c)]


def curve_keys(runs: pd.DataFrame) -> list[str]:
    """Key columns (besides `mixer`) that separate one cost-vs-tokens curve from another.

    Only cost keys separate curves (`COST_KEYS`): a training row and a cost-only row of one configuration are one
    point of one curve. The patch size is held fixed along a curve, so N grows with the image as in a resolution
    sweep. A sweep over patch sizes at one image size has no such curve with two points; there the curve runs
    over patch sizes at a fixed image size instead.
    """
    keys = facet_keys(runs)
    if runs["patch_size"].nunique() < 2:
        return keys
    per_patch = runs.groupby(keys + ["mixer", "patch_size"])["tokens"].nunique()
    if (per_patch >= 2).any():
        return keys + ["patch_size"]
    return keys + ["img_size"] if runs["img_size"].nunique() > 1 else keys


def curve_points(runs: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """The ok measurements of `metric` per curve and N, the median over every row at that point.

    Rows at one point are replicates (seeds) or the same configuration measured again by a training point: the
    median keeps one value per point, so a curve has one line whatever else was run at its configurations.

    Args:
        runs: the loaded runs.
        metric: a cost column.
        keys: the curve keys (from `curve_keys`).

    Returns:
        Columns `keys + ["mixer", "tokens", metric]`, sorted by curve and N, without missing values.
    """
    ok = runs[(runs["status"] == "ok") & runs[metric].notna()]
    points = ok.groupby(keys + ["mixer", "tokens"], as_index=False)[metric].median()
    return points.sort_values(keys + ["mixer", "tokens"], ignore_index=True)


def cost_points(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per cost point (`COST_KEYS` and N), whatever else was run there.

    A cost-only row and a training row at one configuration, or several seeds, are one point: each cost is the
    median over the rows whose measurement of it ran ok. The status is "ok" when any row ran, else the first
    row's; `train_status` likewise from the training step (`step_status`), "" where none was asked for; `impl`
    lists the implementations that ran.

    Args:
        runs: the loaded runs.
        metrics: the cost columns to keep.

    Returns:
        Columns `COST_KEYS + ["tokens"] + metrics + ["status", "train_status", "impl"]`, in first-seen order.
    """
    keys = list(COST_KEYS) + ["tokens"]
    frame = runs[keys].copy()
    for metric in metrics:
        frame[metric] = runs[metric].where(step_status(runs, metric) == "ok")
    frame["status"] = runs["status"]
    frame["train_status"] = step_status(runs, "train_step_ms")
    frame["impl"] = runs["impl"].fillna("").astype(str)
    grouped = frame.groupby(keys, sort=False, dropna=False)
    points = grouped[metrics].median() if metrics else grouped.size().to_frame().iloc[:, :0]
    points["status"] = grouped["status"].agg(_combined_status)
    points["train_status"] = grouped["train_status"].agg(_combined_status)
    points["impl"] = grouped["impl"].agg(lambda s: ", ".join(sorted(set(s) - {""})))
    return points.reset_index()


def _combined_status(statuses: pd.Series) -> str:
    """"ok" when any of the rows ran ok, else the first failure, else "" (nothing measured)."""
    values = [str(s) for s in statuses]
    if "ok" in values:
        return "ok"
    return next((s for s in values if s), "")


def iter_groups(frame: pd.DataFrame, keys: list[str]) -> Iterator[tuple[dict, pd.DataFrame]]:
    """`groupby` that also works with no keys: yields (dict of key values, sub-frame), sorted by the keys."""
    if not keys:
        yield {}, frame
        return
    for values, sub in frame.groupby(keys, sort=True):
        yield dict(zip(keys, values)), sub


def exponent_table(runs: pd.DataFrame, n_points: int = FIT_POINTS) -> pd.DataFrame:
    """Fitted scaling exponent of every curve and cost metric.

    Returns:
        Long format: curve keys, `mixer`, `metric`, `exponent`, `points` (how many entered the fit),
        `tokens_min` and `tokens_max` (the fitted range).
    """
    keys = curve_keys(runs)
    rows = []
    for metric in _present_metrics(runs):
        for key_values, curve in iter_groups(curve_points(runs, metric, keys), keys + ["mixer"]):
            exponent, used = fit_exponent(curve["tokens"], curve[metric], n_points)
            rows.append({**key_values, "metric": metric, "exponent": exponent, "points": len(used),
                         "tokens_min": used.min() if len(used) else math.nan,
                         "tokens_max": used.max() if len(used) else math.nan})
    return pd.DataFrame(rows, columns=keys + ["mixer", "metric", "exponent", "points", "tokens_min", "tokens_max"])


def crossover_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Crossover of every mixer against each reference mixer present, per curve and cost metric.

    The image size at the crossing is `sqrt(N) * patch` for the curve's patch size, or for every patch size of
    the sweep when curves run over patch sizes (columns `img_px_p<patch>`).

    Returns:
        Long format: curve keys, `mixer`, `reference`, `metric`, `kind`, `tokens`, `img_px_p<patch>` columns,
        `description` (table phrase) and `note` (where either mixer stopped running, e.g. out of memory).
    """
    keys = curve_keys(runs)
    patches = sorted(runs["patch_size"].unique())
    img_columns = [f"img_px_p{p}" for p in patches]
    rows = []
    for metric in [m for m in ("latency_ms", "peak_mem_mb", "gmacs") if m in _present_metrics(runs)]:
        points = curve_points(runs, metric, keys)
        for key_values, group in iter_groups(points, keys):
            for reference in [r for r in REFERENCES if r in set(group["mixer"])]:
                ref = group[group["mixer"] == reference].set_index("tokens")[metric]
                for mixer in sorted(set(group["mixer"]) - {reference}, key=mixer_rank):
                    own = group[group["mixer"] == mixer].set_index("tokens")[metric]
                    common = own.index.intersection(ref.index)
                    crossover = find_crossover(common, own[common], ref[common])
                    last_common = common.max() if len(common) else -math.inf
                    row = {**key_values, "mixer": mixer, "reference": reference, "metric": metric,
                           "kind": crossover.kind, "tokens": crossover.tokens,
                           "description": crossover.describe(),
                           "note": _failure_note(runs, key_values, (mixer, reference), last_common)}
                    if crossover.tokens is not None:
                        # A curve at one patch size says nothing about the image size at another.
                        for p in [key_values["patch_size"]] if "patch_size" in key_values else patches:
                            row[f"img_px_p{p}"] = math.sqrt(crossover.tokens) * p
                    rows.append(row)
    columns = keys + ["mixer", "reference", "metric", "kind", "tokens"] + img_columns + ["description", "note"]
    return pd.DataFrame(rows, columns=columns)


def step_status(runs: pd.DataFrame, metric: str) -> pd.Series:
    """The outcome of the measurement behind `metric`, per row: "ok", a failure status, or "" if not measured.

    Inference costs follow `status`. A training-step cost follows `train_status` when the inference ran (a row may
    be ok for inference and oom or skipped for its training step), and is "" where no training step was asked for
    (a training row without one, or an old runs.csv without `train_status` and without a value).
    """
    status = runs["status"].astype(str)
    if metric not in TRAIN_STEP_METRICS:
        return status
    train = runs["train_status"].fillna("").astype(str).str.strip().str.lower()
    train = train.where(train != "", np.where(runs[metric].notna(), "ok", ""))
    return status.where(status != "ok", train)


def first_failures(runs: pd.DataFrame, metric: str = "latency_ms") -> pd.DataFrame:
    """The smallest N at which each mixer stopped running, per curve: where a curve of `metric` ends early.

    Args:
        runs: the loaded runs.
        metric: the cost drawn; a training-step metric ends where the training step failed (`step_status`).

    Returns:
        Curve keys, `mixer`, `tokens`, `status` for the first failed point beyond the largest ok point.
    """
    keys = curve_keys(runs)
    runs = runs.assign(_status=step_status(runs, metric))
    rows = []
    for key_values, curve in iter_groups(runs, keys + ["mixer"]):
        ok_tokens = curve.loc[curve["_status"] == "ok", "tokens"]
        last_ok = ok_tokens.max() if len(ok_tokens) else -math.inf
        failed = curve[~curve["_status"].isin(["ok", ""]) & (curve["tokens"] > last_ok)].sort_values("tokens")
        if len(failed):
            rows.append({**key_values, "tokens": failed["tokens"].iloc[0], "status": failed["_status"].iloc[0]})
    return pd.DataFrame(rows, columns=keys + ["mixer", "tokens", "status"])


def _failure_note(runs: pd.DataFrame, key_values: dict, mixers: tuple[str, str], last_common: float) -> str:
    """Why a comparison stops at `last_common`: e.g. "attention_naive oom from N = 4,096"."""
    sub = runs
    for key, value in key_values.items():
        sub = sub[sub[key] == value]
    notes = []
    for mixer in mixers:
        failed = sub[(sub["mixer"] == mixer) & (sub["status"] != "ok") & (sub["tokens"] > last_common)]
        if len(failed):
            first = failed.sort_values("tokens").iloc[0]
            notes.append(f"{mixer} {first['status']} from N = {first['tokens']:,.0f}")
    return "; ".join(notes)


def _present_metrics(runs: pd.DataFrame) -> list[str]:
    """Cost metrics with at least one value in the sweep."""
    return [m for m in COST_METRICS if m in runs and runs[m].notna().any()]
