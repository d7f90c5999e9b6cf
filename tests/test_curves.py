"""Learning curves, the convergence rule, the schedule and fresh training data per epoch (issue 32)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.schema import CURVE_COLUMNS, KEY_COLUMNS
from experiments.train import device_trainer
from experiments.train.convergence import ceiling_reached, curve_numbers, last_improvement, plateau_seen
from experiments.train.curve import read_curve
from experiments.train.datasets import build_dataset, fresh_seed
from experiments.train.device_trainer import SplitScore, eval_interval, train_on_device
from experiments.train.recipe import TrainRecipe
from experiments.train.schedule import WarmupConstantDecay
from tests.test_train import VIEW, channel_set, crash_after, tiny_vit

# 20 optimizer steps an epoch (160 images, batches of 8), a validation split of 40 of 200 images.
RECIPE = TrainRecipe(epochs=2, batch_size=8, lr=3e-3, warmup_epochs=0.25, val_fraction=0.2, eval_batch_size=64)
KEY = {column: f"k-{column}" for column in KEY_COLUMNS}


def train(model, recipe: TrainRecipe = RECIPE, **kwargs) -> device_trainer.DeviceRun:
    kwargs = {"dtype": torch.float32, "seed": 0, "curve_key": KEY, "flops_per_sample": 1000.0, **kwargs}
    return train_on_device(model, channel_set(200, 1), channel_set(32, 2), VIEW, recipe, **kwargs)


def test_a_curve_has_twenty_evenly_spaced_points_and_one_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "curves" / "abc.csv"
    run = train(tiny_vit(), curve_path=path)
    samples = [row["samples_seen"] for row in run.curve]
    assert samples[0] == 0 and run.curve[0]["train_loss"] is None and len(samples) >= 1 + RECIPE.eval_points
    gaps = np.diff(samples)
    assert gaps.min() > 0 and gaps.max() - gaps.min() <= RECIPE.batch_size  # even, within one partial batch
    assert samples[-1] == RECIPE.epochs * 160 and run.curve[-1]["val_accuracy"] == run.val_accuracy
    assert [row["train_flops"] for row in run.curve] == [1000.0 * s for s in samples]
    rows = read_curve(path)
    assert list(rows[0]) == list(KEY_COLUMNS + CURVE_COLUMNS) and len(rows) == len(run.curve)
    assert all(row["mixer"] == "k-mixer" for row in rows) and rows[0]["train_loss"] == ""
    assert run.rule_columns["curve_points"] == len(rows) and run.rule_columns["stop_reason"] == "max_budget"
    assert run.rule_columns["converged"] == ""  # no rule set: nothing judged whether it converged
    assert not [p for p in path.parent.iterdir() if p != path]  # no temporary file left beside it


def test_a_killed_training_resumes_its_curve_exactly(tmp_path: Path) -> None:
    straight = train(tiny_vit(), curve_path=tmp_path / "straight.csv")
    path = tmp_path / "resumed.csv"
    with pytest.raises(RuntimeError, match="simulated crash"):
        # Crashes in epoch 2: the file holds the curve up to the last evaluation before the crash.
        train(crash_after(tiny_vit(), 45), checkpoint_dir=tmp_path / "ckpt", curve_path=path, checkpoint_every_s=0)
    partial = read_curve(path)
    assert 1 < len(partial) < len(straight.curve)
    resumed = train(tiny_vit(seed=9), checkpoint_dir=tmp_path / "ckpt", curve_path=path)

    def without_wall(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]

    # Bit-for-bit on a CPU: the same rows as an uninterrupted run, wall time aside.
    assert without_wall(resumed.curve) == without_wall(straight.curve)
    assert without_wall(read_curve(path)) == without_wall(read_curve(tmp_path / "straight.csv"))
    assert resumed.result.accuracy == straight.result.accuracy


def test_a_checkpoint_with_the_curve_as_a_list_still_resumes(tmp_path: Path) -> None:
    """Checkpoints hold the curve as JSON text now (pickling the list cost seconds per training); one written
    before, with the list itself, resumes to the same curve."""
    import json

    from experiments.train.recipe import CHECKPOINT_NAME

    straight = train(tiny_vit())
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(crash_after(tiny_vit(), 45), checkpoint_dir=tmp_path / "ckpt", checkpoint_every_s=0)
    checkpoint = tmp_path / "ckpt" / CHECKPOINT_NAME
    saved = torch.load(checkpoint, weights_only=True)
    assert isinstance(saved["curve"], str)
    torch.save({**saved, "curve": json.loads(saved["curve"])}, checkpoint)
    resumed = train(tiny_vit(seed=9), checkpoint_dir=tmp_path / "ckpt")
    assert [{k: v for k, v in row.items() if k != "wall_s"} for row in resumed.curve] == \
        [{k: v for k, v in row.items() if k != "wall_s"} for row in straight.curve]


def fake_scores(monkeypatch, accuracy_at) -> None:
    """Replaces validation by `accuracy_at(evaluation index)`, so the rule sees a curve of the test's shape."""
    calls = [0]
    real = device_trainer.evaluate_split

    def fake(model, split, view, *, buckets=None, **kwargs) -> SplitScore:
        if len(split) != 40:  # the test split (32 images): the real thing
            return real(model, split, view, buckets=buckets, **kwargs)
        calls[0] += 1
        return SplitScore(accuracy_at(calls[0] - 1), 1.0, {})

    monkeypatch.setattr(device_trainer, "evaluate_split", fake)


