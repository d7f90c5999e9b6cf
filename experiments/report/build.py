"""Rebuild a sweep's tables, figures and summary from its `runs.csv` alone (`build_report`), and write its
headline into a README (`write_headline`); the command line is `python -m experiments.report`.

A point's cost depends on the cost keys only (`crossover.COST_KEYS`): the cost tables and figures take the median
over every row of one configuration (seeds, and the training rows that also measured it). Accuracy tables and
figures use the rows with an accuracy, split by data set, epochs and training recipe.

The report reads files, never models: it imports pandas, seaborn and matplotlib, not torch or the project's
model code, so it runs anywhere the CSV can be copied.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from ..runs_csv import OPTIONAL_KEYS, RunsFileError, read_table
from ..schema import COLUMNS, KEY_COLUMNS, STATUSES
from . import tables as report_tables
from .manifest import (
    SUMMARY_MARKER, SUMMARY_NAME, ForeignFileError, check_overwrites, content_hash, read_manifest,
    recorded_claims, refuse_special_files, refuse_symlinks, remove_stale, write_manifest,
)
from .claims import ClaimsError, load_claims, write_claims
from .plots import RC, TRAIN_WALL_PANELS, WALL_PANELS
from .erf import erf_figures, erf_tables, load_maps, maps_at_chosen_rates, outdated_maps_line
from .plots_accuracy import accuracy_figures
from .plots_accuracy_n import accuracy_n_figures
from .plots_lr import lr_figures
from .rates import budget_lines, named_rows, rate_lines, without_named_rates
from .reach import (
    control_tables, reach_figures, reach_notes, reach_summary_lines, reach_tables, separation_tables,
)
from .convergence import UNRECORDED_NOTE, convergence_notes, converged_flags, provisional_note, recorded
from .curves import Curves, load_curves
from .plots_curves import curve_figures
from .stats import INTERVAL_NOTE
from .tables_convergence import convergence_tables, reach_bucket_tables
from .plots_cost import patch_figures, wall_figures
from .plan_accuracy import plan_accuracy_summary, plan_accuracy_tables, predicted_rows
from .ratios import ratio_notes, ratio_tables
from .identity import keep_rows
from .legacy_rows import reread
from .plots_mfu import mfu_figures
from .summary_extra import extra_summary_lines, headline_mfu_lines
from .crossover import FIT_POINTS, accuracy_rows, cost_points, crossover_table, curve_keys, exponent_table
from .mixer_order import mixer_rank

# Without these a point cannot be placed or its costs read: the rest of the schema is optional.
REQUIRED_COLUMNS: tuple[str, ...] = tuple(k for k in KEY_COLUMNS if k not in OPTIONAL_KEYS) + (
    "tokens", "status", "params", "gmacs", "latency_ms", "peak_mem_mb")

# Schema columns that hold text (JSON included); every other schema column is numeric.
TEXT_COLUMNS: frozenset[str] = frozenset({
    "mixer", "preset", "overrides", "device", "dtype", "dataset", "train", "compile", "impl", "status", "error",
    "accuracy_by_bucket", "lr_stage", "lr_source", "trainer", "converged", "stop_reason",
    "train_status", "memory_method", "commit", "dirty", "torch_version", "cuda_version", "device_name",
    "python_version", "timestamp", "timing_mode", "triton_version", "mamba_ssm_version", "paired_reference",
})

# Numeric columns that place a point: a row without them is unusable.
INTEGER_KEYS: tuple[str, ...] = ("img_size", "patch_size", "batch_size", "epochs", "seed", "tokens")

# Subfolders the report writes into; it removes there only the files its manifest lists (report/manifest.py).
TABLES_DIR, FIGURES_DIR = "tables", "figures"

# LaTeX captions of the tables.
TABLE_CAPTIONS: dict[str, str] = {
    "costs": r"Cost of each mixer per token count $N$; latency is the median $\pm$ IQR of one batch.",
    "exponents": rf"Fitted exponent $k$ of cost $\propto N^k$ over the {FIT_POINTS} largest token counts that ran.",
    "crossovers": r"Token count $N$ (and image size) from which each mixer is cheaper than the reference.",
    "accuracy": r"Top-1 accuracy of each trained point over seeds (mean $\pm$ s.d., 95\% $t$ interval, $n$) with "
                r"its parameters and cost.",
    "reach": r"Reach: top-1 accuracy (\%) per direction and mark distance, mean $\pm$ s.d. [95\% $t$ interval] "
             r"over seeds.",
    "reach_separations": r"Reach buckets where Welch's $t$-test separates two mixers (two-sided, $p < 0.05$).",
    "erf": r"Radii (patches) around the centre token holding 50\% and 90\% of its effective receptive field.",
    "plan_accuracy": r"The cost planner's prediction against the measurement, per point that ran.",
    "convergence": r"Per training setting: whether it converged, the test accuracy it converged to, and the "
                   r"samples and training FLOPs it needed to first reach the target validation accuracy.",
    "reach_control": r"Reach positive control: each mixer's accuracy on the bucket(s) its first layer(s) cover.",
    "reach_to_target": r"Reach: samples seen until each bucket's validation accuracy first reached the target.",
    "ratios": r"Cost of each mixer as a multiple of attention's at the same point (same size, batch, compile and "
              r"model; the mixer's own options in the row).",
}


class ReportError(ValueError):
    """A runs.csv the report cannot use; the message says why in one line."""


def load_runs(path: Path) -> pd.DataFrame:
    """Read and check a runs.csv.

    Cells are read as text, so that an empty cell stays empty instead of turning a text column into floats,
    then the numeric schema columns are converted. A point measured twice (a rerun) keeps its last ok row, or
    its last row if none is ok; two implementations under one key are kept apart (`identity.keep_rows`), and
    rows of older code are read as today's (`legacy_rows.reread`).

    Args:
        path: the runs.csv file.

    Returns:
        One row per point, every status kept; cost cells of points that did not run are NaN.

    Raises:
        ReportError: the file is missing, empty, unparsable, lacks required columns, or has a non-numeric key.
    """
    if not path.is_file():
        raise ReportError(f"no runs.csv at {path}")
    try:  # the sweep's reader: a torn last line, a stray line or a bad key reads the same for both
        header, rows = read_table(path)
    except RunsFileError as error:
        raise ReportError(str(error)) from None
    if not header:
        raise ReportError(f"{path} is empty")
    runs = pd.DataFrame(rows, columns=list(header), dtype=str)
    missing = [c for c in REQUIRED_COLUMNS if c not in runs.columns]
    if missing:
        raise ReportError(f"{path} is missing required column(s): {', '.join(missing)}")
    if runs.empty:
        raise ReportError(f"{path} has a header but no rows")
    return keep_rows(reread(_convert_numeric(runs, path)))


def _convert_numeric(runs: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Numeric schema columns to numbers (empty cells to NaN); key columns must all parse."""
    runs = runs.copy()
    for column in (c for c in COLUMNS if c in runs.columns and c not in TEXT_COLUMNS):
        runs[column] = pd.to_numeric(runs[column].str.strip(), errors="coerce")  # "" and junk become NaN
    for column in INTEGER_KEYS:
        bad = runs.index[~np.isfinite(runs[column])]  # tokens=1e400 reads as inf: no integer either
        if len(bad):
            lines = ", ".join(str(i + 2) for i in bad[:5])  # +2: the header is line 1
            raise ReportError(f"{path}: column {column!r} is empty or not a number on line(s) {lines}")
        runs[column] = runs[column].astype("int64")
    for column in TEXT_COLUMNS - set(runs.columns):
        runs[column] = OPTIONAL_KEYS.get(column, "")  # read as empty, so grouping and formatting need no checks
    for column in set(COLUMNS) - TEXT_COLUMNS - set(runs.columns):
        runs[column] = float("nan")
    for column, default in OPTIONAL_KEYS.items():
        runs[column] = runs[column].str.strip().replace("", default)
    for column in ("status", "train_status"):
        runs[column] = runs[column].str.strip().str.lower()
    return runs


