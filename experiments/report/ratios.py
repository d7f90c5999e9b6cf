"""Each mixer's cost as a multiple of attention's at the same point: the numbers a "within 1.5x of attention" claim
cites, at every measured N, rather than read off a log-log plot.

A point's reference is attention measured with the same cost keys (preset, size, patch, batch, device, dtype,
compile, timing mode) and the same model overrides; only the mixer and its own options (`mixer_options`) differ,
so mamba parameter-matched to attention is a row of its own against attention at attention's options. Compiled rows
are compared with compiled attention, eager with eager.

Beside the timed ratios, the ratio of the model's forward MACs per image (`gmacs`, counted, so exact): what the
arithmetic alone predicts, so a timed ratio far above it is the implementation's (or the work MACs do not count),
not the mixer's.

Where the sweep timed attention beside each point (`paired_reference = "attention"`, experiments/measure/paired.py),
the ratio is that paired one: the two timed call for call, seconds apart, so a machine's drift between the two rows
does not enter it. The ratio of the two rows is kept beside it (`<metric>_ratio_apart`).
"""
from __future__ import annotations

import json
import math

import pandas as pd

from .crossover import COST_KEYS, cost_points, varying_keys
from .mixer_order import mixer_rank
from .point_keys import json_object

REFERENCE = "attention"
# Cost column, label in the display: the counted one first (what the arithmetic predicts), then the timed ones.
RATIO_METRICS: dict[str, str] = {"gmacs": "MACs", "latency_ms": "latency", "train_step_ms": "train step"}
# Those a sweep times, and may time beside attention (paired); the others are counted, the same at every run.
TIMED_METRICS = ("latency_ms", "train_step_ms")


def _parsed(overrides: object) -> dict | None:
    """The overrides cell as a dict ({} where empty or missing), None where it is not a JSON object."""
    return json_object("" if pd.isna(overrides) else str(overrides))


def model_overrides(overrides: object) -> str:
    """The overrides without `mixer_options` (which belong to the mixer), as canonical JSON; "{}" where none, the
    cell itself where it is not a JSON object."""
    parsed = _parsed(overrides)
    if parsed is None:
        return str(overrides)
    return json.dumps({k: v for k, v in parsed.items() if k != "mixer_options"}, sort_keys=True, separators=(",", ":"))


def mixer_options(overrides: object) -> str:
    """The `mixer_options` of the overrides as compact JSON, "" where the mixer ran at its defaults."""
    options = (_parsed(overrides) or {}).get("mixer_options")
    return json.dumps(options, sort_keys=True, separators=(",", ":")) if options else ""


