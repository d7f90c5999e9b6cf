"""A sweep on a shared machine: threads from the free cores, passive OpenMP waits, time limits from predicted
cost, the load in every row, and nothing left behind (processes, semaphores) when a point is killed."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from experiments.measure.point import Point
from experiments.measure.timing import TimingProtocol
from experiments.sweep.isolation import run_isolated
from experiments.sweep.machine import choose_threads, fit_to_machine, matmul_rate, time_limit

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("cpus,busy,threads", [(2, 0.0, 2), (2, 0.2, 2), (2, 1.0, 1), (2, 1.9, 1), (2, 3.5, 1),
                                               (16, 4.1, 12)])
def test_threads_are_the_free_cores(cpus: int, busy: float, threads: int) -> None:
    assert choose_threads(cpus, busy) == threads


def point(**kwargs) -> Point:
    return Point(**{"mixer": "linear", "preset": "micro", "img_size": 32, "patch_size": 4, "batch_size": 1,
                    "timeout_s": 300.0, **kwargs})


def test_time_limit_grows_with_predicted_cost_never_below_timeout() -> None:
    """Where the user gave no limit (0), it grows with the predicted cost, never below 30 minutes."""
    rate = 1e9  # MAC/s
    small = point(timeout_s=0.0)
    assert time_limit(small, 1_000_000, rate) == 1800.0
    big = point(timeout_s=0.0, epochs=4, dataset="pathfinder", train='{"train_samples":4000}')
    # 8 forward calls (2 warm-up, 5 timed, 1 counted), 7 train steps of 3 forwards' work, 4 epochs of 4000 images
    # at 3.5 forwards each; plus 2 x 1 s of timed minimum
    predicted = (8 + 7 * 3 + 4 * 4000 * 3.5) * 10**8 / rate + 2
    assert time_limit(big, 10**8, rate) == pytest.approx(20 * predicted, rel=1e-6)
    assert time_limit(big, 10**8, rate / 4) > 3.9 * time_limit(big, 10**8, rate) - 200  # a slower machine, longer
    assert time_limit(big, None, rate) == 1800.0  # unknown cost: the floor


def test_fit_to_machine_sets_threads_only_where_asked() -> None:
    points = [point(), point(num_threads=3), point(device="cuda")]
    fitted = fit_to_machine(points, threads=1, rate=1e9, macs={})
    assert [p.num_threads for p in fitted] == [1, 3, 0]
    assert [p.key for p in fitted] == [p.key for p in points]  # threads and limits are not part of a point's key


def test_matmul_rate_is_positive() -> None:
    assert matmul_rate(1) > 1e6


def _environment(p: Point) -> dict:
    import os

    import torch

    from experiments.sweep.isolation import MALLOC_ENV

    return {"status": "ok", "omp": os.environ.get("OMP_WAIT_POLICY", ""), "threads": torch.get_num_threads(),
            "malloc": {name: os.environ.get(name) for name in MALLOC_ENV}}


def test_points_run_with_the_wait_policy_the_sweep_chose_and_fixed_malloc_thresholds() -> None:
    import os

    from experiments.sweep.isolation import MALLOC_ENV

    row = run_isolated(_environment, point(), 60)
    assert row["omp"] == os.environ.get("OMP_WAIT_POLICY", ""), row  # set in this process before the server
    assert row["malloc"] == MALLOC_ENV, row


def test_openmp_threads_wait_passively_only_where_other_work_takes_a_core() -> None:
    """Passive waits protect the points from a busy machine; on a quiet one they cost every parallel region a
    wake-up (a batch-1 CPU forward took far longer), so the OpenMP runtime's default stays there."""
    from experiments.sweep.machine import openmp_wait_policy

    assert openmp_wait_policy(0.0) is None and openmp_wait_policy(0.2) is None
    assert openmp_wait_policy(0.9) == "PASSIVE" and openmp_wait_policy(1.5) == "PASSIVE"


def test_a_sweep_row_records_threads_and_load(tmp_path: Path) -> None:
    from experiments.sweep.__main__ import main
    from experiments.sweep.runs_file import read_rows

    config = tmp_path / "c.toml"
    config.write_text('mixers = ["linear"]\nimg_sizes = [16]\npatch_sizes = [8]\ntimeout_s = 60\n'
                      '[timing]\nwarmup = 0\nmin_repeats = 1\nmin_time_s = 0.0\n')
    assert main(["--config", str(config), "--out", str(tmp_path / "out"), "--quiet", "--no-report"]) == 0
    (row,) = read_rows(tmp_path / "out" / "runs.csv")
    assert int(row["cpu_threads"]) >= 1
    assert float(row["load_start"]) >= 0 and float(row["load_end"]) >= 0
    assert 0 <= float(row["busy_start"]) <= 2 * (os.cpu_count() or 1)
    # what the fork server was started with, the runtime's default named so (an empty cell is an older row's)
    assert row["omp_wait_policy"] == (os.environ.get("OMP_WAIT_POLICY") or "default")