def build_report(sweep_dir: Path, claims: str | None = None, drop_claims: bool = False) -> list[Path]:
    """Rebuild every table, figure and the summary of a sweep from its runs.csv.

    Args:
        sweep_dir: the sweep folder holding runs.csv (a path to the runs.csv itself is accepted too).
        claims: also check these published claims (a file of experiments/report/claims/ or a TOML path):
            tables/claims.* and a section at the end of summary.md. None: the claims the previous report checked,
            if any (`claims_to_check`).
        drop_claims: with claims None, check none, even where the previous report did.

    Returns:
        The files written, summary.md last.

    Raises:
        ReportError: runs.csv is missing or unusable; runs.csv, tables/, figures/ or summary.md is a symbolic
            link; or a file the report would write over is not its own (a summary.md someone else wrote).
        ClaimsError: the claims cannot be read or match no row; nothing is written then.
    """
    sweep_dir = Path(sweep_dir)
    if sweep_dir.is_file():
        sweep_dir = sweep_dir.parent
    try:  # before any work: a folder the report may not write into is refused at once
        refuse_symlinks(sweep_dir)
        refuse_special_files(sweep_dir)  # a FIFO would hang the report, a folder fail it midway
        check_overwrites(sweep_dir, [SUMMARY_NAME], read_manifest(sweep_dir))
    except ForeignFileError as error:
        raise ReportError(str(error)) from None
    claims = claims_to_check(sweep_dir, claims, drop_claims)
    runs = load_runs(sweep_dir / "runs.csv")
    try:
        return _build(sweep_dir, runs, claims)
    except OSError as error:  # a full disk: the staging folder goes, the previous report and runs.csv stay
        raise ReportError(f"cannot write the report into {sweep_dir} ({error.strerror or error}); the previous "
                          "report and runs.csv are as they were: free space and rerun") from None


