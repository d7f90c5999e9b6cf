"""Whether a training converged, as the report reads and marks it.

Rows written under the convergence rule say `converged` (True: validation stopped improving; False: the maximum
budget ended it) and `stop_reason`; rows from before the rule say neither. An accuracy of an unconverged training
is a lower bound on what the mixer can do, so every table and figure that shows one marks it (`UNCONVERGED_MARK`,
with `UNCONVERGED_NOTE` as its footnote), and a comparison of two mixers that rests on one says so
(`provisional_note`). A folder with no convergence recorded at all gets one line saying so (`UNRECORDED_NOTE`),
not a mark on every row: its substance is what it was.
"""
from __future__ import annotations

import pandas as pd

UNCONVERGED_MARK = "†"
UNCONVERGED_NOTE = (f"{UNCONVERGED_MARK} not converged: the maximum budget ended the training before its validation "
                    "accuracy stopped improving; its accuracy is a lower bound on what the mixer can do, and a "
                    "ranking against it is provisional.")
UNRECORDED_NOTE = ("No learning curves recorded: these points trained for a fixed budget before the convergence rule "
                   "existed, so whether each accuracy is a plateau or a cut-off is unknown.")
NEVER = "never"


def converged_flags(rows: pd.DataFrame) -> pd.Series:
    """Per row: True (converged), False (ended at the maximum budget, or diverged) or None (not recorded)."""
    if "converged" not in rows:
        return pd.Series(None, index=rows.index, dtype=object)
    text = rows["converged"].fillna("").astype(str).str.strip().str.lower()
    reason = rows["stop_reason"].fillna("").astype(str).str.strip().str.lower() if "stop_reason" in rows else \
        pd.Series("", index=rows.index)
    flags = text.map({"true": True, "1": True, "1.0": True, "false": False, "0": False, "0.0": False})
    # A row with a stop reason but no flag (a hand-edited file) reads from the reason.
    by_reason = {"plateau": True, "ceiling": True, "max_budget": False, "diverged": False}
    flags = flags.where(flags.notna(), reason.map(by_reason))
    return flags.astype(object).where(flags.notna(), None)


def recorded(rows: pd.DataFrame) -> pd.Series:
    """True for rows whose convergence was recorded (trained under the rule)."""
    return converged_flags(rows).notna()


def converged_cell(flags: pd.Series) -> str:
    """A group's cell: "yes" (every seed converged), "no †", "k/n †" (k of n converged), or "" (not recorded)."""
    known = [bool(f) for f in flags if f is not None]
    if not known:
        return ""
    if all(known):
        return "yes"
    k = sum(known)
    return f"no {UNCONVERGED_MARK}" if k == 0 else f"{k}/{len(known)} {UNCONVERGED_MARK}"


def unconverged(flags: pd.Series) -> bool:
    """True when any seed of a group is recorded as not converged."""
    return any(f is False for f in flags)


def unconverged_mixers(rows: pd.DataFrame, setting: list[str]) -> set[tuple]:
    """The (setting values..., mixer) groups of `rows` with a seed recorded as not converged."""
    flags = converged_flags(rows)
    marked = set()
    for values, sub in rows.assign(_flag=flags).groupby([*setting, "mixer"], sort=False, dropna=False):
        if unconverged(sub["_flag"]):
            marked.add(values if isinstance(values, tuple) else (values,))
    return marked


def provisional_note(mixers: list[str]) -> str:
    """The words beside a comparison of mixers some of which did not converge ("" when all did)."""
    if not mixers:
        return ""
    return f"provisional: {', '.join(mixers)} not converged {UNCONVERGED_MARK}"


def convergence_notes(rows: pd.DataFrame) -> tuple[str, ...]:
    """The footnotes a table of these trained rows needs about convergence: the mark's meaning where a row
    carries it, or that nothing was recorded."""
    flags = converged_flags(rows)
    if rows.empty:
        return ()
    if flags.isna().all():
        return (UNRECORDED_NOTE,)
    return (UNCONVERGED_NOTE,) if unconverged(flags) else ()
