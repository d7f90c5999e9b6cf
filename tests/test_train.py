"""The training loop: learns with every registered mixer, resumes exactly, stops on divergence, is repeatable."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from experiments.train.device_data import DeviceSplit, DeviceView
from experiments.train.device_trainer import CHECKPOINT_KEYS, train_on_device
from experiments.train.recipe import CHECKPOINT_NAME, TrainRecipe, TrainResult, no_weight_decay_names, param_groups
from mixers import list_mixers
from models import create_vit

IMG, PATCH, CLASSES = 16, 4, 4
CPU = torch.device("cpu")
# Small enough for a few seconds per run on two cores; warm-up off so the first steps already learn.
FAST = TrainRecipe(epochs=2, batch_size=16, lr=3e-3, warmup_epochs=0.0, eval_batch_size=64)
N_TRAIN = 160
VIEW = DeviceView(IMG, torch.full((CLASSES, 1, 1), 0.4), torch.full((CLASSES, 1, 1), 0.15), False, 1)


def channel_set(n: int, seed: int) -> DeviceSplit:
    """uint8 noise images whose label is the channel that is brightened in a random square.

    Learnable within a few steps even after mean pooling, so every mixer can show progress quickly.
    """
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, CLASSES, IMG, IMG, generator=g) * 30 + 90  # (n, C, H, W), one channel per class
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    corners = torch.randint(0, IMG // 2, (n, 2), generator=g)
    for i, (label, (r, c)) in enumerate(zip(labels.tolist(), corners.tolist())):
        images[i, label, r : r + IMG // 2, c : c + IMG // 2] += 60
    return DeviceSplit(images.clamp(0, 255).to(torch.uint8), labels)


def tiny_vit(mixer: str = "attention", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return create_vit(
        "micro", mixer=mixer, img_size=IMG, patch_size=PATCH, num_classes=CLASSES, in_chans=CLASSES, depth=1
    )


def weights(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


@torch.no_grad()
def dataset_loss(model: nn.Module, data: DeviceSplit) -> float:
    model.eval()
    images = (data.images.float() / 255 - VIEW.mean) / VIEW.std
    return nn.functional.cross_entropy(model(images), data.labels).item()


def run(model: nn.Module, recipe: TrainRecipe = FAST, *, train: DeviceSplit | None = None, **kwargs) -> TrainResult:
    kwargs = {"dtype": torch.float32, "seed": 0, **kwargs}
    train = channel_set(N_TRAIN, 1) if train is None else train
    return train_on_device(model, train, channel_set(64, 2), VIEW, recipe, **kwargs).result


def crash_after(model: nn.Module, calls: int) -> nn.Module:
    """Makes the model raise on its `calls + 1`-th forward, as a job killed mid-training stops."""
    original, count = model.forward, [0]

    def forward(x: Tensor) -> Tensor:
        count[0] += 1
        if count[0] > calls:
            raise RuntimeError("simulated crash")
        return original(x)

    model.forward = forward
    return model


@pytest.mark.parametrize("mixer", list_mixers())
def test_training_reduces_loss_for_every_mixer(mixer: str) -> None:
    train = channel_set(N_TRAIN, 1)
    model = tiny_vit(mixer)
    before = dataset_loss(model, train)
    result = run(model, train=train)
    after = dataset_loss(model, train)
    assert result.status == "ok" and result.error == ""
    assert result.epochs_done == FAST.epochs and result.train_samples == N_TRAIN
    assert after < 0.9 * before, f"{mixer}: loss {before:.3f} -> {after:.3f}"
    assert 0.0 <= result.accuracy <= 1.0 and result.best_accuracy is None  # no per-epoch test selection
    assert result.train_time_s > 0 and result.train_img_s > 0


def test_learns_the_task() -> None:
    result = run(tiny_vit(), dataclasses.replace(FAST, epochs=3))
    assert result.accuracy > 0.6  # chance is 0.25


# Crash in epoch 2 (7 steps an epoch, one evaluation on the test split at the end). With a checkpoint at every
# evaluation, the one on disk is the last evaluation's; with an interval no run reaches, the checkpoints are the
# first evaluation's and the end's, so the crashed run resumes from the start. Either ends as an uninterrupted run.
@pytest.mark.parametrize("every, crashed_at_step",
                         [(0, lambda step: 0 < step <= 10), (math.inf, lambda step: step == 0)],
                         ids=["every-evaluation", "first-and-last"])
def test_resume_matches_uninterrupted_run(tmp_path: Path, every: float, crashed_at_step) -> None:
    recipe = dataclasses.replace(FAST, epochs=3)
    train = channel_set(100, 1)
    straight = tiny_vit()
    expected = run(straight, recipe, train=train)

    with pytest.raises(RuntimeError, match="simulated crash"):
        run(crash_after(tiny_vit(), 10), recipe, train=train, checkpoint_dir=tmp_path, checkpoint_every_s=every)
    assert crashed_at_step(torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)["step"])

    # A differently initialised model proves the weights come from the checkpoint.
    resumed_model = tiny_vit(seed=123)
    resumed = run(resumed_model, recipe, train=train, checkpoint_dir=tmp_path, checkpoint_every_s=every)
    assert resumed.status == "ok" and resumed.epochs_done == recipe.epochs
    assert resumed.accuracy == expected.accuracy and resumed.best_accuracy == expected.best_accuracy
    assert resumed.final_train_loss == pytest.approx(expected.final_train_loss, abs=0)
    assert_same_weights(weights(resumed_model), weights(straight))
    assert torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)["step"] == 21
    assert not [p for p in tmp_path.iterdir() if p.name != CHECKPOINT_NAME]  # no temp files left behind


def test_resume_with_drop_path_restores_rng(tmp_path: Path) -> None:
    # Drop-path draws from the global RNG, so matching the straight run needs the saved RNG state.
    recipe = dataclasses.replace(FAST, epochs=2)
    train = channel_set(96, 1)

    def build(seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return create_vit(
            "micro",
            mixer="attention",
            img_size=IMG,
            patch_size=PATCH,
            num_classes=CLASSES,
            in_chans=CLASSES,
            depth=2,
            drop_path_rate=0.3,
        )

    straight = build()
    run(straight, recipe, train=train)
    with pytest.raises(RuntimeError):
        run(crash_after(build(), 8), recipe, train=train, checkpoint_dir=tmp_path, checkpoint_every_s=0)
    resumed = build(seed=7)
    run(resumed, recipe, train=train, checkpoint_dir=tmp_path, checkpoint_every_s=0)
    assert_same_weights(weights(resumed), weights(straight))


def test_resume_refuses_a_different_recipe(tmp_path: Path) -> None:
    recipe = dataclasses.replace(FAST, epochs=1)
    run(tiny_vit(), recipe, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="lr"):
        run(tiny_vit(), dataclasses.replace(recipe, lr=1e-4), checkpoint_dir=tmp_path)


def test_finished_checkpoint_returns_its_result(tmp_path: Path) -> None:
    recipe = dataclasses.replace(FAST, epochs=1)
    first = run(tiny_vit(), recipe, checkpoint_dir=tmp_path)
    again = run(tiny_vit(seed=5), recipe, checkpoint_dir=tmp_path)
    assert again == first


class Planted:
    """Unpickling it creates `marker`, as a hostile pickle would run any code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _plant_pickle(path: Path, tmp_path: Path) -> None:
    # Every key a checkpoint has, so only the loader (not a missing key) can stop the code from running.
    torch.save({**{key: 0 for key in CHECKPOINT_KEYS}, "seed": 0, "train_samples": N_TRAIN,
                "recipe": Planted(tmp_path / "marker")}, path)