def ratio_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per point of every mixer but attention: its latency and training step over attention's at that point.

    Returns:
        Long format: the cost keys that vary (besides the mixer and overrides), `mixer`, `options` (its
        `mixer_options`, "" at the defaults), `tokens`, and per metric of `RATIO_METRICS` that was measured the
        mixer's value, attention's and `<metric>_ratio`; for a timed metric (`TIMED_METRICS`) the ratio is the
        one timed beside attention where the row was, else the ratio of the two rows, and `<metric>_ratio_apart`
        (the ratio of the two rows) follows; then `paired` (whether every timed ratio of the row is a paired one);
        empty where attention did not run or nothing was timed.
    """
    metrics = [m for m in RATIO_METRICS if m in runs.columns and runs[m].notna().any()]
    timed = [m for m in metrics if m in TIMED_METRICS]
    if not timed or REFERENCE not in set(runs["mixer"]):
        return pd.DataFrame()
    runs, paired = _paired_to_reference(runs, timed)
    points = cost_points(runs, metrics + paired)
    points = points[points["status"] == "ok"].copy()
    points["model_overrides"] = points["overrides"].map(model_overrides)
    points["options"] = points["overrides"].map(mixer_options)
    text_keys = [k for k in COST_KEYS if k not in ("mixer", "overrides")] + ["model_overrides"]
    points[text_keys] = points[text_keys].astype(str)  # NaN (eager's empty compile) must match NaN
    match = text_keys + ["tokens"]
    reference = points[(points["mixer"] == REFERENCE) & (points["options"] == "")]
    reference = reference[match + metrics].drop_duplicates(match)
    others = points[points["mixer"] != REFERENCE]
    merged = others.merge(reference, on=match, suffixes=("", "_ref"))
    some_beside = some_apart = pd.Series(False, index=merged.index)
    for metric in metrics:
        apart = merged[metric] / merged[f"{metric}_ref"]
        if metric not in timed:
            merged[f"{metric}_ratio"] = apart
            continue
        column = paired_column(metric)
        beside = merged[column] if column in paired else pd.Series(math.nan, index=merged.index)
        merged[f"{metric}_ratio"] = beside.where(beside.notna(), apart)
        merged[f"{metric}_ratio_apart"] = apart
        some_beside, some_apart = some_beside | beside.notna(), some_apart | (beside.isna() & apart.notna())
    merged["paired"] = some_beside & ~some_apart  # every timed ratio of the row taken side by side
    keys = [k for k in varying_keys(runs, COST_KEYS) if k not in ("mixer", "overrides", "img_size")]
    merged["_rank"] = merged["mixer"].map(mixer_rank)
    merged = merged.sort_values(keys + ["_rank", "options", "tokens"], ignore_index=True)
    value_columns = [c for m in metrics for c in (m, f"{m}_ref", f"{m}_ratio")
                     + ((f"{m}_ratio_apart",) if m in timed else ())]
    return merged[keys + ["mixer", "options", "tokens"] + value_columns + ["paired"]]


def paired_column(metric: str) -> str:
    """The row's column of `metric` over the reference's timed beside it: latency_ms -> latency_vs_ref."""
    return metric.removesuffix("_ms") + "_vs_ref"


def _paired_to_reference(runs: pd.DataFrame, metrics: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """`runs` with the paired columns of `metrics` kept only where attention was the one timed beside the point,
    and the names of those columns that hold a value."""
    columns = [paired_column(m) for m in metrics if paired_column(m) in runs.columns]
    if not columns or "paired_reference" not in runs.columns:
        return runs, []
    runs = runs.copy()
    beside_attention = runs["paired_reference"].astype(str) == REFERENCE
    for column in columns:
        runs[column] = pd.to_numeric(runs[column], errors="coerce").where(beside_attention)
    return runs, [c for c in columns if runs[c].notna().any()]


def ratio_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(numeric, display): the display one row per mixer and setting, one column per metric and N.

    The patch size labels rows only where one N was reached with more than one patch size (a resolution sweep at
    two patch sizes); where it fixes N, the column of N says it. An empty compile reads "eager", empty options
    "defaults".
    """
    numeric = ratio_table(runs)
    if numeric.empty:
        return numeric, pd.DataFrame()
    rows = [c for c in numeric.columns if c not in ("tokens", "paired") and not c.startswith(tuple(RATIO_METRICS))]
    if "patch_size" in rows and numeric.groupby("tokens")["patch_size"].nunique().max() <= 1:
        rows.remove("patch_size")
    blank = {"compile": "eager", "options": "defaults"}
    display_rows = {}
    for _, row in numeric.iterrows():
        label = tuple(blank.get(c, "") if pd.isna(row[c]) or str(row[c]) in ("", "nan") else str(row[c])
                      for c in rows)
        cells = display_rows.setdefault(label, {})
        for metric, name in RATIO_METRICS.items():
            ratio = row.get(f"{metric}_ratio")
            if ratio is not None and not (isinstance(ratio, float) and math.isnan(ratio)):
                cells[f"{name} ×, N={row['tokens']:,}"] = f"{ratio:.2f}"
    columns = [f"{name} ×, N={n:,}" for name in RATIO_METRICS.values() for n in sorted(numeric["tokens"].unique())]
    display = pd.DataFrame([{**dict(zip(rows, label)), **cells} for label, cells in display_rows.items()])
    display = display.reindex(columns=rows + [c for c in columns if c in display.columns]).fillna("–")
    display = display.rename(columns={c: c.replace("_", " ").capitalize() for c in rows})
    return numeric, display


def ratio_notes(numeric: pd.DataFrame) -> tuple[str, ...]:
    """What the ratios of `ratio_table` divide: MACs counted, timings taken side by side or two rows taken apart."""
    paired = int(numeric["paired"].sum()) if "paired" in numeric else 0
    apart = len(numeric) - paired
    notes = []
    if "gmacs_ratio" in numeric and numeric["gmacs_ratio"].notna().any():
        notes.append("MACs ×: the whole model's forward multiply-accumulates per image over attention's, counted "
                     "(gmacs): the ratio the arithmetic alone predicts. A timed ratio well above it is time spent "
                     "outside that arithmetic (element-wise work, per-op overhead, memory traffic).")
    if paired:
        notes.append(f"{'All' if not apart else paired} of the {len(numeric)} rows' timed ratios were timed beside "
                     f"{REFERENCE}, call for call in alternating blocks (paired_reference): the machine's drift "
                     "between two rows does not enter them; ratios.csv keeps the ratio of the two rows "
                     "(*_ratio_apart).")
    if apart:
        notes.append(f"{'All' if not paired else apart} of the {len(numeric)} rows' timed ratios divide two rows "
                     "timed apart (minutes apart in a sweep), which a machine whose speed drifts moves; a sweep "
                     f"with --paired-reference {REFERENCE} times the two side by side.")
    return tuple(notes)
