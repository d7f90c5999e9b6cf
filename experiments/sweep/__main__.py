"""Run a sweep: every point isolated, one row per point appended to <out>/runs.csv, then the report.

    python -m experiments.sweep                       # the embedded default (CPU, minutes, no download)
    python -m experiments.sweep --config quadratic_wall --device cuda
    python -m experiments.sweep --mixers attention linear --img-sizes 64 128 --patch-sizes 8 --out results/mine

Rerunning a sweep skips the points already in runs.csv, so an interrupted sweep resumes where it stopped (on the
same CPU or GPU model: experiments/sweep/same_machine.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import time
from pathlib import Path

from ..bench.cli import positive_number
from ..measure.point import Point, point_group
from ..schema import KEY_COLUMNS
from ..train.datasets import DATASET_NAMES, DatasetError
from .config import (GRID_FIELDS, SWEEP_FIELDS, ConfigError, SweepConfig, _digest, apply_flags, batch_size_arg,
                     config_from_dict, describe_runs, flag_built_values, flag_to_option, load_config, named_configs,
                     union_points)
from .lr_stages import SeedStage, seed_points, stage_lines
from .plan import Budget, Planner, budget_order, load_note, plan_lines, side_by_side_order
from .machine import (busy_cores, choose_threads, fit_to_machine, load_average, matmul_rate, usable_cpus,
                      with_limits_given)
from .device_peak import with_device_peak
from .out_dir import OutDirError, SweepLock, check_out_dir
from .references import check_clean_tree
from .same_machine import check_same_machine
from .runs_file import RunsFileError, append_row, latest_by_key, read_rows

# A dry run calibrates for at most this long (a grid of large sizes would otherwise measure for minutes); what it
# could not measure in that time is named in the plan as not predicted, with the reason.
DRY_RUN_CALIBRATION_S = 20.0

# Which runs a flag changes; the same text is the module docstring of experiments/sweep/config.py in short.
FLAG_RULE = """\
which runs a flag changes (--dry-run prints, per run, what it does, its points and the flags it took):
  --mixers, --presets, --img-sizes, --patch-sizes or --batch-sizes WITHOUT --config: a sweep of that grid alone,
      one run on the default config's top-level fields (what the flags leave: sizes, patches, timing), none of
      its runs; cost only unless --epochs N (N > 0, with --dataset) asks it to train; into results/local/custom/
      unless --out says otherwise
  with --config X (or no grid flag, on the default config):
      grid flags and --device, --dtype, --timeout-s, --memory-limit-mb, --num-threads, --compile,
      --paired-reference: every run
      --epochs, --dataset, --data-dir, --data-path, --seeds, --parallel: the runs that train (every run if none
      trains)
      --out, --launcher: the sweep
  seeds multiply training points only: a cost point runs once, with the first seed (its time and memory do not
  depend on the values of the initial weights)"""

# Flags that override config fields: flag name -> (field, argparse kwargs)
_FIELD_FLAGS = {
    "mixers": dict(nargs="+", metavar="NAME", help="mixers to run, by registry key: {registered}; default: the "
                   "config's list, else every registered mixer"),
    "presets": dict(nargs="+", metavar="NAME", help="backbone presets: micro, tiny, small, base"),
    "img_sizes": dict(nargs="+", type=int, metavar="PX", help="input sides in pixels (square images)"),
    "patch_sizes": dict(nargs="+", type=int, metavar="PX", help="patch sides in pixels; must divide every image size"),
    "batch_sizes": dict(nargs="+", type=batch_size_arg, metavar="B",
                        help="batch sizes for the cost measurements; max: the largest power of two that fits"),
    "timing_modes": dict(nargs="+", choices=["eager", "graphed"], metavar="MODE",
                         help="eager (back-to-back calls) and/or graphed (CUDA graph replay); a key like --compile"),
    "seeds": dict(nargs="+", type=int, metavar="S", help="random seeds (weights, data order)"),
    "device": dict(choices=["cpu", "cuda"], help="where to run"),
    "dtype": dict(choices=["float32", "bfloat16", "float16"], help="inference dtype; training uses autocast to it"),
    "epochs": dict(type=int, help="training epochs per point; 0 measures cost only"),
    "dataset": dict(help=f"data set to train on: {', '.join(DATASET_NAMES)}"),
    "data_dir": dict(metavar="DIR", help="folder of cifar10/cifar100/imagefolder data"),
    "data_path": dict(metavar="FILE", help="the .npz file for --dataset npz"),
    "timeout_s": dict(type=float, metavar="S", help="per-point time limit in seconds; a point over it is recorded as "
                      "timeout (default: chosen per point from its predicted cost on this machine, at least 30 min)"),
    "memory_limit_mb": dict(type=int, metavar="MB", help="CPU: cap on the address space one point may add (emulates "
                            "less memory; thread stacks and allocator arenas count, so tensors hit it sooner)"),
    "num_threads": dict(type=int, metavar="T", help="CPU threads per point (0: the cores free when the sweep starts)"),
    "parallel": dict(type=int, metavar="N", help="CPU training points that run at once, each on --num-threads "
                     "threads (set it, e.g. 1); cost points still run one at a time, so their timings stay quiet"),
    "compile": dict(metavar="MODE", help="time a torch.compile'd model (default, max-autotune, ...); none: eager; "
                    "a separate key, so compiled rows sit beside eager ones"),
    "paired_reference": dict(metavar="MIXER", help="time this mixer (e.g. attention) beside every other point, call "
                             "for call, after the point's own timings: the rows' *_vs_ref columns, ratios a drifting "
                             "machine does not move (eager and compiled timing only)"),
    "launcher": dict(choices=["local", "submitit"], help="local: one isolated process per point; submitit: a job per point"),
    "out": dict(metavar="DIR", help="results folder (default: results/local/<config name>; committed references live in results/<config name>)"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit status 2, no usage dump
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m experiments.sweep",
        allow_abbrev=False,  # a typo of one flag must not silently set another
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the rule's layout below
        description=__doc__.split("\n\n")[0] + "\nWith no arguments it runs the embedded default sweep (all "
        "built-in mixers, micro preset, CPU, 16 to 4096 tokens,\nthen a short reach training run with 3 seeds) "
        "into results/local/default/.",
        epilog=FLAG_RULE + "\n\nFields not given on the command line come from the config file; see "
        "experiments/configs/.",
    )
    parser.add_argument("--config", default=None, metavar="NAME|PATH",
                        help=f"named config ({', '.join(named_configs())}) or a TOML file; default: default (but "
                        "grid flags without --config make a sweep of their own, see below)")
    from mixers import list_mixers  # the registry, so a mixer added in one file is listed too

    for name, kwargs in _FIELD_FLAGS.items():
        if name == "mixers":
            kwargs = dict(kwargs, help=kwargs["help"].format(registered=", ".join(list_mixers())))
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, **kwargs)
    parser.add_argument("--slurm", default=None, metavar="PARTITION",
                        help="with --launcher submitit: submit to this Slurm partition (default: run jobs locally)")
    parser.add_argument("--retry-failed", action="store_true",
                        help="rerun points whose last row is error, timeout, oom or skipped (appends newer rows)")
    parser.add_argument("--no-report", action="store_true", help="do not rebuild tables and plots at the end")
    parser.add_argument("--reuse-out", action="store_true",
                        help="write into an --out folder that holds files but no runs.csv (refused otherwise, as it "
                             "is probably not a sweep's); nothing there is deleted or overwritten, so a summary.md "
                             "the report did not write is still refused (unless --no-report)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="run into a committed reference folder (results/<name>) from a working tree with "
                             "uncommitted changes; its rows say dirty=True")
    parser.add_argument("--allow-mixed-machines", action="store_true",
                        help="resume an --out folder whose rows another CPU or GPU model measured (refused "
                             "otherwise: its tables would compare the two machines as if one had measured them); "
                             "each row keeps its device_name. Not checked under --slurm (the nodes run the points)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print each point's predicted latency, memory and time, and the sweep's total, and stop")
    parser.add_argument("--budget-minutes", type=positive_number("minutes"), default=None, metavar="M",
                        help="run the most informative points first (coarse sizes of every curve) and stop before M "
                             "minutes are spent; rerun the same command to continue (every run makes at least "
                             "one point, even one predicted to take longer)")
    parser.add_argument("--calibrate-from", nargs="+", type=Path, default=[], metavar="RUNS_CSV",
                        help="runs.csv files of the target device to fit the cost model to (e.g. a GPU's, when "
                             "planning a CUDA sweep on a CPU machine)")
    parser.add_argument("--no-plan", action="store_true",
                        help="no cost prediction (skips the calibration run; rows get no predicted_* cells), "
                        "except that --budget-minutes needs predictions and still calibrates, for at most a fifth "
                        "of M; with --dry-run: list the runs and points without measuring anything")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--save-weights", action="store_true",
                        help="training points save their final weights to <out>/weights/<key hash>.safetensors, "
                             "for `python -m experiments.playground --weights <out>`")
    return parser


@dataclasses.dataclass(frozen=True)
class FlagsApplied:
    """How the command line made the sweep, for --dry-run: a header line and, per run, the flags it took."""

    header: str
    taken: list[list[str]]


def config_from_args(args: argparse.Namespace) -> tuple[SweepConfig, FlagsApplied]:
    """The sweep the command line asks for, by the rule of `FLAG_RULE` (experiments/sweep/config.py has it whole)."""
    flags = {name: getattr(args, name) for name in _FIELD_FLAGS if getattr(args, name) is not None}
    grid = [flag_to_option(k) for k in GRID_FIELDS if k in flags]
    if args.config is None and grid:
        default, _ = load_config("default")
        config = config_from_dict(flag_built_values(default, flags), "command line")
        header = (f"a sweep built from the command line ({', '.join(grid)} without --config): one run of that grid "
                  "on the default config's top-level fields, none of its runs")
        return config, FlagsApplied(header, [[k for k in flags if k not in SWEEP_FIELDS]])
    values, source = load_config(args.config or "default")
    values, taken = apply_flags(values, flags)
    config = config_from_dict(values, source)
    return config, FlagsApplied(f"config {source} ({config.name}), {len(taken)} run{'s' * (len(taken) > 1)}", taken)


def skipped_row(point: Point, oom_tokens: int) -> dict[str, object]:
    return {"status": "skipped", "tokens": point.tokens,
            "error": f"not attempted: {point.mixer} ran out of memory at {oom_tokens} tokens"}


def key_columns(point: Point) -> dict[str, object]:
    return {column: getattr(point, column) for column in KEY_COLUMNS}


def pending_points(points: list[Point], done: dict, retry_failed: bool) -> list[Point]:
    """The points with no row yet; with `retry_failed`, also those whose last row failed, whole or in its training
    step (an ok row whose train_status is oom or skipped: a wall a busy machine or a mislabelled error put there
    would otherwise stay in the summary)."""
    def needs_run(point: Point) -> bool:
        row = done.get(point.key)
        if row is None:
            return True
        failed = row["status"] not in ("ok", "diverged") or row.get("train_status") in ("oom", "skipped")
        return retry_failed and failed

    return [p for p in points if needs_run(p)]


class MemoryWall:
    """Smallest token count that ran out of memory, per group, for inference and for the training step.

    Points are run in ascending size within a group, so once a point is out of memory the larger ones would be
    too: they are recorded as skipped (inference) or run without their training step.
    """

    def __init__(self) -> None:
        self.inference: dict[tuple[str, ...], int] = {}
        self.train_step: dict[tuple[str, ...], int] = {}

    def add(self, row: dict) -> None:
        if not row.get("tokens"):
            return
        group, tokens = point_group(row), int(row["tokens"])
        if row.get("status") == "oom":
            self.inference[group] = min(self.inference.get(group, tokens), tokens)
        elif row.get("train_status") == "oom":
            self.train_step[group] = min(self.train_step.get(group, tokens), tokens)

    def prepare(self, point: Point) -> tuple[Point, dict | None]:
        limit = self.inference.get(point.group)
        if limit is not None and point.tokens >= limit:
            return point, skipped_row(point, limit)
        limit = self.train_step.get(point.group)
        if limit is not None and point.tokens >= limit and point.measure_train_step:
            return dataclasses.replace(point, measure_train_step=False), None
        return point, None

    def train_step_skipped(self, point: Point) -> int | None:
        limit = self.train_step.get(point.group)
        return limit if limit is not None and point.tokens >= limit else None


def summary_line(point: Point, row: dict) -> str:
    if row.get("status") != "ok":
        return f"{row.get('status', '?'):>8}  {point.label()}  {row.get('error', '')}"[:220]
    parts = [f"{row['latency_ms']:.1f} ms", f"{row['peak_mem_mb']:.1f} MiB", f"{row['gmacs']:.3g} GMACs"]
    if row.get("train_step_ms"):
        parts.append(f"train {row['train_step_ms']:.1f} ms")
    if row.get("accuracy") not in (None, ""):
        parts.append(f"acc {row['accuracy']:.3f}")
    return f"{'ok':>8}  {point.label()}  " + ", ".join(parts)


class PlannedProgress:
    """The progress bar, with the planner's time left where there is a planner.

    tqdm's own estimate assumes every point costs the mean of those done so far; a sweep runs the small points of
    a curve first (and a budgeted one its coarse sizes), so that estimate ran far short (3 s shown with 32 s
    left). With a planner the bar shows the sum of its predictions for the points not yet finished instead.
    """

    def __init__(self, points: list[Point], planner: Planner | None, enabled: bool) -> None:
        from tqdm import tqdm

        self.planner = planner
        self.left = {p.key: p for p in points}
        # Without tqdm's {remaining}: the postfix carries the planner's figure.
        bar_format = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]" if planner else None
        self.bar = tqdm(total=len(points), disable=not enabled, unit="point", dynamic_ncols=True,
                        bar_format=bar_format)

    def seconds_left(self) -> str:
        """'~32 s left (planner)', with how many points it could not predict; '' without a planner."""
        if self.planner is None or not self.left:
            return ""
        # Points that run side by side (parallel) take their share of the wall time.
        predicted = [None if (s := self.planner.predict(p).point_s) is None else s / p.parallel
                     for p in self.left.values()]
        known = [s for s in predicted if s is not None]
        if not known:
            return "time left unknown (no prediction yet)"
        total = sum(known)
        text = f"~{total:.0f} s" if total < 120 else f"~{total / 60:.1f} min"
        unknown = len(predicted) - len(known)
        return f"{text} left (planner)" + (f" + {unknown} points not predicted" if unknown else "")

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        """What the launchers call as a point starts (`text`: its label)."""
        eta = self.seconds_left()
        self.bar.set_postfix_str(f"{text}; {eta}" if eta else text, refresh=refresh)

    def write(self, text: str) -> None:
        self.bar.write(text)

    def finished(self, point: Point) -> None:
        self.left.pop(point.key, None)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def run_sweep(config: SweepConfig, points: list[Point], *, retry_failed: bool = False, progress: bool = True,
              slurm_partition: str | None = None, planner: Planner | None = None,
              budget_minutes: float | None = None, started: float | None = None) -> Path:
    """Runs the pending ones of `points` (the validated `config.points(...)`), appending rows to <out>/runs.csv;
    returns that path. With a `planner` each row records its prediction; with a budget the points run coarse
    first and those that would overrun it are left for the next run (every run makes at least one)."""
    from .launchers import make_launcher
    from ..measure.run import describe_without_running

    runs_path = config.out_dir / "runs.csv"
    done = latest_by_key(read_rows(runs_path))
    todo = pending_points(points, done, retry_failed)
    load_start, busy_start, machine_note = load_average(), math.nan, ""
    if slurm_partition is None:  # points run on this machine: fit them to what it has free now
        todo, load_start, busy_start, machine_note = _fit_to_machine(todo)
    else:
        todo = with_limits_given(todo)
    wall = MemoryWall()
    if not retry_failed:
        for row in done.values():
            wall.add(row)
    budget = Budget(budget_minutes, planner, started or time.monotonic()) if budget_minutes and planner else None
    if budget:  # ordered over the whole sweep, so a resumed run continues the same sequence
        # The fitted points (threads, time limits), not the config's: a config without timeout_s has 0 there,
        # "choose one", and a point run with it was killed at once.
        fitted = {p.key: p for p in todo}
        todo = [fitted[p.key] for p in budget_order(points, {p.key: planner.predict(p) for p in points})
                if p.key in fitted]
    else:
        todo = side_by_side_order(todo, planner)
    wanted_train_step = {p.key: p.measure_train_step for p in todo}
    launcher = make_launcher(config, slurm_partition, max((p.timeout_s for p in todo), default=0.0))
    bar = PlannedProgress(todo, planner, progress)
    bar.write(f"{config.name}: {len(points)} points, {len(points) - len(todo)} already in {runs_path}, "
              f"{len(todo)} to run{machine_note}")
    todo = with_device_peak(todo, bar.write)
    # Wall time between two rows that the row's own point_seconds does not see (process start, bookkeeping),
    # measured in this run only: time between two runs of the command is no per-point overhead.
    last_row_at: list[float] = []

    def record(point: Point, row: dict) -> None:
        if budget and budget.cut_short(point, row):
            bar.write(f"{'budget':>8}  {point.label()}  stopped when the budget ran out; the next run starts it again")
            last_row_at.append(time.monotonic())
            return
        if budget and budget.forced == point.key:
            bar.write(f"{'budget':>8}  {point.label()}  ran although the budget was spent or too small for it: "
                      "every run makes at least one point, so rerunning always progresses")
        if "macs_analytic" not in row:  # the point never reported: fill in what the configuration tells
            row = {**describe_without_running(point), **row}
        now = time.monotonic()
        if planner and last_row_at and row.get("point_seconds") not in (None, ""):
            planner.observe_gap(now - last_row_at[-1] - float(row["point_seconds"]))
        if planner:
            row = {**row, **planner.predict(point).columns()}
            planner.observe(point, row)
        if wanted_train_step[point.key] and not point.measure_train_step and row.get("status") == "ok":
            row["train_status"] = "skipped"
            row["error"] = f"train step not attempted: out of memory at {wall.train_step_skipped(point)} tokens"
        if row.get("cpu_threads") in (None, "") and point.num_threads:  # a point that never reported
            row["cpu_threads"] = point.num_threads
        row = {**row, **key_columns(point), "load_start": load_start, "load_end": load_average(),
               "busy_start": "" if math.isnan(busy_start) else round(busy_start, 2)}
        append_row(runs_path, row)
        wall.add(row)
        bar.write(summary_line(point, row))
        bar.finished(point)
        last_row_at.append(time.monotonic())

    try:
        launcher.run(budget.points(todo) if budget else todo, record, wall.prepare, bar)
    finally:
        bar.close()
    if budget and budget.held_back:
        print(f"budget: {len(budget.held_back)} points left for the next run (same command); "
              f"{max(budget.left(), 0):.0f} s of the budget unused")
    return runs_path


def _fit_to_machine(todo: list[Point]) -> tuple[list[Point], float, float, str]:
    """Threads from the cores free now and time limits from a calibrated rate (experiments/sweep/machine.py):
    (the points adjusted, the load average at the start, the cores other work kept busy then, a note for the
    first progress line)."""
    from ..measure.run import describe_without_running

    load_start = load_average()
    if not todo:
        return todo, load_start, math.nan, ""
    cpus, busy = usable_cpus(), busy_cores()
    threads = choose_threads(cpus, busy)
    rate = matmul_rate(threads)
    macs = {p.key: describe_without_running(p).get("macs_analytic") for p in todo}
    note = (f"; {cpus} cpus, {busy:.1f} busy with other work (load average {load_start:g}): "
            f"{thread_note(todo, threads)}")
    return fit_to_machine(todo, threads, rate, macs), load_start, busy, note


def thread_note(points: list[Point], threads: int) -> str:
    """What each CPU point runs on: `threads` where it leaves num_threads at 0, its own count where it sets one
    (the default's training run sets 1, its cost run takes the free cores)."""
    cpu = [p for p in points if p.device == "cpu"]
    if not cpu:
        return "no CPU points"
    parts = []
    auto = sum(1 for p in cpu if not p.num_threads)
    if auto:
        parts.append(f"{threads} thread{'s' * (threads > 1)} for the {auto} CPU points that leave num_threads at 0")
    for count in sorted({p.num_threads for p in cpu if p.num_threads}):
        points_set = sum(1 for p in cpu if p.num_threads == count)
        parts.append(f"{count} thread{'s' * (count > 1)} for the {points_set} that set num_threads = {count}")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # a budget counts from here: checking and planning are part of what it bounds
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config, applied = config_from_args(args)
        from mixers import list_mixers

        run_points = config.run_points(list_mixers())
        points = union_points(run_points)
        if args.save_weights:
            points = with_weights_paths(points, config.out_dir)
        data_notes = check_environment(config, dry_run=args.dry_run)
        check_mixers_run_or_refuse(points)
        if not args.slurm:
            check_threads(points)
        for path in args.calibrate_from:
            check_calibration_file(path)
        # A dry run checks the folder too (creating nothing), before it plans: a bad --out is said at once, not
        # after a plan that the real run would then refuse.
        check_out_dir(config.out_dir, reuse=args.reuse_out, report=not args.no_report)
        if not args.dry_run:
            check_clean_tree(config.out_dir, args.allow_dirty)
        done_rows = read_rows(config.out_dir / "runs.csv")  # refuse a foreign or damaged runs.csv before running
        check_thread_counts(points, done_rows, config.out_dir)
        # A dry run is refused as the real run would be, at once: for the seeds whose grid is done too, which the
        # real run checks only once its grid stage has run.
        done = latest_by_key(done_rows)
        check_machine(points, done, args, config.out_dir)
        seeds = seed_points(config, list_mixers(), done) if args.dry_run else None
        if seeds is not None:
            check_machine(seeds.ready, done, args, config.out_dir)
        if args.slurm and config.launcher != "submitit":
            raise ConfigError("--slurm submits through submitit: add --launcher submitit")
    except (ConfigError, RunsFileError, DatasetError, OutDirError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(config, run_points, args, applied, data_notes, seeds)
    try:
        with SweepLock(config.out_dir):  # one sweep per results folder; the second says who holds it
            return _run_and_report(config, points, args, started)
    except OutDirError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2


def with_weights_paths(points: list[Point], out_dir: Path) -> list[Point]:
    """The points, each training one set to save its weights, named by the key hash as its checkpoints are."""
    if not any(p.epochs for p in points):
        raise ConfigError("--save-weights saves trained weights, but this sweep trains nothing (epochs 0): "
                          "add --epochs N and --dataset NAME")
    return [dataclasses.replace(p, weights_path=str(out_dir / "weights" / f"{_digest(p.key)}.safetensors"))
            if p.epochs else p for p in points]


def check_threads(points: list[Point]) -> None:
    """More threads than this process may run on measures oversubscription, not the point: refused, not clamped,
    so no row records a thread count other than the one asked for."""
    cpus = usable_cpus()
    asked = max((p.num_threads for p in points), default=0)
    if asked > cpus:
        raise ConfigError(f"num_threads {asked} is more than the {cpus} CPUs this process may use; give at most "
                          f"{cpus} (or 0: the cores free when the sweep starts)")
    side_by_side = max(points, key=lambda p: p.parallel * p.num_threads, default=None)
    if side_by_side is not None and side_by_side.parallel * side_by_side.num_threads > cpus:
        p = side_by_side
        raise ConfigError(f"parallel {p.parallel} x num_threads {p.num_threads} is more than the {cpus} CPUs this "
                          f"process may use; give parallel x num_threads <= {cpus}")


def check_thread_counts(points: list[Point], rows: list[dict[str, str]], out_dir: Path) -> None:
    """The thread count is no key column, so a rerun at another `num_threads` would skip every point already
    measured at the first count: refused, with the advice to give each count its own folder.

    Only points that ask for a count are checked; at 0 the sweep chooses from the cores free at its start, and a
    resumed run may choose differently by design.
    """
    done = latest_by_key(rows)
    for point in points:
        row = done.get(point.key)
        if point.device != "cpu" or not point.num_threads or row is None or row.get("cpu_threads") in (None, ""):
            continue
        if int(float(row["cpu_threads"])) != point.num_threads:
            raise ConfigError(f"num_threads {point.num_threads}: {out_dir / 'runs.csv'} measured {point.label()} on "
                              f"{row['cpu_threads']} threads, and a rerun skips the points already there; give "
                              f"each thread count its own --out")


def check_machine(points: list[Point], done: dict, args: argparse.Namespace, out_dir: Path) -> None:
    """Refuses the points this run would make where another machine measured the folder's rows
    (experiments/sweep/same_machine.py), unless --allow-mixed-machines. Not under --slurm: the cluster's nodes run
    the points, and this machine's name says nothing of theirs."""
    if args.allow_mixed_machines or args.slurm:
        return
    check_same_machine(pending_points(points, done, args.retry_failed), done, out_dir)


def check_calibration_file(path: Path) -> None:
    """A --calibrate-from file must be a runs.csv with rows: one that is not would silently calibrate nothing."""
    advice = "give the runs.csv of a sweep on the target device"
    if not path.exists():
        raise ConfigError(f"--calibrate-from {path}: no such file; {advice}")
    if not path.is_file():
        raise ConfigError(f"--calibrate-from {path} is not a file; {advice}")
    try:
        rows = read_rows(path)
    except RunsFileError as error:
        reason = str(error).rsplit("; ", 1)[0]  # drop the advice meant for a sweep's own runs.csv
        raise ConfigError(f"--calibrate-from: {reason}; {advice}") from None
    except OSError as error:
        raise ConfigError(f"--calibrate-from {path}: cannot read it ({error.strerror or error}); {advice}") from None
    if not rows:
        raise ConfigError(f"--calibrate-from {path} holds no rows; {advice}")


def _build_planner(config: SweepConfig, points: list[Point], args: argparse.Namespace) -> Planner:
    # A budgeted sweep spends at most a fifth of its budget calibrating; its own rows refine the fit after. A dry
    # run only plans: its calibration is bounded too, and the plan names what it could not predict. A sweep says
    # so before it calibrates: minutes without a row would otherwise look like a hang.
    seconds = args.budget_minutes * 12 if args.budget_minutes else math.inf
    if args.dry_run:
        seconds = min(seconds, DRY_RUN_CALIBRATION_S)
    say = None if args.dry_run or args.quiet else functools.partial(print, file=sys.stderr, flush=True)
    return Planner.build(points, config.out_dir / "runs.csv", extra_runs=args.calibrate_from, calibration_s=seconds,
                         say=say)


def _dry_run(config: SweepConfig, run_points: list[list[Point]], args: argparse.Namespace,
             applied: FlagsApplied, data_notes: list[str], stage: SeedStage) -> int:
    """Prints what each run is and the plan: every point with its predicted cost, in the order a budgeted sweep
    would run them (with --no-plan, the points alone, nothing measured); `data_notes` say which data this
    machine lacks (a dry run plans from sizes, not images); `stage` is the seed stage the folder's rows leave."""
    from mixers import list_mixers

    started = time.perf_counter()
    points = union_points(run_points)
    shared = sum(len(run) for run in run_points) - len(points)
    seeds_after_grid = len(stage.ready) + len(stage.waiting)
    print("\n".join([applied.header, *describe_runs(config, list_mixers(), run_points, applied.taken), *data_notes]))
    print(f"{len(points) + seeds_after_grid} points in all"
          + (f" ({shared} shared by two runs, run once)" if shared else "")
          + (f" ({seeds_after_grid} of them seeds run after the learning-rate grid)" if seeds_after_grid else "")
          + f", into {config.out_dir}/")
    points = points + stage.ready + stage.waiting  # the seed stage after the grid, as a sweep runs it
    if args.no_plan:
        print("\n".join(f"{index + 1:>4} {point.label()}" for index, point in enumerate(points)))
        print("\n".join(stage_lines(config, points, stage)))
        print(f"(--no-plan: nothing measured, no cost predicted; {load_note()})")
        return 0
    planner = _build_planner(config, points, args)
    if args.budget_minutes:
        order = budget_order(points, {p.key: planner.predict(p) for p in points})
    else:
        order = side_by_side_order(points, planner)
    print("\n".join(plan_lines(planner, points, order, args.budget_minutes) + stage_lines(config, points, stage)))
    print(f"(planned in {time.perf_counter() - started:.1f} s; {load_note()})")
    return 0


def _run_and_report(config: SweepConfig, points: list[Point], args: argparse.Namespace, started: float) -> int:
    """The sweep, then its report, while this process holds the results folder (`started`: the command's start
    on the monotonic clock, where a budget starts counting)."""
    planner = _build_planner(config, points, args) if not args.no_plan or args.budget_minutes else None
    try:
        runs_path = run_sweep(config, points, retry_failed=args.retry_failed, progress=not args.quiet,
                              slurm_partition=args.slurm, planner=planner, budget_minutes=args.budget_minutes,
                              started=started)
        runs_path = _run_seed_stage(config, args, planner, started) or runs_path
    except KeyboardInterrupt:
        print(f"\ninterrupted; rows written so far are kept in {config.out_dir / 'runs.csv'}; "
              "rerun the same command to resume", file=sys.stderr)
        return 130
    except RunsFileError as error:
        print(f"python -m experiments.sweep: error: {error}", file=sys.stderr)
        return 1
    except ConfigError as error:  # a check that could only run once the grid had rows (the seed stage's machine)
        print(f"python -m experiments.sweep: error: {error}", file=sys.stderr)
        return 2
    print(f"runs: {runs_path} ({time.monotonic() - started:.0f} s)")
    if not args.no_report:
        from ..report.build import ReportError, build_report
        from ..report.claims import ClaimsError

        try:
            written = build_report(config.out_dir)
        # a file put in the report's way while the sweep ran, or claims an earlier report checked that it cannot
        # check again (python -m experiments.report with --claims or --no-claims rebuilds it)
        except (ReportError, ClaimsError) as error:
            print(f"python -m experiments.sweep: error: {error}; the rows are kept in {runs_path}", file=sys.stderr)
            return 2
        print(f"report: {len(written)} files in {config.out_dir}/ (summary: {config.out_dir / 'summary.md'})")
    return 0


def _run_seed_stage(config: SweepConfig, args: argparse.Namespace, planner: Planner | None,
                    started: float) -> Path | None:
    """The seeds at each setting's chosen rate, once its learning-rate grid has rows (experiments/sweep/lr_stages.py)."""
    from mixers import list_mixers

    done = latest_by_key(read_rows(config.out_dir / "runs.csv"))
    stage = seed_points(config, list_mixers(), done)
    print("\n".join(stage_lines(config, [], stage)))
    if not stage.ready:
        return None
    if args.budget_minutes and Budget(args.budget_minutes, planner, started).left() <= 0:
        # The grid stage of this command has run points: "every run makes at least one" is met, and a forced
        # seed point would overrun the budget by a whole training.
        print(f"budget: spent before the seed runs; their {len(stage.ready)} points start in the next run "
              "(same command)")
        return None
    check_machine(stage.ready, done, args, config.out_dir)  # main's check saw the grid's points only
    ready = with_weights_paths(stage.ready, config.out_dir) if args.save_weights else stage.ready
    return run_sweep(config, ready, retry_failed=args.retry_failed, progress=not args.quiet,
                     slurm_partition=args.slurm, planner=planner, budget_minutes=args.budget_minutes, started=started)


def check_environment(config: SweepConfig, dry_run: bool = False) -> list[str]:
    """Problems that would fail every point: say so once, before running any.

    A dry run only plans, so it may plan for a device or data this machine lacks: it reads no data (a plan needs
    sizes, which a config's `train_samples` gives, not images; a CIFAR set would even be downloaded) and returns
    one note per data set that a real run could not read here, instead of failing.
    """
    import torch

    notes = []
    for name, run in zip(config.run_names(), config.run_configs()):
        if run.device == "cuda" and not torch.cuda.is_available() and not dry_run:
            raise ConfigError("device: cuda was asked for but torch sees no CUDA device; use --device cpu "
                              "(or --dry-run to plan it)")
        if run.compile not in ("", "none") and not dry_run:
            check_compile(run.device)
        if run.epochs > 0:
            from ..train.datasets import check_dataset_available

            if not dry_run:
                check_dataset_available(run.dataset, data_dir=run.data_dir or None, data_path=run.data_path or None)
            elif run.dataset not in DATASET_NAMES:
                raise DatasetError(f"unknown data set {run.dataset!r}; choose one of {', '.join(DATASET_NAMES)}")
            elif run.dataset == "npz" and not Path(run.data_path).is_file():
                notes.append(f"note: run {name!r} reads {run.data_path or '(no --data-path)'}, which is "
                             "not here: planned without it (the training images counted from the config's "
                             "train_samples; without them the time is unknown); a real run needs the file "
                             "(--data-path)")
    return notes


def check_mixers_run_or_refuse(points: list[Point]) -> None:
    """A mixer whose options cannot run on this CPU would fail every one of its points: refuse it up front."""
    from .mixer_smoke import check_mixers_run

    try:
        check_mixers_run(points)
    except ValueError as error:
        raise ConfigError(f"mixer_options: {error}") from None


def check_compile(device: str) -> None:
    """torch.compile needs a working backend (on a CPU, inductor's C++ compiler): try a tiny function once."""
    import torch

    try:
        torch.compile(lambda x: torch.sin(x) + 1)(torch.randn(8, device=device))
    except Exception as error:  # noqa: BLE001 - any failure means compiled points cannot run here
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise ConfigError(f"compile: torch.compile does not work on this {device} ({type(error).__name__}: "
                          f"{first}); use --compile none") from None


if __name__ == "__main__":
    sys.exit(main())