def _plant_truncated(path: Path, tmp_path: Path) -> None:
    run(tiny_vit(), FAST, checkpoint_dir=tmp_path / "real")  # a finished run: resuming it would change nothing
    data = (tmp_path / "real" / CHECKPOINT_NAME).read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _plant_foreign(path: Path, tmp_path: Path) -> None:
    torch.save({"model": {}, "epoch": 1}, path)  # loads, but has no 'recipe' and the rest


@pytest.mark.parametrize("plant", [_plant_pickle, _plant_truncated, _plant_foreign], ids=["pickle", "truncated",
                                                                                         "foreign"])
def test_bad_checkpoint_is_named_moved_aside_and_the_run_restarts(tmp_path: Path, plant, caplog) -> None:
    recipe = dataclasses.replace(FAST, epochs=1)
    straight = tiny_vit()
    expected = run(straight, recipe)
    folder = tmp_path / "point"
    folder.mkdir()
    plant(folder / CHECKPOINT_NAME, tmp_path)
    planted = (folder / CHECKPOINT_NAME).read_bytes()

    model = tiny_vit()
    with caplog.at_level("WARNING", logger="experiments.train.recipe"):
        result = run(model, recipe, checkpoint_dir=folder)
    assert not (tmp_path / "marker").exists()  # the planted code never ran
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(folder / CHECKPOINT_NAME) in warnings[0], warnings
    aside = [p for p in folder.iterdir() if p.name.startswith(f"{CHECKPOINT_NAME}.bad-")]
    assert len(aside) == 1 and aside[0].name in warnings[0] and aside[0].read_bytes() == planted  # kept, not lost
    # Restarted from scratch and finished exactly as a run that never saw the bad file.
    assert result.status == "ok" and result.epochs_done == recipe.epochs and result.accuracy == expected.accuracy
    assert_same_weights(weights(model), weights(straight))
    assert torch.load(folder / CHECKPOINT_NAME, weights_only=True)["step"] == 10  # 160 images, batches of 16