def claims_to_check(sweep_dir: Path, claims: str | None, drop_claims: bool = False) -> str | None:
    """The claims a rebuild checks: those named; none with drop_claims; else those the previous report checked,
    as its manifest records them, so that a plain rebuild keeps tables/claims.* and the summary's section.

    Raises:
        ReportError: the folder holds tables/claims.csv and records no claims (a report from before it recorded
            them): a plain rebuild would drop the section and leave or remove the tables, so it asks which.
        ClaimsError: the recorded claims file cannot be read (moved, or a path relative to another folder); the
            message says that --no-claims drops them.
    """
    if claims or drop_claims:
        return claims or None
    recorded = recorded_claims(sweep_dir)
    if recorded is None and os.path.lexists(sweep_dir / TABLES_DIR / "claims.csv"):
        raise ReportError(f"{sweep_dir} holds a report's published claims (tables/claims.*) and does not record "
                          "which claims file made them: rerun with --claims NAME|PATH to keep them, or --no-claims "
                          "to drop them")
    if recorded:
        try:
            load_claims(recorded)
        except ClaimsError as error:
            raise ClaimsError(f"{error} (the previous report checked them; --no-claims drops them)") from None
    return recorded


def _build(sweep_dir: Path, runs: pd.DataFrame, claims: str | None) -> list[Path]:
    """`build_report` once the folder is checked and runs.csv read."""
    # Everything is written into a staging folder beside the old report and moved over it only once complete,
    # file by file with os.replace: a failure (or a kill) midway leaves the previous report as it was.
    staging = Path(tempfile.mkdtemp(prefix=".report-", dir=sweep_dir))
    try:
        curve_data = load_curves(sweep_dir, runs)
        tables, figures, frames = _write_outputs(runs, sweep_dir, staging / TABLES_DIR, staging / FIGURES_DIR,
                                                 curve_data)
        tables = [sweep_dir / p.relative_to(staging) for p in tables]
        figures = [sweep_dir / p.relative_to(staging) for p in figures]
        text = render_summary(sweep_dir, runs, tables, figures, *frames)
        planner = plan_accuracy_summary(runs)
        if not planner.empty:
            text += "\n## Planner accuracy (predicted / measured)\n\n" + report_tables.to_markdown(planner)
        text += "\n" + "\n".join(extra_summary_lines(runs, cost_curve_rows(runs)))
        reach_lines = rate_lines(runs) + budget_lines(runs) + report_tables.parameter_lines(runs)
        reach_lines += convergence_lines(runs, curve_data)
        reach_lines += reach_summary_lines(runs)
        reach_lines += [line for line in [outdated_maps_line(sweep_dir, runs)] if line]
        if reach_lines:
            text += "\n" + "\n".join(reach_lines)
        if claims:  # published with the rest, so the manifest lists them and a bad claims file writes nothing
            claim_files, section = write_claims(runs, claims, staging / TABLES_DIR)
            tables += [sweep_dir / p.relative_to(staging) for p in claim_files]
            text += "\n" + section
        (staging / SUMMARY_NAME).write_text(text, encoding="utf-8")
        summary = sweep_dir / SUMMARY_NAME
        _publish(staging, sweep_dir, tables + figures + [summary], claims)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tables + figures + [summary]


