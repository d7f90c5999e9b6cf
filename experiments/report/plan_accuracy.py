"""How well the sweep's cost planner predicted the points that ran: predicted vs measured, per point and overall.

The predictions are the `predicted_*` cells each row got before its point ran (experiments/sweep/plan.py).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

# (prediction column, measured column, label)
PAIRS: tuple[tuple[str, str, str], ...] = (
    ("predicted_latency_ms", "latency_ms", "Latency (ms)"),
    ("predicted_train_step_ms", "train_step_ms", "Train step (ms)"),
    ("predicted_peak_mem_mb", "peak_mem_mb", "Peak mem. (MiB)"),
    ("predicted_train_peak_mem_mb", "train_peak_mem_mb", "Peak mem. train (MiB)"),
    ("predicted_point_s", "point_seconds", "Point wall time (s)"),
)
POINT_COLUMNS = ("mixer", "img_size", "patch_size", "tokens", "batch_size", "epochs", "compile")


def predicted_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The ok rows that carry a prediction."""
    present = [p for p, _, _ in PAIRS if p in runs.columns]
    if not present:
        return runs.iloc[0:0]
    return runs[(runs["status"] == "ok") & runs[present].notna().any(axis=1)]


def plan_accuracy_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per point: predicted, measured and predicted / measured for each quantity; (numeric, display)."""
    rows = predicted_rows(runs)
    numeric = rows[list(POINT_COLUMNS)].copy()
    display = numeric.astype(str)
    for predicted, measured, label in PAIRS:
        ratio = rows[predicted] / rows[measured]
        numeric[f"{predicted}"] = rows[predicted]
        numeric[measured] = rows[measured]
        numeric[f"ratio_{measured}"] = ratio
        display[f"{label}: predicted / measured"] = [
            "" if np.isnan(r) else f"{p:.3g} / {m:.3g} ({r:.2f}x)"
            for p, m, r in zip(rows[predicted], rows[measured], ratio)]
    return numeric.reset_index(drop=True), display.reset_index(drop=True)


def plan_accuracy_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per quantity: points compared, median error |predicted / measured - 1|, and the worst ratio (the one
    farthest from 1 on a log scale, as predicted / measured)."""
    rows = predicted_rows(runs)
    lines = []
    for predicted, measured, label in PAIRS:
        ratio = (rows[predicted] / rows[measured]).replace([np.inf, -np.inf], np.nan).dropna()
        ratio = ratio[ratio > 0]
        if ratio.empty:
            continue
        worst = ratio.iloc[int(np.argmax(np.abs(np.log(ratio.to_numpy()))))]
        lines.append({"Quantity": label, "Points": len(ratio),
                      "Median error (%)": f"{100 * float(np.median(np.abs(ratio - 1))):.0f}",
                      "Median ratio": f"{float(np.median(ratio)):.2f}", "Worst ratio": f"{worst:.2f}"})
    return pd.DataFrame(lines)