def test_killed_point_leaves_no_workers_and_no_warnings(tmp_path: Path) -> None:
    """A point killed at its limit while a process pool of its own ran: the pool goes with it, and the sweep
    exits without resource_tracker's "leaked semaphore objects" warning."""
    (tmp_path / "pool_point.py").write_text(textwrap.dedent("""
        import os, time
        from concurrent.futures import ProcessPoolExecutor

        def _sleep(path):
            open(path, "a").write(f"{os.getpid()}\\n")
            time.sleep(120)

        def point_with_pool(point):
            with ProcessPoolExecutor(max_workers=2) as pool:
                list(pool.map(_sleep, [point.data_path] * 2))
            return {"status": "ok"}
    """))
    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(tmp_path)!r})
        from pool_point import point_with_pool
        from experiments.measure.point import Point
        from experiments.sweep.isolation import run_isolated
        if __name__ == "__main__":
            p = Point(mixer="linear", preset="micro", img_size=8, patch_size=4, batch_size=1, data_path={str(pids)!r})
            print(run_isolated(point_with_pool, p, 8)["status"])
    """)
    (tmp_path / "sweep.py").write_text(script)
    result = subprocess.run([sys.executable, str(tmp_path / "sweep.py")], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "timeout", result.stderr
    assert "leaked" not in result.stderr and "Warning" not in result.stderr, result.stderr
    workers = [int(line) for line in pids.read_text().split()]
    assert len(workers) == 2
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()
             and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]]
    assert not alive, f"pool workers outlived their point: {alive}"


def _summary_of_two_cost_rows(folder: Path, **load: float) -> str:
    """The report's summary.md of a sweep of two cost rows whose load columns are `load`."""
    from experiments.report.build import build_report
    from experiments.sweep.runs_file import append_row

    for img in (16, 32):
        append_row(folder / "runs.csv", {
            "mixer": "linear", "preset": "micro", "overrides": "{}", "img_size": img, "patch_size": 8,
            "batch_size": 1, "device": "cpu", "dtype": "float32", "epochs": 0, "seed": 0, "train": "{}",
            "tokens": (img // 8) ** 2, "status": "ok", "params": 10, "gmacs": 0.001 * img, "latency_ms": 0.1 * img,
            "peak_mem_mb": 1.0, "cpu_threads": 1, **load})
    build_report(folder)
    return (folder / "summary.md").read_text()


def test_summary_says_when_the_machine_was_busy(tmp_path: Path) -> None:
    quiet = _summary_of_two_cost_rows(tmp_path / "quiet", load_start=0.1, load_end=1.1)
    assert "the machine was busy" not in quiet
    busy = _summary_of_two_cost_rows(tmp_path / "busy", load_start=1.4, load_end=2.4)
    assert "the machine was busy" in busy and "load average (1 min): 1.4 to 1.4 when the sweep(s) started" in busy


def test_a_sweeps_own_last_minute_is_not_other_work(tmp_path: Path) -> None:
    """cifar_cpu's seed stage started at a load average of 1.02, its own rate grid's trainings of the minute
    before, with 0.0 cores busy with other work: the summary called the machine busy. Sampled cores decide."""
    own = _summary_of_two_cost_rows(tmp_path / "own", load_start=1.02, load_end=2.0, busy_start=0.0)
    assert "the machine was busy" not in own and "(sampled over 1 s): 0 to 0" in own
    other = _summary_of_two_cost_rows(tmp_path / "other", load_start=1.02, load_end=2.0, busy_start=1.2)
    assert "other work held 1.2 cores" in other


def test_a_users_limit_is_the_limit() -> None:
    """A limit the user gave holds whatever the prediction (issue 35: --timeout-s 5 became 6,743 s); only where none
    was given (0) does the prediction choose it."""
    big = point(timeout_s=5.0, epochs=4, dataset="pathfinder")
    assert time_limit(big, 10**8, 1e9) == 5.0
    automatic = point(timeout_s=0.0, epochs=4, dataset="pathfinder")
    assert time_limit(automatic, 10**8, 1e9) > 1800.0
    assert time_limit(point(timeout_s=0.0), None, 1e9) == 1800.0


def test_a_long_point_stops_at_the_users_limit(tmp_path: Path) -> None:
    """A training of minutes with --timeout-s 3 is a timeout row within seconds (before the fix its limit was
    20 x the predicted cost, at least 30 minutes: a hung imagefolder point of 4 FIFO images ran past 900 s)."""
    from experiments.sweep.__main__ import main
    from experiments.sweep.runs_file import read_rows

    config = tmp_path / "c.toml"
    config.write_text('mixers = ["linear"]\nimg_sizes = [16]\npatch_sizes = [4]\nmeasure_train_step = false\n'
                      '[timing]\nwarmup = 0\nmin_repeats = 1\nmin_time_s = 0.0\n'
                      '[train]\ntrain_samples = 4000\n')
    started = time.monotonic()
    assert main(["--config", str(config), "--out", str(tmp_path / "out"), "--quiet", "--no-report", "--no-plan",
                 "--dataset", "reach", "--epochs", "200", "--timeout-s", "3"]) == 0
    (row,) = read_rows(tmp_path / "out" / "runs.csv")
    assert row["status"] == "timeout", row
    assert time.monotonic() - started < 120  # seconds of limit, plus the sweep's start and a killed worker
