"""Figures of a sweep report, as PNG (200 dpi) and PDF.

Every figure draws a mixer in the same colour, marker and line style (`mixer_style`), in every sweep, so a
reader learns the mapping once. Figures are built with `matplotlib.figure.Figure` rather than pyplot: no global
figure registry, no interactive backend, nothing to close.
"""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.axis import Axis
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, ScalarFormatter

from experiments.crossover import (
    FIT_POINTS, REFERENCES, curve_keys, curve_points, facet_keys, first_failures, iter_groups, mixer_rank,
)

# seaborn's colour-blind-safe palette (Okabe-Ito-like); indices into it below.
PALETTE: list[tuple[float, float, float]] = sns.color_palette("colorblind", 10)

# Fixed styles of the built-in mixers: (palette index, marker, line style). The two attentions share the blue
# family on purpose: they compute the same function.
_BUILTIN_STYLES: dict[str, tuple[int, str, str | tuple]] = {
    "attention": (0, "o", "-"),
    "attention_naive": (9, "s", "--"),
    "swin": (2, "^", "-."),
    "linear": (1, "D", (0, (1, 1.5))),
    "mamba": (3, "v", (0, (4, 1.5, 1, 1.5, 1, 1.5))),
}
# What a mixer a user adds draws from: the palette entries no built-in uses (but yellow, too faint on white),
# and other markers.
_FALLBACK_COLORS: tuple[int, ...] = (4, 5, 7, 6)
_FALLBACK_MARKERS: tuple[str, ...] = ("P", "X", "h", "<", ">", "p", "*")
_FALLBACK_LINESTYLES: tuple[str | tuple, ...] = ("-", "--", "-.", (0, (1, 1.5)))

# How a curve's end is marked, by the status of the first point that did not run.
STATUS_MARKERS: dict[str, str] = {"oom": "x", "timeout": "+", "error": "*", "skipped": "1", "diverged": "2"}

# Panels of the wall figures: (cost column, axis label with unit).
WALL_PANELS: tuple[tuple[str, str], ...] = (
    ("latency_ms", "Inference latency per batch (ms)"),
    ("peak_mem_mb", "Peak memory, inference (MiB)"),
    ("gmacs", "Forward GMACs per image"),
)
TRAIN_WALL_PANELS: tuple[tuple[str, str], ...] = (
    ("train_step_ms", "Training step per batch (ms)"),
    ("train_peak_mem_mb", "Peak memory, training step (MiB)"),
)

# Paper-sized text: the figures are drawn at the size they are printed (a two-column page is ~7 in wide).
RC: dict[str, object] = {
    **sns.axes_style("ticks"),
    "font.size": 8,
    "axes.labelsize": 8,
    "axes.titlesize": 8.5,
    "legend.fontsize": 6.5,
    "legend.title_fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "lines.linewidth": 1.3,
    "lines.markersize": 4,
    "axes.grid": True,
    "grid.color": "0.9",
    "grid.linewidth": 0.5,
    "pdf.fonttype": 42,  # TrueType, so the text stays editable and searchable in the PDF
}
DPI = 200

_SHORT_KEYS: dict[str, str] = {
    "preset": "preset", "overrides": "overrides", "device": "", "dtype": "", "batch_size": "batch",
    "dataset": "", "epochs": "epochs", "patch_size": "patch", "img_size": "image",
}


@dataclass(frozen=True)
class MixerStyle:
    """How one mixer is drawn in every figure."""

    color: tuple[float, float, float]
    marker: str
    linestyle: str | tuple


