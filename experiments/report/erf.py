"""Effective receptive field maps in the report: a grid of heat maps (one column per mixer, at initialisation and
after training) and the radii holding 50% and 90% of each map's gradient mass.

Reads `<sweep>/erf/<key hash>.npz` (written by training points with `erf = true`, experiments/train/erf.py) with
numpy alone; a file counts only when its key matches an ok row of runs.csv, so maps of points since removed or
rerun under another setting are ignored, and so are maps of an earlier method (`schema.ERF_METHOD`; the summary
says how many). Seeds are averaged: each map is normalised to sum 1 first.
"""
from __future__ import annotations

import json
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from ..schema import ERF_METHOD, KEY_COLUMNS
from .mixer_order import mixer_rank
from .plots import _save, facets
from .point_keys import key_text, normalised_key, ok_row_keys
from .stats import seed_stats

ERF_DIR = "erf"
STAGES = ("init", "trained")
STAGE_TITLES = {"init": "at initialisation", "trained": "after training"}
MASS_LEVELS = (0.5, 0.9)
LOG_FLOOR = 1e-3  # the colour scale spans [1e-3, 1] of each map's maximum
FACET_KEYS = ("dataset", "img_size", "patch_size", "preset", "epochs", "train")


def mass_radius(grad_map: np.ndarray, patch_size: int, fraction: float) -> float:
    """Smallest radius, in patches, around the centre token's centre holding `fraction` of the map's mass."""
    h, w = grad_map.shape
    gh, gw = h // patch_size, w // patch_size
    cy, cx = (gh // 2 + 0.5) * patch_size - 0.5, (gw // 2 + 0.5) * patch_size - 0.5
    yy, xx = np.mgrid[0:h, 0:w]
    distance = np.hypot(yy - cy, xx - cx).ravel()
    order = np.argsort(distance, kind="stable")
    mass = np.cumsum(grad_map.ravel()[order])
    if mass[-1] <= 0:
        return math.nan
    index = int(np.searchsorted(mass, fraction * mass[-1]))
    return float(distance[order][min(index, len(order) - 1)] / patch_size)


def load_maps(sweep_dir: Path, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (ok point, stage) with a saved map of the current method: the key columns, `stage` and `map`
    (normalised to sum 1)."""
    records = []
    for key, maps, patch, method in _map_files(sweep_dir, runs):
        if method != ERF_METHOD:
            continue
        for stage, grad_map in maps.items():
            total = grad_map.sum()
            if total > 0:
                records.append({**{c: key.get(c) for c in KEY_COLUMNS}, "patch": patch, "stage": stage,
                                "map": grad_map / total})
    return pd.DataFrame.from_records(records)


def maps_at_chosen_rates(maps: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The maps of the rows the accuracy tables use (each setting at its rate chosen on validation, or named per
    mixer: `rates.at_chosen_rates`), with the rate taken out of `train`, so one figure shows every mixer at its own
    rate instead of one figure per rate of a grid."""
    from .rates import at_chosen_rates

    if maps.empty:
        return maps
    ok = runs[runs["status"] == "ok"]
    chosen = at_chosen_rates(ok)

    def key(row) -> tuple[str, ...]:
        return tuple(key_text(row.get(c, "")) for c in KEY_COLUMNS)

    train_by_key = {key(ok.loc[index]): train for index, train in zip(chosen.index, chosen["train"])}
    keys = [key(row) for row in maps.to_dict("records")]
    kept = maps[[k in train_by_key for k in keys]].copy()
    kept["train"] = [train_by_key[k] for k in keys if k in train_by_key]
    return kept


def outdated_maps_line(sweep_dir: Path, runs: pd.DataFrame) -> str:
    """A summary line saying how many maps of ok points were left out for an earlier method, or ""."""
    outdated = sum(method != ERF_METHOD for *_, method in _map_files(sweep_dir, runs))
    if not outdated:
        return ""
    return (f"- effective receptive fields: {outdated} map file(s) in {ERF_DIR}/ were computed by an earlier method "
            "(the sum of the centre token after the final LayerNorm, which is zero at initialisation, so those "
            "maps show float32 round-off) and are not shown; rerun the training points to regenerate them")


def _map_files(sweep_dir: Path, runs: pd.DataFrame) -> list[tuple[dict, dict[str, np.ndarray], int, str]]:
    """(key, maps by stage, patch size, method) of each readable map file whose key is an ok row of `runs`."""
    folder = sweep_dir / ERF_DIR
    if not folder.is_dir():
        return []
    known = ok_row_keys(runs)
    found = []
    for path in sorted(folder.glob("*.npz")):
        try:
            with np.load(path, allow_pickle=False) as f:
                key = json.loads(str(f["key"]))
                maps = {stage: f[stage].astype(np.float64) for stage in STAGES if stage in f.files}
                patch = int(f["patch_size"])
                method = str(f["method"]) if "method" in f.files else ""
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
            continue  # a foreign or truncated file: not ours to report
        if not isinstance(key, dict):  # a key of another shape ("[1, 2]"): not a map the sweep saved
            continue
        key = normalised_key(key)
        if tuple(key_text(key[c]) for c in KEY_COLUMNS) in known:
            found.append((key, maps, patch, method))
    return found


def erf_radii(maps: pd.DataFrame) -> pd.DataFrame:
    """Per map: r50 and r90 in patches."""
    if maps.empty:
        return maps
    radii = maps.drop(columns="map").copy()
    for level in MASS_LEVELS:
        radii[f"r{int(level * 100)}"] = [mass_radius(m, p, level) for m, p in zip(maps["map"], maps["patch"])]
    return radii


def erf_tables(maps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Radii per mixer and stage, mean ± s.d. over seeds (patches), numeric and display."""
    radii = erf_radii(maps)
    if radii.empty:
        return radii, pd.DataFrame()
    group = [*[k for k in FACET_KEYS if radii[k].nunique() > 1], "mixer", "stage"]
    records = []
    for values, sub in radii.groupby(group, sort=False):
        record = dict(zip(group, values))
        for level in MASS_LEVELS:
            name = f"r{int(level * 100)}"
            stats = seed_stats(sub[name])
            record.update({f"{name}_patches": stats["mean"], f"{name}_sd": stats["sd"]})
        record["seeds"] = len(sub)
        records.append(record)
    numeric = pd.DataFrame.from_records(records)
    numeric = numeric.sort_values(group, key=lambda c: c.map(mixer_rank) if c.name == "mixer" else
                                  c.map(STAGES.index) if c.name == "stage" else c, ignore_index=True)
    display = numeric[group].astype(str).rename(columns={"mixer": "Mixer", "stage": "Stage"})
    for level in MASS_LEVELS:
        name = f"r{int(level * 100)}"
        display[f"{name} (patches, {int(level * 100)}% of mass)"] = [
            f"{m:.2f}" if not math.isfinite(s) else f"{m:.2f} ± {s:.2f}"
            for m, s in zip(numeric[f"{name}_patches"], numeric[f"{name}_sd"])]
    display["n"] = numeric["seeds"].astype(str)
    return numeric, display


def erf_figures(maps: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One grid per setting: a column per mixer, a row per stage, each map scaled to its own maximum."""
    if maps.empty:
        return []
    keys = [k for k in FACET_KEYS if maps[k].astype(str).nunique() > 1]
    paths = []
    for facet in facets(maps.assign(**{k: maps[k].astype(str) for k in keys}), keys):
        paths += _save(_erf_figure(facet.rows, facet.title), out_dir / f"erf{facet.suffix}")
    return paths


def _erf_figure(rows: pd.DataFrame, title: str) -> Figure:
    mixers = sorted(rows["mixer"].unique(), key=mixer_rank)
    stages = [s for s in STAGES if (rows["stage"] == s).any()]
    fig = Figure(figsize=(1.45 * len(mixers) + 0.4, 1.55 * len(stages) + 0.5), layout="constrained")
    axes = fig.subplots(len(stages), len(mixers), squeeze=False)
    radii = erf_radii(rows)
    for i, stage in enumerate(stages):
        for j, mixer in enumerate(mixers):
            ax = axes[i, j]
            pick = (rows["stage"] == stage) & (rows["mixer"] == mixer)
            ax.set_xticks([])
            ax.set_yticks([])
            if not pick.any():
                ax.set_axis_off()
                continue
            mean_map = np.mean(np.stack(list(rows.loc[pick, "map"])), 0)
            # A log scale (three decades) shows the tails that a linear one hides under the centre patch's peak
            # (the residual path makes a token depend most on its own patch); exact zeros sit at the floor.
            ax.imshow(np.clip(mean_map / mean_map.max(), LOG_FLOOR, 1), cmap="magma",
                      norm=LogNorm(vmin=LOG_FLOOR, vmax=1), interpolation="nearest")
            r50, r90 = radii.loc[pick, "r50"].mean(), radii.loc[pick, "r90"].mean()
            ax.set_xlabel(f"r50 {r50:.1f} · r90 {r90:.1f} p", fontsize=6)
            if i == 0:
                ax.set_title(mixer, fontsize=7.5)
            if j == 0:
                ax.set_ylabel(STAGE_TITLES[stage], fontsize=7)
    seeds = int(rows.groupby(["mixer", "stage"]).size().min())
    head = "Effective receptive field of the centre token (|gradient| w.r.t. pixels, log scale, 3 decades)"
    fig.suptitle(" · ".join(t for t in (head, title, f"{seeds} seed{'s' * (seeds != 1)}") if t), fontsize=7.5)
    return fig
