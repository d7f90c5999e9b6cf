"""Reach curves: accuracy against mark distance, one line per mixer, one panel per direction, 95% intervals over
seeds; their table, and which buckets separate two mixers' intervals.

Reads the `accuracy_by_bucket` column (JSON {"direction:distance": accuracy}) that reach training points write;
one model per mixer and seed is evaluated on every bucket, so a bucket's n is the number of seeds.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .control import (
    CONTROL_ACCURACY, NEGATIVE_CONTROLS, SOLVABLE_WITHOUT_MIXING, UNDER_TRAINED, control_verdicts,
    solvable_without_mixing, task_of, under_trained,
)
from .convergence import UNCONVERGED_MARK, UNCONVERGED_NOTE, converged_flags, provisional_note
from .crossover import COST_KEYS, RECIPE_KEYS, accuracy_facet_keys, accuracy_rows
from .mixer_order import mixer_rank
from .plots import (
    FIGURE_MARGIN, PANEL_HEIGHT, PANEL_WIDTH, _legend_columns, _mixer_handle, _save, facets, mixer_style,
    percent_error_bars,
)
from .stats import ACCURACY_BOUNDS, ALPHA, INTERVAL_NOTE, TEST_NAME, chance, seed_stats, welch_p
from .tables import MISSING, sort_rows

DIRECTION_ORDER = ("horizontal", "vertical", "diagonal")
UNDER_TRAINED_MARK = "‡"
UNDER_TRAINED_NOTE = (f"{UNDER_TRAINED_MARK} {UNDER_TRAINED}: below {CONTROL_ACCURACY:.0f}% on its positive control "
                      "bucket(s), which its first layer(s) already cover (tables/reach_control): it did not learn the "
                      "task, so its other buckets are not a finding about how far it sees.")
SOLVABLE_MARK = "§"
SOLVABLE_NOTE = (f"{SOLVABLE_MARK} {SOLVABLE_WITHOUT_MIXING}: a mixer that relates no tokens (identity) beat chance "
                 "on this task (tables/reach_control), so no accuracy here says how far a mixer sees.")


def bucket_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (run row, bucket): the run's key columns, `direction`, `distance` and `bucket_accuracy` (%)."""
    rows = accuracy_rows(runs)
    rows = rows[rows["accuracy_by_bucket"].astype(str).str.strip().str.startswith("{")]
    flags = converged_flags(rows)
    records = []
    for index, row in rows.iterrows():
        for bucket, value in json.loads(row["accuracy_by_bucket"]).items():
            direction, distance = bucket.rsplit(":", 1)
            record = {k: row[k] for k in (*COST_KEYS, *RECIPE_KEYS, "tokens", "seed")}
            record["backbone"] = backbone_overrides(row["overrides"])
            record.update(registry=row["mixer"], direction=direction, distance=int(distance),
                          bucket_accuracy=float(value) * 100, converged=flags[index])
            records.append(record)
    return name_variants(pd.DataFrame.from_records(records))


def name_variants(buckets: pd.DataFrame) -> pd.DataFrame:
    """A mixer trained with several `mixer_options` in one setting (reach_long's swin with 2 x 2 windows and with
    one window over the grid) is several mixers here: each is named by its options, "swin (window_size 4)", so
    the tables give each its own column and control, and `registry` keeps the registry name. A mixer with one set
    of options keeps its plain name."""
    if buckets.empty:
        return buckets
    options = buckets["overrides"].map(lambda overrides: _parsed(overrides).get("mixer_options") or {})
    # Per task, not per setting: each variant may have trained at a rate of its own (`train` differs).
    keys = [*task_of(_setting(buckets)), "mixer"]
    several = buckets.assign(_options=options.map(_canonical)).groupby(keys, dropna=False)["_options"] \
        .transform("nunique") > 1
    named = [f"{mixer} ({', '.join(f'{k} {v}' for k, v in sorted(opts.items())) or 'default'})" if many else mixer
             for mixer, opts, many in zip(buckets["mixer"], options, several)]
    return buckets.assign(mixer=named)