def mixer_style(name: str) -> MixerStyle:
    """The fixed style of a built-in mixer, or a stable one derived from the name of any other.

    The fallback hashes the name with CRC-32 (stable across runs and machines, unlike `hash`) into the palette
    entries that no built-in uses, and independently into markers and line styles, so two added mixers that
    share a colour still differ in marker.
    """
    if name in _BUILTIN_STYLES:
        color, marker, linestyle = _BUILTIN_STYLES[name]
        return MixerStyle(PALETTE[color], marker, linestyle)
    digest = zlib.crc32(name.encode("utf-8"))
    return MixerStyle(
        PALETTE[_FALLBACK_COLORS[digest % len(_FALLBACK_COLORS)]],
        _FALLBACK_MARKERS[(digest // 7) % len(_FALLBACK_MARKERS)],
        _FALLBACK_LINESTYLES[(digest // 49) % len(_FALLBACK_LINESTYLES)],
    )


def write_figures(runs: pd.DataFrame, exponents: pd.DataFrame, crossovers: pd.DataFrame,
                  out_dir: Path) -> list[Path]:
    """Draw every figure the sweep has data for.

    Args:
        runs: the loaded runs.
        exponents: from `crossover.exponent_table`.
        crossovers: from `crossover.crossover_table`.
        out_dir: folder for the files.

    Returns:
        The paths written.
    """
    with matplotlib.rc_context(RC):
        paths = wall_figures(runs, exponents, crossovers, out_dir, WALL_PANELS, "wall")
        paths += wall_figures(runs, exponents, crossovers, out_dir, TRAIN_WALL_PANELS, "wall_train")
        # Only a grid of image sizes x patch sizes reaches one N in several ways.
        if runs["patch_size"].nunique() > 1 and runs["img_size"].nunique() > 1:
            paths += patch_figures(runs, out_dir)
        if "accuracy" in runs and runs.loc[runs["status"] == "ok", "accuracy"].notna().any():
            paths += accuracy_figures(runs, out_dir)
    return paths


def wall_figures(runs: pd.DataFrame, exponents: pd.DataFrame, crossovers: pd.DataFrame, out_dir: Path,
                 panels: tuple[tuple[str, str], ...], name: str) -> list[Path]:
    """The quadratic wall: one panel per cost against N on log-log axes, one figure per curve setting.

    Each line is labelled with its fitted exponent; a curve that stops early gets its status marker at the N
    that failed, near the top of the panel; dotted verticals mark where a mixer becomes cheaper than the
    reference attention.

    Returns:
        The paths written; none when no panel has data.
    """
    panels = tuple((m, label) for m, label in panels if m in runs and runs[m].notna().any())
    if not panels:
        return []
    keys = curve_keys(runs)
    failures = first_failures(runs)
    paths = []
    for values, setting in iter_groups(runs, keys):
        # Each panel's legend sits in its own row below it: the exponents differ per panel, and a legend
        # inside would cover the small-N end of the lines.
        legend_height = 0.13 * setting["mixer"].nunique() + 0.1
        fig = Figure(figsize=(2.45 * len(panels) + 0.3, 2.75 + legend_height), layout="constrained")
        grid = fig.subplots(2, len(panels), squeeze=False, height_ratios=[2.75, legend_height])
        reference = next((r for r in REFERENCES if r in set(setting["mixer"])), None)
        for ax, legend_ax, (metric, label) in zip(grid[0], grid[1], panels):
            _draw_cost_curves(ax, setting, metric, keys, _select(exponents, values, metric=metric))
            _draw_failures(ax, _select(failures, values))
            if reference:
                _draw_crossovers(ax, _select(crossovers, values, metric=metric, reference=reference))
            _style_token_axis(ax, setting, values)
            ax.set_ylabel(label)
            legend_ax.axis("off")
            if ax.lines:
                legend_ax.legend(*ax.get_legend_handles_labels(), loc="upper center", frameon=False,
                                 handlelength=2.6, borderaxespad=0)
        fig.suptitle(_facet_title(values) or None, fontsize=8.5)
        _figure_legend(fig, setting, _select(failures, values), reference, panels)
        paths += _save(fig, out_dir / f"{name}{_facet_suffix(values)}")
    return paths


def patch_figures(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Patch size against resolution: the same N reached by different (image size, patch size) pairs.

    Panels: latency against N, latency against image size, and accuracy against N when measured. Colour and
    marker say the mixer; line style and marker fill say the patch size.

    Returns:
        The paths written.
    """
    patches = sorted(runs["patch_size"].unique())
    keys = facet_keys(runs)
    metrics = [m for m in ("latency_ms", "accuracy") if m in runs and runs[m].notna().any()]
    if "latency_ms" not in metrics:
        return []
    paths = []
    for values, setting in iter_groups(runs, keys):
        ok = setting[setting["status"] == "ok"]
        points = ok.groupby(["mixer", "patch_size", "img_size", "tokens"], as_index=False)[metrics].agg(
            {m: "median" if m != "accuracy" else "mean" for m in metrics})
        panels = [("tokens", "latency_ms"), ("img_size", "latency_ms")]
        if "accuracy" in metrics and points["accuracy"].notna().any():
            panels.append(("tokens", "accuracy"))
        fig = Figure(figsize=(2.45 * len(panels) + 0.3, 2.9), layout="constrained")
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, (x, y) in zip(axes, panels):
            for (mixer, patch), line in points.groupby(["mixer", "patch_size"]):
                line = line.dropna(subset=[y]).sort_values(x)
                style = mixer_style(mixer)
                first_patch = patch == patches[0]
                ax.plot(line[x], line[y] * (100 if y == "accuracy" else 1), color=style.color,
                        marker=style.marker, linestyle=_PATCH_LINESTYLES[patches.index(patch) % 4],
                        markerfacecolor=style.color if first_patch else "white")
            ax.set_xscale("log")
            _plain_log_ticks(ax.xaxis, sorted(points[x].unique()))
            ax.set_xlabel("Tokens N" if x == "tokens" else "Image size (px)")
            if y == "accuracy":
                ax.set_ylabel("Top-1 accuracy (%)")
            else:
                ax.set_yscale("log")
                ax.set_ylabel("Inference latency per batch (ms)")
        fig.suptitle(_facet_title(values) or None, fontsize=8.5)
        handles = [_mixer_handle(m, linestyle="-") for m in sorted(set(points["mixer"]), key=mixer_rank)]
        handles += [Line2D([], [], color="0.2", linestyle=_PATCH_LINESTYLES[i % 4], marker="o",
                           markerfacecolor="0.2" if i == 0 else "white", label=f"patch {p} px")
                    for i, p in enumerate(patches)]
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 7), frameon=False)
        paths += _save(fig, out_dir / f"patch_resolution{_facet_suffix(values)}")
    return paths


_PATCH_LINESTYLES: tuple[str | tuple, ...] = ("-", "--", ":", "-.")


def accuracy_figures(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Accuracy against cost (GMACs, latency), with the Pareto front of the points no other point dominates.

    Points average accuracy over seeds. Front points are labelled "image/patch".

    Returns:
        The paths written.
    """
    keys = facet_keys(runs)
    paths = []
    for values, setting in iter_groups(runs, keys):
        ok = setting[(setting["status"] == "ok") & setting["accuracy"].notna()]
        if ok.empty:
            continue
        costs = [c for c in ("gmacs", "latency_ms") if ok[c].notna().any()]
        if not costs:
            continue
        points = ok.groupby(["mixer", "img_size", "patch_size"], as_index=False).agg(
            accuracy=("accuracy", "mean"), **{c: (c, "median") for c in costs})
        points["accuracy"] *= 100
        fig = Figure(figsize=(2.6 * len(costs) + 0.3, 2.9), layout="constrained")
        axes = fig.subplots(1, len(costs), squeeze=False)[0]
        for ax, cost in zip(axes, costs):
            _draw_accuracy_panel(ax, points.dropna(subset=[cost]), cost)
        fig.suptitle(_facet_title(values) or None, fontsize=8.5)
        handles = [_mixer_handle(m, linestyle="none") for m in sorted(set(points["mixer"]), key=mixer_rank)]
        handles.append(Line2D([], [], color="0.25", linestyle="--", label="Pareto front (labels: image/patch px)"))
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), frameon=False)
        paths += _save(fig, out_dir / f"accuracy_cost{_facet_suffix(values)}")
    return paths


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


def _draw_accuracy_panel(ax: Axes, points: pd.DataFrame, cost: str) -> None:
    """Scatter of accuracy against one cost, the Pareto front as a step line, its points labelled."""
    for mixer, group in points.groupby("mixer"):
        style = mixer_style(mixer)
        ax.scatter(group[cost], group["accuracy"], color=style.color, marker=style.marker, s=18, zorder=3,
                   edgecolors="white", linewidths=0.4)
    front = points.iloc[pareto_front(points[cost].to_numpy(), points["accuracy"].to_numpy())]
    ax.step(front[cost], front["accuracy"], where="post", color="0.25", linestyle="--", linewidth=0.9, zorder=2)
    # Up and to the left of a front point lies nothing (such a point would dominate it): room for its label.
    # A run of front points at the same (image, patch) is labelled once, at its cheapest point.
    previous = None
    for _, point in front.iterrows():
        text = f"{point['img_size']:.0f}/{point['patch_size']:.0f}"
        if text != previous:
            ax.annotate(text, (point[cost], point["accuracy"]), xytext=(-3, 3), textcoords="offset points",
                        ha="right", va="bottom", fontsize=5.5, color="0.3")
        previous = text
    ax.margins(x=0.08, y=0.1)
    ax.set_xscale("log")
    ax.set_xlabel("Forward GMACs per image" if cost == "gmacs" else "Inference latency per batch (ms)")
    ax.set_ylabel("Top-1 accuracy (%)")


def _draw_cost_curves(ax: Axes, setting: pd.DataFrame, metric: str, keys: list[str],
                      exponents: pd.DataFrame) -> None:
    """One line per mixer, labelled with its fitted exponent, e.g. "linear (N^1.02)".

    A mixer with no ok point still gets a legend entry, so that its failure marker has a name.
    """
    points = curve_points(setting, metric, keys)
    fitted = exponents.set_index("mixer")["exponent"] if len(exponents) else pd.Series(dtype=float)
    for mixer in sorted(set(setting["mixer"]), key=mixer_rank):
        line = points[points["mixer"] == mixer]
        style = mixer_style(mixer)
        exponent = fitted.get(mixer, math.nan)
        label = f"{mixer} ($N^{{{exponent:.2f}}}$)" if math.isfinite(exponent) else mixer
        if line.empty:
            label = f"{mixer} (no ok point)"
        ax.plot(line["tokens"], line[metric], color=style.color, marker=style.marker,
                linestyle=style.linestyle, label=label)
    ax.set_yscale("log")


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
    _plain_log_ticks(ax.xaxis, tokens)
    ax.set_xlabel("Tokens N")
    patches = setting["patch_size"].unique()
    if "patch_size" in values or len(patches) == 1:
        patch = float(values.get("patch_size", patches[0]))
        top = ax.secondary_xaxis("top", functions=(lambda n: np.sqrt(np.clip(n, 1e-9, None)) * patch,
                                                  lambda s: (np.clip(s, 1e-9, None) / patch) ** 2))
        _plain_log_ticks(top.xaxis, sorted(setting["img_size"].unique()))
        top.set_xlabel(f"Image size (px), patch {patch:.0f}", fontsize=7)
        top.tick_params(labelsize=6.5)


def _plain_log_ticks(axis: Axis, ticks: list[float], max_labels: int = 6) -> None:
    """Ticks at the measured values (thinned to `max_labels`) with plain labels: "1024", not "10^3".

    Token counts of a resolution sweep are few and evenly spaced in log, so they make the clearest ticks.
    """
    step = max(1, math.ceil(len(ticks) / max_labels))
    shown = list(ticks)[::-1][::step][::-1]  # keep the largest, where the interesting end of the wall is
    axis.set_major_locator(FixedLocator(shown))
    formatter = ScalarFormatter()
    formatter.set_scientific(False)
    axis.set_major_formatter(formatter)
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _figure_legend(fig: Figure, setting: pd.DataFrame, failures: pd.DataFrame, reference: str | None,
                   panels: tuple[tuple[str, str], ...]) -> None:
    """The figure-wide key: what the failure markers and crossover lines mean, how exponents were fitted."""
    handles = [Line2D([], [], color="0.2", marker=STATUS_MARKERS.get(s, "*"), linestyle="none",
                      markersize=6, markeredgewidth=1.4, label=f"stopped: {s}")
               for s in sorted(set(failures["status"]))]
    has_crossover_panel = any(m in ("latency_ms", "peak_mem_mb", "gmacs") for m, _ in panels)
    if reference and has_crossover_panel and len(set(setting["mixer"])) > 1:
        handles.append(Line2D([], [], color="0.2", linestyle=(0, (2, 2)), linewidth=0.9,
                              label=f"becomes cheaper than {reference} (in the mixer's colour)"))
    handles.append(Line2D([], [], linestyle="none",
                          label=f"$N^k$: log-log slope over the {FIT_POINTS} largest ok N"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)


def _mixer_handle(mixer: str, linestyle: str) -> Line2D:
    """A legend entry in the mixer's colour and marker."""
    style = mixer_style(mixer)
    return Line2D([], [], color=style.color, marker=style.marker, linestyle=linestyle, label=mixer)


def _select(frame: pd.DataFrame, values: dict, **extra: object) -> pd.DataFrame:
    """Rows of `frame` matching every key value given."""
    mask = pd.Series(True, index=frame.index)
    for key, value in {**values, **extra}.items():
        mask &= frame[key] == value
    return frame[mask]


def _facet_title(values: dict) -> str:
    """A figure title naming the setting, e.g. "preset tiny · batch 8 · bfloat16 · patch 16"."""
    parts = []
    for key, value in values.items():
        value = f"{value:g}" if isinstance(value, float) else str(value)
        unit = " px" if key in ("patch_size", "img_size") else ""
        parts.append(f"{_SHORT_KEYS.get(key, key)} {value}{unit}".strip())
    return " · ".join(parts)


def _facet_suffix(values: dict) -> str:
    """A file-name suffix naming the setting, e.g. "_preset-tiny_batch-8_patch-16"; empty for one setting."""
    parts = []
    for key, value in values.items():
        text = "default" if key == "overrides" and str(value) in ("", "{}") else str(value)
        text = re.sub(r"[^A-Za-z0-9.]+", "", text.replace(":", "-"))[:40] or "none"
        parts.append(f"{_SHORT_KEYS.get(key) or key}-{text}")
    return "".join(f"_{p}" for p in parts)


def _save(fig: Figure, stem: Path) -> list[Path]:
    """Write `<stem>.png` and `<stem>.pdf`, without timestamps so that a rebuild is byte-stable."""
    png, pdf = stem.with_suffix(".png"), stem.with_suffix(".pdf")
    fig.savefig(png, dpi=DPI, metadata={"Software": None})
    fig.savefig(pdf, metadata={"CreationDate": None, "Creator": None, "Producer": None})
    return [png, pdf]
