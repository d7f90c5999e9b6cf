"""Cost figures: the quadratic wall (cost against tokens N) and patch size against resolution.

They split only on the keys a cost depends on (`crossover.COST_KEYS`), so a training row and a cost-only row of
one configuration are one point (their median). Styles, facets, axes and files come from `plots`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .crossover import (
    FIT_POINTS, REFERENCES, accuracy_rows, cost_points, curve_keys, curve_points, facet_keys, first_failures,
)
from .mixer_order import mixer_rank
from .plots import (
    FIGURE_MARGIN, Facet, NiceLogLocator, PANEL_HEIGHT, PANEL_WIDTH, STATUS_MARKERS, _legend_columns,
    _measured_ticks, _mixer_legend, _plain_labels, _save, _select, facets, mixer_style,
)


# --- the wall: cost against tokens -------------------------------------------------------------------------

def wall_figures(runs: pd.DataFrame, exponents: pd.DataFrame, crossovers: pd.DataFrame, out_dir: Path,
                 panels: tuple[tuple[str, str], ...], name: str) -> list[Path]:
    """The quadratic wall: one panel per cost against N on log-log axes, one figure per curve setting.

    Under each panel, the fitted exponent of each mixer; a curve that stops early gets its status marker at the N
    that failed, near the top of the panel (for the training-step panels, where the training step failed while
    the inference ran); dotted verticals mark where a mixer becomes cheaper than the reference attention.

    Returns:
        The paths written; none when no panel has data.
    """
    panels = tuple((m, label) for m, label in panels if m in runs and runs[m].notna().any())
    if not panels:
        return []
    keys = curve_keys(runs)
    failures = first_failures(runs, panels[0][0])
    with_data = runs[runs[[m for m, _ in panels]].notna().any(axis=1)]
    paths = []
    for facet in facets(runs, keys, untitled=("patch_size",)):
        if not _select(with_data, facet.values).shape[0]:
            continue  # e.g. no training step measured at this patch size
        fig = _wall_figure(facet, panels, _select(exponents, facet.values), _select(crossovers, facet.values),
                           _select(failures, facet.values), keys)
        paths += _save(fig, out_dir / f"{name}{facet.suffix}")
    return paths


def _wall_figure(facet: Facet, panels: tuple[tuple[str, str], ...], exponents: pd.DataFrame,
                 crossovers: pd.DataFrame, failures: pd.DataFrame, keys: list[str]) -> Figure:
    """One wall figure: the panels, each with its exponent key below, the mixers on top, the notes at the bottom."""
    setting = facet.rows
    mixers = sorted(set(setting["mixer"]), key=mixer_rank)
    width = PANEL_WIDTH * len(panels) + FIGURE_MARGIN
    key_height = 0.16 * math.ceil(len(mixers) / 5) + 0.2
    fig = Figure(figsize=(width, PANEL_HEIGHT + key_height + 0.75 + (0.2 if facet.title else 0)),
                 layout="constrained")
    grid = fig.subplots(2, len(panels), squeeze=False, height_ratios=[PANEL_HEIGHT, key_height])
    reference = next((r for r in REFERENCES if r in mixers), None)
    for ax, key_ax, (metric, label) in zip(grid[0], grid[1], panels):
        fitted = _select(exponents, {}, metric=metric)
        _draw_cost_curves(ax, setting, metric, keys, mixers)
        _draw_failures(ax, failures)
        if reference:
            _draw_crossovers(ax, _select(crossovers, {}, metric=metric, reference=reference))
        _style_token_axis(ax, setting, facet.values)
        ax.yaxis.set_major_locator(NiceLogLocator())
        _plain_labels(ax.yaxis)
        ax.set_ylabel(label)
        _exponent_key(key_ax, fitted, mixers)
    _mixer_legend(fig, mixers, width, title=facet.title)
    _notes_legend(fig, failures, reference, panels, len(mixers))
    return fig


def _draw_cost_curves(ax: Axes, setting: pd.DataFrame, metric: str, keys: list[str], mixers: list[str]) -> None:
    """One line per mixer through its ok points (the median of the rows at each point)."""
    points = curve_points(setting, metric, keys)
    for mixer in mixers:
        line = points[points["mixer"] == mixer]
        style = mixer_style(mixer)
        ax.plot(line["tokens"], line[metric], color=style.color, marker=style.marker, linestyle=style.linestyle)
    ax.set_yscale("log")


def _exponent_key(ax: Axes, exponents: pd.DataFrame, mixers: list[str]) -> None:
    """Under a panel: each mixer's marker with its fitted exponent k ("–" when it has none)."""
    ax.axis("off")
    fitted = exponents.set_index("mixer")["exponent"] if len(exponents) else pd.Series(dtype=float)
    handles = []
    for mixer in mixers:
        style = mixer_style(mixer)
        k = fitted.get(mixer, math.nan)
        handles.append(Line2D([], [], color=style.color, marker=style.marker, linestyle="none",
                              label=f"{k:.2f}" if math.isfinite(k) else "–"))
    ax.legend(handles=handles, loc="upper center", ncol=min(len(handles), 5), frameon=False, borderaxespad=0,
              handletextpad=0.1, columnspacing=0.9, handlelength=1.2, fontsize=7,
              title=f"fitted $k$ of cost $\\propto N^k$ ({FIT_POINTS} largest N)", title_fontsize=6.5)


