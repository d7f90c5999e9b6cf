"""Per-setting learning rates chosen on the validation split, never on test: the choice, the sweep's two stages
(grid, then the seeds at the chosen rate), the validation split's disjointness, and the report's use of it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.lr_grid import choose_rate, choose_rates
from experiments.report.build import build_report, load_runs
from experiments.report.crossover import accuracy_rows
from experiments.sweep.__main__ import main
from experiments.sweep.runs_file import read_rows
from experiments.train.datasets import build_dataset
from experiments.train.validation import validation_indices

import tiny_sweep

TRAIN = '{"batch_size":32,"lr":%s,"val_fraction":0.2}'


def grid_row(mixer: str, lr: float, seed: int, val: float, test: float, stage: str = "grid") -> dict:
    return {"mixer": mixer, "preset": "micro", "overrides": "{}", "img_size": 16, "patch_size": 4, "batch_size": 1,
            "device": "cpu", "dtype": "float32", "dataset": "reach", "epochs": 2, "seed": seed,
            "train": TRAIN % lr, "compile": "", "status": "ok", "val_accuracy": val, "accuracy": test,
            "best_accuracy": test, "lr": lr, "lr_stage": stage, "val_samples": 20, "tokens": 16, "params": 1000,
            "gmacs": 0.001, "latency_ms": 1.0, "peak_mem_mb": 1.0}


# Test accuracy (and its per-epoch maximum) favours 3e-3; validation favours 1e-3.
ROWS = [grid_row("attention", 1e-3, 0, val=0.80, test=0.60), grid_row("attention", 3e-3, 0, val=0.70, test=0.90),
        grid_row("attention", 1e-3, 1, val=0.0, test=0.62, stage="seed"),
        grid_row("linear", 1e-3, 0, val=0.55, test=0.70), grid_row("linear", 3e-3, 0, val=0.65, test=0.52)]


def test_choice_reads_validation_only() -> None:
    choices = {group[0]: choice.lr for group, choice in choose_rates(ROWS).items()}
    assert choices == {"attention": 1e-3, "linear": 3e-3}  # test accuracy would pick the other rate for both


def test_ties_failed_rates_and_nothing_to_choose() -> None:
    assert choose_rate({3e-3: [0.5], 1e-3: [0.5]}).lr == 1e-3  # ties: the smaller rate
    choice = choose_rate({1e-3: [0.4, 0.6], 3e-3: [None], 1e-2: [""]})
    assert choice.lr == 1e-3 and choice.val_accuracy == {1e-3: pytest.approx(0.5)} and choice.failed == (3e-3, 1e-2)
    assert choose_rate({1e-3: [None]}) is None


def test_report_keeps_rows_at_the_rate_chosen_on_validation(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    pd.DataFrame(ROWS).to_csv(path, index=False)
    rows = accuracy_rows(load_runs(path))
    assert sorted(zip(rows["mixer"], rows["seed"], rows["lr"])) == [
        ("attention", 0, 1e-3), ("attention", 1, 1e-3), ("linear", 0, 3e-3)]
    assert rows["train"].nunique() == 1 and "lr" not in json.loads(rows["train"].iloc[0])  # one recipe, per-mixer rates


def test_validation_split_is_disjoint_from_train_and_test(tmp_path: Path) -> None:
    train_idx, val_idx = validation_indices(100, 0.2, seed=3)
    assert len(val_idx) == 20 and not set(train_idx) & set(val_idx) and len(train_idx) + len(val_idx) == 100
    assert not np.array_equal(val_idx, validation_indices(100, 0.2, seed=4)[1])  # seeded

    # Every image carries its identity in its pixels: train ids 0..199, test ids 1000..1049.
    def images(ids: np.ndarray) -> np.ndarray:
        x = np.zeros((len(ids), 8, 8, 3), dtype=np.uint8)
        x[:, :, :, 0], x[:, :, :, 1] = (ids // 256)[:, None, None], (ids % 256)[:, None, None]
        return x

    path = tmp_path / "ids.npz"
    np.savez(path, x_train=images(np.arange(200)), y_train=np.zeros(200, np.uint8),
             x_test=images(np.arange(1000, 1050)), y_test=np.zeros(50, np.uint8))
    bundle = build_dataset("npz", data_path=path, img_size=8, train_samples=120, rand_augment="")
    # What the training loop holds out (device_trainer.train_on_device): these indices of the training split.
    train_idx, val_idx = validation_indices(len(bundle.train), 0.25, seed=0)
    stored = bundle.train.images.astype(int)  # (N, H, W, C) uint8 as stored

    def ids(index: np.ndarray) -> set[int]:
        return {int(i) for i in stored[index][:, 0, 0, 0] * 256 + stored[index][:, 0, 0, 1]}

    m0, m1 = bundle.mean[:2]
    s0, s1 = bundle.std[:2]
    test = {int(round(float(x[0, 0, 0] * s0 + m0) * 255)) * 256 + int(round(float(x[1, 0, 0] * s1 + m1) * 255))
            for x, _ in (bundle.test[i] for i in range(len(bundle.test)))}
    used, val = ids(train_idx), ids(val_idx)
    assert len(val) == 30 and len(used) == 90
    assert not val & used and not val & test and val <= set(range(200))


def grid_config(tmp_path: Path) -> Path:
    text = tiny_sweep.tiny_config(["attention", "linear"], [16]).replace("patch_sizes = [8]", "patch_sizes = [4]")
    head, timing = text.split("[timing]")
    head += 'epochs = 1\ndataset = "reach"\nseeds = [0, 1]\nlr_grid = [1e-3, 3e-3]\n'
    tail = '\n[train]\ntrain_samples = 80\nbatch_size = 32\nval_fraction = 0.25\n'
    return tiny_sweep.write_config(tmp_path, head + "[timing]" + timing + tail)


def test_sweep_runs_the_grid_then_the_seeds_at_the_chosen_rate(tmp_path: Path, capsys) -> None:
    config, out = grid_config(tmp_path), tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--dry-run", "--no-plan"]) == 0
    plan = capsys.readouterr().out
    assert "learning-rate grid: 4 points (rates 1e-3, 3e-3)" in plan and "2 waiting on the grid" in plan
    assert len(re.findall(r"lr=chosen .* seed 1\n", plan)) == 2

    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-plan", "--no-report"]) == 0
    rows = read_rows(out / "runs.csv")
    grid = [r for r in rows if r["lr_stage"] == "grid"]
    seeds = [r for r in rows if r["lr_stage"] == "seed"]
    assert len(grid) == 4 and {r["seed"] for r in grid} == {"0"} and len(seeds) == 2
    assert all(r["val_samples"] == "20" and r["train_samples"] == "60" and r["trainer"] == "device" for r in rows)
    # Every training leaves its learning curve under curves/, named by its key's hash, its key on every row.
    from experiments.measure.point import point_key
    from experiments.sweep.config import _digest
    from experiments.train.curve import read_curve

    for row in rows:
        curve = read_curve(out / "curves" / f"{_digest(point_key(row))}.csv")
        # 2 optimizer steps (60 images, batch 32, 1 epoch): fewer than eval_points, so one evaluation a step
        assert len(curve) == int(row["curve_points"]) == 3 and curve[0]["samples_seen"] == "0"
        assert {c["seed"] for c in curve} == {row["seed"]} and row["stop_reason"] == "max_budget"
    for seed_row in seeds:
        mine = {float(r["lr"]): float(r["val_accuracy"]) for r in grid if r["mixer"] == seed_row["mixer"]}
        best = max(mine.values())
        assert float(seed_row["lr"]) == min(lr for lr, v in mine.items() if v == best) and seed_row["seed"] == "1"
    assert "chosen lr=" in capsys.readouterr().out

    # Resumed: the grid rows are there, so a dry run now plans the seeds at their chosen rates.
    assert main(["--config", str(config), "--out", str(out), "--dry-run", "--no-plan"]) == 0
    assert "2 chosen from rows in runs.csv, 0 waiting" in capsys.readouterr().out
    build_report(out)
    summary = (out / "summary.md").read_text()
    assert "## Learning rate per mixer (chosen on validation, never on test)" in summary
    assert (out / "figures" / "lr_grid.png").exists()
    assert "Best acc." not in (out / "tables" / "accuracy.md").read_text()


@pytest.mark.parametrize("fields, message", [
    ('lr_grid = [1e-3]\n', "set train.val_fraction"),
    ('lr_grid = [0.0]\n[train]\nval_fraction = 0.1\n', "lr_grid must hold learning rates > 0"),
    ('lr_grid = [1e-3]\n[train]\nval_fraction = 0.1\nlr = 1e-3\n', "remove lr from [train]"),
])
def test_bad_grid_is_refused_with_one_line(tmp_path: Path, capsys, fields: str, message: str) -> None:
    text = tiny_sweep.tiny_config(["attention"], [16]).split("[timing]")[0]
    text += 'epochs = 1\ndataset = "reach"\n' + fields
    config = tiny_sweep.write_config(tmp_path, text)
    assert main(["--config", str(config), "--out", str(tmp_path / "out"), "--dry-run", "--no-plan"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def named_config(tmp_path: Path, fields: str) -> Path:
    text = tiny_sweep.tiny_config(["attention", "linear"], [16]).split("[timing]")[0]
    text += 'epochs = 1\ndataset = "reach"\n' + fields
    text += '[timing]\nwarmup = 0\nmin_repeats = 1\nmin_time_s = 0.0\n'
    return tiny_sweep.write_config(tmp_path, text + '[train]\ntrain_samples = 40\nbatch_size = 20\nlr = 5e-4\n')


def test_rates_named_per_mixer_train_each_mixer_at_its_rate_and_name_their_source(tmp_path: Path) -> None:
    config = named_config(tmp_path, 'lr_by_mixer = { linear = 3e-3 }\nlr_source = "results/somewhere"\n')
    out = tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-plan"]) == 0
    rows = {r["mixer"]: r for r in read_rows(out / "runs.csv")}
    assert json.loads(rows["linear"]["train"])["lr"] == 3e-3 and float(rows["linear"]["lr"]) == 3e-3
    assert rows["linear"]["lr_source"] == "results/somewhere"
    assert float(rows["attention"]["lr"]) == 5e-4 and rows["attention"]["lr_source"] == ""  # not named: train.lr
    summary = (out / "summary.md").read_text()
    assert "- linear: lr 3e-3 (from results/somewhere; 1 point)" in summary
    assert "and a learning rate per mixer (below)" in summary


@pytest.mark.parametrize("fields, message", [
    ('lr_by_mixer = { linear = 3e-3 }\n', "say where the rates were chosen in lr_source"),
    ('lr_by_mixer = { linear = 0.0 }\nlr_source = "x"\n', "lr_by_mixer.linear must be a learning rate > 0"),
    ('lr_by_mixer = { linearr = 1e-3 }\nlr_source = "x"\n', "lr_by_mixer.linearr: no mixer 'linearr' is registered"),
    ('lr_by_mixer = { linear = 1e-3 }\nlr_source = "x"\nlr_grid = [1e-3]\n', "give one of them"),
])
def test_bad_named_rates_are_refused_with_one_line(tmp_path: Path, capsys, fields: str, message: str) -> None:
    config = named_config(tmp_path, fields)
    assert main(["--config", str(config), "--out", str(tmp_path / "out"), "--dry-run", "--no-plan"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def lr_from_config(tmp_path: Path, small: str = "", large: str = 'lr_from = "small"\n') -> Path:
    """Two runs: `small` tunes each mixer's rate on a grid at 16 px / patch 4, `large` trains at patch 8."""
    text = tiny_sweep.tiny_config(["attention", "linear"], [16]).split("[timing]")[0]
    text += 'epochs = 1\ndataset = "reach"\nseeds = [0, 1]\n'
    text += '[timing]\nwarmup = 0\nmin_repeats = 1\nmin_time_s = 0.0\n'
    text += '[train]\ntrain_samples = 80\nbatch_size = 32\nval_fraction = 0.25\n'
    text += f'[[runs]]\nname = "small"\npatch_sizes = [4]\nlr_grid = [1e-3, 3e-3]\n{small}'
    text += f'[[runs]]\nname = "large"\npatch_sizes = [8]\nseeds = [0]\n{large}'
    return tiny_sweep.write_config(tmp_path, text)


