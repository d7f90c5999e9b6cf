"""The two numbers of every training, per setting: what it converged to (capability) and the samples and training
FLOPs it needed to first reach a stated validation accuracy (speed), with whether it converged; and for reach the
samples to that accuracy per (direction, distance) bucket, read from the learning curves.

The capability is the test `accuracy` over seeds (`tables.accuracy_summary`, its interval clipped to [0, 100]%).
The speed is the mean over the seeds that reached `target_accuracy` of `samples_to_target` and `flops_to_target`
(columns the training writes from its curve); "never" where no seed reached it, "(k/n)" where only some did.
"""
from __future__ import annotations

import math

import pandas as pd

from .convergence import NEVER, UNCONVERGED_MARK, converged_flags, recorded, unconverged
from .crossover import COST_KEYS, RECIPE_KEYS, accuracy_facet_keys, accuracy_rows
from .curves import bucket_curves, first_reach
from .mixer_order import mixer_rank
from .reach import DIRECTION_ORDER, backbone_overrides, name_variants
from .tables import MISSING, POINT_KEYS, accuracy_summary, fmt_number, fmt_spread, sort_rows

# The setting a training belongs to, as the accuracy table groups its rows.
SETTING_KEYS: list[str] = [*COST_KEYS, *RECIPE_KEYS, "tokens"]


def fmt_count(value: float) -> str:
    """A count that spans decades (samples, FLOPs): three significant figures, powers of ten as "e12"."""
    if not math.isfinite(value):
        return MISSING
    if value < 1e6:
        return fmt_number(value)
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def reach_cell(values: pd.Series) -> str:
    """Mean over the seeds that reached the target, "(k/n)" where some did not, "never" where none did."""
    reached = values.dropna()
    if reached.empty:
        return NEVER
    text = fmt_count(float(reached.mean()))
    return text if len(reached) == len(values) else f"{text} ({len(reached)}/{len(values)})"