def _write_outputs(
    runs: pd.DataFrame, sweep_dir: Path, tables_dir: Path, figures_dir: Path, curve_data: Curves | None = None,
) -> tuple[list[Path], list[Path], tuple[pd.DataFrame, pd.DataFrame]]:
    """Every table and figure of `runs` (and its learning curves), written into the two (new) folders; also the
    display frames of the exponents and crossovers, which the summary repeats."""
    curve_data = load_curves(sweep_dir, runs) if curve_data is None else curve_data
    tables_dir.mkdir(parents=True)
    figures_dir.mkdir(parents=True)
    curves = cost_curve_rows(runs)
    keys = curve_keys(curves)
    exponents, crossovers = exponent_table(curves), crossover_table(curves)
    costs = report_tables.cost_tables(runs)
    exponent_frames = report_tables.exponent_tables(exponents, keys)
    crossover_frames = report_tables.crossover_tables(crossovers, keys)

    tables = report_tables.write_table(*costs, tables_dir / "costs", TABLE_CAPTIONS["costs"])
    tables += report_tables.write_table(*exponent_frames, tables_dir / "exponents", TABLE_CAPTIONS["exponents"])
    tables += report_tables.write_table(*crossover_frames, tables_dir / "crossovers", TABLE_CAPTIONS["crossovers"])
    ratios = ratio_tables(runs)
    if not ratios[0].empty:
        tables += report_tables.write_table(*ratios, tables_dir / "ratios", TABLE_CAPTIONS["ratios"],
                                            ratio_notes(ratios[0]))
    trained = accuracy_rows(runs)
    if not trained.empty:
        tables += report_tables.write_table(*report_tables.accuracy_tables(runs), tables_dir / "accuracy",
                                            TABLE_CAPTIONS["accuracy"], (INTERVAL_NOTE, *convergence_notes(trained)))
    convergence = convergence_tables(runs)
    if not convergence[0].empty:
        tables += report_tables.write_table(*convergence, tables_dir / "convergence", TABLE_CAPTIONS["convergence"],
                                            (INTERVAL_NOTE, *convergence_notes(trained), _NEVER_NOTE))
    if not predicted_rows(runs).empty:
        tables += report_tables.write_table(*plan_accuracy_tables(runs), tables_dir / "plan_accuracy",
                                            TABLE_CAPTIONS["plan_accuracy"])
    reach = reach_tables(runs)
    if not reach[0].empty:
        tables += report_tables.write_table(*reach, tables_dir / "reach", TABLE_CAPTIONS["reach"],
                                            reach_notes(reach[0]))
        tables += report_tables.write_table(*control_tables(runs), tables_dir / "reach_control",
                                            TABLE_CAPTIONS["reach_control"])
        tables += report_tables.write_table(*separation_tables(runs), tables_dir / "reach_separations",
                                            TABLE_CAPTIONS["reach_separations"])
    to_target = reach_bucket_tables(runs, curve_data.points)
    if not to_target[0].empty:
        tables += report_tables.write_table(*to_target, tables_dir / "reach_to_target",
                                            TABLE_CAPTIONS["reach_to_target"], (_NEVER_NOTE,))
    erf_maps = maps_at_chosen_rates(load_maps(sweep_dir, runs), runs)
    if not erf_maps.empty:
        tables += report_tables.write_table(*erf_tables(erf_maps), tables_dir / "erf", TABLE_CAPTIONS["erf"])
    figures = write_figures(runs, exponents, crossovers, figures_dir, curves)
    with matplotlib.rc_context(RC):
        figures += curve_figures(runs, curve_data.points, figures_dir)
        figures += erf_figures(erf_maps, figures_dir)
    return tables, figures, (exponent_frames[1], crossover_frames[1])


# The footnote of a table that times the first reach of a target.
_NEVER_NOTE = ("Samples (and training FLOPs) to target: the mean over the seeds whose validation accuracy reached the "
               "target, first evaluation at or above it; (k/n) where only k of n seeds did; \"never\" where none did.")


def convergence_lines(runs: pd.DataFrame, curve_data: Curves) -> list[str]:
    """A summary section on the learning curves and the convergence rule: how many trainings converged, which
    did not (so that no ranking on them reads as final), curve files left out; or that none were recorded."""
    trained = accuracy_rows(runs)
    if trained.empty:
        return []
    lines = ["## Learning curves and convergence", ""]
    flags = converged_flags(trained)
    if not recorded(trained).any() and curve_data.points.empty:
        return lines + [f"- {UNRECORDED_NOTE}", *(f"- curve file skipped: {n}" for n in curve_data.notes), ""]
    done, cut = sum(f is True for f in flags), sum(f is False for f in flags)
    lines.append(f"- {done} of {len(trained)} trainings converged (validation accuracy stopped improving), {cut} "
                 f"ended at their maximum budget or diverged, {len(trained) - done - cut} trained before the rule "
                 "(not recorded).")
    open_ = sorted(set(trained.loc[flags.map(lambda f: f is False), "mixer"]), key=mixer_rank)
    if open_:
        lines.append(f"- {provisional_note(open_)}: every table marks their accuracy, and any ranking of a mixer "
                     "against them is provisional (its accuracy may still rise with more samples).")
    drawn = set(curve_data.points["row"]) & set(trained.index)
    missing = len(trained) - len(drawn)
    lines.append(f"- learning curves: {len(drawn)} of {len(trained)} trainings"
                 + (f"; {missing} without a curve file" if missing else ""))
    lines += [f"- curve file skipped: {note}" for note in curve_data.notes]
    return lines + [""]


def _publish(staging: Path, sweep_dir: Path, written: list[Path], claims: str | None = None) -> None:
    """Moves the complete new report from `staging` over the old one, summary.md last, then removes the files the
    previous report listed in its manifest that this one did not write (so no figure outlives the data it came
    from), and nothing else. The manifest records `claims` (the claims checked), for the next plain rebuild.

    The manifest lists the old and the new files while they are moved, so a kill at any moment leaves every file
    the report wrote listed, and the next rebuild still knows them as its own.

    Raises:
        ReportError: a link where the report writes, or a file in the way that the report did not write.
    """
    names = [path.relative_to(sweep_dir).as_posix() for path in written]
    try:
        refuse_symlinks(sweep_dir)
        previous = read_manifest(sweep_dir)
        check_overwrites(sweep_dir, names, previous)
    except ForeignFileError as error:
        raise ReportError(str(error)) from None
    hashes = {name: content_hash(staging / name) for name in names}  # what is ours is what we wrote
    write_manifest(sweep_dir, {**(previous or {}), **hashes}, claims)
    for path in written:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / path.relative_to(sweep_dir), path)
    remove_stale(sweep_dir, previous, names)
    write_manifest(sweep_dir, hashes, claims)


