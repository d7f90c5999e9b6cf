"""The sweep runner end to end: rows, resume, kill -9, bad input, the OOM cascade, the submitit launcher."""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.sweep.runs_file import append_row, read_rows
from experiments.schema import COLUMNS
from experiments.sweep.__main__ import main

import tiny_sweep
from tiny_sweep import tiny_config

REPO = Path(__file__).resolve().parent.parent

TINY = tiny_config(["attention", "linear"], [16, 32])


def write_config(tmp_path: Path, text: str = TINY) -> Path:
    return tiny_sweep.write_config(tmp_path, text)


def rows_of(out: Path) -> list[dict[str, str]]:
    return read_rows(out / "runs.csv")


def test_tiny_sweep_end_to_end_and_resume(tmp_path: Path, capsys) -> None:
    config, out = write_config(tmp_path), tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--quiet"]) == 0
    rows = rows_of(out)
    assert [(r["mixer"], r["tokens"], r["status"]) for r in rows] == [
        ("attention", "4", "ok"), ("attention", "16", "ok"), ("linear", "4", "ok"), ("linear", "16", "ok")]
    assert all(r["commit"] and r["torch_version"] and r["device_name"] and r["impl"] for r in rows)
    assert (out / "summary.md").exists() and any((out / "figures").glob("*.png"))
    assert "report:" in capsys.readouterr().out

    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report"]) == 0
    assert len(rows_of(out)) == 4  # resume: nothing new to run

    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--img-sizes", "16", "24"]) == 0
    assert len(rows_of(out)) == 6  # only the two new points were added


def test_killed_sweep_resumes_without_loss(tmp_path: Path) -> None:
    config, out = write_config(tmp_path), tmp_path / "out"
    command = [sys.executable, "-m", "experiments.sweep", "--config", str(config), "--out", str(out), "--quiet",
               "--no-report", "--img-sizes", "16", "32", "48", "64"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = out / "runs.csv"
    deadline = time.time() + 120
    while time.time() < deadline and (not runs.exists() or runs.read_text().count("\n") < 3):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    before = rows_of(out)
    assert 2 <= len(before) < 8
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = rows_of(out)
    assert after[: len(before)] == before  # nothing written was lost or changed
    keys = [(r["mixer"], r["img_size"]) for r in after]
    assert len(keys) == len(set(keys)) == 8


def test_half_written_row_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    keys = {"img_size": 32, "patch_size": 8, "batch_size": 1, "epochs": 0, "seed": 0}  # every row has them
    append_row(path, {"mixer": "attention", "status": "ok", **keys})
    with path.open("a") as f:
        f.write("linear,micro,{},3")  # a write cut short: no newline
    assert len(read_rows(path)) == 1
    append_row(path, {"mixer": "swin", "status": "ok", **keys})
    assert [r["mixer"] for r in read_rows(path)] == ["attention", "swin"]
    assert list(csv.reader(path.open()))[0] == list(COLUMNS)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--mixers", "atention"], "unknown mixer(s) atention; registered: attention"),
        (["--img-sizes", "30", "--patch-sizes", "8"], "patch size does not divide the image for 30px/patch 8"),
        (["--batch-sizes", "0"], "batch_sizes must be >= 1"),
        (["--config", "no_such_config"], "no config 'no_such_config'; named configs: "),
        (["--epochs", "1", "--dataset", "npz", "--data-path", "/nonexistent/x.npz"], "/nonexistent/x.npz"),
    ],
)
def test_bad_input_is_one_line_and_touches_nothing(tmp_path: Path, flags: list[str], message: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "runs.csv").write_text(",".join(COLUMNS) + "\n")
    before = (out / "runs.csv").read_bytes()
    args = ["--config", str(write_config(tmp_path)), "--out", str(out), *flags]
    result = subprocess.run([sys.executable, "-m", "experiments.sweep", *args], cwd=REPO, capture_output=True,
                            text=True)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert (out / "runs.csv").read_bytes() == before


def test_config_typo_names_the_field(tmp_path: Path) -> None:
    config = write_config(tmp_path, TINY.replace("img_sizes", "img_sizs"))
    result = subprocess.run([sys.executable, "-m", "experiments.sweep", "--config", str(config)], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "unknown field(s) img_sizs" in result.stderr and "img_sizes" in result.stderr


def test_out_of_memory_skips_larger_points(tmp_path: Path) -> None:
    """A memory cap makes materialised attention fail at 16K tokens: that row is oom, larger ones skipped."""
    config, out = write_config(tmp_path), tmp_path / "out"
    args = ["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--mixers", "attention_naive",
            "--img-sizes", "32", "512", "1024", "--patch-sizes", "4", "--memory-limit-mb", "600"]
    assert main(args) == 0
    statuses = [(r["tokens"], r["status"]) for r in rows_of(out)]
    assert statuses == [("64", "ok"), ("16384", "oom"), ("65536", "skipped")]
    assert "ran out of memory at 16384 tokens" in rows_of(out)[2]["error"]
    assert main(args) == 0 and len(rows_of(out)) == 3  # oom and skipped rows count as done...
    assert main([*args, "--retry-failed"]) == 0
    assert [r["status"] for r in rows_of(out)][3:] == ["oom", "skipped"]  # ...until asked to retry


def test_submitit_local_executor(tmp_path: Path) -> None:
    config, out = write_config(tmp_path), tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--launcher", "submitit",
                 "--mixers", "linear"]) == 0
    rows = rows_of(out)
    assert [(r["mixer"], r["status"]) for r in rows] == [("linear", "ok"), ("linear", "ok")]