def backbone_overrides(overrides: object) -> str:
    """A row's overrides less its `mixer_options`, as canonical JSON: what every mixer of a setting shares (the
    head's pooling, the depth), where `mixer_options` is each mixer's own (a parameter-matched mamba)."""
    return _canonical({k: v for k, v in _parsed(overrides).items() if k != "mixer_options"})


def _parsed(overrides: object) -> dict:
    """A row's `overrides` JSON as a dict ({} for none)."""
    text = str(overrides).strip()
    return json.loads(text) if text.startswith("{") else {}


def _canonical(values: dict) -> str:
    """measure.point.canonical_json's spelling, written here: importing experiments.measure pulls torch into the
    report, which must rebuild without it (tests/test_report.py)."""
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


def _group_keys(buckets: pd.DataFrame) -> list[str]:
    return [*COST_KEYS, *RECIPE_KEYS, "tokens", "backbone", "direction", "distance"]


def reach_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per mixer, setting and bucket: mean, s.d., 95% t interval (in %) and n over seeds, with chance."""
    return _summarise(bucket_rows(runs))


def _summarise(buckets: pd.DataFrame) -> pd.DataFrame:
    """`reach_summary` of rows already split into buckets (`bucket_rows`)."""
    if buckets.empty:
        return pd.DataFrame()
    records = []
    for values, sub in buckets.groupby(_group_keys(buckets), sort=False, dropna=False):
        stats = seed_stats(sub["bucket_accuracy"], ACCURACY_BOUNDS)
        level = chance(str(sub["dataset"].iloc[0]))
        records.append({**dict(zip(_group_keys(buckets), values)),
                        "registry": sub["registry"].iloc[0] if "registry" in sub else sub["mixer"].iloc[0],
                        "accuracy": stats["mean"],
                        "accuracy_sd": stats["sd"], "ci_low": stats["ci_low"], "ci_high": stats["ci_high"],
                        "seeds": stats["n"], "chance": level * 100 if level is not None else math.nan,
                        "unconverged": any(f is False for f in sub["converged"])})
    summary = pd.DataFrame.from_records(records)
    summary["direction_rank"] = summary["direction"].map(lambda d: DIRECTION_ORDER.index(d)
                                                         if d in DIRECTION_ORDER else len(DIRECTION_ORDER))
    return sort_rows(summary, ["direction_rank", "distance", "mixer"]).drop(columns="direction_rank")


def _setting(frame: pd.DataFrame) -> list[str]:
    """The columns that pick a reach setting shared by mixers: the cost and recipe keys but the mixer and its
    overrides (mixers differ in those: a parameter-matched mamba), and the overrides every mixer shares
    (`backbone`: mean against max pooling are two settings, never one mixer's seeds)."""
    return [k for k in (*COST_KEYS, *RECIPE_KEYS, "tokens", "backbone")
            if k not in ("mixer", "overrides") and k in frame]


def reach_controls(runs: pd.DataFrame) -> pd.DataFrame:
    """The positive control of every mixer and reach setting (`control.control_verdicts`)."""
    summary = reach_summary(runs)
    if summary.empty:
        return pd.DataFrame()
    return control_verdicts(summary, _setting(summary))


def _cautions(summary: pd.DataFrame, verdicts: pd.DataFrame) -> dict[tuple, list[str]]:
    """Per (setting..., mixer): what a comparison resting on it must say: under-trained, not converged."""
    setting = _setting(summary)
    failed = under_trained(verdicts, setting)
    solvable = solvable_without_mixing(verdicts, setting)
    task = [setting.index(k) for k in task_of(setting)]
    cautions: dict[tuple, list[str]] = {}
    for values, sub in summary.groupby([*setting, "mixer"], sort=False, dropna=False):
        key = values if isinstance(values, tuple) else (values,)
        cautions[key] = ([UNDER_TRAINED] if key in failed else []) + \
            ([SOLVABLE_WITHOUT_MIXING] if tuple(key[i] for i in task) in solvable else []) + \
            (["not converged"] if sub["unconverged"].any() else [])
    return cautions


def separations(buckets: pd.DataFrame, verdicts: pd.DataFrame | None = None) -> pd.DataFrame:
    """Pairs of mixers that differ in some bucket (same setting) by Welch's t-test over seeds (`stats.welch_p`,
    `stats.TEST_NAME`): better, worse, their means, the gap between the means and the p-value; and `note`, which
    says where the comparison is no finding (a mixer under-trained by its positive control) or provisional (one
    not converged).

    Args:
        buckets: per-seed bucket rows (`bucket_rows`).
        verdicts: the positive controls (`control.control_verdicts`); by default computed from `buckets`.
    """
    if buckets.empty:
        return pd.DataFrame()
    setting = _setting(buckets)
    summary = _summarise(buckets)
    verdicts = control_verdicts(summary, setting) if verdicts is None else verdicts
    cautions = _cautions(summary, verdicts)
    records = []
    for values, sub in buckets.groupby([*setting, "direction", "distance"], sort=False, dropna=False):
        here = tuple(values[:len(setting)])
        per_mixer = {m: g["bucket_accuracy"] for m, g in sub.groupby("mixer", sort=False)}
        for a, acc_a in per_mixer.items():
            for b, acc_b in per_mixer.items():
                if a == b or not acc_a.mean() > acc_b.mean():
                    continue
                p = welch_p(acc_a, acc_b)
                if p < ALPHA:
                    records.append({"direction": sub["direction"].iloc[0], "distance": sub["distance"].iloc[0],
                                    "better": a, "worse": b, "better_acc": acc_a.mean(), "worse_acc": acc_b.mean(),
                                    "gap": acc_a.mean() - acc_b.mean(), "p_value": p,
                                    "seeds": min(len(acc_a), len(acc_b)),
                                    "note": _pair_note({m: cautions.get((*here, m), []) for m in (a, b)})})
    return pd.DataFrame.from_records(records)


def _pair_note(cautions: dict[str, list[str]]) -> str:
    """What a comparison of two mixers must say about them: "" when both were trained well and converged."""
    failed = [m for m, c in cautions.items() if UNDER_TRAINED in c]
    open_ = [m for m, c in cautions.items() if "not converged" in c]
    parts = [f"not a finding: {SOLVABLE_WITHOUT_MIXING} {SOLVABLE_MARK}"] \
        if any(SOLVABLE_WITHOUT_MIXING in c for c in cautions.values()) else []
    parts += [f"not a finding: {', '.join(failed)} {UNDER_TRAINED} {UNDER_TRAINED_MARK}"] if failed else []
    parts += [provisional_note(open_)] if open_ else []
    return "; ".join(parts)


def reach_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The reach table: numeric long frame, and a display frame with a row per bucket and a column per mixer,
    cells "mean ± s.d. [95% CI]" in percent, marked † where not converged and ‡ where the mixer failed its
    positive control (its column then says "under-trained" where it failed in every setting shown)."""
    summary = reach_summary(runs)
    if summary.empty:
        return summary, pd.DataFrame()
    setting = _setting(summary)
    cautions = _cautions(summary, control_verdicts(summary, setting))
    varying = [k for k in accuracy_facet_keys(runs) if k in summary and k != "overrides"]
    varying += ["backbone"] if summary["backbone"].nunique() > 1 else []  # mean and max pooling: a row block each
    index = [*varying, "direction", "distance"]
    keys = [tuple(r[c] for c in [*setting, "mixer"]) for r in summary.to_dict("records")]
    cells = [_cell(r) + _marks(cautions.get(k, [])) for (_, r), k in zip(summary.iterrows(), keys)]
    summary = summary.assign(cell=cells,
                             under_trained=[UNDER_TRAINED in cautions.get(k, []) for k in keys],
                             solvable_without_mixing=[SOLVABLE_WITHOUT_MIXING in cautions.get(k, []) for k in keys])
    wide = summary.pivot_table(index=index, columns="mixer", values="cell", aggfunc="first", sort=False)
    wide = wide[sorted(wide.columns, key=mixer_rank)].fillna(MISSING).reset_index()
    failed_everywhere = summary.groupby("mixer")["under_trained"].all()
    wide = wide.rename(columns={m: f"{m} ({UNDER_TRAINED})" for m in failed_everywhere.index if failed_everywhere[m]})
    wide = wide.rename(columns={"direction": "Direction", "distance": "Distance (patches)",
                                "backbone": "Shared overrides"})
    numeric = summary.drop(columns="cell").rename(columns={"accuracy": "accuracy_pct", "accuracy_sd": "sd_pct",
                                                           "ci_low": "ci_low_pct", "ci_high": "ci_high_pct"})
    return numeric, wide.astype(str)


def reach_notes(numeric: pd.DataFrame) -> tuple[str, ...]:
    """The reach table's footnotes: its interval, and its marks where a cell carries one."""
    notes = [INTERVAL_NOTE]
    if "unconverged" in numeric and numeric["unconverged"].any():
        notes.append(UNCONVERGED_NOTE)
    if "under_trained" in numeric and numeric["under_trained"].any():
        notes.append(UNDER_TRAINED_NOTE)
    if "solvable_without_mixing" in numeric and numeric["solvable_without_mixing"].any():
        notes.append(SOLVABLE_NOTE)
    return tuple(notes)


def _marks(cautions: list[str]) -> str:
    marks = (UNCONVERGED_MARK if "not converged" in cautions else "") + \
        (UNDER_TRAINED_MARK if UNDER_TRAINED in cautions else "") + \
        (SOLVABLE_MARK if SOLVABLE_WITHOUT_MIXING in cautions else "")
    return f" {marks}" if marks else ""


def _cell(row: pd.Series) -> str:
    if not math.isfinite(row["ci_low"]):
        return f"{row['accuracy']:.1f}"
    return f"{row['accuracy']:.1f} ± {row['accuracy_sd']:.1f} [{row['ci_low']:.1f}, {row['ci_high']:.1f}]"


def control_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The positive control per mixer and setting: its buckets and their accuracy, the verdict and why."""
    verdicts = reach_controls(runs)
    if verdicts.empty:
        return verdicts, pd.DataFrame()
    varying = [k for k in accuracy_facet_keys(runs) if k in verdicts and k != "overrides"]
    varying += ["backbone"] if verdicts["backbone"].nunique() > 1 else []
    verdicts = sort_rows(verdicts, [*varying, "mixer"])
    display = verdicts[varying].astype(str).rename(columns={"backbone": "Shared overrides"}).assign(**{
        "Mixer": verdicts["mixer"], f"Control bucket(s): mean acc. (needs >= {CONTROL_ACCURACY:.0f}%)":
        verdicts["control"].replace("", MISSING), "Verdict": verdicts["verdict"], "Why": verdicts["reason"]})
    return verdicts, display


def separation_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Buckets where Welch's t-test separates two mixers (`stats.TEST_NAME`), with the note that says where the
    comparison is no finding or provisional."""
    pairs = separations(bucket_rows(runs))
    if pairs.empty:
        return pairs, pd.DataFrame()
    display = pd.DataFrame({
        "Direction": pairs["direction"], "Distance (patches)": pairs["distance"].astype(str),
        "Better": pairs["better"], "Worse": pairs["worse"],
        "Acc. (%)": [f"{a:.1f} vs {b:.1f}" for a, b in zip(pairs["better_acc"], pairs["worse_acc"])],
        "Gap between means (pts)": pairs["gap"].map(lambda v: f"{v:.1f}"),
        "p (Welch's t)": pairs["p_value"].map(lambda v: f"{v:.2g}"), "n": pairs["seeds"].astype(str),
    })
    if pairs["note"].ne("").any():
        display["Note"] = pairs["note"].replace("", MISSING)
    return pairs, display


def reach_summary_lines(runs: pd.DataFrame) -> list[str]:
    """A summary section: each mixer's positive control, how many buckets separate a pair of mixers (Welch's
    t-test), and the largest gaps, each saying where a mixer was under-trained or did not converge."""
    buckets = bucket_rows(runs)
    summary = _summarise(buckets)
    if summary.empty:
        return []
    verdicts = control_verdicts(summary, _setting(summary))
    pairs = separations(buckets, verdicts)
    seeds = int(summary["seeds"].min())
    lines = ["## Reach: positive control", "",
             f"A bucket a mixer's first layer(s) already cover must reach {CONTROL_ACCURACY:.0f}% "
             "(experiments/report/control.py says which buckets count for which mixer); a mixer below it is "
             f"{UNDER_TRAINED}, and its other buckets are not read as a finding. A mixer that relates no tokens "
             f"({', '.join(NEGATIVE_CONTROLS)}) is the negative control: where it beats chance, the setting is "
             f"{SOLVABLE_WITHOUT_MIXING} and no mixer's reach there is a finding.", ""]
    several = verdicts["backbone"].nunique() > 1  # e.g. mean against max pooling: say which row is which
    for record in sort_rows(verdicts, ["backbone", "mixer"] if several else ["mixer"]).to_dict("records"):
        shown = f" ({record['control']})" if record["control"] else ""
        name = f"{record['mixer']} {record['backbone']}" if several else record["mixer"]
        lines.append(f"- {name}: **{record['verdict']}**{shown}: {record['reason']}"
                     if record["verdict"] in (UNDER_TRAINED, SOLVABLE_WITHOUT_MIXING) else
                     f"- {name}: {record['verdict']}{shown}: {record['reason']}")
    lines += ["", "## Reach: does any distance or direction separate two mixers?", ""]
    if seeds < 2:
        return lines + ["Only one seed per bucket: no test, so no separation can be claimed.", ""]
    if pairs.empty:
        return lines + [f"No: in no bucket does {TEST_NAME} separate two mixers ({seeds}+ seeds).", ""]
    lines.append(f"Yes, in {pairs.groupby(['direction', 'distance']).ngroups} of "
                 f"{summary.groupby(['direction', 'distance']).ngroups} buckets by {TEST_NAME} ({seeds}+ seeds "
                 "per mixer); the widest gaps:")
    lines.append("")
    for _, p in pairs.sort_values("gap", ascending=False).head(8).iterrows():
        note = f"; {p['note']}" if p["note"] else ""
        lines.append(f"- {p['direction']} {p['distance']} patches: {p['better']} {p['better_acc']:.1f}% > "
                     f"{p['worse']} {p['worse_acc']:.1f}% (gap {p['gap']:.1f} pts, p = {p['p_value']:.2g}{note})")
    return lines + [""]


def reach_figures(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Accuracy against distance: a panel per direction, a line per mixer, 95% intervals as error bars."""
    buckets = bucket_rows(runs)
    summary = _summarise(buckets)
    if summary.empty:
        return []
    keys = [k for k in accuracy_facet_keys(runs) if k in summary and k != "overrides"]
    keys += ["backbone"] if summary["backbone"].nunique() > 1 else []
    group = _group_keys(buckets)
    failed = under_trained(control_verdicts(summary, _setting(summary)), _setting(summary))
    failed_mixers = {key[-1] for key in failed}
    paths = []
    for facet in facets(summary, keys, context=("epochs",)):
        per_seed = buckets.merge(facet.rows[group].drop_duplicates(), on=group)  # this facet's runs, a dot each
        marked = {m for m in facet.rows["mixer"].unique() if m in failed_mixers and
                  any(key[-1] == m and key[:-1] in _settings_of(facet.rows) for key in failed)}
        paths += _save(_reach_figure(facet.rows, per_seed, facet.title, marked), out_dir / f"reach{facet.suffix}")
    return paths


def _settings_of(rows: pd.DataFrame) -> set[tuple]:
    """The reach settings (`_setting`) present in `rows`."""
    setting = _setting(rows)
    return {tuple(r[c] for c in setting) for r in rows[setting].drop_duplicates().to_dict("records")}


def _reach_figure(rows: pd.DataFrame, per_seed: pd.DataFrame, title: str, under: set[str] = frozenset()) -> Figure:
    """Means with clipped 95% intervals, and each seed as a faint dot: with 3 seeds a bimodal spread (some seeds
    learn, others stay at chance) reads off the dots, not off an interval. Mixers are dodged along x; a mixer in
    `under` failed its positive control and says "under-trained" in the legend."""
    directions = sorted(rows["direction"].unique(), key=lambda d: (DIRECTION_ORDER + (d,)).index(d))
    width = (PANEL_WIDTH + 0.1) * len(directions) + FIGURE_MARGIN
    fig = Figure(figsize=(width, PANEL_HEIGHT + 0.8), layout="constrained")
    axes = fig.subplots(1, len(directions), squeeze=False, sharey=True)[0]
    mixers = sorted(rows["mixer"].unique(), key=mixer_rank)
    level = rows["chance"].iloc[0]
    distances = sorted(rows["distance"].unique())
    step = min((b - a for a, b in zip(distances, distances[1:])), default=1)
    for ax, direction in zip(axes, directions):
        for i, mixer in enumerate(mixers):
            line = rows[(rows["direction"] == direction) & (rows["mixer"] == mixer)].sort_values("distance")
            style = mixer_style(mixer)
            dodge = (i - (len(mixers) - 1) / 2) * 0.5 * step / max(len(mixers), 1)
            dots = per_seed[(per_seed["direction"] == direction) & (per_seed["mixer"] == mixer)]
            ax.scatter(dots["distance"] + dodge, dots["bucket_accuracy"], color=style.color, marker=style.marker,
                       s=14, alpha=0.55, linewidths=0, zorder=1.5)
            yerr = percent_error_bars(line["accuracy"], line["ci_low"], line["ci_high"])
            ax.errorbar(line["distance"] + dodge, line["accuracy"], yerr=yerr, color=style.color, marker=style.marker,
                        linestyle=style.linestyle, markersize=4, linewidth=1.1, capsize=2, elinewidth=0.8)
        if math.isfinite(level):
            ax.axhline(level, color="0.5", linestyle=":", linewidth=0.9)
        ax.set_title(direction, fontsize=8)
        ax.set_xlabel("Mark distance (patches)")
        ax.set_xticks(sorted(rows["distance"].unique()))
    axes[0].set_ylabel("Top-1 accuracy (%)")
    seeds = int(rows["seeds"].min())
    caption = f"mean and 95% CI (clipped to 0-100%) over {seeds} seed{'s' * (seeds != 1)}, dots: seeds"
    fig.suptitle(f"{title} · {caption}".strip(" ·"), fontsize=8.5)
    handles = [_mixer_handle(m, linestyle=mixer_style(m).linestyle) for m in mixers]
    for handle in handles:
        if handle.get_label() in under:
            handle.set_label(f"{handle.get_label()} ({UNDER_TRAINED})")
    if math.isfinite(level):
        handles.append(Line2D([], [], color="0.5", linestyle=":", linewidth=0.9, label="chance"))
    fig.legend(handles=handles, loc="outside lower center", frameon=False, handlelength=2.2,
               ncol=_legend_columns([h.get_label() for h in handles], width, handle_in=2.2 * 7 / 72))
    return fig
