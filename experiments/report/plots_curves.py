"""Learning-curve figures: validation accuracy against training FLOPs and against samples seen, one line per mixer
(the mean over seeds, a band over their range), one figure per training setting as the accuracy tables group them;
for reach, one panel per (direction, distance) bucket.

Under the convergence rule a seed that stopped early is held at its last accuracy to the end of the line (the rule
stopped it on a plateau, so that is what more samples would have given it), and the line's end marker is hollow
where a seed ended at the maximum budget unconverged (`convergence.UNCONVERGED_MARK`). The x axis is logarithmic
where its values span a decade or more (the evaluation before the first step, at 0, then sits off the axis and is
left out).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from .convergence import converged_flags
from .crossover import accuracy_facet_keys, accuracy_rows
from .curves import bucket_curves
from .mixer_order import mixer_rank
from .plots import (
    FIGURE_MARGIN, PANEL_HEIGHT, PANEL_WIDTH, NiceLogLocator, _legend_columns, _mixer_handle, _plain_labels, _save,
    facets, mixer_style,
)
from .reach import DIRECTION_ORDER
from .stats import chance

# The x axes of the learning curves: (curve column, label; "{unit}" is the FLOP unit `_flop_unit` picks).
CURVE_AXES: tuple[tuple[str, str], ...] = (
    ("train_flops", "Training compute ({unit}, fwd + bwd, counted)"),
    ("samples_seen", "Training samples seen"),
)
# FLOP units by size, so tick labels stay short and plain ("20", not "2 x 10^10").
FLOP_UNITS: tuple[tuple[float, str], ...] = ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"),
                                              (1e6, "MFLOP"), (1.0, "FLOP"))
# A positive range at least this wide (max / min) is drawn on a log axis.
LOG_SPAN = 10.0
BAND_ALPHA = 0.18


def curve_rows(runs: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """The evaluations of the rows the accuracy tables use, with their setting: the accuracy rows' columns
    (each at its chosen rate) joined to the curves by `row`, accuracy in percent."""
    rows = accuracy_rows(runs)
    joined = points[points["row"].isin(rows.index)]
    if joined.empty:
        return joined
    setting = rows.drop(columns=[c for c in rows.columns if c in joined.columns and c != "row"])
    setting = setting.assign(_converged=converged_flags(rows))
    out = joined.merge(setting, left_on="row", right_index=True, how="left")
    return out.assign(val_accuracy=out["val_accuracy"] * 100)


def curve_figures(runs: pd.DataFrame, points: pd.DataFrame, out_dir: Path) -> list[Path]:
    """`curves{suffix}`: accuracy against training FLOPs and samples seen per setting; and, for tasks with
    buckets, `curves_buckets{suffix}`: a panel per bucket against samples seen.

    Args:
        runs: the loaded runs.
        points: the curves' evaluations (`curves.load_curves(...).points`).
        out_dir: folder for the files.

    Returns:
        The paths written (none without curves).
    """
    evaluations = curve_rows(runs, points)
    if evaluations.empty:
        return []
    keys = [*accuracy_facet_keys(runs), "img_size", "patch_size"]
    paths = []
    for facet in facets(evaluations, keys, always=("dataset",), context=("epochs",)):
        paths += _save(_curve_figure(facet.rows, facet.title), out_dir / f"curves{facet.suffix}")
        buckets = bucket_curves(facet.rows)
        if not buckets.empty:
            per_bucket = buckets.merge(facet.rows[["row", "mixer", "seed", "_converged", "dataset"]]
                                       .drop_duplicates("row"), on="row")
            per_bucket["val_accuracy"] *= 100
            paths += _save(_bucket_figure(per_bucket, facet.title), out_dir / f"curves_buckets{facet.suffix}")
    return paths


def _seed_counts(rows: pd.DataFrame) -> tuple[int, int]:
    """The fewest and the most seeds with a curve that any mixer has."""
    counts = rows.groupby("mixer")["seed"].nunique()
    return int(counts.min()), int(counts.max())


def _seed_text(seeds: tuple[int, int]) -> str:
    """"3 seeds", "1 seed", or "2-3 seeds" where mixers differ (a curve file skipped)."""
    low, high = seeds
    return f"{low} seed{'s' * (low != 1)}" if low == high else f"{low}-{high} seeds"


def _flop_unit(largest: float) -> tuple[float, str]:
    """(divisor, name) of the largest FLOP unit at most `largest`."""
    return next(((scale, name) for scale, name in FLOP_UNITS if largest >= scale), FLOP_UNITS[-1])


def _mean_band(curve: pd.DataFrame, x: str) -> pd.DataFrame:
    """Per evaluation: the mean x over the seeds evaluated there; the mean accuracy and its range over every seed,
    a seed that has stopped held at its last accuracy."""
    # Evaluations are evenly spaced in samples, so one index is one point of training for every seed. Without the
    # hold, a seed that learnt and stopped early would leave the mean, which would fall back to the others.
    accuracy = (curve.pivot_table(index="eval_index", columns="row", values="val_accuracy", aggfunc="mean")
                .sort_index().ffill())
    return pd.DataFrame({"x": curve.groupby("eval_index")[x].mean(), "mean": accuracy.mean(axis=1),
                         "low": accuracy.min(axis=1), "high": accuracy.max(axis=1),
                         "seeds": accuracy.notna().sum(axis=1)}).reset_index().sort_values("x")


def _log_x(values: pd.Series) -> bool:
    positive = values[values > 0]
    return len(positive) > 1 and positive.max() / positive.min() >= LOG_SPAN


def _draw_curves(ax: Axes, rows: pd.DataFrame, x: str) -> None:
    """A line per mixer (mean over seeds), its band (range over seeds), the end hollow where unconverged."""
    log = _log_x(rows[x])
    for mixer in sorted(rows["mixer"].unique(), key=mixer_rank):
        curve = rows[rows["mixer"] == mixer]
        if log:
            curve = curve[curve[x] > 0]
        line = _mean_band(curve, x)
        if line.empty:
            continue
        style = mixer_style(mixer)
        ax.plot(line["x"], line["mean"], color=style.color, linestyle=style.linestyle, linewidth=1.2)
        if (line["seeds"] > 1).any():
            ax.fill_between(line["x"], line["low"], line["high"], color=style.color, alpha=BAND_ALPHA, linewidth=0)
        done = any(f is False for f in curve.drop_duplicates("row")["_converged"])
        ax.plot(line["x"].iloc[-1], line["mean"].iloc[-1], marker=style.marker, markersize=4.5, color=style.color,
                markerfacecolor="white" if done else style.color, linestyle="none")
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(NiceLogLocator(fallback_bins=4))
    _plain_labels(ax.xaxis)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))


def _chance_line(ax: Axes, dataset: str) -> bool:
    level = chance(dataset)
    if level is None:
        return False
    ax.axhline(level * 100, color="0.5", linestyle=":", linewidth=0.9, zorder=1)
    return True


def _target_line(ax: Axes, rows: pd.DataFrame) -> bool:
    """The stated accuracy whose first reach the tables time, where the rows share one."""
    targets = rows["target_accuracy"].dropna().unique() if "target_accuracy" in rows else []
    if len(targets) != 1:
        return False
    ax.axhline(targets[0] * 100, color="0.35", linestyle="--", linewidth=0.8, zorder=1)
    return True


def _legend(fig: Figure, rows: pd.DataFrame, width: float, chance_drawn: bool, target_drawn: bool,
            seeds: int) -> None:
    """The mixers' key, then what the band, a hollow end and the dashed and dotted lines mean where drawn."""
    mixers = sorted(rows["mixer"].unique(), key=mixer_rank)
    handles = [_mixer_handle(m, linestyle=mixer_style(m).linestyle) for m in mixers]
    if seeds > 1:
        handles.append(Line2D([], [], color="0.6", linewidth=5, alpha=0.4, label="range over seeds"))
    if any(f is False for f in rows.drop_duplicates("row")["_converged"]):
        handles.append(Line2D([], [], color="0.3", marker="o", markerfacecolor="white", linestyle="none",
                              label="end: not converged (max. budget)"))
    if target_drawn:
        handles.append(Line2D([], [], color="0.35", linestyle="--", linewidth=0.8, label="target accuracy"))
    if chance_drawn:
        handles.append(Line2D([], [], color="0.5", linestyle=":", linewidth=0.9, label="chance"))
    fig.legend(handles=handles, loc="outside lower center", frameon=False, handlelength=2.2,
               ncol=_legend_columns([h.get_label() for h in handles], width, handle_in=2.2 * 7 / 72))


