"""A sweep on a shared machine: threads from the free cores, passive OpenMP waits, time limits from predicted
cost, the load in every row, and nothing left behind (processes, semaphores) when a point is killed."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from experiments.measure.point import Point
from experiments.sweep.isolation import run_isolated

REPO = Path(__file__).resolve().parent.parent


def point(**kwargs) -> Point:
    return Point(**{"mixer": "linear", "preset": "micro", "img_size": 32, "patch_size": 4, "batch_size": 1,
                    "timeout_s": 300.0, **kwargs})


def _environment(p: Point) -> dict:
    import os

    import torch

    return {"status": "ok", "omp": os.environ.get("OMP_WAIT_POLICY", ""), "threads": torch.get_num_threads()}


def test_points_run_with_passive_openmp_waits() -> None:
    row = run_isolated(_environment, point(), 60)
    assert row["omp"] == "PASSIVE", row


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
