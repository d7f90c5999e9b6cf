"""Where points run: one isolated local process each, or one submitit job each (Slurm, or its local executor).

Either way the sweep process alone writes runs.csv, so rows from a cluster land in the same file.
"""
from __future__ import annotations

from collections.abc import Callable

from ..measure.point import Point
from ..measure.run import measure_point
from .config import SweepConfig
from .isolation import run_isolated

Record = Callable[[Point, dict], None]
# Decides, just before a point runs, whether it runs as is, runs adjusted, or is recorded as skipped.
Prepare = Callable[[Point], "tuple[Point, dict | None]"]


class LocalLauncher:
    """Points one after another, each in its own child process with the point's time limit."""

    def run(self, points: list[Point], record: Record, prepare: Prepare, bar) -> None:
        for point in points:
            point, skipped = prepare(point)
            if skipped is not None:
                record(point, skipped)
                continue
            bar.set_postfix_str(point.label(), refresh=True)
            record(point, run_isolated(measure_point, point, point.timeout_s))


def measure_in_job(point: Point) -> dict:
    """What a submitit job runs: the same isolated measurement as a local sweep."""
    return run_isolated(measure_point, point, point.timeout_s)


class SubmititLauncher:
    """A job per point through submitit: Slurm when a partition is given, else its local executor.

    On Slurm the jobs of a sweep run in parallel, each on its own allocation (a GPU each for CUDA sweeps), so an
    out-of-memory point cancels the larger points of its group that have not started. The local executor would
    start every job at once on one machine and time them against each other, so there they run one at a time.
    """

    def __init__(self, config: SweepConfig, partition: str | None, longest_s: float = 0.0) -> None:
        import submitit

        self.parallel = partition is not None
        self.executor = submitit.AutoExecutor(folder=config.out_dir / ".submitit",
                                              cluster="slurm" if partition else "local")
        longest = max([longest_s] + [p.timeout_s for p in [config] + config.run_configs()])
        params: dict[str, object] = {"timeout_min": max(1, int(longest // 60) + 2), "nodes": 1, "tasks_per_node": 1}
        if any(run.device == "cuda" for run in config.run_configs()):
            params["gpus_per_node"] = 1
        if partition:
            params["slurm_partition"] = partition
        self.executor.update_parameters(**params)

    def run(self, points: list[Point], record: Record, prepare: Prepare, bar) -> None:
        if not self.parallel:
            for point in points:
                point, skipped = prepare(point)
                if skipped is None:
                    bar.set_postfix_str(point.label(), refresh=True)
                record(point, skipped if skipped is not None else self._result(point, self.executor.submit(measure_in_job, point)))
            return
        jobs = []
        for point in points:
            point, skipped = prepare(point)
            if skipped is not None:
                record(point, skipped)
            else:
                jobs.append((point, self.executor.submit(measure_in_job, point)))
        for point, job in jobs:  # in sweep order, so rows land ascending within a group
            _, skipped = prepare(point)
            if skipped is not None and not job.done():
                job.cancel(check=False)
                record(point, skipped)
                continue
            bar.set_postfix_str(point.label(), refresh=True)
            record(point, self._result(point, job))

    @staticmethod
    def _result(point: Point, job) -> dict:
        try:
            return job.result()
        except Exception as error:  # noqa: BLE001 - a failed job is one failed point
            return {"status": "error", "error": f"submitit job {job.job_id}: {type(error).__name__}: {error}"[:500]}


def make_launcher(config: SweepConfig, slurm_partition: str | None = None,
                  longest_s: float = 0.0) -> LocalLauncher | SubmititLauncher:
    """The launcher of `config`; `longest_s`, the longest time limit of its points, sizes submitit's job limit."""
    if config.launcher == "submitit":
        return SubmititLauncher(config, slurm_partition, longest_s)
    return LocalLauncher()