def cost_curve_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows cost curves (walls, exponents, crossovers) are drawn from: the cost-only rows when there are some.

    A training run may build its models otherwise (the parameter-matched mamba of the accuracy configs), and one
    such point would split every curve figure in two.
    """
    return runs[runs["epochs"] == 0] if (runs["epochs"] == 0).any() else runs


def write_figures(runs: pd.DataFrame, exponents: pd.DataFrame, crossovers: pd.DataFrame,
                  out_dir: Path, curves: pd.DataFrame | None = None) -> list[Path]:
    """Draw every figure the sweep has data for.

    Args:
        runs: the loaded runs.
        curves: the rows the cost curves are drawn from (default: all runs).
        exponents: from `crossover.exponent_table`.
        crossovers: from `crossover.crossover_table`.
        out_dir: folder for the files.

    Returns:
        The paths written.
    """
    curves = runs if curves is None else curves
    with matplotlib.rc_context(RC):
        paths = wall_figures(curves, exponents, crossovers, out_dir, WALL_PANELS, "wall")
        paths += wall_figures(curves, exponents, crossovers, out_dir, TRAIN_WALL_PANELS, "wall_train")
        paths += mfu_figures(curves, out_dir)
        # Only a grid of image sizes x patch sizes reaches one N in several ways.
        if curves["patch_size"].nunique() > 1 and curves["img_size"].nunique() > 1:
            paths += patch_figures(curves, out_dir)
        if not accuracy_rows(runs).empty:
            paths += accuracy_figures(runs, out_dir)
            paths += accuracy_n_figures(runs, out_dir)
            paths += lr_figures(runs, out_dir)
            paths += reach_figures(runs, out_dir)
    return paths


def render_summary(sweep_dir: Path, runs: pd.DataFrame, tables: list[Path], figures: list[Path],
                   exponents: pd.DataFrame, crossovers: pd.DataFrame) -> str:
    """The sweep's summary.md: setup, provenance, counting convention, links, exponents and crossovers."""
    def link(path: Path) -> str:
        return path.relative_to(sweep_dir).as_posix()

    statuses = runs["status"].value_counts()
    status_text = ", ".join(f"{statuses[s]} {s}" for s in [*STATUSES, *sorted(set(statuses.index) - set(STATUSES))]
                            if s in statuses)
    lines = [
        f"# Sweep report: {sweep_dir.resolve().name}",
        "",
        f"Rebuilt from `runs.csv` ({len(runs)} rows: {status_text}) {SUMMARY_MARKER}",
        "",
        "## Setup",
        "",
        *_setup_lines(runs),
        "",
        "## Provenance",
        "",
        *_provenance_lines(runs),
        "",
        "## Counting convention",
        "",
        "- MACs are multiply-accumulates of one image's forward pass; GFLOPs = 2 x GMACs.",
        "- Counted: matmul-like work (linear layers, convolutions, attention's QK^T and AV, bmm). Softmax, "
        "norms and element-wise operations are not counted.",
        "- The selective scan counts 9 x L x D x N FLOPs per direction (4.5 x L x D x N MACs; D the scan "
        "channels, N the state size); Vision Mamba's two directions count twice.",
        "- Latency is the median over repeats of one batch, with its interquartile range; throughput is "
        "batch size / median latency. Memory is in MiB (2^20 bytes), the peak above the baseline.",
        f"- Scaling exponent k: least-squares slope of log(cost) against log(N) over the {FIT_POINTS} largest "
        "token counts that ran (ok) on each curve.",
        "- Crossover: the cost ratio mixer / reference, interpolated linearly in log-log space between adjacent "
        "measured N, crosses 1; the image size there is sqrt(N) x patch size.",
        "",
        "## Tables",
        "",
        *_table_links(tables, link),
        "",
        "## Figures",
        "",
        *_figure_links(figures, link),
        "",
        f"## Scaling exponents (cost ~ N^k, {FIT_POINTS} largest ok N)",
        "",
        report_tables.to_markdown(exponents) if not exponents.empty else "No curve has two ok points.\n",
        "## Crossovers",
        "",
        report_tables.to_markdown(crossovers) if not crossovers.empty
        else "No reference mixer (attention, attention_naive) in this sweep.\n",
    ]
    return "\n".join(lines)


