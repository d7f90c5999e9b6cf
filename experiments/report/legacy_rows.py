"""Rows written by older code, read as today's code writes them.

Until the fvcore count learnt to leave `macs` empty with a note when it ran out of memory (experiments/measure/
run.py, `_count_fvcore_or_note`), an out-of-memory there marked the whole point `oom`, though its latency had
been measured: the float32 trace, run after the bf16 timing, needs more memory than the timing did. Such a row
(status oom with a measured latency) is read as `ok` with a note, so its latency stays on the curve and no
table calls that size a memory wall.
"""
from __future__ import annotations

import pandas as pd

FVCORE_NOTE = "fvcore count: out of memory (macs left empty)"
REREAD_NOTE = "written as oom by code older than the fvcore fix; its timing ran, read as ok"


def reread(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with every oom row that holds a measured latency read as ok, its error kept behind the notes."""
    timed_oom = (runs["status"] == "oom") & runs["latency_ms"].notna()
    if not timed_oom.any():
        return runs
    runs = runs.copy()
    runs.loc[timed_oom, "error"] = [f"{FVCORE_NOTE}; {REREAD_NOTE}; was: {e}"[:500]
                                    for e in runs.loc[timed_oom, "error"]]
    runs.loc[timed_oom, "status"] = "ok"
    return runs


def reread_rows(runs: pd.DataFrame) -> pd.Series:
    """True for the rows `reread` changed (their error starts with both notes)."""
    return runs["error"].fillna("").astype(str).str.contains(REREAD_NOTE, regex=False)


def reread_lines(runs: pd.DataFrame) -> list[str]:
    """A summary bullet for the rows read as ok."""
    rows = runs[reread_rows(runs)]
    if rows.empty:
        return []
    where = ", ".join(f"{m} N = {int(n):,}" for m, n in zip(rows["mixer"], rows["tokens"]))
    return [f"- read as ok: {len(rows)} row(s) written as oom although their timing ran ({where}); the out-of-"
            "memory was fvcore's float32 count, which now leaves `macs` empty with a note instead"]
