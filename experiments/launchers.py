"""Where points run: one isolated local process each, or one submitit job each (Slurm, or its local executor).

Either way the sweep process alone writes runs.csv, so rows from a cluster land in the same file.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .config import SweepConfig
from .isolation import run_isolated
from .measure import measure_point
from .point import Point

Record = Callable[[Point, dict], None]
ShouldSkip = Callable[[Point], "int | None"]
SkippedRow = Callable[[Point, int], dict]


class LocalLauncher:
    """Points one after another, each in a forked child with the config's time limit."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def run(self, points: list[Point], record: Record, should_skip: ShouldSkip, skipped_row: SkippedRow, bar) -> None:
        for point in points:
            oom_tokens = should_skip(point)
            if oom_tokens is not None:
                record(point, skipped_row(point, oom_tokens))
                continue
            bar.set_postfix_str(point.label(), refresh=True)
            record(point, run_isolated(measure_point, point, self.timeout_s))


def measure_in_job(point: Point, timeout_s: float) -> dict:
    """What a submitit job runs: the same isolated measurement as a local sweep."""
    return run_isolated(measure_point, point, timeout_s)


class SubmititLauncher:
    """A job per point through submitit: Slurm when a partition is given, else its local executor.

    Points of a group run in parallel, so an out-of-memory point cancels the larger points of its group that
    have not started, and records them as skipped.
    """

    def __init__(self, folder: Path, timeout_s: float, partition: str | None) -> None:
        import submitit

        cluster = "slurm" if partition else "local"
        self.executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
        params = {"timeout_min": max(1, int(timeout_s // 60) + 2)}
        if partition:
            params["slurm_partition"] = partition
        self.executor.update_parameters(**params)
        self.timeout_s = timeout_s

    def run(self, points: list[Point], record: Record, should_skip: ShouldSkip, skipped_row: SkippedRow, bar) -> None:
        jobs = []
        for point in points:
            oom_tokens = should_skip(point)
            if oom_tokens is not None:
                record(point, skipped_row(point, oom_tokens))
            else:
                jobs.append((point, self.executor.submit(measure_in_job, point, self.timeout_s)))
        for point, job in jobs:  # in sweep order, so rows land ascending within a group
            oom_tokens = should_skip(point)
            if oom_tokens is not None and not job.done():
                job.cancel(check=False)
                record(point, skipped_row(point, oom_tokens))
                continue
            bar.set_postfix_str(point.label(), refresh=True)
            try:
                row = job.result()
            except Exception as error:  # noqa: BLE001 - a failed job is one failed point
                row = {"status": "error", "error": f"submitit job {job.job_id}: {type(error).__name__}: {error}"[:500]}
            record(point, row)


def make_launcher(config: SweepConfig, slurm_partition: str | None = None):
    if config.launcher == "submitit":
        return SubmititLauncher(config.out_dir / ".submitit", config.timeout_s, slurm_partition)
    return LocalLauncher(config.timeout_s)
