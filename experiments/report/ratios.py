"""Each mixer's cost as a multiple of attention's at the same point: the numbers a "within 1.5x of attention" claim
cites, at every measured N, rather than read off a log-log plot.

A point's reference is attention measured with the same cost keys (preset, size, patch, batch, device, dtype,
compile, timing mode) and the same model overrides; only the mixer and its own options (`mixer_options`) differ,
so mamba parameter-matched to attention is a row of its own against attention at attention's options. Compiled rows
are compared with compiled attention, eager with eager.
"""
from __future__ import annotations

import json
import math

import pandas as pd

from .crossover import COST_KEYS, cost_points, varying_keys
from .mixer_order import mixer_rank
from .point_keys import json_object

REFERENCE = "attention"
# Cost column, label in the display.
RATIO_METRICS: dict[str, str] = {"latency_ms": "latency", "train_step_ms": "train step"}


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
        mixer's value, attention's and `<metric>_ratio`; empty where attention did not run.
    """
    metrics = [m for m in RATIO_METRICS if m in runs.columns and runs[m].notna().any()]
    if not metrics or REFERENCE not in set(runs["mixer"]):
        return pd.DataFrame()
    points = cost_points(runs, metrics)
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
    for metric in metrics:
        merged[f"{metric}_ratio"] = merged[metric] / merged[f"{metric}_ref"]
    keys = [k for k in varying_keys(runs, COST_KEYS) if k not in ("mixer", "overrides", "img_size")]
    merged["_rank"] = merged["mixer"].map(mixer_rank)
    merged = merged.sort_values(keys + ["_rank", "options", "tokens"], ignore_index=True)
    value_columns = [c for m in metrics for c in (m, f"{m}_ref", f"{m}_ratio")]
    return merged[keys + ["mixer", "options", "tokens"] + value_columns]


def ratio_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(numeric, display): the display one row per mixer and setting, one column per metric and N.

    The patch size labels rows only where one N was reached with more than one patch size (a resolution sweep at
    two patch sizes); where it fixes N, the column of N says it. An empty compile reads "eager", empty options
    "defaults".
    """
    numeric = ratio_table(runs)
    if numeric.empty:
        return numeric, pd.DataFrame()
    rows = [c for c in numeric.columns if c not in ("tokens",) and not c.startswith(tuple(RATIO_METRICS))]
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
