"""Bad input and faults: each stops with one line that names the field or file and the fix, before anything is
written, or keeps every row written before it (a full disk, a torn row, two sweeps into one folder)."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from experiments.measure.point import Point
from experiments.measure.run import is_out_of_memory
from experiments.measure.timing import TimingProtocol
from experiments.report.__main__ import main as report_main
from experiments.report.build import build_report, load_runs
from experiments.runs_csv import RunsFileError
from experiments.schema import COLUMNS
from experiments.sweep.__main__ import main, pending_points
from experiments.sweep.isolation import run_isolated
from experiments.sweep.out_dir import SweepLock
from experiments.sweep.runs_file import append_row, read_rows

import tiny_sweep
from tiny_sweep import tiny_config
from messages import one_line_error

TINY = tiny_config(["linear"], [16, 32])


def write_config(tmp_path: Path, text: str = TINY) -> Path:
    return tiny_sweep.write_config(tmp_path, text)


def _row(mixer: str, img_size: int = 16) -> dict[str, object]:
    return {"mixer": mixer, "preset": "micro", "overrides": "{}", "img_size": img_size, "patch_size": 8,
            "batch_size": 1, "device": "cpu", "dtype": "float32", "dataset": "", "epochs": 0, "seed": 0,
            "train": "{}", "tokens": (img_size // 8) ** 2, "status": "ok", "params": 10, "gmacs": 0.001,
            "latency_ms": 1.0, "peak_mem_mb": 1.0}


# --- 1. a write that fails never loses rows silently -----------------------------------------------------------

def _fail_on_runs_csv(monkeypatch, behaviour: str, after: int = 0) -> None:
    """Makes os.write on runs.csv write short (half, then nothing) or raise ENOSPC, after `after` good writes."""
    real_write = os.write
    seen = {"writes": 0}

    def write(fd: int, data) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith("runs.csv"):
            return real_write(fd, data)
        seen["writes"] += 1
        if seen["writes"] <= after:
            return real_write(fd, data)
        if behaviour == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if behaviour == "short" and seen["writes"] == after + 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        return 0

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("behaviour", ["short", "enospc"])
def test_failed_write_keeps_earlier_rows_and_says_so(tmp_path: Path, monkeypatch, behaviour: str) -> None:
    path = tmp_path / "runs.csv"
    append_row(path, _row("attention"))
    before = path.read_bytes()
    _fail_on_runs_csv(monkeypatch, behaviour)
    with pytest.raises(RunsFileError, match="cannot write a row to .*earlier row is kept"):
        append_row(path, _row("linear"))
    assert path.read_bytes() == before  # no half row left behind


def test_short_writes_are_completed(tmp_path: Path, monkeypatch) -> None:
    """os.write may write less than asked without an error: the rest follows, the row lands whole."""
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:7]))
    path = tmp_path / "runs.csv"
    append_row(path, _row("attention"))
    append_row(path, _row("linear"))
    assert [r["mixer"] for r in read_rows(path)] == ["attention", "linear"]


def test_full_disk_stops_the_sweep_with_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "out"
    _fail_on_runs_csv(monkeypatch, "enospc", after=1)  # the first point's row lands, the second's does not
    assert main(["--config", str(write_config(tmp_path)), "--out", str(out), "--quiet"]) == 1
    one_line_error(capsys, "cannot write a row to", "No space left on device", "rerun to resume")
    assert [r["img_size"] for r in read_rows(out / "runs.csv")] == ["16"]
    assert not (out / "summary.md").exists()  # no report of a sweep that stopped


def test_full_disk_at_the_start_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 20, defect 7: the lock's details are the sweep's first write; a full disk there was a traceback."""
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    out = tmp_path / "out"
    assert main(["--config", str(write_config(tmp_path)), "--out", str(out), "--quiet", "--no-plan"]) == 2
    one_line_error(capsys, "cannot write", ".sweep.lock", "No space left on device", "free space")
    assert not (out / "runs.csv").exists()


# --- 2, 7. one reader for the sweep and the report -----------------------------------------------------------

