"""What each mixer buys as N grows: accuracy against token count per mixer (a line per data set, a marker per
patch size) above its cost against the same N, so gain and price read off one column per mixer.

Accuracy is the mean over seeds at each setting's chosen rate (`crossover.accuracy_rows`); cost is the median
latency of the same configurations (`crossover.cost_points`), or GMACs per image where no latency was measured.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .convergence import UNCONVERGED_MARK, converged_flags
from .crossover import COST_KEYS, accuracy_rows, cost_points
from .mixer_order import mixer_rank
from .plots import COST_LABELS, FIGURE_MARGIN, PANEL_HEIGHT, PANEL_WIDTH, _legend_columns, _save

PATCH_MARKERS = ("o", "s", "^", "D", "v", "P")
DATASET_STYLES = ("-", "--", ":", "-.")


def accuracy_n_figures(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """`accuracy_tokens.png/pdf` when some mixer was trained at two token counts or more; else nothing."""
    trained = accuracy_rows(runs)
    if trained.empty or trained.groupby("mixer")["tokens"].nunique().max() < 2:
        return []
    cost = "latency_ms" if runs["latency_ms"].notna().any() else "gmacs"
    point = ["mixer", "dataset", "img_size", "patch_size", "tokens"]
    points = trained.groupby(point, as_index=False)["accuracy"].mean()
    points["accuracy"] *= 100
    # A point some seed of which ended unconverged is drawn hollow: its accuracy is a lower bound.
    flags = trained.assign(_open=converged_flags(trained).map(lambda f: f is False))
    points = points.merge(flags.groupby(point, as_index=False)["_open"].any(), on=point)
    costs = cost_points(runs[runs["mixer"].isin(points["mixer"])], [cost])
    costs = costs.merge(trained[list(COST_KEYS)].drop_duplicates(), on=list(COST_KEYS))  # the trained configurations
    costs = costs.groupby(["mixer", "img_size", "patch_size", "tokens"], as_index=False)[cost].median()
    mixers = sorted(points["mixer"].unique(), key=mixer_rank)
    datasets = sorted(points["dataset"].unique())
    patches = sorted(points["patch_size"].unique())
    width = PANEL_WIDTH * len(mixers) + FIGURE_MARGIN
    fig = Figure(figsize=(width, 2 * PANEL_HEIGHT + 0.9), layout="constrained")
    axes = fig.subplots(2, len(mixers), squeeze=False, sharex=True)
    for column, mixer in enumerate(mixers):
        top, bottom = axes[0][column], axes[1][column]
        for d, dataset in enumerate(datasets):
            line = points[(points["mixer"] == mixer) & (points["dataset"] == dataset)].sort_values("tokens")
            line = line.groupby("tokens", as_index=False).agg(accuracy=("accuracy", "mean"))
            top.plot(line["tokens"], line["accuracy"], color="0.35", linestyle=DATASET_STYLES[d % 4], linewidth=1)
            for p, patch in enumerate(patches):
                at = points[(points["mixer"] == mixer) & (points["dataset"] == dataset) & (points["patch_size"] == patch)]
                top.scatter(at["tokens"], at["accuracy"], marker=PATCH_MARKERS[p % 6], s=22, zorder=3,
                            facecolors=["white" if o else "0.15" for o in at["_open"]], edgecolors="0.15")
        mine = costs[costs["mixer"] == mixer]
        for p, patch in enumerate(patches):
            at = mine[mine["patch_size"] == patch].sort_values("tokens")
            bottom.plot(at["tokens"], at[cost], marker=PATCH_MARKERS[p % 6], color="0.15", linewidth=0.8,
                        markersize=4)
        top.set_title(mixer, fontsize=8.5)
        bottom.set_xscale("log")
        bottom.set_yscale("log")
        bottom.set_xlabel("Tokens N")
    axes[0][0].set_ylabel("Top-1 accuracy (%)")
    axes[1][0].set_ylabel(COST_LABELS[cost])
    handles = [Line2D([], [], color="0.35", linestyle=DATASET_STYLES[d % 4], label=ds) for d, ds in enumerate(datasets)]
    handles += [Line2D([], [], color="0.15", marker=PATCH_MARKERS[p % 6], linestyle="none", label=f"patch {patch} px")
                for p, patch in enumerate(patches)]
    if points["_open"].any():
        handles.append(Line2D([], [], color="0.15", marker="o", markerfacecolor="white", linestyle="none",
                              label=f"hollow: not converged {UNCONVERGED_MARK}"))
    fig.suptitle("Accuracy (mean over seeds, each mixer at its chosen rate) and cost against token count N",
                 fontsize=8.5)
    fig.legend(handles=handles, loc="outside lower center", frameon=False,
               ncol=_legend_columns([h.get_label() for h in handles], width, handle_in=2.6 * 7 / 72))
    return _save(fig, out_dir / "accuracy_tokens")
