"""The learning-rate grid's validation curve: validation accuracy against the rate, a line per mixer, a panel per
(data set, image, patch), the chosen rate ringed. What the rate chosen for each mixer rests on."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..lr_grid import rate_group
from .mixer_order import mixer_rank
from .plots import FIGURE_MARGIN, PANEL_HEIGHT, PANEL_WIDTH, _legend_columns, _mixer_handle, _save, mixer_style
from .rates import grid_rows, rate_choices
from ..lr_grid import rate_of

PANEL_KEYS = ("dataset", "img_size", "patch_size")


def lr_figures(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """`lr_grid.png/pdf` when the sweep ran a learning-rate grid; else nothing."""
    grid = grid_rows(runs)
    choices = rate_choices(runs)
    if grid.empty or not choices:
        return []
    points = grid.assign(rate=[rate_of(str(t)) for t in grid["train"]],
                         chosen=[choices[g].lr if g in choices else float("nan")
                                 for g in (rate_group(r) for r in grid.to_dict("records"))])
    points = points.groupby(["mixer", *PANEL_KEYS, "rate"], as_index=False).agg(
        val=("val_accuracy", "mean"), chosen=("chosen", "first"))
    points["val"] = points["val"] * 100
    panels = list(points.groupby(list(PANEL_KEYS), sort=True))
    width = PANEL_WIDTH * len(panels) + FIGURE_MARGIN
    fig = Figure(figsize=(width, PANEL_HEIGHT + 0.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, ((dataset, img, patch), panel) in zip(axes, panels):
        for mixer, line in panel.groupby("mixer"):
            style = mixer_style(mixer)
            line = line.sort_values("rate")
            ax.plot(line["rate"], line["val"], color=style.color, marker=style.marker, linestyle=style.linestyle)
            best = line[line["rate"] == line["chosen"]]
            ax.scatter(best["rate"], best["val"], s=110, facecolors="none", edgecolors=style.color, linewidths=1.2)
        ax.set_xscale("log")
        ax.set_xlabel("Peak learning rate")
        ax.set_title(f"{dataset} · {img} px · patch {patch}", fontsize=8)
    axes[0].set_ylabel("Validation top-1 (%)")
    mixers = sorted(points["mixer"].unique(), key=mixer_rank)
    handles = [_mixer_handle(m, linestyle=mixer_style(m).linestyle) for m in mixers]
    handles.append(Line2D([], [], color="0.3", marker="o", markersize=9, markerfacecolor="none", linestyle="none",
                          label="chosen rate (best mean validation accuracy)"))
    fig.suptitle("LR grid: validation picks the rate", fontsize=8.5)
    fig.legend(handles=handles, loc="outside lower center", frameon=False,
               ncol=_legend_columns([h.get_label() for h in handles], width, handle_in=2.6 * 7 / 72))
    return _save(fig, out_dir / "lr_grid")