def test_the_rule_stops_on_a_plateau(monkeypatch) -> None:
    fake_scores(monkeypatch, lambda i: min(0.3 + 0.1 * i, 0.6))  # climbs for three evaluations, then flat
    recipe = dataclasses.replace(RECIPE, epochs=8, patience=0.25, min_delta=0.01, target_accuracy=0.5)
    run = train(tiny_vit(), recipe)
    budget = recipe.epochs * 160
    samples = [row["samples_seen"] for row in run.curve]
    columns = run.rule_columns
    assert columns["stop_reason"] == "plateau" and columns["converged"] is True
    assert samples[-1] < budget and len(samples) >= 1 + recipe.eval_points
    # The plateau is declared a patience after the last gain; the decay then runs 15% of what was trained.
    every = eval_interval(recipe, recipe.epochs * 20) * recipe.batch_size
    assert columns["converged_samples"] == 3 * every
    declared = next(s for s in samples if s - 3 * every >= 0.25 * budget)
    assert samples[-1] == declared + round(recipe.decay_fraction * declared / recipe.batch_size) * recipe.batch_size
    assert columns["samples_to_target"] == 2 * every and columns["flops_to_target"] == 2 * every * 1000.0
    assert run.curve[-1]["lr"] == pytest.approx(recipe.min_lr)  # annealed before stopping


def test_the_rule_with_stop_at_ceiling_ends_at_a_perfect_score(monkeypatch) -> None:
    fake_scores(monkeypatch, lambda i: (0.3, 0.65, 1.0)[min(i, 2)])  # perfect from the third evaluation
    recipe = dataclasses.replace(RECIPE, epochs=8, patience=0.25, min_delta=0.01, stop_at_ceiling=True)
    run = train(tiny_vit(), recipe)
    samples = [row["samples_seen"] for row in run.curve]
    assert run.rule_columns["stop_reason"] == "ceiling" and run.rule_columns["converged"] is True
    # Declared at the evaluation that reached 1.0, not a patience later; then the decay of 15% of what was trained.
    every = eval_interval(recipe, recipe.epochs * 20) * recipe.batch_size
    declared = 2 * every
    assert samples[-1] == declared + round(recipe.decay_fraction * declared / recipe.batch_size) * recipe.batch_size
    assert run.curve[-1]["lr"] == pytest.approx(recipe.min_lr)
    fake_scores(monkeypatch, lambda i: (0.3, 0.65, 1.0)[min(i, 2)])  # without it: the plateau, a patience later
    plain = train(tiny_vit(), dataclasses.replace(recipe, stop_at_ceiling=False))
    assert plain.rule_columns["stop_reason"] == "plateau" and plain.curve[-1]["samples_seen"] > samples[-1]


