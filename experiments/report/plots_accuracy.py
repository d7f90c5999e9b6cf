"""Accuracy figures: top-1 accuracy against cost (GMACs, latency), with the Pareto front labelled.

They split on the data set, epochs and recipe too, and read the rows that have an accuracy. A point is the mean
over seeds with its 95% t interval as an error bar; the front runs only through points whose interval lies wholly
above chance (`stats.above_chance`), so noise around 50% on a binary task draws no front. Styles, facets, axes
and files come from `plots`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.markers import MarkerStyle
from matplotlib.ticker import MaxNLocator

from .crossover import COST_KEYS, accuracy_facet_keys, accuracy_rows, cost_points
from .mixer_order import mixer_rank
from .convergence import UNCONVERGED_MARK
from .stats import above_chance
from .tables import accuracy_summary
from .plots import (
    COST_LABELS, FIGURE_MARGIN, Facet, NiceLogLocator, PANEL_HEIGHT, PANEL_WIDTH, _legend_columns, _mixer_handle,
    _plain_labels, _save, facets, mixer_style, percent_error_bars,
)


def accuracy_figures(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Accuracy against cost (GMACs, latency), with the Pareto front of the points no other point dominates.

    One figure per data set, epochs, recipe and varying cost key. Accuracy is the mean over seeds of the rows
    that have one; the costs are the cost point's (the median over every row of that configuration, as in the
    wall figures and the costs table). Front points are labelled "image/patch" when the points differ in size.

    Error bars are the 95% t interval over seeds, clipped to [0, 100] (none with one seed); the dotted line is
    chance, where known.

    Returns:
        The paths written.
    """
    costs = [c for c in ("gmacs", "latency_ms") if runs[c].notna().any()]
    if not costs:
        return []
    point = list(COST_KEYS) + ["tokens"]
    point_costs = cost_points(runs, costs)[point + costs]
    paths = []
    for facet in facets(accuracy_rows(runs), accuracy_facet_keys(runs), always=("dataset",), context=("epochs",)):
        summary = accuracy_summary(facet.rows, point + ["dataset"])
        points = summary.merge(point_costs, on=point, how="left")
        paths += _save(_accuracy_figure(facet, points, costs), out_dir / f"accuracy_cost{facet.suffix}")
    return paths


def _accuracy_figure(facet: Facet, points: pd.DataFrame, costs: list[str]) -> Figure:
    """One accuracy figure: a panel per cost, the mixers and the front's key at the foot."""
    sizes = points[["img_size", "patch_size"]].drop_duplicates()
    one_size = len(sizes) == 1
    title = facet.title
    if one_size:
        title += f" · image {sizes['img_size'].iloc[0]} px, patch {sizes['patch_size'].iloc[0]} px"
    width = (PANEL_WIDTH + 0.15) * len(costs) + FIGURE_MARGIN
    fig = Figure(figsize=(width, PANEL_HEIGHT + 0.8), layout="constrained")
    axes = fig.subplots(1, len(costs), squeeze=False)[0]
    for ax, cost in zip(axes, costs):
        _draw_accuracy_panel(ax, points.dropna(subset=[cost]), cost, label_front=not one_size)
    level = points["chance"].iloc[0] if "chance" in points else math.nan
    fig.suptitle(title.strip(" ·"), fontsize=8.5)
    handles = [_mixer_handle(m, linestyle="none") for m in sorted(set(points["mixer"]), key=mixer_rank)]
    front = "Pareto front, points above chance" + ("" if one_size else " (image/patch px)")
    handles.append(Line2D([], [], color="0.25", linestyle="--", linewidth=0.9, label=front))
    handles.append(Line2D([], [], color="0.25", marker="|", linestyle="none",
                          label="95% CI over seeds (clipped to 0-100%)"))
    if math.isfinite(level):
        handles.append(Line2D([], [], color="0.5", linestyle=":", linewidth=0.9, label="chance"))
    if _unconverged(points).any():
        handles.append(Line2D([], [], color="0.25", marker="o", markerfacecolor="white", linestyle="none",
                              label=f"hollow (x faint): not converged {UNCONVERGED_MARK} (a lower bound; front "
                              "provisional)"))
    fig.legend(handles=handles, loc="outside lower center", frameon=False, handlelength=1.6,
               ncol=_legend_columns([h.get_label() for h in handles], width, handle_in=1.6 * 7 / 72))
    return fig