def _draw_failures(ax: Axes, failures: pd.DataFrame) -> None:
    """Mark the N where each curve stopped, in the mixer's colour, stacked near the top of the panel.

    The y position is in axes coordinates: a failed point has no cost to place it by.
    """
    if failures.empty or not ax.lines:
        return
    # Headroom above the data, so the markers sit in a band of their own instead of on the lines.
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, top * (top / bottom) ** (0.08 * len(failures) + 0.04))
    ordered = failures.sort_values("mixer", key=lambda s: s.map(mixer_rank))
    for row, (_, failure) in enumerate(ordered.iterrows()):
        ax.plot([failure["tokens"]], [0.95 - 0.07 * row], transform=ax.get_xaxis_transform(),
                marker=STATUS_MARKERS.get(failure["status"], "*"), markersize=7, markeredgewidth=1.6,
                color=mixer_style(failure["mixer"]).color, linestyle="none", clip_on=False, zorder=4)


def _draw_crossovers(ax: Axes, crossovers: pd.DataFrame) -> None:
    """Thin verticals, in the mixer's colour, at the N where it becomes cheaper than the reference."""
    for _, crossing in crossovers[crossovers["kind"] == "crosses"].iterrows():
        ax.axvline(crossing["tokens"], color=mixer_style(crossing["mixer"]).color, linestyle=(0, (2, 2)),
                   linewidth=0.9, alpha=0.9, zorder=1)


def _style_token_axis(ax: Axes, setting: pd.DataFrame, values: dict) -> None:
    """Log token axis spanning every attempted N, with image size on the top axis when one patch size applies."""
    tokens = sorted(setting["tokens"].unique())
    ax.set_xscale("log")
    ax.set_xlim(tokens[0] / 1.4, tokens[-1] * 1.4)
    _measured_ticks(ax.xaxis, tokens)
    ax.set_xlabel("Tokens N")
    patches = setting["patch_size"].unique()
    if "patch_size" in values or len(patches) == 1:
        patch = float(values.get("patch_size", patches[0]))
        top = ax.secondary_xaxis("top", functions=(lambda n: np.sqrt(np.clip(n, 1e-9, None)) * patch,
                                                  lambda s: (np.clip(s, 1e-9, None) / patch) ** 2))
        top.tick_params(labelsize=6.5)
        _measured_ticks(top.xaxis, sorted(setting["img_size"].unique()), fontsize=6.5)
        top.set_xlabel(f"Image size (px), patch {patch:.0f} px", fontsize=7)


def _notes_legend(fig: Figure, failures: pd.DataFrame, reference: str | None,
                  panels: tuple[tuple[str, str], ...], n_mixers: int) -> None:
    """The figure's notation at its foot: what the failure markers and the crossover lines mean."""
    handles = [Line2D([], [], color="0.2", marker=STATUS_MARKERS.get(s, "*"), linestyle="none",
                      markersize=6, markeredgewidth=1.4, label=f"stopped: {s}")
               for s in sorted(set(failures["status"]))]
    has_crossover_panel = any(m in ("latency_ms", "peak_mem_mb", "gmacs") for m, _ in panels)
    if reference and has_crossover_panel and n_mixers > 1:
        handles.append(Line2D([], [], color="0.2", linestyle=(0, (2, 2)), linewidth=0.9,
                              label=f"becomes cheaper than {reference} (line in the mixer's colour)"))
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False,
                   fontsize=6.5, handlelength=2.2)



