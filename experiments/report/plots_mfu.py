"""How close each mixer comes to the device: MFU (achieved FLOP/s over the measured matmul peak) against N.

One figure per curve setting, like the wall; a panel for inference and one for the training step where the rows
have it. Drawn only when some row holds an MFU (rows measured before the peak calibration have none).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from .crossover import curve_keys, curve_points
from .mixer_order import mixer_rank
from .plots import FIGURE_MARGIN, PANEL_HEIGHT, PANEL_WIDTH, _mixer_legend, _save, _select, facets, mixer_style
from .plots_cost import _style_token_axis

MFU_PANELS: tuple[tuple[str, str], ...] = (
    ("mfu", "MFU, inference (% of measured peak)"),
    ("train_mfu", "MFU, training step (% of measured peak)"),
)


def mfu_figures(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """MFU (%) against tokens on log-log axes, one line per mixer; returns the paths written."""
    panels = tuple((m, label) for m, label in MFU_PANELS if m in runs and runs[m].notna().any())
    if not panels:
        return []
    keys = curve_keys(runs)
    with_data = runs[runs[[m for m, _ in panels]].notna().any(axis=1)]
    paths = []
    for facet in facets(runs, keys, untitled=("patch_size",)):
        setting = _select(with_data, facet.values)
        if setting.empty:
            continue
        mixers = sorted(set(setting["mixer"]), key=mixer_rank)
        width = PANEL_WIDTH * len(panels) + FIGURE_MARGIN
        fig = Figure(figsize=(width, PANEL_HEIGHT + 0.75 + (0.2 if facet.title else 0)), layout="constrained")
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, (metric, label) in zip(axes, panels):
            points = curve_points(setting, metric, keys)
            for mixer in mixers:
                line = points[points["mixer"] == mixer]
                style = mixer_style(mixer)
                ax.plot(line["tokens"], 100 * line[metric], color=style.color, marker=style.marker,
                        linestyle=style.linestyle)
            ax.set_yscale("log")
            _style_token_axis(ax, setting, facet.values)
            ax.set_ylabel(label)
        _mixer_legend(fig, mixers, width, title=facet.title)
        paths += _save(fig, out_dir / f"mfu{facet.suffix}")
    return paths