def _unconverged(points: pd.DataFrame) -> pd.Series:
    """True for the points some seed of which is recorded as not converged (`tables.accuracy_summary`)."""
    if "converged" not in points:
        return pd.Series(False, index=points.index)
    return points["converged"].fillna("").astype(str).str.endswith(UNCONVERGED_MARK)


def pareto_front(cost: np.ndarray, accuracy: np.ndarray) -> np.ndarray:
    """Indices of the points that no other point dominates (at most the cost and strictly more accuracy).

    Returns:
        Indices into the inputs, by increasing cost.
    """
    order = np.lexsort((-np.asarray(accuracy), np.asarray(cost)))  # by cost, then best accuracy first
    front, best = [], -math.inf
    for i in order:
        if accuracy[i] > best:
            front.append(i)
            best = accuracy[i]
    return np.array(front, dtype=int)


def _draw_accuracy_panel(ax: Axes, points: pd.DataFrame, cost: str, label_front: bool) -> None:
    """Means with 95% intervals against one cost, chance dotted, and the Pareto front of the points above chance
    as a step line, its points optionally labelled."""
    for mixer, group in points.groupby("mixer"):
        style = mixer_style(mixer)
        # A setting some seed of which did not converge is drawn hollow: its accuracy is a lower bound.
        hollow = _unconverged(group)
        if MarkerStyle(style.marker).is_filled():
            solid = dict(color=style.color, edgecolors="white", linewidths=0.5)
            open_ = dict(facecolors="white", edgecolors=style.color, linewidths=1.0)
        else:  # a line marker ('x') has no face to leave white, and a white one vanishes: faint instead
            solid = dict(color=style.color, linewidths=1.0)
            open_ = dict(color=style.color, linewidths=1.0, alpha=0.45)
        ax.scatter(group.loc[~hollow, cost], group.loc[~hollow, "accuracy"], marker=style.marker, s=30, zorder=3,
                   **solid)
        ax.scatter(group.loc[hollow, cost], group.loc[hollow, "accuracy"], marker=style.marker, s=30, zorder=3,
                   **open_)
        yerr = percent_error_bars(group["accuracy"], group["accuracy_ci_low"], group["accuracy_ci_high"])
        ax.errorbar(group[cost], group["accuracy"], yerr=yerr, fmt="none",
                    ecolor=style.color, elinewidth=0.9, capsize=2, zorder=2.5)
    level = points["chance"].iloc[0] if len(points) else math.nan
    if math.isfinite(level):
        ax.axhline(level, color="0.5", linestyle=":", linewidth=0.9, zorder=1)
    real = points[[above_chance(lo, n, level if math.isfinite(level) else None)
                   for lo, n in zip(points["accuracy_ci_low"], points["seeds"])]]
    front = real.iloc[pareto_front(real[cost].to_numpy(), real["accuracy"].to_numpy())]
    if len(front):
        ax.step(front[cost], front["accuracy"], where="post", color="0.25", linestyle="--", linewidth=0.9, zorder=2)
    if label_front:
        _label_front(ax, front, cost)
    ax.set_xscale("log")
    ax.margins(x=0.12, y=0.12)
    ax.xaxis.set_major_locator(NiceLogLocator(fallback_bins=4))
    _plain_labels(ax.xaxis)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    ax.set_xlabel(COST_LABELS[cost])
    ax.set_ylabel("Top-1 accuracy (%)")


def _label_front(ax: Axes, front: pd.DataFrame, cost: str) -> None:
    """Label front points "image/patch": up and to the left (where no point can lie), the first up and right.

    A run of front points at the same (image, patch) is labelled once, at its cheapest point.
    """
    previous = None
    for i, (_, point) in enumerate(front.iterrows()):
        text = f"{point['img_size']:.0f}/{point['patch_size']:.0f}"
        if text != previous:
            left = i > 0
            ax.annotate(text, (point[cost], point["accuracy"]), xytext=(-4 if left else 4, 4),
                        textcoords="offset points", ha="right" if left else "left", va="bottom", fontsize=6,
                        color="0.3")
        previous = text
