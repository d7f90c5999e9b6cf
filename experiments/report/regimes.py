"""The two timing regimes side by side: eager (calls issued from Python, back to back) and graphed (a CUDA graph
replayed). Their difference at the smallest N, where the arithmetic is least, is the launch floor eager PyTorch
pays per call; the summary states it per mixer and setting.
"""
from __future__ import annotations

import pandas as pd

from .crossover import COST_KEYS
from .mixer_order import mixer_rank


def launch_floors(runs: pd.DataFrame) -> pd.DataFrame:
    """Per mixer and setting with both regimes ok: the smallest common N, eager and graphed latency (median over
    rows) and their difference `floor_ms`."""
    ok = runs[(runs["status"] == "ok") & runs["latency_ms"].notna()]
    if ok.empty or set(ok["timing_mode"]) < {"eager", "graphed"}:
        return pd.DataFrame()
    setting = [k for k in COST_KEYS if k not in ("timing_mode", "img_size")] + ["tokens"]
    points = ok.groupby(setting + ["timing_mode"], as_index=False)["latency_ms"].median()
    wide = points.pivot_table(index=setting, columns="timing_mode", values="latency_ms").dropna()
    if wide.empty or not {"eager", "graphed"} <= set(wide.columns):
        return pd.DataFrame()
    wide = wide.reset_index()
    curve = [k for k in setting if k != "tokens"]
    smallest = wide.loc[wide.groupby(curve)["tokens"].idxmin()]
    smallest = smallest.assign(floor_ms=smallest["eager"] - smallest["graphed"])
    return smallest.sort_values(["mixer", "batch_size"], key=lambda s: s.map(mixer_rank) if s.name == "mixer" else s)


def launch_floor_lines(runs: pd.DataFrame) -> list[str]:
    """The summary's section on the two regimes, empty when the sweep timed only one."""
    floors = launch_floors(runs)
    if floors.empty:
        return []
    lines = ["## Launch floor (eager minus graphed latency at the smallest N)", ""]
    for _, row in floors.iterrows():
        batch = "max" if row["batch_size"] == 0 else row["batch_size"]
        extra = f", {row['overrides']}" if row["overrides"] not in ("", "{}") else ""
        lines.append(f"- {row['mixer']} (batch {batch}{extra}) at N = {int(row['tokens']):,}: eager "
                     f"{row['eager']:.3g} ms, graphed {row['graphed']:.3g} ms, floor {row['floor_ms']:.3g} ms "
                     f"({row['floor_ms'] / row['eager']:.0%} of eager)")
    return lines + [""]
