"""What the sweep's flags mean: grid flags alone make a sweep of that grid; on a config, each flag goes to the runs
the rule names (experiments/sweep/config.py); seeds multiply training points only; --dry-run says it per run."""
from __future__ import annotations

from pathlib import Path

import pytest

from experiments.measure.point import Point
from experiments.sweep.__main__ import build_parser, config_from_args, main
from experiments.sweep.config import SweepConfig, load_config
from mixers import list_mixers

import tiny_sweep
from tiny_sweep import tiny_config

README_GRID = ["--mixers", "attention", "linear", "--img-sizes", "64", "128", "256", "--patch-sizes", "8"]


def sweep_of(argv: list[str]) -> tuple[SweepConfig, list[Point]]:
    config, _ = config_from_args(build_parser().parse_args(argv))
    return config, config.points(list_mixers())


def dry_run(capsys, argv: list[str]) -> str:
    assert main([*argv, "--dry-run", "--no-plan"]) == 0
    return capsys.readouterr().out


def test_grid_flags_without_config_are_one_cost_run_of_that_grid() -> None:
    """The README's example once re-aimed the default's training run too: 24 points, trained up to 31 min each."""
    config, points = sweep_of([*README_GRID, "--out", "results/mine"])
    assert len(points) == 6 and all(p.epochs == 0 for p in points)
    assert {(p.mixer, p.img_size, p.patch_size) for p in points} == {
        (m, s, 8) for m in ("attention", "linear") for s in (64, 128, 256)}
    assert config.out_dir == Path("results/mine") and len(config.run_configs()) == 1
    assert sweep_of(README_GRID)[0].out_dir == Path("results/local/custom")


def test_grid_flags_without_config_train_only_when_epochs_ask() -> None:
    _, points = sweep_of(["--mixers", "linear", "--img-sizes", "16", "--patch-sizes", "4", "--epochs", "1",
                          "--dataset", "reach", "--seeds", "0", "1"])
    assert [(p.epochs, p.dataset, p.seed) for p in points] == [(1, "reach", 0), (1, "reach", 1)]


def test_dataset_without_epochs_on_a_flag_built_sweep_is_one_line(tmp_path: Path, capsys) -> None:
    assert main([*README_GRID, "--dataset", "reach", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "add --epochs" in err
    assert not (tmp_path / "out").exists()


def test_on_a_config_grid_flags_go_to_every_run_and_training_flags_to_the_runs_that_train() -> None:
    config, points = sweep_of(["--config", "default", "--img-sizes", "64", "--epochs", "2"])
    cost, accuracy = config.run_configs()
    assert (cost.img_sizes, cost.epochs) == ((64,), 0)  # still a cost run: --epochs is for the runs that train
    assert (accuracy.img_sizes, accuracy.epochs, accuracy.seeds) == ((64,), 2, (0, 1, 2))
    assert len([p for p in points if p.epochs == 0]) == 5 * 2  # five mixers, patch 4 and 8
    assert len([p for p in points if p.epochs == 2]) == 5 * 3  # four mixers and identity, three seeds


def test_training_flags_train_every_run_of_a_config_where_nothing_trains(tmp_path: Path) -> None:
    text = tiny_config(["linear"], [16]) + '\n[[runs]]\nname = "a"\n\n[[runs]]\nname = "b"\npatch_sizes = [4]\n'
    config = tiny_sweep.write_config(tmp_path, text)
    _, points = sweep_of(["--config", str(config), "--epochs", "1", "--dataset", "reach"])
    assert sorted((p.patch_size, p.epochs) for p in points) == [(4, 1), (8, 1)]


def test_dry_run_says_what_each_run_is_and_which_flags_it_took(capsys) -> None:
    sizes = len(load_config("default")[0]["img_sizes"])  # the default's grid, whatever its sizes are
    out = dry_run(capsys, ["--config", "default", "--mixers", "linear", "--epochs", "2"])
    assert f"run cost: cost only, {2 * sizes} points (1 mixer x 1 preset x {sizes} image sizes x 2 patch sizes" in out
    assert "flags taken: --mixers\n" in out
    assert "run accuracy: trains on reach for 2 epochs, 3 points (1 mixer" in out
    assert "x 3 seeds); flags taken: --mixers, --epochs" in out
    assert f"{2 * sizes + 3} points in all" in out
    out = dry_run(capsys, README_GRID)
    assert "a sweep built from the command line (--mixers, --img-sizes, --patch-sizes without --config)" in out
    assert "run custom: cost only, 6 points" in out and "6 points in all" in out


def test_cost_points_are_not_repeated_per_seed() -> None:
    """--epochs 0 made the default's training run cost points repeated for seeds 0, 1 and 2: identical rows."""
    _, points = sweep_of(["--config", "default", "--epochs", "0", *README_GRID])
    # attention and linear train with the cost run's models, so the two runs share their 6 points: one seed, no repeat.
    assert {p.seed for p in points} == {0} and {p.overrides for p in points} == {"{}"} and len(points) == 6
    _, points = sweep_of(["--mixers", "linear", "--img-sizes", "16", "--patch-sizes", "8", "--seeds", "3", "4"])
    assert [p.seed for p in points] == [3]  # the first seed


def test_progress_label_names_the_seed_of_a_training_point() -> None:
    point = Point(mixer="linear", preset="micro", img_size=16, patch_size=4, batch_size=1, dataset="reach", epochs=8,
                  seed=2)
    assert point.label().endswith("reach x8ep seed 2")


@pytest.mark.parametrize("file_name,name", [("my_sweep.toml", "my_sweep"), ("my sweep.v2.toml", "my_sweep_v2")])
def test_a_config_without_a_name_is_named_after_its_file(tmp_path: Path, file_name: str, name: str) -> None:
    """Unnamed configs all ran into results/local/custom and resumed from each other's rows."""
    path = tmp_path / file_name
    path.write_text(tiny_config(["linear"], [16]).replace('name = "tiny"\n', ""))
    config, _ = sweep_of(["--config", str(path)])
    assert config.name == name and config.out_dir == Path(f"results/local/{name}")
