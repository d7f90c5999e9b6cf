"""Tables of a sweep report: costs per point, scaling exponents and crossovers, as CSV, Markdown and LaTeX.

Each table exists twice: a numeric frame (written as CSV, for re-analysis) and a display frame of formatted
strings (written as Markdown and booktabs LaTeX, for reading). Headers carry their units.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from ..lr_grid import format_rate
from ..schema import MAX_BATCH
from .stats import ACCURACY_BOUNDS, chance, seed_stats
from .crossover import (
    COST_KEYS, COST_METRICS, RECIPE_KEYS, accuracy_facet_keys, accuracy_rows, cost_points, curve_keys, varying_keys,
)
from .mixer_order import mixer_rank
from .convergence import UNCONVERGED_MARK, converged_cell, converged_flags
from .flags import add_flags, point_flags

# Readable headers, with units, for every column a table can show.
HEADERS: dict[str, str] = {
    "mixer": "Mixer",
    "preset": "Preset",
    "overrides": "Overrides",
    "device": "Device",
    "dtype": "Dtype",
    "batch_size": "Batch",
    "dataset": "Dataset",
    "epochs": "Epochs",
    "seed": "Seed",
    "train": "Recipe",
    "seeds": "Seeds",
    "img_size": "Image (px)",
    "patch_size": "Patch (px)",
    "tokens": "Tokens N",
    "params": "Params (M)",
    "gmacs": "GMACs / img",
    "latency_ms": "Latency (ms)",
    "latency_iqr_ms": "Latency IQR (ms)",
    "throughput_img_s": "Throughput (img/s)",
    "peak_mem_mb": "Peak mem. inference (MiB)",
    "train_step_ms": "Train step (ms)",
    "train_step_iqr_ms": "Train step IQR (ms)",
    "train_peak_mem_mb": "Peak mem. train (MiB)",
    "accuracy": "Top-1 acc. (%)",
    "accuracy_sd": "Acc. s.d. (%)",
    "accuracy_ci_low": "Acc. 95% CI low (%)",
    "accuracy_ci_high": "Acc. 95% CI high (%)",
    "chance": "Chance (%)",
    "lr": "LR",
    "val_accuracy": "Val. acc. (%)",
    "train_time_s": "Train time (s)",
    "status": "Status",
    "train_status": "Train step status",
    "impl": "Impl.",
    "reference": "Reference",
    "timing_mode": "Timing",
    "batch_used": "Batch used",
    "train_batch_used": "Train batch used",
    "peak_mem_total_mb": "Peak mem. total (MiB)",
    "peak_mem_reserved_mb": "Peak mem. reserved (MiB)",
    "achieved_tflops": "TFLOP/s",
    "mfu": "MFU (%)",
    "train_achieved_tflops": "Train TFLOP/s",
    "train_mfu": "Train MFU (%)",
    "flags": "Flags",
}

# Cost columns of the main table, in order; each is shown only when the sweep has a value for it.
COST_TABLE_METRICS: tuple[str, ...] = (
    "params", "gmacs", "batch_used", "latency_ms", "latency_iqr_ms", "throughput_img_s", "achieved_tflops", "mfu",
    "peak_mem_mb", "peak_mem_total_mb", "peak_mem_reserved_mb",
    "train_batch_used", "train_step_ms", "train_step_iqr_ms", "train_achieved_tflops", "train_mfu", "train_peak_mem_mb",
)

# Shown even where no row has a value ("–"): how close a point came to the device's measured peak.
ALWAYS_SHOWN: tuple[str, ...] = ("mfu",)

# Fractions shown in percent.
PERCENT_COLUMNS: tuple[str, ...] = ("mfu", "train_mfu")

# Timings shown as one "median ± IQR" cell: the median column, its spread column and the cell's header.
SPREAD_COLUMNS: dict[str, tuple[str, str]] = {
    "latency_ms": ("latency_iqr_ms", "Latency (ms, median ± IQR)"),
    "train_step_ms": ("train_step_iqr_ms", "Train step (ms, median ± IQR)"),
}

# Key columns shown even when constant: they say where a point sits on its curve.
POINT_KEYS: tuple[str, ...] = ("img_size", "patch_size", "tokens")

# Metric names in exponent and crossover table headers.
METRIC_LABELS: dict[str, str] = {
    "latency_ms": "Latency",
    "peak_mem_mb": "Peak mem.",
    "gmacs": "MACs",
    "train_step_ms": "Train step",
    "train_peak_mem_mb": "Peak mem. train",
}

MISSING = "–"  # an en dash for an empty cell


def fmt_number(value: float, digits: int = 3) -> str:
    """Format to `digits` significant figures without scientific notation, with thousands separators."""
    if value is None or not math.isfinite(value):
        return MISSING
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def fmt_spread(median: float, iqr: float, digits: int = 3) -> str:
    """`median ± iqr`, the spread to the median's decimals, so the two read as one measurement."""
    text = fmt_number(median, digits)
    if text == MISSING or iqr is None or not math.isfinite(iqr):
        return text
    decimals = len(text.split(".")[1]) if "." in text else 0
    return f"{text} ± {iqr:,.{decimals}f}"