def convergence_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per training setting and mixer trained under the convergence rule.

    Returns:
        The numeric frame (accuracy in percent; samples and FLOPs as the mean over the seeds that reached the
        target, NaN where none did; `reached` of `seeds`) and its display frame. Both empty where no row recorded
        its convergence.
    """
    rows = accuracy_rows(runs)
    rows = rows[recorded(rows)]
    if rows.empty:
        return pd.DataFrame(), pd.DataFrame()
    summary = accuracy_summary(rows, SETTING_KEYS)
    records = []
    for values, sub in rows.groupby(SETTING_KEYS, sort=False, dropna=False):
        flags = converged_flags(sub)
        reasons = sub["stop_reason"].fillna("").astype(str).str.strip().replace("", "?").value_counts()
        records.append({
            **dict(zip(SETTING_KEYS, values)),
            "converged_seeds": sum(f is True for f in flags), "unconverged": unconverged(flags),
            "stop_reasons": ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())),
            "target_accuracy": sub["target_accuracy"].mean() * 100,
            "converged_samples": sub["converged_samples"].mean(),
            "samples_to_target": sub["samples_to_target"].mean(), "flops_to_target": sub["flops_to_target"].mean(),
            "reached": int(sub["samples_to_target"].notna().sum()),
            # No stated target: nothing was timed, so neither a number nor "never".
            "_samples_cell": reach_cell(sub["samples_to_target"]) if sub["target_accuracy"].notna().any() else MISSING,
            "_flops_cell": reach_cell(sub["flops_to_target"]) if sub["target_accuracy"].notna().any() else MISSING,
        })
    table = summary.merge(pd.DataFrame.from_records(records), on=SETTING_KEYS, how="left")
    shown = list(dict.fromkeys(["mixer", *accuracy_facet_keys(runs), *POINT_KEYS]))
    numeric = sort_rows(table, [k for k in shown if k not in POINT_KEYS] + ["patch_size", "tokens"])
    display = numeric[shown].astype(str).rename(columns={"mixer": "Mixer", "img_size": "Image (px)",
                                                         "patch_size": "Patch (px)", "tokens": "Tokens N"})
    display["Converged"] = numeric["converged"]
    display["Stopped by"] = numeric["stop_reasons"]
    display["Converged acc. (%, test, mean ± s.d.)"] = [
        fmt_spread(m, s) + (f" {UNCONVERGED_MARK}" if u else "")
        for m, s, u in zip(numeric["accuracy"], numeric["accuracy_sd"], numeric["unconverged"])]
    display["95% CI (%)"] = [f"[{lo:.1f}, {hi:.1f}]" if math.isfinite(lo) else MISSING
                             for lo, hi in zip(numeric["accuracy_ci_low"], numeric["accuracy_ci_high"])]
    display["n"] = numeric["seeds"].astype(int).astype(str)
    display["Target (%, val.)"] = numeric["target_accuracy"].map(lambda v: fmt_number(v, 3))
    display["Samples to target"] = numeric["_samples_cell"]
    display["Train FLOPs to target"] = numeric["_flops_cell"]
    display["Samples at best val."] = numeric["converged_samples"].map(fmt_count)
    return numeric.drop(columns=["_samples_cell", "_flops_cell"]), display


def reach_bucket_tables(runs: pd.DataFrame, points: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per setting, mixer and reach bucket: the samples and FLOPs each seed's curve needed to first reach the row's
    `target_accuracy` on that bucket's validation images, the mean over the seeds that did.

    Args:
        runs: the loaded runs.
        points: the curves' evaluations (`curves.load_curves(...).points`).

    Returns:
        The numeric long frame and a display frame with a row per bucket and a column per mixer (samples).
    """
    rows = accuracy_rows(runs)
    buckets = bucket_curves(points[points["row"].isin(rows.index)])
    if buckets.empty:
        return pd.DataFrame(), pd.DataFrame()
    per_seed = []
    for (row, direction, distance), curve in buckets.groupby(["row", "direction", "distance"], sort=False):
        target = float(rows.at[row, "target_accuracy"])
        if not math.isfinite(target):
            continue  # no stated accuracy to time: neither a number nor "never"
        samples, flops = first_reach(curve, target)
        per_seed.append({**{k: rows.at[row, k] for k in SETTING_KEYS}, "direction": direction, "distance": distance,
                         "backbone": backbone_overrides(rows.at[row, "overrides"]),
                         "samples_to_target": samples, "flops_to_target": flops})
    if not per_seed:
        return pd.DataFrame(), pd.DataFrame()
    per_seed = name_variants(pd.DataFrame.from_records(per_seed))  # as the reach table names them
    group = [*SETTING_KEYS, "backbone", "direction", "distance"]
    records = []
    for values, sub in per_seed.groupby(group, sort=False, dropna=False):
        records.append({**dict(zip(group, values)), "samples_to_target": sub["samples_to_target"].mean(),
                        "flops_to_target": sub["flops_to_target"].mean(),
                        "reached": int(sub["samples_to_target"].notna().sum()), "seeds": len(sub),
                        "cell": reach_cell(sub["samples_to_target"])})
    numeric = pd.DataFrame.from_records(records)
    numeric["direction_rank"] = numeric["direction"].map(
        lambda d: DIRECTION_ORDER.index(d) if d in DIRECTION_ORDER else len(DIRECTION_ORDER))
    numeric = sort_rows(numeric, ["direction_rank", "distance", "mixer"]).drop(columns="direction_rank")
    varying = [k for k in accuracy_facet_keys(runs) if k in numeric and k != "overrides"]
    varying += ["backbone"] if numeric["backbone"].nunique() > 1 else []
    index = [*varying, "direction", "distance"]
    wide = numeric.pivot_table(index=index, columns="mixer", values="cell", aggfunc="first", sort=False)
    wide = wide[sorted(wide.columns, key=mixer_rank)].fillna(MISSING).reset_index()
    wide = wide.rename(columns={"direction": "Direction", "distance": "Distance (patches)",
                                "backbone": "Shared overrides"})
    return numeric.drop(columns="cell"), wide.astype(str)
