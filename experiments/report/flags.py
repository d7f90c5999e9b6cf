"""Flags a reader needs before citing a row: measured from a dirty tree, noisy, on a curve that runs backwards,
or read as ok from an older row. Tables show them in a `Flags` column; the summary lists them.

- dirty: the working tree had uncommitted changes, so `commit` names code that did not run.
- IQR over 10%: a timing whose interquartile range exceeds a tenth of its median (latency or training step).
- runs backwards: the latency falls as N grows, by more than the noise (the larger IQR of the two points, and at
  least 5%): a launch-bound or disturbed measurement, not a cost.
- oom read as ok: experiments/report/legacy_rows.py.
"""
from __future__ import annotations

import pandas as pd

from .crossover import COST_KEYS, iter_groups
from .legacy_rows import reread_rows

NOISY_IQR = 0.10  # IQR / median above this is flagged
BACKWARDS_MARGIN = 0.05  # a fall smaller than this fraction of the smaller N's latency is noise

DIRTY, NOISY, BACKWARDS, REREAD = "dirty tree", "IQR over 10%", "runs backwards", "oom read as ok"


def is_dirty(runs: pd.DataFrame) -> pd.Series:
    return runs["dirty"].fillna("").astype(str).str.strip().str.lower().isin(["true", "1"])


def _noisy(runs: pd.DataFrame) -> pd.Series:
    noisy = pd.Series(False, index=runs.index)
    for median, iqr in (("latency_ms", "latency_iqr_ms"), ("train_step_ms", "train_step_iqr_ms")):
        noisy |= (runs[iqr] > NOISY_IQR * runs[median]).fillna(False)
    return noisy & (runs["status"] == "ok")


def backwards_steps(runs: pd.DataFrame, curve_keys: list[str]) -> pd.DataFrame:
    """Where a latency curve falls as N grows: curve keys, mixer, `tokens` (the larger N), `from_tokens`,
    `latency_ms` and `from_latency_ms` (medians over the rows at each point)."""
    ok = runs[(runs["status"] == "ok") & runs["latency_ms"].notna()]
    points = ok.groupby(curve_keys + ["mixer", "tokens"], as_index=False)[["latency_ms", "latency_iqr_ms"]].median()
    rows = []
    for values, curve in iter_groups(points, curve_keys + ["mixer"]):
        curve = curve.sort_values("tokens")
        latency, iqr = curve["latency_ms"].to_numpy(), curve["latency_iqr_ms"].fillna(0).to_numpy()
        tokens = curve["tokens"].to_numpy()
        for i in range(1, len(curve)):
            noise = max(iqr[i - 1], iqr[i], BACKWARDS_MARGIN * latency[i - 1])
            if latency[i] < latency[i - 1] - noise:
                rows.append({**values, "tokens": tokens[i], "from_tokens": tokens[i - 1],
                             "latency_ms": latency[i], "from_latency_ms": latency[i - 1]})
    return pd.DataFrame(rows, columns=curve_keys + ["mixer", "tokens", "from_tokens", "latency_ms", "from_latency_ms"])


def point_flags(runs: pd.DataFrame, curve_keys: list[str]) -> pd.DataFrame:
    """Flags per cost point (`COST_KEYS` and tokens, as `crossover.cost_points`): a `flags` column of text,
    "" where none applies."""
    keys = list(COST_KEYS) + ["tokens"]
    marks = runs[keys].assign(_dirty=is_dirty(runs), _noisy=_noisy(runs), _reread=reread_rows(runs))
    grouped = marks.groupby(keys, sort=False, dropna=False)[["_dirty", "_noisy", "_reread"]].any().reset_index()
    steps = backwards_steps(runs, curve_keys)
    back = set(map(tuple, steps[curve_keys + ["mixer", "tokens"]].astype(str).to_numpy())) if len(steps) else set()
    at = grouped[curve_keys + ["mixer", "tokens"]].astype(str).to_numpy()
    grouped["_back"] = [tuple(row) in back for row in at]
    names = ((DIRTY, "_dirty"), (NOISY, "_noisy"), (BACKWARDS, "_back"), (REREAD, "_reread"))
    grouped["flags"] = ["; ".join(name for name, column in names if row[column]) for _, row in grouped.iterrows()]
    return grouped[keys + ["flags"]]


def add_flags(numeric: pd.DataFrame, flags: pd.DataFrame) -> pd.Series:
    """The `flags` of each row of a table keyed by (some of) the cost keys and tokens, "" where none."""
    keys = [k for k in list(COST_KEYS) + ["tokens"] if k in numeric.columns]
    merged = numeric[keys].astype(str).merge(flags.astype({k: str for k in keys}).groupby(keys, as_index=False)
                                             ["flags"].agg(lambda f: "; ".join(dict.fromkeys(
                                                 x for s in f for x in s.split("; ") if x))),
                                             on=keys, how="left")
    return pd.Series(merged["flags"].fillna("").to_numpy(), index=numeric.index)


def flag_lines(runs: pd.DataFrame, curve_keys: list[str]) -> list[str]:
    """The summary's section on flags: what each means and where it applies."""
    lines = ["## Flags", "",
             "Tables mark a point in their `Flags` column when it is one of these:", ""]
    dirty = runs[is_dirty(runs)]
    commits = ", ".join(sorted({c[:10] for c in dirty["commit"].fillna("") if c}))
    lines.append(f"- {DIRTY}: {len(dirty)} of {len(runs)} rows were measured from a working tree with uncommitted "
                 f"changes" + (f" (commit {commits}, which does not hold the code that ran)" if len(dirty) else ""))
    noisy = runs[_noisy(runs)]
    where = "; ".join(f"{m} at N = {', '.join(f'{int(n):,}' for n in sorted(rows['tokens']))}"
                      for m, rows in noisy.groupby("mixer", sort=False))
    lines.append(f"- {NOISY}: {len(noisy)} row(s) whose latency or training step has an interquartile range above "
                 f"{NOISY_IQR:.0%} of its median" + (f" ({where})" if len(noisy) else ""))
    steps = backwards_steps(runs, curve_keys)
    falls = "; ".join(
        f"{row['mixer']}{_setting(row, curve_keys)} {row['from_latency_ms']:.3g} ms at N = {int(row['from_tokens']):,}"
        f" to {row['latency_ms']:.3g} ms at N = {int(row['tokens']):,}" for _, row in steps.iterrows())
    lines.append(f"- {BACKWARDS}: {len(steps)} step(s) where a latency curve falls as N grows, beyond the larger "
                 f"IQR of the two points and {BACKWARDS_MARGIN:.0%}" + (f": {falls}" if falls else "") +
                 ("; such a curve is bound by kernel launches or was disturbed, not by its cost" if falls else ""))
    reread = runs[reread_rows(runs)]
    lines.append(f"- {REREAD}: {len(reread)} row(s) written as oom by older code although their timing ran")
    return lines + [""]


def _setting(row: pd.Series, keys: list[str]) -> str:
    values = [f"{k} {row[k]}" for k in keys if k not in ("patch_size",) and str(row[k]) not in ("", "{}")]
    return f" ({', '.join(values)})" if values else ""
