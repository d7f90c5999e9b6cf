"""The cost planner: the fit, the coarse-first order with the OOM cascade, the budget, old runs.csv keys, dry runs."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.measure.point import Point, point_key
from experiments.schema import COLUMNS, KEY_COLUMNS
from experiments.sweep.__main__ import MemoryWall, key_columns, main
from experiments.sweep.costmodel import nonnegative_fit
from experiments.sweep.plan import Budget, Prediction, bisection_ranks, budget_order, protocol_seconds
from experiments.sweep.runs_file import append_row, latest_by_key, read_rows

from tiny_sweep import tiny_config

REPO = Path(__file__).resolve().parent.parent

TINY = tiny_config(["attention", "linear"], [16, 32, 48, 64, 96])
# A plan drawn from committed GPU rows, as on a machine without one (where one is, it would calibrate on it)
WITHOUT_CUDA = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def test_nonnegative_fit_recovers_rates() -> None:
    x = np.array([[1.0, m, b] for m, b in [(1e6, 1e4), (4e6, 2e4), (1.6e7, 4e4), (6.4e7, 8e4)]])
    y = x @ np.array([0.5, 2e-6, 0.0])
    assert np.allclose(nonnegative_fit(x, y), [0.5, 2e-6, 0.0], rtol=1e-6, atol=1e-12)


def test_protocol_seconds_follows_the_timing_protocol() -> None:
    from experiments.measure.timing import TimingProtocol

    protocol = TimingProtocol(warmup=2, min_repeats=5, min_time_s=1.0, max_repeats=1000)
    assert protocol_seconds(10.0, protocol) == (2 + 100 + 1) * 0.01  # 100 repeats reach 1 s
    assert protocol_seconds(500.0, protocol) == (2 + 5 + 1) * 0.5  # min_repeats rules


def test_bisection_ranks() -> None:
    assert bisection_ranks(1) == [0]
    assert bisection_ranks(5) == [0, 3, 2, 4, 1]  # smallest, largest, middle, quarters


def _points(sizes: list[int], mixer: str = "attention") -> list[Point]:
    return [Point(mixer=mixer, preset="micro", img_size=s, patch_size=8, batch_size=1) for s in sizes]


def _prediction(point: Point, fits: bool | None = True, seconds: float | None = 1.0) -> Prediction:
    return Prediction(point, 0.0, 1.0, None, 1.0, None, None, seconds, fits, point.batch_size, None)


def test_order_is_coarse_first_and_the_oom_cascade_still_holds() -> None:
    points = _points([16, 32, 48, 64, 80]) + _points([16, 32], "linear")
    fits = {p.key: _prediction(p, fits=p.img_size < 80) for p in points}
    order = budget_order(points, fits)
    assert [(p.mixer, p.img_size) for p in order] == [
        ("attention", 16), ("linear", 16), ("attention", 64), ("linear", 32), ("attention", 32),
        ("attention", 48), ("attention", 80)]  # 80 is predicted not to fit: last, after the whole curve
    # The wall: 64 ran out of memory first (it was ordered early); 48 and 32 still run, 80 is skipped.
    wall = MemoryWall()
    wall.add({**{c: getattr(order[2], c) for c in KEY_COLUMNS}, "tokens": order[2].tokens, "status": "oom"})
    decisions = {p.img_size: wall.prepare(p)[1] is None for p in order[3:] if p.mixer == "attention"}
    assert decisions == {48: True, 32: True, 80: False}


class _FakePlanner:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def predict(self, point: Point) -> Prediction:
        return _prediction(point, seconds=self.seconds)


def test_budget_holds_back_what_would_overrun_and_bounds_the_rest() -> None:
    points = _points([16, 32, 48])
    budget = Budget(1.0, _FakePlanner(seconds=25.0), time.monotonic())  # 60 s: two 25 s points fit
    handed = list(budget.points(points[:2]))
    assert handed[0] == points[0]  # a run's first point runs whole, with its own limit (the test below)
    assert len(handed) == 2 and handed[1].timeout_s <= 60.0
    assert budget.cut_short(handed[1], {"status": "timeout"})  # a budget timeout writes no row
    assert not budget.cut_short(handed[1], {"status": "ok"})
    budget.deadline = time.monotonic() + 10.0
    assert list(budget.points(points[2:])) == [] and len(budget.held_back) == 1


def test_budgeted_sweep_stops_within_budget_and_resumes_without_duplicates(tmp_path: Path) -> None:
    config, out = tmp_path / "tiny.toml", tmp_path / "out"
    config.write_text(TINY)
    args = ["--config", str(config), "--out", str(out), "--quiet", "--no-report"]
    budget_s = 15.0
    started = time.perf_counter()
    assert main([*args, "--budget-minutes", str(budget_s / 60)]) == 0
    assert time.perf_counter() - started <= budget_s * 1.1 + 2.0  # +2 s: reading runs.csv, imports on a busy CPU
    first = read_rows(out / "runs.csv")
    assert main([*args, "--budget-minutes", "10"]) == 0
    rows = read_rows(out / "runs.csv")
    assert rows[: len(first)] == first
    # The first sitting's rows (several sizes of each mixer: the ends and middle of its curve) calibrate the second,
    # so every point it runs is predicted; the first sitting's calibration may reach one size only within its fifth
    # of 15 s on a busy machine, and one size predicts nothing elsewhere (issue 35).
    assert all(r["predicted_point_s"] for r in rows[len(first):])
    keys = [point_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == 10


def test_a_budgeted_sweep_gives_each_point_its_chosen_limit_where_the_config_sets_none(tmp_path: Path) -> None:
    """A config without timeout_s (0: the sweep chooses each limit) under --budget-minutes ran every point with
    a limit of 0 s: each was killed at once and recorded as a timeout."""
    config, out = tmp_path / "tiny.toml", tmp_path / "out"
    config.write_text(tiny_config(["attention"], [16, 32]).replace("timeout_s = 120\n", ""))
    args = ["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--budget-minutes", "5"]
    assert main(args) == 0
    rows = read_rows(out / "runs.csv")
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["error"] for r in rows]


def test_a_budget_spent_by_the_grid_leaves_the_seed_runs_for_the_next_run(monkeypatch, capsys) -> None:
    """reach_cpu's 48-minute budget ran out in the rate grid; the seed stage then forced a training past it."""
    import argparse
    import types

    import experiments.sweep.__main__ as sweep_main

    point = Point(mixer="attention", preset="micro", img_size=16, patch_size=4, batch_size=1)
    monkeypatch.setattr(sweep_main, "seed_points", lambda *args: types.SimpleNamespace(ready=[point]))
    monkeypatch.setattr(sweep_main, "stage_lines", lambda *args: [])
    monkeypatch.setattr(sweep_main, "read_rows", lambda path: [])
    monkeypatch.setattr(sweep_main, "run_sweep", lambda *args, **kwargs: pytest.fail("a seed point ran"))
    config = types.SimpleNamespace(out_dir=Path("unused"))
    args = argparse.Namespace(budget_minutes=1.0, save_weights=False, retry_failed=False, quiet=True, slurm=None,
                              allow_mixed_machines=False)
    assert sweep_main._run_seed_stage(config, args, None, started=time.monotonic() - 61) is None
    assert "their 1 points start in the next run" in capsys.readouterr().out


