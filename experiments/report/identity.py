"""Which rows of runs.csv the report keeps, and under what name: never a silent last-one-wins.

A point measured again keeps its last ok row (a retry that worked), or its last row when none is ok. The key does
not fix everything that ran, however: a mixer with an automatic kernel choice (mamba's scan_impl "auto") runs
mamba-ssm's CUDA kernel where it imports and the PyTorch scan where it does not, under one key. Rows of one key
whose ok rows name two implementations (`impl`) are both kept, and every row of that mixer's curve is drawn and
tabled as its own series, "mamba (torch_stream)" beside "mamba (mamba_ssm_cuda)", so no figure or table takes a
median over two implementations or keeps whichever was written last.
"""
from __future__ import annotations

import pandas as pd

from ..schema import KEY_COLUMNS

# A curve of one mixer: the key without the sizes along it.
SERIES_COLUMNS: tuple[str, ...] = tuple(c for c in KEY_COLUMNS if c not in ("img_size", "patch_size"))


def impl_series_name(mixer: str, impl: str) -> str:
    """The name a mixer's rows carry when its curve holds two implementations: "mamba (torch_stream)"."""
    return f"{mixer} ({impl})"


def base_mixer(name: str) -> str:
    """The registry key of a (possibly split) series name."""
    return name.split(" (", 1)[0]


def keep_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per key, or per key and implementation where a key's ok rows name several (those series renamed).

    Args:
        runs: every row of runs.csv, in file order, statuses normalised.

    Returns:
        The kept rows in file order, index reset.
    """
    keys = list(KEY_COLUMNS)
    ranked = runs.assign(_line=range(len(runs)), _impl=runs["impl"].fillna("").astype(str).str.strip())
    ok = ranked[ranked["status"] == "ok"].drop_duplicates(keys + ["_impl"], keep="last")
    ok_keys = pd.MultiIndex.from_frame(ok[keys])
    failed = ranked[(ranked["status"] != "ok") & ~pd.MultiIndex.from_frame(ranked[keys]).isin(ok_keys)]
    kept = pd.concat([ok, failed.drop_duplicates(keys, keep="last")]).sort_values("_line")
    impls = ok.groupby(keys, sort=False)["_impl"].nunique()
    split = {tuple(k[keys.index(c)] for c in SERIES_COLUMNS) for k in impls.index[impls > 1]}
    if split:
        series = pd.Series(list(map(tuple, kept[list(SERIES_COLUMNS)].to_numpy())), index=kept.index)
        renamed = series.isin(split) & (kept["_impl"] != "")
        kept.loc[renamed, "mixer"] = [impl_series_name(m, i) for m, i in zip(kept.loc[renamed, "mixer"],
                                                                             kept.loc[renamed, "_impl"])]
    return kept.drop(columns=["_line", "_impl"]).reset_index(drop=True)


def split_lines(runs: pd.DataFrame) -> list[str]:
    """Summary bullets naming the series that `keep_rows` split by implementation."""
    split = sorted({m for m in runs["mixer"] if base_mixer(m) != m})
    if not split:
        return []
    return [f"- one key, two implementations: rows of {', '.join(sorted({base_mixer(m) for m in split}))} whose "
            f"key was measured with more than one `impl` are kept apart as {', '.join(split)} (the key does not "
            "fix the kernel an automatic choice picks)"]