def test_stop_at_ceiling_needs_the_rule() -> None:
    with pytest.raises(ValueError, match="set patience"):
        dataclasses.replace(RECIPE, patience=None, stop_at_ceiling=True)
    with pytest.raises(ValueError, match="true or false"):
        dataclasses.replace(RECIPE, patience=0.25, stop_at_ceiling=1)


def test_the_rule_runs_on_while_the_curve_climbs(monkeypatch) -> None:
    fake_scores(monkeypatch, lambda i: 0.1 + 0.011 * i)  # a gain above min_delta at every evaluation
    recipe = dataclasses.replace(RECIPE, epochs=4, patience=0.25, min_delta=0.01, target_accuracy=0.99)
    run = train(tiny_vit(), recipe)
    assert run.rule_columns["stop_reason"] == "max_budget" and run.rule_columns["converged"] is False
    assert run.curve[-1]["samples_seen"] == recipe.epochs * 160
    assert run.rule_columns["samples_to_target"] is None and run.rule_columns["flops_to_target"] is None


def test_rule_as_a_function_of_the_history() -> None:
    samples = [0, 100, 200, 300, 400, 500]
    flat = [0.5, 0.7, 0.8, 0.801, 0.805, 0.79]  # gains below min_delta after 200
    assert last_improvement(samples, flat, min_delta=0.01) == 200
    assert plateau_seen(samples, flat, patience_samples=300, min_delta=0.01)
    assert not plateau_seen(samples, flat, patience_samples=301, min_delta=0.01)
    at_chance = [0.5, 0.505, 0.498, 0.502, 0.5, 0.507]  # never improved on its start: waiting, not converged
    assert not plateau_seen(samples, at_chance, patience_samples=100, min_delta=0.01)
    # From below chance onto the majority class (0.47 -> 0.51): a gain, but no learning.
    collapsed = [0.47, 0.51, 0.51, 0.505, 0.51, 0.51]
    assert plateau_seen(samples, collapsed, patience_samples=300, min_delta=0.03)
    assert not plateau_seen(samples, collapsed, patience_samples=300, min_delta=0.03, chance=0.5)
    blip = [0.505, 0.5575, 0.495, 0.505, 0.5, 0.505]  # one noisy evaluation above chance, then chance again
    assert not plateau_seen(samples, blip, patience_samples=300, min_delta=0.03, chance=0.5)
    # A blip, then a long stretch at chance, then the rise: patience counts from the rise, not from the blip.
    late = [0.42, 0.555, 0.5, 0.51, 0.5, 0.58]
    assert not plateau_seen(samples, late, patience_samples=300, min_delta=0.03, chance=0.5)
    risen = [0.42, 0.555, 0.5, 0.6, 0.6, 0.6]
    assert not plateau_seen(samples, risen, patience_samples=300, min_delta=0.03, chance=0.5)
    assert plateau_seen(samples, risen, patience_samples=200, min_delta=0.03, chance=0.5)
    climbing = [0.5, 0.52, 0.54, 0.56, 0.58, 0.60]
    assert not plateau_seen(samples, climbing, patience_samples=100, min_delta=0.01)
    # Slow gains that add up count once they pass min_delta over the best so far.
    assert last_improvement(samples, [0.5, 0.506, 0.512, 0.512, 0.512, 0.512], min_delta=0.01) == 200
    numbers = curve_numbers(samples, flat, min_delta=0.01, target_accuracy=0.75, flops_per_sample=2.0)
    assert (numbers.converged_samples, numbers.samples_to_target, numbers.flops_to_target) == (200, 200, 400.0)
    assert curve_numbers(samples, flat, min_delta=0.0, target_accuracy=0.9, flops_per_sample=2.0
                         ).samples_to_target is None
    assert curve_numbers(samples, [None] * 6, min_delta=0.0, target_accuracy=0.9, flops_per_sample=None
                         ).converged_samples is None