def _curve_figure(rows: pd.DataFrame, title: str) -> Figure:
    """Two panels: validation accuracy against training FLOPs, and against samples seen."""
    width = (PANEL_WIDTH + 0.15) * len(CURVE_AXES) + FIGURE_MARGIN
    fig = Figure(figsize=(width, PANEL_HEIGHT + 0.9), layout="constrained")
    axes = fig.subplots(1, len(CURVE_AXES), squeeze=False, sharey=True)[0]
    chance_drawn = target_drawn = False
    scale, unit = _flop_unit(float(rows["train_flops"].max()))
    rows = rows.assign(train_flops=rows["train_flops"] / scale)
    for ax, (x, label) in zip(axes, CURVE_AXES):
        label = label.format(unit=unit)
        _draw_curves(ax, rows, x)
        chance_drawn = _chance_line(ax, str(rows["dataset"].iloc[0]))
        target_drawn = _target_line(ax, rows)
        ax.set_xlabel(label + (" (log)" if _log_x(rows[x]) else ""))
    axes[0].set_ylabel("Validation top-1 accuracy (%)")
    seeds = _seed_counts(rows)
    caption = f"mean over {_seed_text(seeds)}" + (", band: their range" if max(seeds) > 1 else "")
    fig.suptitle(" · ".join(t for t in ("Learning curves", title, caption) if t), fontsize=8.5)
    _legend(fig, rows, width, chance_drawn, target_drawn, max(seeds))
    return fig