def test_report_drops_a_torn_last_row_as_the_sweep_does(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    for img in (16, 32, 48):
        append_row(path, _row("linear", img))
    text = path.read_text()
    last = text[text.rstrip("\n").rfind("\n") + 1:]
    path.write_text(text[: len(text) - len(last)] + last[: len(last) // 2 + 20])  # killed inside the last write
    assert len(read_rows(path)) == 2
    assert len(load_runs(path)) == 2


def test_stray_line_stops_the_sweep_before_it_runs(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    append_row(out / "runs.csv", _row("linear"))
    with (out / "runs.csv").open("a") as f:
        f.write("a note someone pasted here\n")
    before = (out / "runs.csv").read_bytes()
    assert main(["--config", str(write_config(tmp_path)), "--out", str(out), "--quiet"]) == 2
    one_line_error(capsys, "line 3 has 1 cells where the header has")
    assert (out / "runs.csv").read_bytes() == before


# --- 3, 4. the results folder ----------------------------------------------------------------------------------

def test_second_sweep_into_one_folder_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    with SweepLock(out):
        assert main(["--config", str(write_config(tmp_path)), "--out", str(out), "--quiet"]) == 2
    err = one_line_error(capsys, "is in use by another sweep", f"pid {os.getpid()} on {os.uname().nodename}")
    assert "started 20" in err
    assert not (out / "runs.csv").exists()
    assert main(["--config", str(write_config(tmp_path)), "--out", str(out), "--quiet", "--no-report"]) == 0


@pytest.mark.parametrize("where", ["file", "under_file", "read_only"])
def test_unusable_out_is_refused_before_anything_runs(tmp_path: Path, capsys, where: str) -> None:
    if where == "read_only" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    (tmp_path / "a_file").write_text("x")
    out = {"file": tmp_path / "a_file", "under_file": tmp_path / "a_file" / "out",
           "read_only": tmp_path / "ro" / "out"}[where]
    if where == "read_only":
        (tmp_path / "ro").mkdir(mode=0o555)
    assert main(["--config", str(write_config(tmp_path)), "--out", str(out), "--quiet"]) == 2
    one_line_error(capsys, f"--out {out}")
    assert (tmp_path / "a_file").read_text() == "x"


# --- 5. validation: one line naming the field, exit 2, nothing written -----------------------------------------

def _npz(tmp_path: Path, float_images: bool = False, negative: bool = False) -> str:
    x = np.zeros((4, 8, 8, 3), dtype=np.float32 if float_images else np.uint8)
    y = np.array([0, 1, -1 if negative else 0, 1])
    path = tmp_path / "data.npz"
    np.savez(path, x_train=x, y_train=y, x_test=x, y_test=y)
    return str(path)


NPZ_FLAGS = ["--epochs", "1", "--dataset", "npz", "--data-path"]


@pytest.mark.parametrize("case,flags,message", [
    ("nan", ["--timeout-s", "nan"], "timeout_s must be a finite number"),
    ("inf", ["--timeout-s", "inf"], "timeout_s must be a finite number"),
    ("memory", ["--memory-limit-mb", "-5"], "memory_limit_mb must be >= 0"),
    ("threads", ["--num-threads", "-1"], "num_threads must be >= 0"),
    ("float_npz", NPZ_FLAGS, "x_train must be uint8 images"),
    ("negative_npz", NPZ_FLAGS, "y_train has negative labels"),
    ("abbreviation", ["--mixer", "linear"], "unrecognized arguments: --mixer"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path: Path, capsys, case: str, flags: list[str],
                                                  message: str) -> None:
    if case.endswith("npz"):
        flags = [*flags, _npz(tmp_path, float_images=case == "float_npz", negative=case == "negative_npz")]
    out = tmp_path / "out"
    try:
        code = main(["--config", str(write_config(tmp_path)), "--out", str(out), "--quiet", *flags])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    assert code == 2
    one_line_error(capsys, message)
    assert not out.exists()


@pytest.mark.parametrize("text,message", [
    ('runs = 5\n', "runs must be a list of tables"),
    ('runs = [5]\n', "runs must be a list of tables"),
    ('overrides = {"*" = 5}\n', "overrides.'*' must be a table"),
    ('[timing]\nwarmup = "1"\n', "timing.warmup must be an integer"),
    ('[timing]\nmin_time_s = nan\n', "timing.min_time_s must be a finite number"),
])
def test_bad_config_values_are_one_line(tmp_path: Path, capsys, text: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('mixers = ["linear"]\n' + text)
    out = tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out)]) == 2
    one_line_error(capsys, message)
    assert not out.exists()


def test_unreadable_config_files_are_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('description = "café"\n'.encode("latin-1"))
    assert main(["--config", str(latin1), "--out", str(out)]) == 2
    one_line_error(capsys, "not UTF-8")
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    assert main(["--config", str(folder), "--out", str(out)]) == 2
    one_line_error(capsys, "is not a file")
    assert not out.exists()


def test_non_utf8_runs_csv_is_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "runs.csv").write_bytes(",".join(COLUMNS).encode() + b"\n\xff\xfe\n")
    assert main(["--config", str(write_config(tmp_path)), "--out", str(out)]) == 2
    one_line_error(capsys, "line 2 is not UTF-8")
    assert read_rows_bytes(out) == ",".join(COLUMNS).encode() + b"\n\xff\xfe\n"


def read_rows_bytes(out: Path) -> bytes:
    return (out / "runs.csv").read_bytes()


# --- 6, 8, 9. the report -----------------------------------------------------------------------------------------

@pytest.fixture()
def reported(tmp_path: Path) -> Path:
    for img in (16, 32, 64):
        append_row(tmp_path / "runs.csv", {**_row("linear", img), "gmacs": 0.001 * img, "latency_ms": 0.1 * img})
    build_report(tmp_path)
    return tmp_path


def test_failed_rebuild_keeps_the_old_report(reported: Path, monkeypatch) -> None:
    import experiments.report.build as build

    old = {p: p.read_bytes() for p in reported.rglob("*") if p.is_file()}
    assert any(p.suffix == ".png" for p in old)

    def fails(*args, **kwargs):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(build, "write_figures", fails)
    with pytest.raises(RuntimeError, match="drawing failed"):
        build_report(reported)
    assert {p: p.read_bytes() for p in reported.rglob("*") if p.is_file()} == old  # nothing lost, nothing left


def test_readme_is_checked_before_the_report_is_rewritten(reported: Path, capsys) -> None:
    summary = (reported / "summary.md").stat().st_mtime_ns
    assert report_main([str(reported), "--readme", str(reported / "MISSING.md")]) == 2
    one_line_error(capsys, "MISSING.md: cannot read it")
    assert (reported / "summary.md").stat().st_mtime_ns == summary


def test_report_refuses_abbreviated_flags(reported: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        report_main([str(reported), "--read", "README.md"])
    assert exit_.value.code == 2


def test_summary_counts_diverged_points_as_ran(tmp_path: Path) -> None:
    for img in (16, 32):
        append_row(tmp_path / "runs.csv", {**_row("linear", img), "status": "diverged", "epochs": 1,
                                           "dataset": "pathfinder", "accuracy": 0.5})
    build_report(tmp_path)
    assert "Cost: 2 points (all ran)" in (tmp_path / "summary.md").read_text()


# --- issue 20, defect 5: memory walls under --memory-limit-mb are labelled oom ------------------------------------

QUICK = TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.0)
# What an address-space cap makes of an allocation: oneDNN's primitive creation, a thread's stack (EAGAIN).
LIMIT_ERRORS = [
    RuntimeError("could not create a primitive descriptor for a matmul primitive"),
    OSError(errno.EAGAIN, os.strerror(errno.EAGAIN)),
    RuntimeError("can't start new thread"),
]


def _point(**kwargs) -> Point:
    defaults = dict(mixer="linear", preset="micro", img_size=16, patch_size=8, batch_size=1, timing=QUICK,
                    overrides='{"depth":1}')
    return Point(**{**defaults, **kwargs})


@pytest.mark.parametrize("error", LIMIT_ERRORS, ids=["onednn", "eagain", "thread"])
def test_limit_failures_are_oom_only_under_a_memory_limit(error: BaseException) -> None:
    assert is_out_of_memory(error, memory_limited=True)
    assert not is_out_of_memory(error)  # without a cap they are faults of their own, not a memory wall


@pytest.mark.parametrize("where", ["inference", "train_step"])
def test_a_primitive_that_cannot_be_created_under_the_limit_is_an_oom_row(monkeypatch, where: str) -> None:
    import experiments.measure.run as run

    def fails(*args, **kwargs):
        raise RuntimeError("could not create a primitive")

    monkeypatch.setattr(run, f"measure_{where}", fails)
    limited = run.measure_point(_point(memory_limit_mb=4096))
    unlimited = run.measure_point(_point())
    if where == "inference":
        assert (limited["status"], unlimited["status"]) == ("oom", "error")
    else:  # the inference stands; the training step is its own wall
        assert limited["status"] == "ok" and limited["train_status"] == "oom"
        assert unlimited["status"] == "error"


def _thread_fails(p: Point) -> dict:
    raise RuntimeError("can't start new thread")


def _aborts(p: Point) -> dict:
    os.abort()


@pytest.mark.parametrize("target", [_thread_fails, _aborts])
def test_isolated_worker_failing_under_the_limit_is_oom(target) -> None:
    assert run_isolated(target, _point(memory_limit_mb=4096), 60)["status"] == "oom"
    assert run_isolated(target, _point(), 60)["status"] == "error"


def test_retry_failed_reruns_ok_rows_whose_training_step_hit_a_wall() -> None:
    points = [_point(img_size=s) for s in (16, 32, 48, 64)]
    done = {points[0].key: {"status": "ok", "train_status": "ok"},
            points[1].key: {"status": "ok", "train_status": "oom"},
            points[2].key: {"status": "ok", "train_status": "skipped"}}
    assert pending_points(points, done, retry_failed=False) == [points[3]]
    assert pending_points(points, done, retry_failed=True) == points[1:]


# --- issue 20: errors forced on some points, the sweep killed and resumed: every row once, and a report --------

def _fault_sweep_config(tmp_path: Path, mixers: list[str], img_sizes: list[int]) -> tuple[Path, list[Point]]:
    """A cost sweep of two override settings (depth 1 and 2) at patch sizes 8 and 16: the config and its points."""
    from experiments.sweep.config import config_from_dict, load_config
    from mixers import list_mixers

    text = tiny_config(mixers, img_sizes).replace("patch_sizes = [8]", "patch_sizes = [8, 16]")
    text += '\n[[runs]]\noverrides = {"*" = {depth = 1}}\n\n[[runs]]\noverrides = {"*" = {depth = 2}}\n'
    path = write_config(tmp_path, text)
    return path, config_from_dict(*load_config(str(path))).points(list_mixers())


def _killed_and_resumed(tmp_path: Path, mixers: list[str], img_sizes: list[int], fault: str) -> None:
    """Runs the sweep in its own process group with `fault` forced, SIGKILLs the group partway, reruns the same
    command to the end, and checks that every point has exactly one row, the forced ones error, and a report."""
    import re
    import signal
    import subprocess
    import sys
    import time

    from experiments.measure.run import FAULT_VARIABLE
    from experiments.sweep.runs_file import latest_by_key

    config, points = _fault_sweep_config(tmp_path, mixers, img_sizes)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "experiments.sweep", "--config", str(config), "--out", str(out), "--quiet",
               "--no-plan"]
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, FAULT_VARIABLE: fault, "PYTHONPATH": str(repo)}
    runs = out / "runs.csv"

    def rows_written() -> int:
        return max(len(runs.read_bytes().splitlines()) - 1, 0) if runs.exists() else 0

    sweep = subprocess.Popen(command, cwd=repo, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        while rows_written() < len(points) // 3 and sweep.poll() is None:
            time.sleep(0.05)
    finally:
        os.killpg(sweep.pid, signal.SIGKILL)  # the sweep, its fork server and whatever else is in its group
        sweep.communicate()
    assert rows_written() < len(points), "the sweep ended before it was killed: nothing was resumed"
    resumed = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    rows = read_rows(runs)
    keys = [p.key for p in points]
    assert len(rows) == len(points) and set(latest_by_key(rows)) == set(keys)  # each point once, none twice
    forced = {p.key for p in points if re.search(fault, p.label())}
    assert 0 < len(forced) < len(points)
    statuses = {key: row["status"] for key, row in latest_by_key(rows).items()}
    assert {k for k, s in statuses.items() if s == "error"} == forced
    assert all(statuses[k] == "ok" for k in set(keys) - forced)
    assert (out / "summary.md").exists() and (out / "tables" / "costs.csv").exists()
    assert list((out / "figures").glob("wall*.png"))


def test_forced_errors_kill_and_resume_leave_every_row_once(tmp_path: Path) -> None:
    """20 points: one mixer's depth-2 setting errors at every point, at two patch sizes (issue 20, defect 4's
    shape), with the sweep killed a third of the way through."""
    _killed_and_resumed(tmp_path, ["linear"], [16, 32, 48, 64, 96], fault=r'\{"depth":2\}')


@pytest.mark.slow
def test_forced_errors_kill_and_resume_at_scale(tmp_path: Path) -> None:
    """100 points (every built-in mixer, five sizes, two patch sizes, two depths); attention's depth-2 setting
    and every 96 px / patch 16 point error."""
    _killed_and_resumed(tmp_path, ["attention", "attention_naive", "swin", "linear", "mamba"],
                        [16, 32, 48, 64, 96], fault=r'^attention micro \{"depth":2\}|96px/p16')