def test_a_run_trains_each_mixer_at_the_rate_another_runs_grid_chose(tmp_path: Path, capsys) -> None:
    config, out = lr_from_config(tmp_path), tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--dry-run", "--no-plan"]) == 0
    plan = capsys.readouterr().out
    assert "run large: trains on reach for 1 epochs, every mixer at the rate run small's" in plan
    assert "2 points (2 mixers x 1 preset" in plan and "4 waiting on the grid" in plan  # 2 seeds of small, 2 large

    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-plan"]) == 0
    rows = read_rows(out / "runs.csv")
    grid = [r for r in rows if r["lr_stage"] == "grid"]
    large = [r for r in rows if r["patch_size"] == "8"]
    assert len(grid) == 4 and len(large) == 2 and len(rows) == 8
    for row in large:
        mine = {float(r["lr"]): float(r["val_accuracy"]) for r in grid if r["mixer"] == row["mixer"]}
        best = min(lr for lr, v in mine.items() if v == max(mine.values()))  # chosen on validation only
        assert float(row["lr"]) == best and json.loads(row["train"])["lr"] == best
        assert row["lr_stage"] == "" and row["lr_source"].startswith("run small of this sweep (its grid at 16 px")

    # The report keeps the grid's choice (its rows share large's recipe) and names where large's rates came from.
    accuracy = accuracy_rows(load_runs(out / "runs.csv"))
    assert len(accuracy) == 2 * 2 + 2 and accuracy["train"].nunique() == 1  # small's seeds 0, 1 and large's seed 0
    summary = (out / "summary.md").read_text()
    assert "## Learning rate per mixer (chosen on validation, never on test)" in summary
    assert "## Learning rate per mixer (taken from a grid run, chosen there on validation)" in summary
    assert "(from run small of this sweep" in summary


