"""Figures of a sweep report, as PNG (200 dpi) and PDF.

Every figure draws a mixer in the same colour, marker and line style (`mixer_style`), in every sweep, so a
reader learns the mapping once. Figures are built with `matplotlib.figure.Figure` rather than pyplot: no global
figure registry, no interactive backend, nothing to close.

Cost figures (the wall, patch against resolution) split only on the keys a cost depends on
(`crossover.COST_KEYS`), so a training row and a cost-only row of one configuration are one point (their median).
Accuracy figures split on the data set, epochs and recipe too, and read the rows that have an accuracy. A figure
file is named by the keys that differ between the figures of its kind, e.g. `wall_patch-4.png`.
"""
from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, Locator, LogLocator, MaxNLocator, NullFormatter, NullLocator

from .crossover import (
    COST_KEYS, FIT_POINTS, REFERENCES, accuracy_facet_keys, accuracy_rows, cost_points, curve_keys, curve_points,
    facet_keys, first_failures, iter_groups, mixer_rank,
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

# Axis labels of the costs an accuracy figure is drawn against.
COST_LABELS: dict[str, str] = {"gmacs": "Forward GMACs per image", "latency_ms": "Inference latency per batch (ms)"}

# Paper-sized text: the figures are drawn at the size they are printed (a two-column page is ~7 in wide).
RC: dict[str, object] = {
    **sns.axes_style("ticks"),
    "font.size": 8,
    "axes.labelsize": 8,
    "axes.titlesize": 8.5,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "legend.columnspacing": 1.2,
    "legend.handletextpad": 0.5,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "lines.linewidth": 1.3,
    "lines.markersize": 4.5,
    "axes.grid": True,
    "grid.color": "0.9",
    "grid.linewidth": 0.5,
    "pdf.fonttype": 42,  # TrueType, so the text stays editable and searchable in the PDF
}
DPI = 200

# Sizes, in inches: one panel (axes and its tick labels) and the extra width of a figure's outer margins.
PANEL_WIDTH, PANEL_HEIGHT, FIGURE_MARGIN = 2.45, 2.3, 0.3

# How each facet key reads in a file name and in a title ("{}" is the value).
_NAME_FORMS: dict[str, str] = {
    "preset": "{}", "device": "{}", "dtype": "{}", "dataset": "{}", "batch_size": "batch-{}",
    "epochs": "epochs-{}", "patch_size": "patch-{}", "img_size": "img-{}", "seed": "seed-{}",
}
_TITLE_FORMS: dict[str, str] = {
    "preset": "preset {}", "device": "{}", "dtype": "{}", "dataset": "{}", "batch_size": "batch {}",
    "epochs": "{} epochs", "patch_size": "patch {} px", "img_size": "image {} px", "seed": "seed {}",
    "overrides": "{}", "train": "recipe {}",
}
# Facet keys holding JSON: they are named by the fields that differ between facets.
_JSON_KEYS: tuple[str, ...] = ("overrides", "train")


@dataclass(frozen=True)
class MixerStyle:
    """How one mixer is drawn in every figure."""

    color: tuple[float, float, float]
    marker: str
    linestyle: str | tuple


@dataclass(frozen=True)
class Facet:
    """One figure of a kind: its key values, its rows, and how it is named and titled."""

    values: dict
    rows: pd.DataFrame
    suffix: str  # file-name suffix, e.g. "_patch-4"; empty for the only figure of its kind
    title: str  # e.g. "preset tiny · batch 8"; empty when nothing needs saying


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
        if not accuracy_rows(runs).empty:
            paths += accuracy_figures(runs, out_dir)
    return paths


# --- facets: which figures, and their names ----------------------------------------------------------------

def facets(rows: pd.DataFrame, keys: list[str], always: tuple[str, ...] = (), untitled: tuple[str, ...] = (),
           context: tuple[str, ...] = ()) -> list[Facet]:
    """One facet per combination of `keys` that exists in `rows`, named by the keys that differ between facets.

    Args:
        rows: the rows to split.
        keys: the keys that pick a figure.
        always: keys named even when they are the same in every facet (e.g. the data set of an accuracy figure).
        untitled: keys left out of the title because the figure says them elsewhere (e.g. on an axis).
        context: keys added to the title (not the name) when they hold one value in the facet (e.g. epochs).

    Returns:
        The facets, sorted by their key values.
    """
    named = list(dict.fromkeys([*always, *keys]))
    groups = list(iter_groups(rows, named))
    differing = [k for k in named if k in always or len({str(v[k]) for v, _ in groups}) > 1]
    texts = {k: _value_texts([v[k] for v, _ in groups], k) for k in differing}
    result = []
    for i, (values, sub) in enumerate(groups):
        names = [_file_part(_NAME_FORMS.get(k, "{}").format(texts[k][i][0])) for k in differing]
        titles = [_title_part(k, texts[k][i][1]) for k in differing if k not in untitled]
        titles += [_title_part(k, _value_texts([sub[k].iloc[0]], k)[0][1])
                   for k in context if k not in differing and sub[k].nunique() == 1]
        result.append(Facet(values, sub, "".join(f"_{n}" for n in names), " · ".join(titles)))
    return result


def _title_part(key: str, text: str) -> str:
    """A key's value as a title reads it: "patch 4 px", "1 epoch", "recipe lr=0.01"."""
    if key == "epochs" and text == "1":
        return "1 epoch"
    return _TITLE_FORMS.get(key, key + " {}").format(text)


def _value_texts(values: list, key: str) -> list[tuple[str, str]]:
    """(file-name text, title text) of one key's value in each facet: the JSON fields that differ, or the value."""
    if key in _JSON_KEYS:
        fields = json_differences([str(v) for v in values])
        return [("_".join(f"{f}-{v}" if f else v for f, v in d.items()) or "default",
                 ", ".join(f"{f}={v}" if f else v for f, v in d.items()) or "default") for d in fields]
    plain = [f"{v:g}" if isinstance(v, float) else str(v) if str(v) != "" else "none" for v in values]
    return [(text, text) for text in plain]


def json_differences(texts: list[str]) -> list[dict[str, str]]:
    """For JSON objects (e.g. training recipes), the fields that differ between them, as short text.

    A field one object lacks reads "default"; text that is not a JSON object stands for itself (field ""). With
    one object, every field is given.

    Examples:
        >>> json_differences(['{"lr": 0.01, "bs": 64}', '{"bs": 64}'])
        [{'lr': '0.01'}, {'lr': 'default'}]
    """
    parsed = [_json_object(t) for t in texts]
    if any(p is None for p in parsed):
        return [{"": t or "none"} for t in texts]
    fields = sorted({f for p in parsed for f in p})
    if len(parsed) > 1:
        fields = [f for f in fields if len({json.dumps(p.get(f), sort_keys=True) for p in parsed}) > 1]
    return [{f: _json_value(p.get(f, "default")) for f in fields} for p in parsed]


def _json_object(text: str) -> dict | None:
    """The JSON object in `text`, {} for empty text, None when it is not an object."""
    if text.strip() in ("", "{}"):
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _json_value(value: object) -> str:
    """A JSON field's value, compact."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)


def _file_part(text: str) -> str:
    """Text safe in a file name: letters, digits and . _ - only, at most 40 characters."""
    return re.sub(r"[^A-Za-z0-9._-]+", "", text.replace(":", "-").replace(",", "-"))[:40] or "none"


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
    if facet.title:
        fig.suptitle(facet.title, fontsize=8.5)
    _mixer_legend(fig, mixers, width)
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
        accuracy = _accuracy_line_points(facet.rows)
        panels = [("tokens", "latency_ms", points), ("img_size", "latency_ms", points)]
        if accuracy is not None:
            panels.append(("tokens", "accuracy", accuracy))
        width = PANEL_WIDTH * len(panels) + FIGURE_MARGIN
        fig = Figure(figsize=(width, PANEL_HEIGHT + 0.75), layout="constrained")
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, (x, y, data) in zip(axes, panels):
            _draw_patch_panel(ax, data, x, y, patches)
        if facet.title:
            fig.suptitle(facet.title, fontsize=8.5)
        _mixer_legend(fig, sorted(set(points["mixer"]), key=mixer_rank), width, linestyles=False)
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


# --- accuracy against cost ---------------------------------------------------------------------------------

def accuracy_figures(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Accuracy against cost (GMACs, latency), with the Pareto front of the points no other point dominates.

    One figure per data set, epochs, recipe and varying cost key. Accuracy is the mean over seeds of the rows
    that have one; the costs are the cost point's (the median over every row of that configuration, as in the
    wall figures and the costs table). Front points are labelled "image/patch" when the points differ in size.

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
        points = facet.rows.groupby(point, as_index=False)["accuracy"].mean().merge(point_costs, on=point,
                                                                                    how="left")
        points["accuracy"] *= 100
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
    fig.suptitle(title.strip(" ·"), fontsize=8.5)
    handles = [_mixer_handle(m, linestyle="none") for m in sorted(set(points["mixer"]), key=mixer_rank)]
    front = "Pareto front" + ("" if one_size else " (image/patch px)")
    handles.append(Line2D([], [], color="0.25", linestyle="--", linewidth=0.9, label=front))
    fig.legend(handles=handles, loc="outside lower center", frameon=False, handlelength=1.6,
               ncol=_legend_columns([h.get_label() for h in handles], width, handle_in=1.6 * 7 / 72))
    return fig


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
    """Scatter of accuracy against one cost, the Pareto front as a step line, its points optionally labelled."""
    for mixer, group in points.groupby("mixer"):
        style = mixer_style(mixer)
        ax.scatter(group[cost], group["accuracy"], color=style.color, marker=style.marker, s=30, zorder=3,
                   edgecolors="white", linewidths=0.5)
    front = points.iloc[pareto_front(points[cost].to_numpy(), points["accuracy"].to_numpy())]
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


# --- axes, legends and files -------------------------------------------------------------------------------

class MeasuredLocator(Locator):
    """Ticks at measured values (token counts, image sizes), thinned at draw time so no two labels touch.

    Token counts of a resolution sweep are few and evenly spaced in log, so they make the clearest ticks. The
    largest value is always kept (the interesting end of the wall); going down, a value is kept when its label
    clears the last kept one, measured in the axis's printed width.
    """

    def __init__(self, values: Iterable[float], fontsize: float = 7, gap_in: float = 0.04) -> None:
        self.values = sorted(float(v) for v in values)
        self.fontsize, self.gap_in = fontsize, gap_in

    def __call__(self) -> list[float]:
        lo, hi = sorted(self.axis.get_view_interval())
        inside = [v for v in self.values if lo * 0.999 <= v <= hi * 1.001]
        return _spaced(inside, lo, hi, self.axis, self.fontsize, self.gap_in)


class NiceLogLocator(Locator):
    """Major ticks of a log axis at round values with plain labels, as many as fit.

    Decades when three or more are in view, else 1-2-5 steps, else 1-1.5-2-3-5-7 steps, else a linear
    `MaxNLocator` (a narrow range); then thinned like `MeasuredLocator` so labels never touch.
    """

    def __init__(self, fallback_bins: int = 4, fontsize: float = 7) -> None:
        self.fallback_bins, self.fontsize = fallback_bins, fontsize

    def __call__(self) -> list[float]:
        lo, hi = sorted(self.axis.get_view_interval())
        if lo <= 0:
            return []
        for mantissas in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7)):
            values = [m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                      for m in mantissas if lo <= m * 10.0**e <= hi]
            if len(values) >= 3:
                break
        else:
            values = [v for v in MaxNLocator(nbins=self.fallback_bins).tick_values(lo, hi) if lo <= v <= hi]
        return _spaced(values, lo, hi, self.axis, self.fontsize, 0.05)


def _spaced(values: list[float], lo: float, hi: float, axis: Axis, fontsize: float, gap_in: float) -> list[float]:
    """The values, thinned from the largest down so that neighbouring labels are `gap_in` inches apart or more."""
    if len(values) < 2 or lo <= 0 or hi <= lo:
        return values
    bbox = axis.axes.get_window_extent()
    vertical = axis.axis_name == "y"
    length_in = (bbox.height if vertical else bbox.width) / axis.get_figure(root=True).dpi
    size_in = fontsize / 72

    def extent(value: float) -> float:  # a label's size along the axis, in inches
        return size_in * (1.0 if vertical else 0.6 * len(_tick_text(value)))

    def position(value: float) -> float:
        return length_in * math.log(value / lo) / math.log(hi / lo)

    kept = [values[-1]]
    for value in reversed(values[:-1]):
        if position(kept[-1]) - position(value) >= (extent(kept[-1]) + extent(value)) / 2 + gap_in:
            kept.append(value)
    return kept[::-1]


def _tick_text(value: float) -> str:
    """A plain tick label: "4,096", "256", "1.5", "0.014"; never "10^3"."""
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _measured_ticks(axis: Axis, values: list[float], fontsize: float = 7) -> None:
    """Major ticks at the measured values with plain labels; no minor ticks."""
    axis.set_major_locator(MeasuredLocator(values, fontsize))
    _plain_labels(axis)
    axis.set_minor_locator(NullLocator())


def _plain_labels(axis: Axis) -> None:
    """Plain major labels (`_tick_text`), unlabelled minor ticks (at 2-9 x 10^k on a log axis)."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: _tick_text(v)))
    if axis.get_scale() == "log" and not isinstance(axis.get_minor_locator(), NullLocator):
        axis.set_minor_locator(LogLocator(subs="auto"))
    axis.set_minor_formatter(NullFormatter())


def _legend_columns(labels: list[str], width_in: float, handle_in: float, font_pt: float = 7) -> int:
    """The columns of a legend in as few rows as fit in `width_in` inches, balanced (no near-empty last row).

    Entries fill a legend column by column, and each column is as wide as its widest entry.
    """
    def width(ncol: int) -> float:
        rows = math.ceil(len(labels) / ncol)
        columns = [labels[i:i + rows] for i in range(0, len(labels), rows)]
        spacing = (RC["legend.columnspacing"] + RC["legend.handletextpad"]) * font_pt / 72
        return sum(max(len(t) for t in c) * 0.58 * font_pt / 72 + handle_in + spacing for c in columns)

    for rows in range(1, len(labels) + 1):
        ncol = math.ceil(len(labels) / rows)
        if width(ncol) <= width_in - 0.1:
            return ncol
    return 1


def _mixer_legend(fig: Figure, mixers: list[str], width_in: float, linestyles: bool = True) -> None:
    """The mixers' key at the top of the figure, wrapped to its width; solid lines when style means else."""
    handles = [_mixer_handle(m, linestyle=mixer_style(m).linestyle if linestyles else "-") for m in mixers]
    fig.legend(handles=handles, loc="outside upper center", frameon=False, handlelength=2.6,
               ncol=_legend_columns(mixers, width_in, handle_in=2.6 * 7 / 72))


def _mixer_handle(mixer: str, linestyle: str | tuple) -> Line2D:
    """A legend entry in the mixer's colour and marker."""
    style = mixer_style(mixer)
    return Line2D([], [], color=style.color, marker=style.marker, linestyle=linestyle, label=mixer)


def _select(frame: pd.DataFrame, values: dict, **extra: object) -> pd.DataFrame:
    """Rows of `frame` matching every key value given."""
    mask = pd.Series(True, index=frame.index)
    for key, value in {**values, **extra}.items():
        mask &= frame[key] == value
    return frame[mask]


def _save(fig: Figure, stem: Path) -> list[Path]:
    """Write `<stem>.png` and `<stem>.pdf`, without timestamps so that a rebuild is byte-stable."""
    png, pdf = stem.with_suffix(".png"), stem.with_suffix(".pdf")
    fig.savefig(png, dpi=DPI, metadata={"Software": None})
    fig.savefig(pdf, metadata={"CreationDate": None, "Creator": None, "Producer": None})
    return [png, pdf]
