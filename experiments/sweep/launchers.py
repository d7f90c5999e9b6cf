"""Where points run: one isolated local process each, or one submitit job each (Slurm, or its local executor).

Either way the sweep process alone writes runs.csv, so rows from a cluster land in the same file.
"""
from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from ..measure.point import Point
from ..measure.run import measure_point
from .config import SweepConfig
from .isolation import kill_group, run_isolated

Record = Callable[[Point, dict], None]
# Decides, just before a point runs, whether it runs as is, runs adjusted, or is recorded as skipped.
Prepare = Callable[[Point], "tuple[Point, dict | None]"]


class LocalLauncher:
    """Points one after another, each in its own child process with the point's time limit; consecutive points
    with `parallel` > 1 (CPU training) run that many at a time."""

    def run(self, points: Iterable[Point], record: Record, prepare: Prepare, bar) -> None:
        queue = _Queue(points)  # read lazily: a budget decides on each point as the previous ones finish
        while (head := queue.peek()) is not None:
            if head.parallel > 1:
                _run_side_by_side(queue.while_parallel(head.parallel), head.parallel, record, prepare, bar)
                continue
            point, skipped = prepare(queue.pop())
            if skipped is not None:
                record(point, skipped)
                continue
            bar.set_postfix_str(point.label(), refresh=True)
            record(point, run_isolated(measure_point, point, point.timeout_s))


class _Queue:
    """Points read one at a time from an iterable, with a look at the next one."""

    def __init__(self, points: Iterable[Point]) -> None:
        self._points = iter(points)
        self._head: list[Point] = []

    def peek(self) -> Point | None:
        if not self._head:
            self._head = [point for point in [next(self._points, None)] if point is not None]
        return self._head[0] if self._head else None

    def pop(self) -> Point:
        point = self.peek()
        assert point is not None
        self._head = []
        return point

    def while_parallel(self, width: int) -> Iterator[Point]:
        """The next points while they run `width` at a time."""
        while (point := self.peek()) is not None and point.parallel == width:
            yield self.pop()


def _run_side_by_side(points: Iterable[Point], width: int, record: Record, prepare: Prepare, bar) -> None:
    """Up to `width` points at once, each isolated in its own child; rows are recorded here, in this thread, one at
    a time as points finish (so runs.csv has one writer). An interrupt kills the running children before leaving."""
    queue = iter(points)
    running: dict[Future, Point] = {}
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="point") as pool:

        def start_next() -> None:
            for point in queue:
                point, skipped = prepare(point)
                if skipped is not None:
                    record(point, skipped)
                    continue
                running[pool.submit(run_isolated, measure_point, point, point.timeout_s)] = point
                bar.set_postfix_str(point.label(), refresh=True)
                return

        try:
            for _ in range(width):
                start_next()
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    record(running.pop(future), future.result())
                    start_next()
        except BaseException:
            # The worker threads wait on their children until each point's time limit: end the children now, so
            # an interrupted sweep stops at once (their rows are not recorded; a rerun measures them again).
            for child in mp.active_children():
                kill_group(child.pid)
            raise


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