def test_checkpoint_holds_only_data(tmp_path: Path) -> None:
    run(tiny_vit(), dataclasses.replace(FAST, epochs=1), checkpoint_dir=tmp_path)
    ckpt = torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)  # no pickled numpy arrays or classes
    assert set(CHECKPOINT_KEYS) | {"recipe", "seed", "train_samples"} <= set(ckpt)


def test_huge_lr_diverges() -> None:
    result = run(tiny_vit(), dataclasses.replace(FAST, lr=1e30, min_lr=0.0))
    assert result.status == "diverged"
    assert "non-finite" in result.error
    assert result.epochs_done < FAST.epochs


def test_poisoned_output_diverges_within_the_first_check() -> None:
    model = tiny_vit()
    model.head.register_forward_hook(lambda module, args, out: out * float("nan"))
    result = run(model)
    # The host reads the finiteness flag every DIVERGENCE_CHECK_STEPS steps (or at an evaluation), so the
    # error names the window of steps it fell in.
    assert result.status == "diverged" and "non-finite at epoch 1, within optimizer steps 1-" in result.error
    assert result.epochs_done == 0 and result.accuracy is None and result.best_accuracy is None


def test_same_seed_same_result() -> None:
    a, b = tiny_vit(), tiny_vit()
    result_a, result_b = run(a, seed=3), run(b, seed=3)
    assert result_a.accuracy == result_b.accuracy and result_a.final_train_loss == result_b.final_train_loss
    assert_same_weights(weights(a), weights(b))
    c = tiny_vit()
    run(c, seed=4)
    assert not torch.equal(weights(a)["head.weight"], weights(c)["head.weight"])


def test_row() -> None:
    result = run(tiny_vit(), dataclasses.replace(FAST, epochs=1))
    assert set(result.to_row()) == {
        "train_samples", "accuracy", "best_accuracy", "final_train_loss", "train_time_s", "train_img_s"
    }


def test_cpu_bf16_autocast_runs() -> None:
    model = tiny_vit()
    result = run(model, dataclasses.replace(FAST, epochs=1), dtype=torch.bfloat16)
    assert result.status == "ok"
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights


def test_unsupported_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="dtype"):
        run(tiny_vit(), dtype=torch.float16)


def test_no_weight_decay_groups() -> None:
    model = tiny_vit("swin")
    model.head.weight._no_weight_decay = True  # mamba_ssm's per-parameter flag
    model.blocks[0].mixer.no_weight_decay = lambda: {"qkv.weight"}  # timm's per-module list
    skip = no_weight_decay_names(model)
    assert {"pos_embed", "head.bias", "norm.weight", "blocks.0.norm1.weight"} <= skip
    assert {"head.weight", "blocks.0.mixer.qkv.weight", "blocks.0.mixer.relative_position_bias_table"} <= skip
    assert "blocks.0.mlp.fc1.weight" not in skip and "patch_embed.proj.weight" not in skip
    groups = param_groups(model, 0.05)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert all(p.ndim >= 2 for p in model.parameters() if id(p) in decayed)


@pytest.mark.parametrize(
    "field, value",
    [
        ("epochs", 0),
        ("epochs", 1.5),
        ("batch_size", 0),
        ("lr", 0.0),
        ("lr", float("nan")),
        ("min_lr", 1.0),
        ("weight_decay", -0.1),
        ("warmup_epochs", 100.0),
        ("label_smoothing", 1.0),
        ("grad_clip", 0.0),
        ("patience", 0.0),
        ("patience", 1.5),
        ("min_delta", -0.1),
        ("target_accuracy", 1.5),
        ("eval_points", 1),
        ("decay_fraction", 0.0),
        ("eval_batch_size", 0),
        ("train_samples", 0),
    ],
)
def test_recipe_validation_names_the_field(field: str, value: object) -> None:
    with pytest.raises((ValueError, TypeError), match=rf"TrainRecipe\.{field}\b"):
        TrainRecipe(**{field: value})


def test_recipe_defaults_are_valid() -> None:
    recipe = TrainRecipe()
    assert recipe.batch_size == 128 and recipe.weight_decay == 0.05 and recipe.label_smoothing == 0.1
    assert TrainRecipe(grad_clip=None, train_samples=10).grad_clip is None


def test_rule_needs_a_validation_split() -> None:
    with pytest.raises(ValueError, match=r"TrainRecipe\.patience.*val_fraction"):
        TrainRecipe(patience=0.25)
    assert TrainRecipe(patience=0.25, val_fraction=0.1).patience == 0.25
