"""Run a sweep: every point isolated, one row per point appended to <out>/runs.csv, then the report.

    python -m experiments.sweep                       # the embedded default (CPU, minutes, no download)
    python -m experiments.sweep --config quadratic_wall --device cuda
    python -m experiments.sweep --mixers attention linear --img-sizes 64 128 --patch-sizes 8 --out results/mine

Rerunning a sweep skips the points already in runs.csv, so an interrupted sweep resumes where it stopped.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

from ..measure.point import Point, point_group
from ..schema import KEY_COLUMNS
from ..train.datasets import DATASET_NAMES, DatasetError
from .config import (ConfigError, SweepConfig, _digest, batch_size_arg, config_from_dict, load_config,
                     named_configs)
from .lr_stages import seed_points, stage_lines
from .plan import Budget, Planner, budget_order, load_note, plan_lines
from .machine import busy_cores, choose_threads, fit_to_machine, load_average, matmul_rate, usable_cpus
from .device_peak import with_device_peak
from .out_dir import OutDirError, SweepLock, check_out_dir
from .references import check_clean_tree
from .runs_file import RunsFileError, append_row, latest_by_key, read_rows

# Flags that override config fields: flag name -> (field, argparse kwargs)
_FIELD_FLAGS = {
    "mixers": dict(nargs="+", metavar="NAME", help="mixers to run, by registry key: attention, attention_naive, swin, "
                   "linear, mamba, neighborhood, vmamba, gla, or any mixer registered in mixers/; default: the "
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
    "timeout_s": dict(type=float, metavar="S", help="per-point time limit, raised for a point whose predicted cost on "
                      "this machine needs more; a point over its limit is recorded as timeout"),
    "memory_limit_mb": dict(type=int, metavar="MB", help="CPU: cap on the address space one point may add (emulates "
                            "less memory; thread stacks and allocator arenas count, so tensors hit it sooner)"),
    "num_threads": dict(type=int, metavar="T", help="CPU threads per point (0: the cores free when the sweep starts)"),
    "compile": dict(metavar="MODE", help="time a torch.compile'd model (default, max-autotune, ...); none: eager; "
                    "a separate key, so compiled rows sit beside eager ones"),
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
        description=__doc__.split("\n\n")[0] + " With no arguments it runs the embedded default sweep "
        "(all built-in mixers, micro preset, CPU, 16 to 4096 tokens, then a short reach training run with 3 "
        "seeds) into results/local/default/. Command-line flags override the chosen --config.",
        epilog="Fields not given on the command line come from the config file; see experiments/configs/.",
    )
    parser.add_argument("--config", default="default", metavar="NAME|PATH",
                        help=f"named config ({', '.join(named_configs())}) or a TOML file; default: default")
    for name, kwargs in _FIELD_FLAGS.items():
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
    parser.add_argument("--dry-run", action="store_true",
                        help="print each point's predicted latency, memory and time, and the sweep's total, and stop")
    parser.add_argument("--budget-minutes", type=float, default=None, metavar="M",
                        help="run the most informative points first (coarse sizes of every curve) and stop before M "
                             "minutes are spent; rerun the same command to continue")
    parser.add_argument("--calibrate-from", nargs="+", type=Path, default=[], metavar="RUNS_CSV",
                        help="runs.csv files of the target device to fit the cost model to (e.g. a GPU's, when "
                             "planning a CUDA sweep on a CPU machine)")
    parser.add_argument("--no-plan", action="store_true",
                        help="no cost prediction (skips the calibration run; rows get no predicted_* cells)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--save-weights", action="store_true",
                        help="training points save their final weights to <out>/weights/<key hash>.safetensors, "
                             "for `python -m experiments.playground --weights <out>`")
    return parser


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    values, source = load_config(args.config)
    flags = {name: getattr(args, name) for name in _FIELD_FLAGS if getattr(args, name) is not None}
    values = {**values, **flags}
    if flags and isinstance(values.get("runs"), list):  # anything else is refused by config_from_dict
        run_flags = {k: v for k, v in flags.items() if k not in ("out", "launcher")}
        values["runs"] = [{**run, **run_flags} if isinstance(run, dict) else run for run in values["runs"]]
    return config_from_dict(values, source)


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


def run_sweep(config: SweepConfig, points: list[Point], *, retry_failed: bool = False, progress: bool = True,
              slurm_partition: str | None = None, planner: Planner | None = None,
              budget_minutes: float | None = None, started: float | None = None) -> Path:
    """Runs the pending ones of `points` (the validated `config.points(...)`), appending rows to <out>/runs.csv;
    returns that path. With a `planner` each row records its prediction; with a budget the points run coarse
    first and those that would overrun it are left for the next run."""
    from tqdm import tqdm

    from .launchers import make_launcher
    from ..measure.run import describe_without_running

    runs_path = config.out_dir / "runs.csv"
    done = latest_by_key(read_rows(runs_path))
    todo = pending_points(points, done, retry_failed)
    load_start, machine_note = load_average(), ""
    if slurm_partition is None:  # points run on this machine: fit them to what it has free now
        todo, load_start, machine_note = _fit_to_machine(todo)
    wall = MemoryWall()
    if not retry_failed:
        for row in done.values():
            wall.add(row)
    budget = Budget(budget_minutes, planner, started or time.monotonic()) if budget_minutes and planner else None
    if budget:  # ordered over the whole sweep, so a resumed run continues the same sequence
        pending = {p.key for p in todo}
        todo = [p for p in budget_order(points, {p.key: planner.predict(p) for p in points}) if p.key in pending]
    wanted_train_step = {p.key: p.measure_train_step for p in todo}
    launcher = make_launcher(config, slurm_partition, max((p.timeout_s for p in todo), default=0.0))
    bar = tqdm(total=len(todo), disable=not progress, unit="point", dynamic_ncols=True)
    bar.write(f"{config.name}: {len(points)} points, {len(points) - len(todo)} already in {runs_path}, "
              f"{len(todo)} to run{machine_note}")
    todo = with_device_peak(todo, bar.write)

    def record(point: Point, row: dict) -> None:
        if budget and budget.cut_short(point, row):
            bar.write(f"{'budget':>8}  {point.label()}  stopped when the budget ran out; the next run starts it again")
            return
        if "macs_analytic" not in row:  # the point never reported: fill in what the configuration tells
            row = {**describe_without_running(point), **row}
        if planner:
            row = {**row, **planner.predict(point).columns()}
            planner.observe(point, row)
        if wanted_train_step[point.key] and not point.measure_train_step and row.get("status") == "ok":
            row["train_status"] = "skipped"
            row["error"] = f"train step not attempted: out of memory at {wall.train_step_skipped(point)} tokens"
        if row.get("cpu_threads") in (None, "") and point.num_threads:  # a point that never reported
            row["cpu_threads"] = point.num_threads
        row = {**row, **key_columns(point), "load_start": load_start, "load_end": load_average()}
        append_row(runs_path, row)
        wall.add(row)
        bar.write(summary_line(point, row))
        bar.update(1)

    try:
        launcher.run(budget.points(todo) if budget else todo, record, wall.prepare, bar)
    finally:
        bar.close()
    if budget and budget.held_back:
        print(f"budget: {len(budget.held_back)} points left for the next run (same command); "
              f"{max(budget.left(), 0):.0f} s of the budget unused")
    return runs_path


def _fit_to_machine(todo: list[Point]) -> tuple[list[Point], float, str]:
    """Threads from the cores free now and time limits from a calibrated rate (experiments/sweep/machine.py):
    (the points adjusted, the load average at the start, a note for the first progress line)."""
    from ..measure.run import describe_without_running

    load_start = load_average()
    if not todo:
        return todo, load_start, ""
    cpus, busy = usable_cpus(), busy_cores()
    threads = choose_threads(cpus, busy)
    rate = matmul_rate(threads)
    macs = {p.key: describe_without_running(p).get("macs_analytic") for p in todo}
    note = (f"; {cpus} cpus, {busy:.1f} busy with other work (load average {load_start:g}): "
            f"{threads} thread{'s' * (threads > 1)} per CPU point")
    return fit_to_machine(todo, threads, rate, macs), load_start, note


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        from mixers import list_mixers

        points = config.points(list_mixers())
        if args.save_weights:
            points = with_weights_paths(points, config.out_dir)
        check_environment(config, dry_run=args.dry_run)
        if not args.dry_run:
            check_out_dir(config.out_dir, reuse=args.reuse_out, report=not args.no_report)
            check_clean_tree(config.out_dir, args.allow_dirty)
        read_rows(config.out_dir / "runs.csv")  # refuse a foreign or damaged runs.csv before running anything
        if args.slurm and config.launcher != "submitit":
            raise ConfigError("--slurm submits through submitit: add --launcher submitit")
    except (ConfigError, RunsFileError, DatasetError, OutDirError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(config, points, args)
    try:
        with SweepLock(config.out_dir):  # one sweep per results folder; the second says who holds it
            return _run_and_report(config, points, args)
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


def _build_planner(config: SweepConfig, points: list[Point], args: argparse.Namespace) -> Planner:
    # A budgeted sweep spends at most a fifth of its budget calibrating; its own rows refine the fit after.
    return Planner.build(points, config.out_dir / "runs.csv", extra_runs=args.calibrate_from,
                         calibration_s=args.budget_minutes * 12 if args.budget_minutes else math.inf)


def _dry_run(config: SweepConfig, points: list[Point], args: argparse.Namespace) -> int:
    """Prints the plan: every point with its predicted cost, in the order a budgeted sweep would run them."""
    started = time.perf_counter()
    from mixers import list_mixers

    stage = seed_points(config, list_mixers(), latest_by_key(read_rows(config.out_dir / "runs.csv")))
    points = points + stage.ready + stage.waiting  # the seed stage after the grid, as a sweep runs it
    planner = _build_planner(config, points, args)
    order = budget_order(points, {p.key: planner.predict(p) for p in points}) if args.budget_minutes else points
    print("\n".join(plan_lines(planner, points, order, args.budget_minutes) + stage_lines(config, points, stage)))
    print(f"(planned in {time.perf_counter() - started:.1f} s; {load_note()})")
    return 0


def _run_and_report(config: SweepConfig, points: list[Point], args: argparse.Namespace) -> int:
    """The sweep, then its report, while this process holds the results folder."""
    started = time.perf_counter()
    planner = _build_planner(config, points, args) if not args.no_plan or args.budget_minutes else None
    try:
        sweep_started = time.monotonic() - (time.perf_counter() - started)
        runs_path = run_sweep(config, points, retry_failed=args.retry_failed, progress=not args.quiet,
                              slurm_partition=args.slurm, planner=planner, budget_minutes=args.budget_minutes,
                              started=sweep_started)
        runs_path = _run_seed_stage(config, args, planner, sweep_started) or runs_path
    except KeyboardInterrupt:
        print(f"\ninterrupted; rows written so far are kept in {config.out_dir / 'runs.csv'}; "
              "rerun the same command to resume", file=sys.stderr)
        return 130
    except RunsFileError as error:
        print(f"python -m experiments.sweep: error: {error}", file=sys.stderr)
        return 1
    print(f"runs: {runs_path} ({time.perf_counter() - started:.0f} s)")
    if not args.no_report:
        from ..report.build import ReportError, build_report

        try:
            written = build_report(config.out_dir)
        except ReportError as error:  # a file put in the report's way while the sweep ran
            print(f"python -m experiments.sweep: error: {error}; the rows are kept in {runs_path}", file=sys.stderr)
            return 2
        print(f"report: {len(written)} files in {config.out_dir}/ (summary: {config.out_dir / 'summary.md'})")
    return 0


def _run_seed_stage(config: SweepConfig, args: argparse.Namespace, planner: Planner | None,
                    started: float) -> Path | None:
    """The seeds at each setting's chosen rate, once its learning-rate grid has rows (experiments/sweep/lr_stages.py)."""
    from mixers import list_mixers

    stage = seed_points(config, list_mixers(), latest_by_key(read_rows(config.out_dir / "runs.csv")))
    print("\n".join(stage_lines(config, [], stage)))
    if not stage.ready:
        return None
    return run_sweep(config, stage.ready, retry_failed=args.retry_failed, progress=not args.quiet,
                     slurm_partition=args.slurm, planner=planner, budget_minutes=args.budget_minutes, started=started)


def check_environment(config: SweepConfig, dry_run: bool = False) -> None:
    """Problems that would fail every point: say so once, before running any. A dry run only plans, so it may
    plan for a device this machine lacks."""
    import torch

    for run in config.run_configs():
        if run.device == "cuda" and not torch.cuda.is_available() and not dry_run:
            raise ConfigError("device: cuda was asked for but torch sees no CUDA device; use --device cpu "
                              "(or --dry-run to plan it)")
        if run.compile not in ("", "none") and not dry_run:
            check_compile(run.device)
        if run.epochs > 0:
            from ..train.datasets import check_dataset_available

            check_dataset_available(run.dataset, data_dir=run.data_dir or None, data_path=run.data_path or None)


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
