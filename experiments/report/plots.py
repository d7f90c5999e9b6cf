"""How every figure of a sweep report looks and is named: mixer styles, facets, axes, legends, PNG (200 dpi) and PDF.

Every figure draws a mixer in the same colour, marker and line style (`mixer_style`), in every sweep, so a
reader learns the mapping once. Figures are built with `matplotlib.figure.Figure` rather than pyplot: no global
figure registry, no interactive backend, nothing to close.

The figures themselves are drawn by `plots_cost` (the wall, patch against resolution) and `plots_accuracy`;
`build.write_figures` draws every one the sweep has data for. A figure file is named by the keys that differ
between the figures of its kind, e.g. `wall_patch-4.png`.
"""
from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, Locator, LogLocator, MaxNLocator, NullFormatter, NullLocator

from .crossover import iter_groups
from .point_keys import json_object


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
    "identity": (7, "x", ":"),  # the negative control (no mixing): grey and dotted, read as a floor
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
    "epochs": "epochs-{}", "patch_size": "patch-{}", "img_size": "img-{}", "seed": "seed-{}", "timing_mode": "{}",
}
_TITLE_FORMS: dict[str, str] = {
    "preset": "preset {}", "device": "{}", "dtype": "{}", "dataset": "{}", "batch_size": "batch {}",
    "epochs": "{} epochs", "patch_size": "patch {} px", "img_size": "image {} px", "seed": "seed {}",
    "overrides": "{}", "train": "recipe {}", "timing_mode": "{} timing",
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
    base = name.split(" (", 1)[0]
    if base != name and base in _BUILTIN_STYLES:  # one implementation of a split series: its mixer's colour
        color, marker, _ = _BUILTIN_STYLES[base]
        digest = zlib.crc32(name.encode("utf-8"))
        return MixerStyle(PALETTE[color], marker, _FALLBACK_LINESTYLES[digest % len(_FALLBACK_LINESTYLES)])
    digest = zlib.crc32(name.encode("utf-8"))
    return MixerStyle(
        PALETTE[_FALLBACK_COLORS[digest % len(_FALLBACK_COLORS)]],
        _FALLBACK_MARKERS[(digest // 7) % len(_FALLBACK_MARKERS)],
        _FALLBACK_LINESTYLES[(digest // 49) % len(_FALLBACK_LINESTYLES)],
    )



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
    if key == "batch_size":  # batch size 0 is "max", the largest that fits
        values = ["max" if str(v) == "0" else v for v in values]
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
    parsed = [json_object(t) for t in texts]
    if any(p is None for p in parsed):
        return [{"": t or "none"} for t in texts]
    fields = sorted({f for p in parsed for f in p})
    if len(parsed) > 1:
        fields = [f for f in fields if len({json.dumps(p.get(f), sort_keys=True) for p in parsed}) > 1]
    return [{f: _json_value(p.get(f, "default")) for f in fields} for p in parsed]


def _json_value(value: object) -> str:
    """A JSON field's value, compact."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)


def _file_part(text: str) -> str:
    """Text safe in a file name: letters, digits and . _ - only, at most 40 characters."""
    return re.sub(r"[^A-Za-z0-9._-]+", "", text.replace(":", "-").replace(",", "-"))[:40] or "none"



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


def _mixer_legend(fig: Figure, mixers: list[str], width_in: float, linestyles: bool = True, title: str = "") -> None:
    """The mixers' key at the top of the figure, wrapped to its width; solid lines when style means else.

    The facet's title heads the key: as a suptitle it would share the top band with the key and overlap it.
    """
    handles = [_mixer_handle(m, linestyle=mixer_style(m).linestyle if linestyles else "-") for m in mixers]
    fig.legend(handles=handles, loc="outside upper center", frameon=False, handlelength=2.6,
               ncol=_legend_columns(mixers, width_in, handle_in=2.6 * 7 / 72), title=title or None,
               title_fontsize=8.5)


def percent_error_bars(mean: pd.Series, low: pd.Series, high: pd.Series) -> list[pd.Series]:
    """`yerr` for accuracy in %: the interval clipped to [0, 100], and none where there is no interval.

    A 95% t interval from 3 seeds can pass 100% (a bimodal spread: some seeds learn, others do not); an axis
    running to 140% would say nothing that the clipped bar does not (the tables clip it too: `stats.ACCURACY_BOUNDS`).
    """
    below = (mean - low.clip(lower=0)).clip(lower=0).fillna(0)
    above = (high.clip(upper=100) - mean).clip(lower=0).fillna(0)
    return [below, above]


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
    # Appended, not with_suffix: a facet's stem may hold a dot (a rate, "lr-0.0005"), which with_suffix would cut.
    png, pdf = stem.parent / f"{stem.name}.png", stem.parent / f"{stem.name}.pdf"
    fig.savefig(png, dpi=DPI, metadata={"Software": None})
    fig.savefig(pdf, metadata={"CreationDate": None, "Creator": None, "Producer": None})
    return [png, pdf]