@pytest.mark.parametrize("small, large, message", [
    ("", 'lr_from = "big"\n', "run large: lr_from = 'big' names no other run of this config (its runs: small)"),
    ("", 'lr_from = "large"\n', "names no other run"),
    ("", 'lr_from = "small"\nlr_grid = [1e-3]\n', "remove lr_grid, lr_by_mixer and train.lr from this run"),
    ("img_sizes = [16, 32]\n", 'lr_from = "small"\n', "give it one img_size, patch_size and batch_size"),
    ('mixers = ["attention"]\n', 'lr_from = "small"\n', "that run's grid has no linear (micro)"),
    ("", 'lr_from = "small"\noverrides = { "*" = { depth = 2 } }\n', "give both runs the same overrides"),
])
def test_bad_lr_from_is_refused_with_one_line(tmp_path: Path, capsys, small: str, large: str, message: str) -> None:
    config = lr_from_config(tmp_path, small, large)
    assert main(["--config", str(config), "--out", str(tmp_path / "out"), "--dry-run", "--no-plan"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_run_without_a_grid_is_no_source_of_rates(tmp_path: Path, capsys) -> None:
    config = lr_from_config(tmp_path, large='lr_from = "small"\n').read_text().replace("lr_grid = [1e-3, 3e-3]\n", "")
    path = tiny_sweep.write_config(tmp_path, config.replace("[train]\n", "[train]\nlr = 1e-3\n"))
    assert main(["--config", str(path), "--out", str(tmp_path / "out"), "--dry-run", "--no-plan"]) == 2
    assert "that run has no learning-rate grid to choose from" in capsys.readouterr().err


def test_budget_rule_takes_the_fewest_epochs_where_the_best_mixer_reaches_the_target_on_validation() -> None:
    from experiments.report.rates import budget_lines

    def at(epochs: int, row: dict) -> dict:
        return {**row, "epochs": epochs}

    rows = [  # test accuracy would call 2 epochs enough (attention 0.95); validation says 4
        at(2, grid_row("attention", 1e-3, 0, val=0.85, test=0.95)),
        at(2, grid_row("attention", 3e-3, 0, val=0.6, test=0.6)),
        at(2, grid_row("linear", 1e-3, 0, val=0.5, test=0.5)),
        at(4, grid_row("attention", 1e-3, 0, val=0.88, test=0.9)),
        at(4, grid_row("attention", 3e-3, 0, val=0.93, test=0.7)),
        at(4, grid_row("linear", 1e-3, 0, val=0.55, test=0.5)),
        at(8, grid_row("attention", 1e-3, 0, val=1.0, test=1.0)),
        at(8, grid_row("linear", 1e-3, 0, val=0.99, test=1.0)),
    ]
    frame = pd.DataFrame(rows)
    text = "\n".join(budget_lines(frame))
    assert "Here: 4 epochs: the fewest at which the best mixer reaches 90% validation accuracy" in text
    assert "| 4 (chosen) | 93.0% | 3e-3: 93.0% | 1e-3: 55.0% |" in text
    assert "no budget reached" in "\n".join(budget_lines(frame, target=1.01))
    assert budget_lines(frame[frame["epochs"] == 2]) == []  # one budget: no rule to apply


def test_erf_maps_are_those_at_the_chosen_rates_in_one_figure() -> None:
    from experiments.report.erf import maps_at_chosen_rates
    from experiments.schema import KEY_COLUMNS

    runs = pd.DataFrame(ROWS)
    maps = pd.DataFrame([{**{c: row.get(c, "") for c in KEY_COLUMNS}, "stage": "trained", "map": None}
                         for row in ROWS])
    kept = maps_at_chosen_rates(maps, runs)
    assert sorted(zip(kept["mixer"], kept["seed"])) == [("attention", 0), ("attention", 1), ("linear", 0)]
    assert kept["train"].nunique() == 1 and "lr" not in json.loads(kept["train"].iloc[0])  # one figure


def test_a_choice_at_the_grid_s_edge_is_flagged_in_the_summary(tmp_path: Path) -> None:
    from experiments.report.rates import grid_edge_note

    assert grid_edge_note(choose_rate({3e-4: [0.3], 1e-3: [0.5], 3e-3: [0.4]})) == ""
    assert "largest rate: its best may lie above" in grid_edge_note(choose_rate({3e-4: [0.3], 1e-3: [0.4],
                                                                                 3e-3: [0.5]}))
    assert "smallest rate: its best may lie below" in grid_edge_note(choose_rate({3e-4: [0.5], 1e-3: [0.4]}))
    assert grid_edge_note(choose_rate({1e-3: [0.4], 3e-3: [0.5], 1e-2: [None]})) == ""  # diverged beyond it
    assert grid_edge_note(choose_rate({3e-4: [1.0], 1e-3: [0.9]})) == ""  # nothing beyond can do better
    assert grid_edge_note(choose_rate({3e-4: [0.7], 1e-3: [0.7], 3e-3: [0.6]})) == ""  # a tie inside the grid
    # a best rate no better than chance on the validation images: the choice is noise, wherever it lies
    noise = choose_rate({3e-4: [0.49], 1e-3: [0.5], 3e-3: [0.52]})
    assert "no rate beats chance (50%" in grid_edge_note(noise, 0.5, 400)
    assert "no rate beats chance" not in grid_edge_note(choose_rate({3e-4: [0.5], 1e-3: [0.6]}), 0.5, 400)
    rows = [grid_row("attention", lr, 0, val=val, test=0.5) for lr, val in ((3e-4, 0.5), (1e-3, 0.8), (3e-3, 0.6))]
    rows += [grid_row("linear", lr, 0, val=val, test=0.5) for lr, val in ((3e-4, 0.5), (1e-3, 0.6), (3e-3, 0.8))]
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    build_report(path.parent)
    lines = (tmp_path / "summary.md").read_text().splitlines()
    attention = next(line for line in lines if line.startswith("- attention (reach"))
    linear = next(line for line in lines if line.startswith("- linear (reach"))
    assert "grid's" not in attention and "the grid's largest rate: its best may lie above it" in linear
    assert "chance" not in attention + linear  # 80% of 20 validation images beats a coin


def test_the_defaults_rates_are_the_ones_its_committed_grid_chose() -> None:
    """default.toml names each mixer's rate with results/default_lr as its source: each must be the rate that
    run's committed rows choose on validation, so a hand-copied rate cannot drift from its evidence."""
    from experiments.sweep.config import load_config

    repo = Path(__file__).resolve().parent.parent
    values, _ = load_config("default")
    (accuracy,) = [run for run in values["runs"] if run.get("lr_by_mixer")]
    assert accuracy["lr_source"] == "results/default_lr"
    chosen = {group[0]: choice.lr for group, choice in choose_rates(read_rows(repo / "results/default_lr/runs.csv"))
              .items()}  # group[0] is the mixer (the first key column)
    assert accuracy["lr_by_mixer"] == {mixer: chosen[mixer] for mixer in accuracy["lr_by_mixer"]}