def _setup_lines(runs: pd.DataFrame) -> list[str]:
    """What was measured, in a few bullets: the values that vary, and the fixed ones a reader needs."""
    mixers = sorted(runs["mixer"].unique(), key=mixer_rank)
    lines = [f"- Mixers ({len(mixers)}): {', '.join(mixers)}"]
    model = f"preset {_values(runs['preset'])}"
    overrides = sorted(set(runs["overrides"]) - {"", "{}"})
    plain = " and none" if overrides and set(runs["overrides"]) & {"", "{}"} else ""
    lines.append(f"- Model: {model}, " + (f"overrides {'; '.join(overrides)}{plain}" if overrides else "no overrides"))
    points = cost_points(runs, [])
    # A diverged point's training failed after its costs were measured: its latency and memory count as ran.
    ok = int(points["status"].isin(["ok", "diverged"]).sum())
    tokens = sorted(points["tokens"].unique())
    ran = "all ran" if ok == len(points) else f"{ok} ran"
    lines.append(
        f"- Cost: {len(points)} points ({ran}), images {_values(points['img_size'])} px, patches "
        f"{_values(points['patch_size'])} px, so N = {tokens[0]:,} to {tokens[-1]:,} tokens; batch "
        f"{_values(points['batch_size'])}, {_values(points['device'])}, {_values(points['dtype'])}")
    lines += _train_step_lines(points)
    lines += _training_lines(runs)
    return lines


def _values(column: pd.Series) -> str:
    """The distinct values of a column, sorted, comma-separated."""
    return ", ".join(_plain(v) for v in sorted(column.unique()))


def _train_step_lines(points: pd.DataFrame) -> list[str]:
    """One bullet when the training step did not run everywhere: how many points, and why."""
    failed = points.loc[~points["train_status"].isin(["ok", ""]) & (points["status"] == "ok"), "train_status"]
    if failed.empty:
        return []
    counts = ", ".join(f"{n} {status}" for status, n in failed.value_counts().sort_index().items())
    return [f"- Training step: not measured at {len(failed)} points whose inference ran ({counts})"]


def _training_lines(runs: pd.DataFrame) -> list[str]:
    """One bullet per training setting (data set, epochs, recipe): where it trained and how it ended."""
    trained = runs[runs["epochs"] > 0]
    named = named_rows(trained)
    # Rates named per mixer differ by mixer: one bullet for the recipe they share, the rates in their own section.
    trained = without_named_rates(trained)
    lines = []
    for (dataset, epochs, recipe), rows in trained.groupby(["dataset", "epochs", "train"], sort=True):
        sizes = sorted({(int(i), int(p)) for i, p in zip(rows["img_size"], rows["patch_size"])})
        statuses = ", ".join(f"{n} {s}" for s, n in rows["status"].value_counts().sort_index().items())
        per_mixer = " and a learning rate per mixer (below)" if named[rows.index].any() else ""
        lines.append(
            f"- Training: {dataset or '(no data set)'}, {epochs} epoch{'s' * (epochs != 1)}, recipe "
            f"{'defaults' if recipe in ('', '{}') else f'`{recipe}`'}{per_mixer}, "
            f"seed{'s' * (rows['seed'].nunique() > 1)} "
            f"{_values(rows['seed'])}; "
            f"image/patch {', '.join(f'{i}/{p}' for i, p in sizes)} px ({len(rows)} points: {statuses})")
    return lines


def _provenance_lines(runs: pd.DataFrame) -> list[str]:
    """Where and with what the points ran, every distinct value of each provenance column."""
    fields = {
        "commit": "commit(s)", "dirty": "dirty working tree", "torch_version": "torch",
        "cuda_version": "CUDA", "device_name": "device", "cpu_threads": "cpu_threads",
        "python_version": "python", "memory_method": "memory read by",
    }
    lines = []
    for column, label in fields.items():
        values = sorted({_plain(v) for v in runs[column]} - {""})
        lines.append(f"- {label}: {', '.join(values) if values else '(not recorded)'}")
    impls = (runs[runs["impl"] != ""].groupby("mixer")["impl"].unique())
    for mixer in sorted(impls.index, key=mixer_rank):
        lines.append(f"- impl of {mixer}: {', '.join(sorted(impls[mixer]))}")
    timestamps = sorted(t for t in runs["timestamp"] if t)
    if timestamps:
        lines.append(f"- measured: {timestamps[0]} to {timestamps[-1]}")
    return lines + _load_lines(runs)


# A 1-minute load average at a sweep's start from this much up means other work held about a core.
BUSY_LOAD = 0.75
# Cores other processes kept busy at a sweep's start (sampled, `busy_start`) from this much up: a process at work.
BUSY_CORES = 0.5


