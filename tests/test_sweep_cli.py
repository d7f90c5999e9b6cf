"""The sweep's and the report's command lines say what they do: bad budgets and calibration files are one line,
thread counts are what each point uses, the time left is the planner's, an orphaned point exits quietly, and the
report of a runs.csv path is written beside it (issue 20, defects 6 and 8)."""
from __future__ import annotations

import io
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from experiments.measure.point import Point
from experiments.report.__main__ import main as report_main
from experiments.schema import COLUMNS
from experiments.sweep.__main__ import PlannedProgress, main, thread_note
from experiments.sweep.machine import usable_cpus
from experiments.sweep.plan import Prediction
from experiments.sweep.runs_file import append_row

import tiny_sweep
from tiny_sweep import tiny_config


def run_cli(tmp_path: Path, capsys, *flags: str) -> tuple[int, str]:
    config = tiny_sweep.write_config(tmp_path, tiny_config(["linear"], [16]))
    try:
        code = main(["--config", str(config), "--out", str(tmp_path / "out"), "--quiet", *flags])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    return code, capsys.readouterr().err


def calibration_file(tmp_path: Path, kind: str) -> str:
    path = tmp_path / f"{kind}.csv"
    if kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "garbage":
        path.write_text("this is not a runs.csv\nat all\n")
    elif kind == "empty":
        path.write_text(",".join(COLUMNS) + "\n")
    elif kind == "folder":
        path.mkdir()
    return str(path)


@pytest.mark.parametrize("flags,message", [
    (["--budget-minutes", "0"], "--budget-minutes: must be a finite number of minutes > 0, got '0'"),
    (["--budget-minutes", "-1"], "must be a finite number of minutes > 0, got '-1'"),
    (["--budget-minutes", "nan"], "must be a finite number of minutes > 0, got 'nan'"),
    (["--num-threads", str(usable_cpus() + 1)], f"is more than the {usable_cpus()} CPUs this process may use"),
    (["--calibrate-from", "missing"], "missing.csv: no such file"),
    (["--calibrate-from", "binary"], "binary.csv: line 2 is not UTF-8 text"),
    (["--calibrate-from", "garbage"], "garbage.csv was written with other columns"),
    (["--calibrate-from", "empty"], "empty.csv holds no rows"),
    (["--calibrate-from", "folder"], "folder.csv is not a file"),
])
def test_bad_budget_threads_and_calibration_files_are_one_line(tmp_path: Path, capsys, flags: list[str],
                                                               message: str) -> None:
    if flags[0] == "--calibrate-from":
        flags = [flags[0], calibration_file(tmp_path, flags[1])]
    for dry_run in ([], ["--dry-run"]):
        code, err = run_cli(tmp_path, capsys, *flags, *dry_run)
        assert code == 2 and message in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert not (tmp_path / "out").exists()


def test_first_line_says_the_threads_each_point_uses() -> None:
    """The default's first line said 2 threads while its training points ran on the 1 they set."""
    cost = Point(mixer="linear", preset="micro", img_size=32, patch_size=4, batch_size=1)
    trained = Point(mixer="linear", preset="micro", img_size=16, patch_size=4, batch_size=1, epochs=8,
                    dataset="reach", num_threads=1)
    note = thread_note([cost, cost, trained], threads=2)
    assert note == ("2 threads for the 2 CPU points that leave num_threads at 0, "
                    "1 thread for the 1 that set num_threads = 1")


class _Planner:
    def predict(self, point: Point) -> Prediction:
        seconds = 20.0 if point.img_size < 64 else None
        return Prediction(point, 0.0, 1.0, None, 1.0, None, None, seconds, True, point.batch_size, None)


def test_progress_shows_the_planners_time_left() -> None:
    """tqdm's estimate (mean time so far x points left) showed 3 s with 32 s left; the planner's sum replaces it."""
    points = [Point(mixer="linear", preset="micro", img_size=s, patch_size=8, batch_size=1) for s in (16, 32, 64)]
    progress = PlannedProgress(points, _Planner(), enabled=True)
    progress.bar.fp = io.StringIO()
    progress.set_postfix_str(points[0].label())
    assert progress.bar.postfix == f"{points[0].label()}; ~40 s left (planner) + 1 points not predicted"
    progress.finished(points[0])
    assert progress.seconds_left() == "~20 s left (planner) + 1 points not predicted"
    assert "<" not in progress.bar.format_dict.get("bar_format", "")  # tqdm's own remaining time is not shown
    progress.close()


def test_report_of_a_runs_csv_path_is_written_beside_it(tmp_path: Path, capsys) -> None:
    """`report DIR/runs.csv` named DIR/runs.csv/summary.md, a path that does not exist."""
    for img in (16, 32, 64):
        append_row(tmp_path / "runs.csv", {
            "mixer": "linear", "preset": "micro", "overrides": "{}", "img_size": img, "patch_size": 8,
            "batch_size": 1, "device": "cpu", "dtype": "float32", "epochs": 0, "seed": 0, "tokens": (img // 8) ** 2,
            "status": "ok", "gmacs": 0.001 * img, "latency_ms": 0.1 * img, "peak_mem_mb": 1.0})
    assert report_main([str(tmp_path / "runs.csv")]) == 0
    assert f"see {tmp_path / 'summary.md'}" in capsys.readouterr().out and (tmp_path / "summary.md").exists()
    other = tmp_path / "notes.txt"
    other.write_text("x")
    assert report_main([str(other)]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a sweep folder" in err and len(err.strip().splitlines()) == 1


def test_point_whose_sweep_is_gone_exits_quietly(capfd) -> None:
    """A point that finished after its sweep was killed printed a BrokenPipeError traceback into the terminal."""
    from experiments.sweep.isolation import _child
    from experiments.sweep.plan import CalibrationJob, _noop

    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    receive.close()  # the sweep's end of the pipe, gone with the sweep
    process = ctx.Process(target=_child, args=(_noop, CalibrationJob(), send, os.getpid()))
    process.start()
    send.close()
    process.join(30)
    assert "BrokenPipeError" not in capfd.readouterr().err and process.exitcode == 1