def display_keys(points: pd.DataFrame, keys: tuple[str, ...] = COST_KEYS) -> list[str]:
    """Key columns a table shows: the mixer, the other `keys` that vary, and the point's place on its curve."""
    varying = [k for k in varying_keys(points, keys) if k not in ("mixer",) + POINT_KEYS]
    return ["mixer"] + varying + list(POINT_KEYS)


def sort_rows(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Sort by the keys, with the built-in mixers first in their fixed order."""
    def rank(column: pd.Series) -> pd.Series:
        return column.map(mixer_rank) if column.name in ("mixer", "reference") else column

    return frame.sort_values(keys, key=rank, ignore_index=True)


def cost_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The main table: one row per cost point (`crossover.cost_points`), every status kept.

    Rows of one configuration (a cost-only row and a training row, or several seeds) are one point: each cost is
    their median. The status reads "ok (train step oom)" where the inference ran but the training step did not.

    Returns:
        The numeric frame (parameters in millions) and its display frame, where latency and train step read
        "median ± IQR".
    """
    trained = "train_step_ms" in runs and runs["train_step_ms"].notna().any()
    metrics = [c for c in COST_TABLE_METRICS if c in runs and (runs[c].notna().any() or c in ALWAYS_SHOWN
                                                               or (c == "train_mfu" and trained))]
    points = cost_points(runs, metrics)
    keys = display_keys(points)
    # Rows run along each curve: by patch size, then token count.
    order = [k for k in keys if k not in POINT_KEYS] + ["patch_size", "tokens", "img_size"]
    extra = ["status"] + (["train_status"] if points["train_status"].ne("").any() else []) + ["impl"]
    points["flags"] = add_flags(points, point_flags(runs, curve_keys(runs)))
    extra += ["flags"] if points["flags"].ne("").any() else []
    numeric = sort_rows(points[keys + metrics + extra], order)
    if "params" in numeric:
        numeric["params"] = numeric["params"] / 1e6
    for column in PERCENT_COLUMNS:
        if column in numeric:
            numeric[column] = numeric[column] * 100

    display = _metric_cells(numeric, keys, metrics)
    display[HEADERS["status"]] = [_status_cell(row) for _, row in numeric.iterrows()]
    display[HEADERS["impl"]] = numeric["impl"].replace("", MISSING)
    if "flags" in numeric:
        display[HEADERS["flags"]] = numeric["flags"].replace("", MISSING)
    return numeric.rename(columns=HEADERS), display.rename(columns=HEADERS)


def _metric_cells(numeric: pd.DataFrame, keys: list[str], metrics: list[str]) -> pd.DataFrame:
    """The display frame of `keys` (as text) and `metrics` (formatted, timings as "median ± IQR")."""
    display = numeric[keys].astype(str)
    if "batch_size" in keys:
        display["batch_size"] = numeric["batch_size"].map(batch_text)
    for column in metrics:
        if any(column == iqr for iqr, _ in SPREAD_COLUMNS.values()):
            continue  # folded into its median's cell
        if column in SPREAD_COLUMNS and SPREAD_COLUMNS[column][0] in numeric:
            iqr, header = SPREAD_COLUMNS[column]
            display[header] = [fmt_spread(m, s) for m, s in zip(numeric[column], numeric[iqr])]
        elif column in ("batch_used", "train_batch_used"):
            display[HEADERS[column]] = numeric[column].map(lambda v: f"{v:,.0f}" if math.isfinite(v) else MISSING)
        else:
            digits = 4 if column == "throughput_img_s" else 3
            display[HEADERS[column]] = numeric[column].map(lambda v: fmt_number(v, digits))
    return display


def batch_text(batch: object) -> str:
    """A batch_size key as a reader reads it: the number, or "max" for the largest that fits (`MAX_BATCH`)."""
    return "max" if str(batch) == str(MAX_BATCH) else str(batch)


def _status_cell(row: pd.Series) -> str:
    """The point's status, with the training step's when that alone failed."""
    train = row.get("train_status", "")
    if row["status"] == "ok" and train not in ("ok", "", None) and isinstance(train, str):
        return f"ok (train step {train})"
    return str(row["status"])


def accuracy_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per trained point: accuracy over seeds (mean, s.d., 95% t interval, n) beside params and GMACs.

    The accuracy comes from the rows with one (`crossover.accuracy_rows`); the cost columns are the cost point's
    (`crossover.cost_points`), so they read the same as in the costs table. Data set and epochs are always shown,
    the other recipe and cost keys when they vary. Chance is the data set's (`stats.CHANCE`), when known.

    Returns:
        The numeric frame (accuracy in percent, params in millions) and its display frame.
    """
    rows = accuracy_rows(runs)
    if rows.empty:
        return pd.DataFrame(), pd.DataFrame()
    group = list(COST_KEYS) + list(RECIPE_KEYS) + ["tokens"]
    table = accuracy_summary(rows, group)
    costs = [c for c in ("params", "gmacs", "latency_ms") if runs[c].notna().any()]
    table = table.merge(cost_points(runs, costs), on=list(COST_KEYS) + ["tokens"], how="left")
    if "params" in table:
        table["params"] = table["params"] / 1e6
    shown = ["mixer"] + [k for k in ("dataset", "epochs") if k not in accuracy_facet_keys(runs)]
    # Per-mixer overrides (a parameter-matched mamba) are no facet, but the reader must see them.
    shown += ["overrides"] if rows["overrides"].nunique() > 1 else []
    shown += [k for k in accuracy_facet_keys(runs)] + list(POINT_KEYS)
    shown = list(dict.fromkeys(shown))
    spread = ["accuracy", "accuracy_sd", "accuracy_ci_low", "accuracy_ci_high", "seeds", "chance"]
    spread += ["converged"] if "converged" in table and table["converged"].ne("").any() else []
    # No best_accuracy: the best epoch on the test split is test-set selection (a diagnostic column of runs.csv).
    values = [c for c in ("lr", "val_accuracy", "train_time_s") if c in table and table[c].notna().any()] + costs
    numeric = sort_rows(table[shown + spread + values], [k for k in shown if k not in POINT_KEYS] + ["patch_size", "tokens"])
    display = numeric[shown].astype(str)
    # The accuracy of a setting some seed of which did not converge carries the mark, explained in a footnote.
    marks = numeric["converged"].map(lambda c: f" {UNCONVERGED_MARK}" if c.endswith(UNCONVERGED_MARK) else "") \
        if "converged" in numeric else pd.Series("", index=numeric.index)
    display["Top-1 acc. (%, mean ± s.d.)"] = [fmt_spread(m, s) + mark for m, s, mark in
                                              zip(numeric["accuracy"], numeric["accuracy_sd"], marks)]
    display["95% CI (%)"] = [_interval_cell(lo, hi) for lo, hi in zip(numeric["accuracy_ci_low"], numeric["accuracy_ci_high"])]
    display["n"] = numeric["seeds"].astype(int).astype(str)
    display["Chance (%)"] = numeric["chance"].map(lambda v: fmt_number(v, 3))
    if "converged" in numeric:
        display["Converged"] = numeric["converged"].replace("", MISSING)
    display = pd.concat([display, _metric_cells(numeric, [], values)], axis=1)
    if "lr" in values:  # rates read as people write them (3e-4), not as 0.000300
        display[HEADERS["lr"]] = numeric["lr"].map(lambda v: format_rate(v) if math.isfinite(v) else MISSING)
    return numeric.rename(columns=HEADERS), display.rename(columns=HEADERS)


def accuracy_summary(rows: pd.DataFrame, group: list[str], column: str = "accuracy") -> pd.DataFrame:
    """Per group: `column` over seeds as mean, s.d., 95% t interval (in percent) and n, with the chance level.

    Returns:
        The group columns, then accuracy, accuracy_sd, accuracy_ci_low, accuracy_ci_high, seeds, chance (percent;
        NaN where unknown), and the rate (when one), the mean val_accuracy (percent) and the median
        train_time_s when the rows have them; `converged` (`convergence.converged_cell`: "yes", "no †", "k/n †",
        or "" where not recorded).
    """
    records = []
    for values, sub in rows.groupby(group, sort=False, dropna=False):
        stats = seed_stats(sub[column] * 100, ACCURACY_BOUNDS)
        level = chance(str(sub["dataset"].iloc[0])) if "dataset" in sub else None
        record = dict(zip(group, values if isinstance(values, tuple) else (values,)))
        record.update(accuracy=stats["mean"], accuracy_sd=stats["sd"], accuracy_ci_low=stats["ci_low"],
                      accuracy_ci_high=stats["ci_high"], seeds=stats["n"],
                      chance=level * 100 if level is not None else math.nan)
        if "lr" in sub and sub["lr"].nunique() == 1:
            record["lr"] = sub["lr"].iloc[0]
        if "val_accuracy" in sub:
            record["val_accuracy"] = sub["val_accuracy"].mean() * 100
        if "train_time_s" in sub:
            record["train_time_s"] = sub["train_time_s"].median()
        record["converged"] = converged_cell(converged_flags(sub))  # "" where not recorded
        records.append(record)
    return pd.DataFrame.from_records(records)


def parameter_lines(runs: pd.DataFrame) -> list[str]:
    """A summary section: parameters of each trained mixer against attention's, and the overrides that set them,
    so a reader sees whether an accuracy gap could be a capacity gap."""
    rows = accuracy_rows(runs)
    if rows.empty or not rows["params"].notna().any():
        return []
    per_mixer = rows.groupby("mixer").agg(params=("params", "median"),
                                          overrides=("overrides", lambda o: "; ".join(sorted(set(o)))))
    lines = ["## Fair comparison: parameters of the trained models", ""]
    reference = per_mixer["params"].get("attention")
    for mixer in sorted(per_mixer.index, key=mixer_rank):
        params, overrides = per_mixer.at[mixer, "params"], per_mixer.at[mixer, "overrides"]
        versus = f" ({(params / reference - 1) * 100:+.1f}% vs attention)" if reference else ""
        setting = f", overrides `{overrides}`" if overrides not in ("", "{}") else ""
        lines.append(f"- {mixer}: {params / 1e6:.3f} M parameters{versus}{setting}")
    return lines + [""]


def _interval_cell(low: float, high: float) -> str:
    """"[low, high]" to one decimal, or a dash with one seed (no interval)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return MISSING
    return f"[{low:.1f}, {high:.1f}]"


def exponent_tables(exponents: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per curve and mixer, one column per cost metric: the fitted exponent k of cost ~ N^k.

    Only curves that exist get a row (no product of key values), and a curve with no fitted exponent (fewer
    than two ok points for every metric) gets none.

    Args:
        exponents: from `crossover.exponent_table`.
        keys: its curve keys.

    Returns:
        The long numeric frame (sorted) and a wide display frame with the fitted token range.
    """
    numeric = sort_rows(exponents, keys + ["mixer", "metric"])
    if numeric.empty:
        return numeric, pd.DataFrame()
    wide = numeric.set_index(keys + ["mixer", "metric"])["exponent"].unstack("metric").dropna(how="all")
    if wide.empty:
        return numeric, pd.DataFrame()
    wide = wide[[m for m in COST_METRICS if m in wide.columns]]
    display = wide.apply(lambda column: column.map(
        lambda v: f"{v:.2f}".replace("-0.00", "0.00") if math.isfinite(v) else MISSING))
    display.columns = [f"{METRIC_LABELS[m]} exp." for m in display.columns]
    # The fit range of the first metric fitted on a curve stands for all: every metric is read at its ok points.
    fitted = numeric[numeric["points"] >= 2].drop_duplicates(keys + ["mixer"]).set_index(keys + ["mixer"])
    display["Fit range (N)"] = [
        f"{fitted.at[i, 'tokens_min']:,.0f}–{fitted.at[i, 'tokens_max']:,.0f}" if i in fitted.index else MISSING
        for i in display.index]
    display = sort_rows(display.reset_index(), keys + ["mixer"]).astype(str)
    return numeric, display.rename(columns=HEADERS)


def crossover_tables(crossovers: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per curve, mixer and reference, one column per metric: where the mixer becomes cheaper.

    Args:
        crossovers: from `crossover.crossover_table`.
        keys: its curve keys.

    Returns:
        The long numeric frame (sorted) and a wide display frame, cells like "N ≈ 1,234 (562 px)".
    """
    numeric = sort_rows(crossovers, keys + ["reference", "mixer", "metric"])
    if numeric.empty:
        return numeric, pd.DataFrame()
    img_columns = [c for c in numeric.columns if c.startswith("img_px_p")]
    numeric = numeric.assign(cell=[_crossover_cell(row, img_columns) for _, row in numeric.iterrows()])
    index = keys + ["reference", "mixer"]
    display = numeric.pivot_table(index=index, columns="metric", values="cell", aggfunc="first")
    display = display[[m for m in COST_METRICS if m in display.columns]].fillna(MISSING)
    display.columns = [METRIC_LABELS[m] for m in display.columns]
    notes = numeric.groupby(index)["note"].agg(lambda n: "; ".join(sorted({x for x in n if x})) or MISSING)
    display["Note"] = notes
    display = sort_rows(display.reset_index(), index).astype(str)
    return numeric.drop(columns="cell"), display.rename(columns=HEADERS)


def _crossover_cell(row: pd.Series, img_columns: list[str]) -> str:
    """The crossover phrase with the image size(s) that reach that token count."""
    images = [(c.removeprefix("img_px_p"), row[c]) for c in img_columns if pd.notna(row[c])]
    if not images:
        return row["description"]
    if len(images) == 1:
        return f"{row['description']} ({images[0][1]:,.0f} px)"
    return f"{row['description']} (" + ", ".join(f"{v:,.0f} px @p{p}" for p, v in images) + ")"


def to_markdown(display: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table, numeric columns right-aligned."""
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    header = "| " + " | ".join(cell(c) for c in display.columns) + " |"
    rule = "|" + "|".join("---:" if _is_numeric(display[c]) else ":---" for c in display.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in display.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def to_latex(display: pd.DataFrame, caption: str, label: str, notes: tuple[str, ...] = ()) -> str:
    """A booktabs table, ready to `\\input`; needs `\\usepackage{booktabs,graphicx}`.

    Wide tables are scaled to the line width rather than left to run into the margin.

    Args:
        display: the cells, escaped here.
        caption: LaTeX source, written as is.
        label: the `\\label` key.
        notes: footnotes (plain text, escaped here), set small under the table.
    """
    align = "".join("r" if _is_numeric(display[c]) else "l" for c in display.columns)
    wide = len(display.columns) > 8
    lines = [
        "% Generated by experiments/report.py from runs.csv; do not edit.",
        "\\begin{table}[t]",
        "\\centering",
        "\\small",
        f"\\caption{{{caption}}}",
        f"\\label{{{label}}}",
        *(["\\resizebox{\\linewidth}{!}{%"] if wide else []),
        f"\\begin{{tabular}}{{{align}}}",
        "\\toprule",
        " & ".join(_latex_escape(c) for c in display.columns) + " \\\\",
        "\\midrule",
        *(" & ".join(_latex_escape(v) for v in row) + " \\\\" for row in display.itertuples(index=False)),
        "\\bottomrule",
        "\\end{tabular}" + ("}" if wide else ""),
        *(f"\\par\\footnotesize {_latex_escape(note)}" for note in notes),
        "\\end{table}",
    ]
    return "\n".join(lines) + "\n"


def write_table(numeric: pd.DataFrame, display: pd.DataFrame, stem: Path, caption: str,
                notes: tuple[str, ...] = ()) -> list[Path]:
    """Write `<stem>.csv` (numeric), `<stem>.md` and `<stem>.tex` (display, with `caption` as LaTeX source, and
    `notes` as footnotes under the Markdown and LaTeX tables: what a marker or an interval means).

    Returns:
        The paths written.
    """
    paths = [stem.with_suffix(".csv"), stem.with_suffix(".md"), stem.with_suffix(".tex")]
    if display.empty:
        display = pd.DataFrame({"": ["no data"]})  # still a valid table, so links and \input never break
    numeric.to_csv(paths[0], index=False, float_format="%.6g")  # measurement noise is far above 6 digits
    footer = "".join(f"\n{note}\n" for note in notes)
    paths[1].write_text(to_markdown(display) + footer, encoding="utf-8")
    paths[2].write_text(to_latex(display, caption, f"tab:{stem.name}", notes), encoding="utf-8")
    return paths


_NUMERIC_CELL = re.compile(r"^(–|-?[\d,]+(\.\d+)?( ± [\d,]+(\.\d+)?)?( [†‡]{1,2})?)$")


def _is_numeric(column: pd.Series) -> bool:
    """True when every cell reads as a number (or is empty), so the column aligns right."""
    cells = column.astype(str)
    return bool(cells.map(lambda c: bool(_NUMERIC_CELL.match(c))).all()) and bool((cells != MISSING).any())


_LATEX_SPECIALS = {
    "\\": "\\textbackslash{}", "&": "\\&", "%": "\\%", "$": "\\$", "#": "\\#", "_": "\\_",
    "{": "\\{", "}": "\\}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}",
}
_LATEX_UNICODE = {"±": "$\\pm$", "≈": "$\\approx$", "–": "--", "≥": "$\\geq$", "†": "\\dag{}"}


def _latex_escape(text: object) -> str:
    """Escape LaTeX specials, then spell the few Unicode symbols the tables use as math."""
    escaped = "".join(_LATEX_SPECIALS.get(ch, ch) for ch in str(text))
    for symbol, macro in _LATEX_UNICODE.items():
        escaped = escaped.replace(symbol, macro)
    return escaped