def test_the_ceiling_is_a_perfect_validation_score() -> None:
    assert ceiling_reached([0.5, 0.8, 1.0])
    assert not ceiling_reached([0.5, 0.8, 0.9975])  # one image wrong: something left to gain
    assert not ceiling_reached([0.5, 1.0, 0.99])  # fallen back since
    assert not ceiling_reached([1.0]) and not ceiling_reached([1.0, 1.0])  # nothing learnt


def test_schedule_warms_up_holds_and_decays_at_the_end() -> None:
    schedule = WarmupConstantDecay(warmup_steps=10, total_steps=100, decay_fraction=0.2, min_ratio=0.01)
    values = [schedule(step) for step in range(100)]
    assert values[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert values[10:80] == [1.0] * 70  # constant until the budget's decay window
    assert np.all(np.diff(values[80:]) < 0) and values[99] == pytest.approx(0.01)
    assert schedule.end_step == 100


def test_schedule_decay_begins_at_a_plateau_and_shortens_the_training() -> None:
    schedule = WarmupConstantDecay(warmup_steps=0, total_steps=1000, decay_fraction=0.15, min_ratio=0.0)
    schedule.begin_decay(200)
    assert schedule.end_step == 230 and schedule(199) == 1.0 and schedule(229) == 0.0
    assert schedule(214) == pytest.approx(0.5)  # linear
    schedule.begin_decay(215)  # once begun, a later plateau changes nothing
    assert schedule.end_step == 230
    late = WarmupConstantDecay(warmup_steps=0, total_steps=1000, decay_fraction=0.15, min_ratio=0.0)
    late.begin_decay(900)  # inside the budget's own window: it is already decaying
    assert late.decay_start is None and late.end_step == 1000


@pytest.mark.parametrize("name", ["reach", "pathfinder"])
def test_fresh_training_data_is_deterministic_per_seed_and_epoch(name: str, tmp_path: Path) -> None:
    bundle = build_dataset(name, img_size=32, patch_size=4, seed=3, train_samples=40, test_samples=8,
                           data_dir=tmp_path, workers=1)
    again = build_dataset(name, img_size=32, patch_size=4, seed=3, train_samples=40, test_samples=8,
                          data_dir=tmp_path, workers=1)
    one, same = bundle.fresh_train(1, 40), again.fresh_train(1, 40)
    assert torch.equal(one[0], same[0]) and torch.equal(one[1], same[1])
    assert one[0].shape == (40, 1, 32, 32) and one[0].dtype == torch.uint8
    assert not torch.equal(one[0], bundle.fresh_train(2, 40)[0])  # another epoch, other images
    fixed = bundle.train.images  # (N, 1, H, W): epoch 0 and the validation split
    assert not torch.equal(one[0], fixed)
    other_seed = build_dataset(name, img_size=32, patch_size=4, seed=4, train_samples=40, test_samples=8,
                               data_dir=tmp_path, workers=1)
    assert not torch.equal(one[0], other_seed.fresh_train(1, 40)[0])
    assert fresh_seed(3, 1) == fresh_seed(3, 1) != fresh_seed(3, 2)


def test_training_draws_fresh_data_from_epoch_one() -> None:
    asked = []
    source = channel_set(160, 7)

    def fresh(epoch: int, n: int):
        asked.append((epoch, n))
        return source

    train(tiny_vit(), dataclasses.replace(RECIPE, epochs=3), fresh_train=fresh)
    assert asked == [(1, 160), (2, 160)]