def test_rows_without_the_compile_column_keep_their_keys(tmp_path: Path) -> None:
    """runs.csv files written before `compile` (and the predicted_* columns) existed: read, keyed as eager, upgraded."""
    old_columns = [c for c in COLUMNS if c != "compile" and not c.startswith("predicted_")]
    path = tmp_path / "runs.csv"
    point = Point(mixer="linear", preset="micro", img_size=32, patch_size=8, batch_size=1)
    values = {**{c: getattr(point, c) for c in KEY_COLUMNS}, "tokens": point.tokens, "status": "ok"}
    path.write_text(",".join(old_columns) + "\n" + ",".join(str(values.get(c, "")) for c in old_columns) + "\n")
    rows = read_rows(path)
    assert rows[0]["compile"] == "" and point.key in latest_by_key(rows)
    assert dataclasses.replace(point, compile="default").key not in latest_by_key(rows)
    append_row(path, {**values, "compile": "default", "predicted_point_s": 1.5})
    rows = read_rows(path)
    assert path.read_text().splitlines()[0].split(",") == list(COLUMNS)
    assert [r["compile"] for r in rows] == ["", "default"] and len(latest_by_key(rows)) == 2


def test_bad_compile_mode_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    result = subprocess.run([sys.executable, "-m", "experiments.sweep", "--config", str(config), "--compile",
                             "fast", "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and "compile must be one of" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans for a CUDA device this machine lacks")
def test_dry_run_plans_cuda_on_a_machine_without_one(tmp_path: Path) -> None:
    """No CUDA here and no CUDA rows given: the plan says it is uncalibrated and still gives MACs and memory."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    result = subprocess.run([sys.executable, "-m", "experiments.sweep", "--config", str(config), "--device", "cuda",
                             "--dry-run", "--out", str(tmp_path / "out")], cwd=tmp_path, capture_output=True,
                            text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "UNCALIBRATED" in result.stdout and "attention micro" in result.stdout


def test_planner_builds_from_training_rows_alone(tmp_path: Path) -> None:
    """A resumed training-only sweep has rows with epochs but no cost rows: the planner must still build.

    It once raised a TypeError there, subtracting an unknown (None) cost-phase time from a point's seconds.
    """
    from experiments.sweep.config import config_from_dict, load_config
    from experiments.sweep.plan import Planner
    from mixers import list_mixers

    values, source = load_config("default_lr")  # a committed training-only sweep
    points = config_from_dict(values, source).points(list_mixers())
    runs = tmp_path / "runs.csv"
    runs.write_text((REPO / "results" / "default_lr" / "runs.csv").read_text())
    planner = Planner.build(points, runs, calibrate=False)
    assert all(planner.predict(p).point.key == p.key for p in points)


def test_a_spent_budget_still_runs_one_point_so_a_rerun_progresses() -> None:
    """A budget smaller than any point (or spent calibrating) ran nothing: every rerun stopped where it was."""
    points = _points([16, 32, 48])
    budget = Budget(1.0, _FakePlanner(seconds=500.0), time.monotonic() - 120.0)  # spent a minute ago
    handed = list(budget.points(points))
    assert handed == points[:1]  # with its own time limit: the budget must not cut the one point a run makes
    assert budget.forced == points[0].key and not budget.cut_short(handed[0], {"status": "timeout"})
    assert budget.held_back == points[1:]


def test_time_between_two_runs_is_not_counted_as_per_point_overhead(tmp_path: Path) -> None:
    """Rows written one per run, 10 s apart: the gap between runs once became every point's predicted overhead,
    so a small budget held back every point (defect 6)."""
    from experiments.sweep.plan import DEFAULT_GAP_S, Planner

    runs = tmp_path / "runs.csv"
    points = _points([16, 32, 48, 64, 80, 96, 112])
    for index, point in enumerate(points):
        append_row(runs, {**{c: getattr(point, c) for c in KEY_COLUMNS}, "tokens": point.tokens, "status": "ok",
                          "latency_ms": 1.0, "peak_mem_mb": 1.0, "point_seconds": 0.1,
                          "timestamp": f"2024-01-01T00:00:{10 * index:02d}+00:00"})
    planner = Planner.build(points, runs, calibrate=False)
    assert planner.gap_s == DEFAULT_GAP_S
    for gap in (0.3, 0.2, 0.4):  # what this run sees between its own rows replaces it
        planner.observe_gap(gap)
    assert planner.gap_s == 0.3


def test_tiny_budget_reruns_each_add_a_row(tmp_path: Path, capsys) -> None:
    config, out = tmp_path / "tiny.toml", tmp_path / "out"
    config.write_text(TINY)
    args = ["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--budget-minutes", "0.0001"]
    for runs in (1, 2):
        assert main(args) == 0
        assert len(read_rows(out / "runs.csv")) == runs
    assert "every run makes at least one point" in capsys.readouterr().out


def test_calibration_keeps_what_it_measured_when_its_bound_stops_a_slow_size(monkeypatch) -> None:
    """The calibration ran in one child for all sizes: a slow size killed at the limit lost every row, and a dry
    run of large sizes measured for a minute to print 'unknown'."""
    import experiments.sweep.isolation as isolation
    from experiments.sweep.plan import calibrate_worker, run_calibration

    limits = []

    def fake_run_isolated(target, job, timeout_s: float) -> dict:
        if target is not calibrate_worker:
            return {"status": "ok"}
        limits.append(timeout_s)
        if job.point.img_size > 16:
            return {"status": "timeout"}
        return {"status": "ok", "rows": [{"img_size": job.point.img_size, "latency_ms": 1.0}]}

    monkeypatch.setattr(isolation, "run_isolated", fake_run_isolated)
    rows, _, stopped = run_calibration(_points([16, 64, 128]), seconds=5.0)
    assert stopped and len(rows) == 1 and rows[0]["img_size"] == "16"
    assert len(limits) == 2 and max(limits) <= 5.0  # no size may run past the bound


def test_a_sweep_says_it_calibrates_before_the_calibration_runs(monkeypatch, tmp_path: Path) -> None:
    """A budgeted sweep calibrated for up to a fifth of its budget with nothing on screen and no row written,
    which looked like a hang (and --no-plan did not skip it)."""
    import experiments.sweep.plan as plan

    heard: list[str] = []

    def fake_calibration(points, seconds):
        assert heard, "the line comes before the calibration, not after"
        return [], 0.1, False

    monkeypatch.setattr(plan, "run_calibration", fake_calibration)
    plan.Planner.build(_points([16, 32]), tmp_path / "runs.csv", calibration_s=120.0, say=heard.append)
    assert len(heard) == 1 and "calibrating" in heard[0] and "120 s" in heard[0] and "--calibrate-from" in heard[0]


def test_plan_names_what_it_cannot_predict_and_why() -> None:
    from experiments.sweep.plan import DEFAULT_GAP_S, Planner, plan_lines

    points = _points([16, 32])
    lines = plan_lines(Planner([], [], None, "unknown", DEFAULT_GAP_S), points)
    assert "no point could be predicted" in lines[-2]
    assert lines[-1].startswith("  not predicted, 2 points: no measured row of attention|cpu|float32")


def test_the_gpu_accuracy_reference_is_planned_whole_within_twenty_minutes(tmp_path: Path) -> None:
    """accuracy_gpu must fit the 20 GPU minutes a reference run gets, as the committed H100 rows predict it.

    Run from a folder with nothing beside it, as in a user's clone: the config's CIFAR subset
    (../shared/data/cifar10-subset.npz, relative to where the sweep runs) is absent, and a dry run plans from the
    config's train_samples, saying so, instead of failing."""
    out = tmp_path / "out"
    alone = tmp_path / "clone"
    alone.mkdir()
    result = subprocess.run([sys.executable, "-m", "experiments.sweep", "--config", "accuracy_gpu", "--device", "cuda",
                             "--dry-run", "--out", str(out), "--calibrate-from",
                             str(REPO / "results" / "gpu_h100" / "runs.csv")],
                            cwd=alone, capture_output=True, text=True,
                            env={**WITHOUT_CUDA, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert "note: run 'cifar32' reads ../shared/data/cifar10-subset.npz, which is not here" in result.stdout
    assert "rows of " + str(REPO / "results" / "gpu_h100" / "runs.csv") + " (NVIDIA H100" in result.stdout
    minutes = re.search(r"predicted wall time of the (\d+) points: ([\d.]+) min", result.stdout)
    assert minutes and "not predicted" not in result.stdout, result.stdout[-2000:]
    assert float(minutes[2]) <= 20.0


def test_training_steps_of_an_npz_come_from_its_size_less_the_validation_split(tmp_path: Path) -> None:
    from experiments.sweep.plan import _train_steps

    path = tmp_path / "small.npz"
    np.savez(path, x_train=np.zeros((50, 8, 8, 3), np.uint8), y_train=np.zeros(50, np.uint8),
             x_test=np.zeros((5, 8, 8, 3), np.uint8), y_test=np.zeros(5, np.uint8))
    point = Point(mixer="attention", preset="micro", img_size=8, patch_size=4, batch_size=1, dataset="npz",
                  data_path=str(path), epochs=2, train='{"batch_size":16,"val_fraction":0.2}')
    assert _train_steps(point) == (2 * 3, 16)  # 50 images less 10 held out: 40 an epoch, 3 steps of 16
    missing = dataclasses.replace(point, data_path=str(tmp_path / "absent.npz"))
    assert _train_steps(missing) is None


def test_points_that_run_side_by_side_form_one_pool_after_the_others_longest_first() -> None:
    from experiments.sweep.plan import side_by_side_order

    cost = _points([16, 32]) + _points([16], "mamba")
    training = [dataclasses.replace(p, epochs=1, dataset="reach", parallel=2, seed=seed)
                for p in _points([16]) + _points([16], "mamba") for seed in (0, 1)]
    points = [cost[0], training[0], cost[1], training[1], training[2], cost[2], training[3]]

    class Seconds:  # mamba's trainings predicted longest, attention's unknown
        def predict(self, point: Point) -> Prediction:
            return _prediction(point, seconds=60.0 if point.mixer == "mamba" and point.epochs else None)

    order = side_by_side_order(points, Seconds())
    assert order[:3] == cost  # the cost points keep their order
    assert [(p.mixer, p.seed) for p in order[3:]] == [("mamba", 0), ("mamba", 1), ("attention", 0), ("attention", 1)]
    assert side_by_side_order(points, None)[3:] == training  # nothing predicted: the order they came in


def _rows_of(points: list[Point], truth) -> list[tuple[Point, dict]]:
    """(point, row) pairs whose every target is `truth(target, work)`: a cost model the fit can recover exactly."""
    from experiments.sweep.costmodel import TARGETS, work

    return [(p, {"status": "ok", **{t: str(truth(t, work(p))) for t in TARGETS}}) for p in points]


def _linear_truth(target: str, w) -> float:
    """Memory of 200 MiB plus the activations, time of 2 ms plus the MACs at 1 TMAC/s; overhead 3 s."""
    if "mem" in target:
        return 200.0 + (w.layer_token_bytes if target == "peak_mem_mb" else 8 * w.token_bytes) / 2**20
    return 3.0 if target == "overhead_s" else 2.0 + w.macs / 1e9


def test_a_batch_max_point_is_predicted_at_the_largest_batch_that_fits_with_its_search() -> None:
    """Planned at the protocol's max_batch, a batch-max point looked like an out-of-memory costing minutes; it is
    predicted where the search will stop: the largest power of two whose predicted peak fits, plus a probe at
    each batch up to it."""
    from experiments.measure.throughput import PROBE_TIMING
    from experiments.schema import MAX_BATCH
    from experiments.sweep.costmodel import work
    from experiments.sweep.plan import DEFAULT_GAP_S, Planner

    sizes = [32, 64, 96, 128]
    measured = [dataclasses.replace(p, batch_size=b) for p in _points(sizes) for b in (1, 4, 16)]
    memory_mb = 250.0  # binds both searches below max_batch, the training step's at a smaller batch
    planner = Planner(_rows_of(measured, _linear_truth), ["test"], memory_mb, "test", DEFAULT_GAP_S)
    point = dataclasses.replace(_points([128])[0], batch_size=MAX_BATCH)

    def resident(batch: int, training: bool) -> float:  # weights (and for training, grads and AdamW), the input
        params, image = work(dataclasses.replace(point, batch_size=1)).params, 3 * point.img_size ** 2
        return ((16 * params + 4 * image * batch) if training else 4 * (params + image * batch)) / 2**20

    def fitting(target: str) -> int:  # the oracle: the truth, batch by batch
        batches = [2**k for k in range(11) if 2**k <= point.timing.max_batch]
        return max(b for b in batches
                   if _linear_truth(target, work(dataclasses.replace(point, batch_size=b)))
                   + resident(b, target == "train_peak_mem_mb") <= memory_mb)

    predicted = planner.predict(point)
    assert (predicted.batch, predicted.train_batch) == (fitting("peak_mem_mb"), fitting("train_peak_mem_mb"))
    assert predicted.train_batch < predicted.batch < point.timing.max_batch  # the test's memory binds both
    assert predicted.fits is True

    def at(b: int) -> Point:
        return dataclasses.replace(point, batch_size=b)

    def search(target: str, found: int) -> float:
        return sum(protocol_seconds(_linear_truth(target, work(at(2**k))), PROBE_TIMING)
                   for k in range(found.bit_length()))

    expected = (DEFAULT_GAP_S + 3.0
                + search("latency_ms", predicted.batch)
                + protocol_seconds(_linear_truth("latency_ms", work(at(predicted.batch))), point.timing)
                + search("train_step_ms", predicted.train_batch)
                + protocol_seconds(_linear_truth("train_step_ms", work(at(predicted.train_batch))), point.timing))
    assert predicted.point_s == pytest.approx(expected, rel=1e-6)


def test_graphed_points_without_graphed_rows_are_predicted_from_eager_ones_and_the_plan_says_so() -> None:
    from experiments.sweep.plan import DEFAULT_GAP_S, Planner, plan_lines

    eager = _points([32, 64, 96, 128])
    planner = Planner(_rows_of(eager, _linear_truth), ["test"], None, "test", DEFAULT_GAP_S)
    graphed = [dataclasses.replace(p, timing_mode="graphed") for p in eager]
    for g, e in zip(graphed, eager):
        assert planner.predict(g).point_s == pytest.approx(planner.predict(e).point_s)
    lines = plan_lines(planner, graphed)
    assert "not predicted" not in "\n".join(lines)
    assert any(line.startswith("  4 graphed points predicted from eager rows") for line in lines)

    # once graphed rows of the mixer exist, they are used instead
    graphed_truth = lambda target, w: _linear_truth(target, w) / (2.0 if target == "latency_ms" else 1.0)  # noqa: E731
    planner = Planner(_rows_of(eager, _linear_truth) + _rows_of(graphed, graphed_truth), ["test"], None, "test",
                      DEFAULT_GAP_S)
    assert planner.predict(graphed[-1]).latency_ms == pytest.approx(planner.predict(eager[-1]).latency_ms / 2, rel=1e-6)
    assert not any("graphed points predicted" in line for line in plan_lines(planner, graphed))


def test_the_gpu_wall_reference_is_predicted_whole_from_the_committed_rows(tmp_path: Path) -> None:
    """gpu_reference plans every point on a machine without a GPU: graphed ones from eager rows, batch-max ones at a
    batch that fits (none predicted to run out of memory)."""
    result = subprocess.run([sys.executable, "-m", "experiments.sweep", "--config", "gpu_reference", "--device",
                             "cuda", "--dry-run", "--out", str(tmp_path / "out"), "--calibrate-from",
                             str(REPO / "results" / "gpu_h100" / "runs.csv")],
                            cwd=REPO, capture_output=True, text=True, env=WITHOUT_CUDA)
    assert result.returncode == 0, result.stderr
    assert re.search(r"predicted wall time of the \d+ points: [\d.]+ min \(", result.stdout), result.stdout[-2000:]
    max_lines = [line for line in result.stdout.splitlines() if " bmax " in line]
    assert max_lines and all(" yes " in line and "(predicted: b" in line for line in max_lines)


def test_the_planner_fits_each_point_s_current_row_and_a_named_scan_apart(tmp_path: Path) -> None:
    """A rerun appends a newer row for the same key (gpu_h100 holds mamba's fallback rows and, later, the compiled
    kernel's): the planner fits the newer, as the report does. A scan named in the overrides is a series apart."""
    from experiments.sweep.costmodel import CostModel, work
    from experiments.sweep.plan import Planner

    def truth(point: Point, factor: float) -> float:  # a latency the fit can express exactly
        return factor * (2.0 + work(point).macs / 1e9)

    slow, fast = 100.0, 1.0
    sizes = [32, 64, 96, 128]
    triton = '{"mixer_options":{"scan_impl":"triton"}}'
    rows = []
    for latency, overrides in ((slow, "{}"), (fast, "{}"), (2 * fast, triton)):
        for size in sizes:
            point = Point(mixer="mamba", preset="micro", img_size=size, patch_size=8, batch_size=1,
                          overrides=overrides)
            rows.append({**{k: str(v) for k, v in key_columns(point).items()}, "status": "ok",
                         "latency_ms": str(truth(point, latency)), "peak_mem_mb": "1", "point_seconds": "1"})
    path = tmp_path / "runs.csv"
    for row in rows:
        append_row(path, row)
    planner = Planner.build(_points([64], "mamba"), path, calibrate=False)
    auto = _points([64], "mamba")[0]
    named = dataclasses.replace(auto, overrides=triton)
    assert CostModel.group(auto) != CostModel.group(named)
    assert planner.predict(auto).latency_ms == pytest.approx(truth(auto, fast), rel=1e-6)
    assert planner.predict(named).latency_ms == pytest.approx(truth(named, 2 * fast), rel=1e-6)


def test_batch_max_rows_are_fitted_at_the_batches_they_found(tmp_path: Path) -> None:
    """A batch-max row measured inference at `batch_used` and its training step at `train_batch_used` (each search
    stops at its own): read back from runs.csv or observed as it lands, each target is fitted at its own batch."""
    from experiments.schema import MAX_BATCH
    from experiments.sweep.costmodel import work
    from experiments.sweep.plan import DEFAULT_GAP_S, Planner

    def truth(point: Point, target: str) -> float:
        return _linear_truth(target, work(point))

    def row_of(point: Point, infer_batch: int, train_batch: int, keys: bool = True) -> dict[str, str]:
        at_infer = dataclasses.replace(point, batch_size=infer_batch)
        at_train = dataclasses.replace(point, batch_size=train_batch)
        key = {k: str(v) for k, v in key_columns(point).items()} if keys else {}
        return {**key, "status": "ok",
                "batch_used": str(infer_batch), "train_batch_used": str(train_batch), "point_seconds": "100",
                **{t: str(truth(at_infer, t)) for t in ("latency_ms", "peak_mem_mb")},
                **{t: str(truth(at_train, t)) for t in ("train_step_ms", "train_peak_mem_mb")}}

    found = {32: (64, 16), 64: (32, 8), 96: (16, 4), 128: (8, 2)}  # size: (inference batch, training batch)
    maxed = {size: dataclasses.replace(_points([size])[0], batch_size=MAX_BATCH) for size in found}
    path = tmp_path / "runs.csv"
    for size, point in maxed.items():
        append_row(path, row_of(point, *found[size]))
    check = dataclasses.replace(_points([64])[0], batch_size=4)
    from_file = Planner.build([check], path, calibrate=False)
    observed = Planner([], [], None, "test", DEFAULT_GAP_S)
    for size, point in maxed.items():  # a live row: the sweep adds the key columns after the planner saw it
        observed.observe(point, row_of(point, *found[size], keys=False))
    overhead = [sorted(float(row["overhead_s"]) for _, row in p.samples) for p in (from_file, observed)]
    assert overhead[0] == pytest.approx(overhead[1])  # the search's probes taken out of both alike
    for planner in (from_file, observed):
        predicted = planner.predict(check)
        assert predicted.latency_ms == pytest.approx(truth(check, "latency_ms"), rel=1e-6)
        assert predicted.train_step_ms == pytest.approx(truth(check, "train_step_ms"), rel=1e-6)
        assert predicted.train_peak_mem_mb == pytest.approx(truth(check, "train_peak_mem_mb"), rel=1e-6)


def test_a_plan_from_one_size_says_it_cannot_extrapolate() -> None:
    """Calibration that keeps one point fits a constant: the plan predicted that constant at every size, "fits:
    yes" up to 1M tokens (issue 35). It predicts the measured size only and says why the others are unknown."""
    from experiments.sweep.costmodel import work
    from experiments.sweep.plan import DEFAULT_GAP_S, Planner, plan_lines

    measured, far = _points([16, 4096])
    planner = Planner(_rows_of([measured], _linear_truth), ["test"], None, "test", DEFAULT_GAP_S)
    assert planner.predict(measured).latency_ms == pytest.approx(_linear_truth("latency_ms", work(measured)))
    assert planner.predict(far).latency_ms is None and planner.predict(far).point_s is None
    assert planner.predict(far).peak_mem_mb > planner.predict(measured).peak_mem_mb  # the analytic estimate grows
    lines = plan_lines(planner, [measured, far])
    assert any("measured at one size only" in line and "cannot extrapolate" in line for line in lines)


@pytest.mark.parametrize("mixer", ["attention", "swin", "mamba", "attention_naive"])
def test_work_from_one_build_equals_a_build_at_each_size(mixer: str) -> None:
    """The planner builds a setting once and counts each size from it (3,000 sizes took 352 s, a meta build each):
    the numbers are those of a model built at that size."""
    from experiments.measure.run import build_model
    from experiments.sweep.costmodel import _model_of, work

    _model_of.cache_clear()
    for img_size in (8, 40, 96):
        point = Point(mixer=mixer, preset="micro", img_size=img_size, patch_size=8, batch_size=1)
        model = build_model(point, device="meta")
        w = work(point)
        assert w.macs == model.macs() and w.tokens == model.tokens
        assert w.params == sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert w.token_bytes == 4 * model.tokens * model.config.dim * model.config.depth
    assert _model_of.cache_info().misses == 1