# --- patch size against resolution -------------------------------------------------------------------------

_PATCH_LINESTYLES: tuple[str | tuple, ...] = ("-", "--", ":", "-.")


def patch_figures(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Patch size against resolution: the same N reached by different (image size, patch size) pairs.

    Panels: latency against N, latency against image size, and accuracy against N when one training setting
    measured it at two token counts or more. Colour and marker say the mixer; line style and marker fill say
    the patch size.

    Returns:
        The paths written.
    """
    if not runs["latency_ms"].notna().any():
        return []
    patches = sorted(runs["patch_size"].unique())
    paths = []
    for facet in facets(runs, facet_keys(runs)):
        points = cost_points(facet.rows, ["latency_ms"])
        points = points[points["status"] == "ok"].dropna(subset=["latency_ms"])
        if points.empty:
            continue  # a setting that failed at every point has no line to draw (its rows stay in the tables)
        accuracy = _accuracy_line_points(facet.rows)
        panels = [("tokens", "latency_ms", points), ("img_size", "latency_ms", points)]
        if accuracy is not None:
            panels.append(("tokens", "accuracy", accuracy))
        width = PANEL_WIDTH * len(panels) + FIGURE_MARGIN
        fig = Figure(figsize=(width, PANEL_HEIGHT + 0.75), layout="constrained")
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, (x, y, data) in zip(axes, panels):
            _draw_patch_panel(ax, data, x, y, patches)
        _mixer_legend(fig, sorted(set(points["mixer"]), key=mixer_rank), width, linestyles=False, title=facet.title)
        handles = [Line2D([], [], color="0.2", linestyle=_PATCH_LINESTYLES[i % 4], marker="o",
                          markerfacecolor="0.2" if i == 0 else "white", label=f"patch {p} px")
                   for i, p in enumerate(patches)]
        fig.legend(handles=handles, loc="outside lower center", frameon=False, handlelength=2.6,
                   ncol=_legend_columns([h.get_label() for h in handles], width, handle_in=2.6 * 7 / 72))
        paths += _save(fig, out_dir / f"patch_resolution{facet.suffix}")
    return paths


def _accuracy_line_points(rows: pd.DataFrame) -> pd.DataFrame | None:
    """Accuracy (%) per mixer, patch and N, when one training setting has a line of two N or more; else None."""
    trained = accuracy_rows(rows)
    if trained.empty or len(trained.groupby(["dataset", "epochs", "train"])) != 1:
        return None
    points = trained.groupby(["mixer", "patch_size", "img_size", "tokens"], as_index=False)["accuracy"].mean()
    if points.groupby(["mixer", "patch_size"])["tokens"].nunique().max() < 2:
        return None
    return points.assign(accuracy=points["accuracy"] * 100)


def _draw_patch_panel(ax: Axes, points: pd.DataFrame, x: str, y: str, patches: list[int]) -> None:
    """One line per mixer and patch size: filled markers for the smallest patch, open for the others."""
    for (mixer, patch), line in points.groupby(["mixer", "patch_size"]):
        line = line.sort_values(x)
        style = mixer_style(mixer)
        ax.plot(line[x], line[y], color=style.color, marker=style.marker,
                linestyle=_PATCH_LINESTYLES[patches.index(patch) % 4],
                markerfacecolor=style.color if patch == patches[0] else "white")
    ax.set_xscale("log")
    values = sorted(points[x].unique())
    ax.set_xlim(values[0] / 1.25, values[-1] * 1.25)
    _measured_ticks(ax.xaxis, values)
    ax.set_xlabel("Tokens N" if x == "tokens" else "Image size (px)")
    if y == "accuracy":
        ax.set_ylabel("Top-1 accuracy (%)")
    else:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(NiceLogLocator())
        _plain_labels(ax.yaxis)
        ax.set_ylabel("Inference latency per batch (ms)")