def _load_lines(runs: pd.DataFrame) -> list[str]:
    """The machine's load while the points ran, and a warning when other work made it busy: judged by the cores
    sampled busy at each sweep's start where the rows hold them, else by the load average, which still holds the
    minute before (a sweep's previous stage reads as other work there)."""
    start, end = runs["load_start"].dropna(), runs["load_end"].dropna()
    if start.empty:
        return []
    lines = [f"- load average (1 min): {start.min():g} to {start.max():g} when the sweep(s) started, "
             f"{end.min():g} to {end.max():g} when points ended (own threads included)"]
    sampled = pd.to_numeric(runs["busy_start"], errors="coerce").dropna() if "busy_start" in runs else None
    if sampled is not None and not sampled.empty:
        lines.append(f"- cores busy with other work when the sweep(s) started (sampled over 1 s): "
                     f"{sampled.min():g} to {sampled.max():g}")
        busy, held = sampled.max() >= BUSY_CORES, f"{sampled.max():g} cores"
    else:
        busy, held = start.max() >= BUSY_LOAD, f"a load of up to {start.max():g}"
    if busy:
        lines.append(f"- **the machine was busy**: other work held {held} when a sweep started; CPU threads were "
                     "chosen from the free cores (cpu_threads above), and latencies are slower and noisier than on "
                     "a quiet machine: compare mixers within one sweep, as ratios")
    return lines


def _plain(value: object) -> str:
    """A cell as text, integers without a trailing ".0" and NaN as empty."""
    if isinstance(value, float):
        return "" if value != value else f"{value:g}"
    return str(value).strip()


def _table_links(tables: list[Path], link: Callable[[Path], str]) -> list[str]:
    """One bullet per table, its Markdown first."""
    titles = {"costs": "Costs per point", "exponents": "Scaling exponents", "crossovers": "Crossovers",
              "ratios": "Cost as a multiple of attention's, per point",
              "accuracy": "Accuracy per trained point", "reach": "Reach accuracy per direction and distance",
              "reach_separations": "Reach buckets that separate two mixers", "erf": "Receptive field radii",
              "convergence": "Convergence and the two numbers per training (converged accuracy, samples to target)",
              "reach_control": "Reach positive control per mixer",
              "reach_to_target": "Reach: samples to the target accuracy per bucket"}
    lines = []
    for stem in dict.fromkeys(p.stem for p in tables):
        files = {p.suffix: p for p in tables if p.stem == stem}
        lines.append(f"- {titles.get(stem, stem)}: [{stem}.md]({link(files['.md'])}) "
                     f"([csv]({link(files['.csv'])}), [LaTeX]({link(files['.tex'])}))")
    return lines


_FIGURE_CAPTIONS: dict[str, str] = {
    "wall_train": "Training step: time and peak memory against tokens.",
    "wall": "The quadratic wall: latency, peak memory and GMACs against tokens (log-log).",
    "mfu": "MFU: achieved FLOP/s as a share of the device's measured matmul peak, against tokens (log-log).",
    "patch_resolution": "Patch size against resolution: the same N from different (image, patch) pairs.",
    "accuracy_cost": "Accuracy against cost (mean and 95% interval over seeds), with the Pareto front of the "
                     "points above chance.",
    "accuracy_tokens": "What each mixer buys as N grows: accuracy (each mixer at its chosen rate) above cost, "
                       "against tokens.",
    "lr_grid": "Learning-rate grid: validation accuracy against the rate, the chosen rate ringed.",
    "reach": "Reach: accuracy against mark distance per direction (mean and 95% interval over seeds).",
    "erf": "Effective receptive field of the centre token, per mixer, at initialisation and after training.",
    "curves_buckets": "Learning curves per reach bucket: validation accuracy against samples seen (mean and range "
                    "over seeds).",
    "curves": "Learning curves: validation accuracy against training FLOPs and samples seen (mean and range over "
              "seeds; a hollow end: not converged).",
}


def _figure_links(figures: list[Path], link: Callable[[Path], str]) -> list[str]:
    """One bullet per figure: its caption, the PNG shown inline, the PDF linked."""
    if not figures:
        return ["No figure: no point ran ok."]
    lines = []
    for stem in dict.fromkeys(p.stem for p in figures):
        files = {p.suffix: p for p in figures if p.stem == stem}
        kind = next(k for k in _FIGURE_CAPTIONS if stem.startswith(k))
        lines += [f"- {_FIGURE_CAPTIONS[kind]} `{stem}` ([PDF]({link(files['.pdf'])}))", "",
                  f"  ![{stem}]({link(files['.png'])})", ""]
    return lines


HEADLINE_START, HEADLINE_END = "<!-- headline:start -->", "<!-- headline:end -->"


def headline_markers(section: str = "") -> tuple[str, str]:
    """The markers of a README headline section: the default one, or a named one such as `gpu`."""
    if not section:
        return HEADLINE_START, HEADLINE_END
    return f"<!-- headline:{section}:start -->", f"<!-- headline:{section}:end -->"