def test_training_step_wall_is_separate_from_inference(tmp_path: Path) -> None:
    """Under a cap, a 4096-token training step runs out of memory while inference fits: the row stays ok."""
    text = TINY.replace("measure_train_step = false", "measure_train_step = true").replace("{depth = 1}", "{depth = 2}")
    config, out = write_config(tmp_path, text), tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--mixers", "attention_naive",
                 "--img-sizes", "32", "256", "288", "--patch-sizes", "4", "--memory-limit-mb", "700",
                 "--num-threads", "2"]) == 0  # threads own stacks and arenas under the cap: fix their number
    rows = rows_of(out)
    assert [(r["tokens"], r["status"], r["train_status"]) for r in rows] == [
        ("64", "ok", "ok"), ("4096", "ok", "oom"), ("5184", "ok", "skipped")]
    assert rows[1]["latency_ms"] and not rows[1]["train_step_ms"]
    assert "train step" in rows[1]["error"] and "out of memory at 4096 tokens" in rows[2]["error"]


@pytest.mark.parametrize(
    "top,tables,message",
    [
        ("", "[overrides.linear]\ndpeth = 2\n", "overrides for linear (micro): unknown ViT override(s) dpeth"),
        ("", "[overrides.attention]\nmixer_options = {window_size = 3}\n",
         "mixer 'attention' has no option(s) window_size"),
        ('epochs = 1\ndataset = "pathfinder"\n', "[train]\nlr = -1.0\n", "train: TrainRecipe.lr must be > 0"),
        ("", '[[runs]]\nimg_sizes = "x"\n', "runs[0]: img_sizes must be a list of integers"),
        ("", "[[runs]]\nbatch_size = 3\n", "runs[0]: unknown field(s) batch_size"),
    ],
)
def test_config_errors_are_caught_before_running(tmp_path: Path, top: str, tables: str, message: str) -> None:
    """Errors in overrides, mixer options, the recipe or a [[runs]] table stop the sweep before any point runs."""
    head, timing = TINY.replace('overrides = {"*" = {depth = 1}}\n', "").split("[timing]")
    config = write_config(tmp_path, head + top + "[timing]" + timing + tables)
    result = subprocess.run([sys.executable, "-m", "experiments.sweep", "--config", str(config), "--out",
                             str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_runs_without_out_never_resume_from_committed_references() -> None:
    """results/<name>/ holds committed reference rows; a plain run writes beside them, in results/local/<name>/."""
    from experiments.sweep.config import config_from_dict, load_config

    values, source = load_config("default")
    assert config_from_dict(values, source).out_dir == Path("results/local/default")
    assert "results/local/" in (REPO / ".gitignore").read_text()


def test_help_names_every_registered_mixer() -> None:
    from experiments.sweep.__main__ import build_parser
    from mixers import list_mixers

    text = " ".join(build_parser().format_help().split())
    assert not [m for m in list_mixers() if m not in text]


def test_default_lists_its_mixers_so_a_new_mixer_does_not_grow_its_budget() -> None:
    """The default's cost run named no mixers, so every mixer registered later joined it unasked (75 points became
    111 with neighborhood, vmamba and gla); the lead adds one after timing it."""
    from experiments.sweep.config import config_from_dict, load_config
    from mixers import list_mixers

    values, source = load_config("default")
    mixers_run = {p.mixer for p in config_from_dict(values, source).points(list_mixers())}
    assert mixers_run == {"attention", "attention_naive", "swin", "linear", "mamba", "identity"}


def training_config(tmp_path: Path, extra: str = "") -> Path:
    text = TINY.split("[timing]")[0] + 'epochs = 1\ndataset = "reach"\nseeds = [0, 1]\nnum_threads = 1\n' + extra
    text += "[timing]\nwarmup = 0\nmin_repeats = 1\nmin_time_s = 0.0\n[train]\ntrain_samples = 40\nbatch_size = 20\n"
    return write_config(tmp_path, text)


def test_training_points_run_side_by_side_and_one_failing_costs_only_its_row(tmp_path: Path) -> None:
    from datetime import datetime, timedelta

    from experiments.measure.run import FAULT_VARIABLE

    def row_interval(row: dict) -> tuple[datetime, datetime]:  # when a point ran: its end, less its own seconds
        end = datetime.fromisoformat(row["timestamp"])
        return end - timedelta(seconds=float(row["point_seconds"] or 0)), end

    out = tmp_path / "out"
    # A fresh process: the fault variable must reach the fork server, which an earlier test may have started.
    env = {**os.environ, FAULT_VARIABLE: r"linear .* seed 1$", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "experiments.sweep", "--config", str(training_config(tmp_path)), "--out",
                    str(out), "--quiet", "--no-plan", "--no-report", "--parallel", "2"], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = rows_of(out)
    assert sorted((r["mixer"], r["img_size"], r["seed"], r["status"]) for r in rows) == sorted(
        (m, s, seed, "error" if (m, seed) == ("linear", "1") else "ok")
        for m in ("attention", "linear") for s in ("16", "32") for seed in ("0", "1"))
    spans = sorted(row_interval(r) for r in rows)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))  # two points ran at once
    assert all(r["cpu_threads"] == "1" for r in rows if r["status"] == "ok")


@pytest.mark.parametrize("flags, message", [
    (["--parallel", "0"], "parallel must be >= 1"),
    (["--parallel", "2", "--num-threads", "0"], "set device = \"cpu\" and num_threads"),
    (["--parallel", "4096", "--num-threads", "1"], "parallel 4096 x num_threads 1 is more than the"),
])
def test_bad_parallel_is_refused_with_one_line(tmp_path: Path, capsys, flags: list[str], message: str) -> None:
    out = tmp_path / "out"
    assert main(["--config", str(training_config(tmp_path)), "--out", str(out), "--dry-run", "--no-plan", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists()