def _bucket_figure(buckets: pd.DataFrame, title: str) -> Figure:
    """A panel per (direction, distance): the bucket's validation accuracy against samples seen."""
    directions = sorted(buckets["direction"].unique(), key=lambda d: (DIRECTION_ORDER + (d,)).index(d))
    distances = sorted(buckets["distance"].unique())
    panel = 1.55
    width = panel * len(distances) + FIGURE_MARGIN + 0.4
    fig = Figure(figsize=(width, panel * len(directions) + 0.9), layout="constrained")
    axes = fig.subplots(len(directions), len(distances), squeeze=False, sharex=True, sharey=True)
    for i, direction in enumerate(directions):
        for j, distance in enumerate(distances):
            ax = axes[i, j]
            here = buckets[(buckets["direction"] == direction) & (buckets["distance"] == distance)]
            if here.empty:
                ax.set_axis_off()
                continue
            _draw_curves(ax, here, "samples_seen")
            _chance_line(ax, str(here["dataset"].iloc[0]))
            ax.set_title(f"{direction}, distance {distance}", fontsize=7)
            ax.tick_params(labelsize=6)
            if i == len(directions) - 1:
                ax.set_xlabel("Samples seen" + (" (log)" if _log_x(buckets["samples_seen"]) else ""), fontsize=7)
            if j == 0:
                ax.set_ylabel("Val. accuracy (%)", fontsize=7)
    seeds = _seed_counts(buckets)
    caption = f"per bucket, mean over {_seed_text(seeds)}" + (", band: range" if max(seeds) > 1 else "")
    # Two lines: a figure of two buckets is narrower than the title and caption side by side.
    fig.suptitle(" · ".join(t for t in ("Learning curves", title) if t) + "\n" + caption, fontsize=8)
    _legend(fig, buckets, width, chance(str(buckets["dataset"].iloc[0])) is not None, False, max(seeds))
    return fig