def check_headline_target(readme: Path, section: str = "", sweep_dir: Path | None = None) -> str:
    """The text of `readme`, after checking it can take a headline (so a report is not rebuilt for nothing).

    Args:
        readme: the Markdown file.
        section: names the markers, as for `headline_markers`.
        sweep_dir: the sweep whose figures the headline links: it must lie under the README's folder, since
            the links are relative to that folder.

    Raises:
        ReportError: the file is missing or unreadable, its markers are missing, repeated or reversed, or the
            sweep lies outside its folder.
    """
    start_marker, end_marker = headline_markers(section)
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
        raise ReportError(f"--readme {readme}: cannot read it ({reason}); give an existing Markdown file") from None
    if start_marker not in text or end_marker not in text:
        raise ReportError(f"{readme} has no {start_marker} ... {end_marker} markers to write between")
    if text.count(start_marker) > 1 or text.count(end_marker) > 1:
        raise ReportError(f"{readme} has {start_marker} or {end_marker} more than once; keep one pair")
    if text.index(end_marker) < text.index(start_marker):
        raise ReportError(f"{readme} has {end_marker} before {start_marker}; put the start marker first")
    if sweep_dir is not None and not sweep_dir.resolve().is_relative_to(readme.parent.resolve()):
        raise ReportError(f"--readme {readme}: the sweep {sweep_dir} is not under the README's folder, so its "
                          "figures cannot be linked from it; give a README in a folder that holds the sweep")
    return text


def write_headline(readme: Path, sweep_dir: Path, section: str = "") -> None:
    """Replace the text between the headline markers of `readme` with this sweep's wall figure and tables.

    The README's first screen shows measured results, so they are generated here from runs.csv, never typed.
    `section` names another pair of markers (`<!-- headline:gpu:start -->`), so one README holds several.
    """
    start_marker, end_marker = headline_markers(section)
    text = check_headline_target(readme, section, sweep_dir)
    runs = load_runs(sweep_dir / "runs.csv")
    curves = cost_curve_rows(runs)
    keys = curve_keys(curves)
    exponents = report_tables.exponent_tables(exponent_table(curves), keys)[1]
    crossovers = report_tables.crossover_tables(crossover_table(curves), keys)[1]
    base = readme.parent.resolve()
    walls = [w for w in sorted((sweep_dir / FIGURES_DIR).glob("wall*.png")) if not w.stem.startswith("wall_train")]
    ok = runs[runs["status"] == "ok"]
    where = ", ".join(sorted({f"{d} ({t} threads)" for d, t in zip(ok["device_name"], ok["cpu_threads"].map(_plain))}))
    commits = ", ".join(sorted({c[:10] for c in ok["commit"] if c}))
    flag = f" --headline {section}" if section else ""
    lines = [
        start_marker,
        f"*Generated by `python -m experiments.report {sweep_dir.as_posix()} --readme {readme.name}{flag}` from "
        f"`{(sweep_dir / 'runs.csv').as_posix()}`: {where}; torch {', '.join(sorted(set(ok['torch_version'])))}; "
        f"commit {commits}; {', '.join(sorted(set(ok['dtype'])))}.*",
        "",
        *(f"![{w.stem}]({w.resolve().relative_to(base).as_posix()})" for w in walls[:1]),
        "",
        f"Scaling exponents k (cost ~ N^k over the {FIT_POINTS} largest token counts):",
        "",
        report_tables.to_markdown(exponents) if not exponents.empty else "(none)",
        "Crossovers (where each mixer becomes cheaper than the reference):",
        "",
        report_tables.to_markdown(crossovers) if not crossovers.empty else "(none)",
        *headline_mfu_lines(runs),
        *_headline_accuracy(runs, sweep_dir, base),
        end_marker,
    ]
    start, end = text.index(start_marker), text.index(end_marker) + len(end_marker)
    readme.write_text(text[:start] + "\n".join(lines) + text[end:], encoding="utf-8")


# The accuracy columns a headline keeps: what was learnt, how sure, and at what size and cost.
_HEADLINE_ACCURACY = ("Mixer", "Dataset", "Overrides", "Image (px)", "Patch (px)", "Top-1 acc. (%, mean ± s.d.)",
                      "95% CI (%)", "n", "Converged", "Chance (%)", "Params (M)", "GMACs / img")


def _headline_accuracy(runs: pd.DataFrame, sweep_dir: Path, base: Path) -> list[str]:
    """The headline's accuracy half, when the sweep trained: the accuracy-cost figure and a compact table."""
    display = report_tables.accuracy_tables(runs)[1]
    if display.empty:
        return []
    figures = sorted((sweep_dir / FIGURES_DIR).glob("accuracy_cost*.png"))
    return [  # the crossover table above ends in a newline
        "Accuracy (mean ± s.d. and 95% t interval over seeds), beside parameters and cost:",
        "",
        *(f"![{f.stem}]({f.resolve().relative_to(base).as_posix()})" for f in figures[:1]),
        "",
        report_tables.to_markdown(display[[c for c in _HEADLINE_ACCURACY if c in display]]),
        *(f"{note}\n" for note in (INTERVAL_NOTE, *convergence_notes(accuracy_rows(runs)))),
    ]
