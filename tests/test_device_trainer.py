"""The device-resident trainer: batched augmentation equals the per-image one, training equals a plain reference
loop on a small seeded case, and a resumed run ends bit-for-bit where an uninterrupted one does (CPU)."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from experiments.train.data_arrays import ArrayDataset, AugmentedArrayDataset
from experiments.train.device_data import DeviceSplit, DeviceView, crop_flip, epoch_draws, to_device
from experiments.train.device_trainer import make_optimizer, make_schedule, train_on_device
from experiments.train.recipe import CHECKPOINT_NAME, TrainRecipe, _epoch_seed
from experiments.train.validation import validation_indices
from models import create_vit

IMG, PATCH, CLASSES, N_TRAIN = 16, 4, 3, 90
RECIPE = TrainRecipe(epochs=2, batch_size=16, lr=3e-3, warmup_epochs=0.5, val_fraction=0.2, eval_batch_size=32)


def arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 (n, IMG, IMG, 3) images whose label is the brightest channel, so a few steps already learn."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    images = rng.integers(0, 120, (n, IMG, IMG, 3))
    images[np.arange(n), :, :, labels] += 100
    return images.astype(np.uint8), labels


def splits() -> tuple[DeviceSplit, DeviceSplit, DeviceView]:
    mean, std = (0.3, 0.3, 0.3), (0.25, 0.25, 0.25)
    x, y = arrays(N_TRAIN, 1)
    x_test, y_test = arrays(40, 2)
    train = AugmentedArrayDataset(x, y, IMG, mean, std, rand_augment="")
    test = ArrayDataset(torch.from_numpy(x_test).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(y_test), IMG,
                        mean, std)
    return to_device(train, test, torch.device("cpu"))


def tiny_vit(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return create_vit("micro", mixer="attention", img_size=IMG, patch_size=PATCH, num_classes=CLASSES, depth=1)


def weights(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


def test_batched_crop_flip_matches_per_image_crop() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (6, 3, 9, 7), generator=g).float()  # odd sizes, not square
    pad = 2
    draws = epoch_draws(6, pad, seed=3)
    batched = crop_flip(images, draws.offsets, draws.flips, pad)
    for i in range(6):
        padded = F.pad(images[i : i + 1], (pad, pad, pad, pad), mode="reflect")[0]
        r, c = draws.offsets[i].tolist()
        expected = padded[:, r : r + 9, c : c + 7]
        expected = expected.flip(-1) if draws.flips[i] else expected
        assert torch.equal(batched[i], expected)


def reference_loop(model: nn.Module, train: DeviceSplit, view: DeviceView, recipe: TrainRecipe, seed: int) -> None:
    """The recipe written as the plainest loop: one image at a time through crop, flip and normalisation."""
    torch.manual_seed(seed)
    keep, _ = validation_indices(len(train), recipe.val_fraction, seed)
    images, labels = train.images[torch.as_tensor(keep)], train.labels[torch.as_tensor(keep)]
    steps = math.ceil(len(keep) / recipe.batch_size)
    optimizer = make_optimizer(model, recipe, torch.device("cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, make_schedule(recipe, steps))
    criterion = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    for epoch in range(recipe.epochs):
        model.train()
        draws = epoch_draws(len(keep), view.pad, _epoch_seed(seed, epoch))
        for step in range(steps):
            batch = []
            for i in draws.order[step * recipe.batch_size : (step + 1) * recipe.batch_size].tolist():
                padded = F.pad(images[i : i + 1].float() / 255, (view.pad,) * 4, mode="reflect")[0]
                r, c = draws.offsets[i].tolist()
                crop = padded[:, r : r + IMG, c : c + IMG]
                crop = crop.flip(-1) if draws.flips[i] else crop
                batch.append((crop - view.mean) / view.std)
            index = draws.order[step * recipe.batch_size : (step + 1) * recipe.batch_size]
            loss = criterion(model(torch.stack(batch)), labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip, foreach=True)
            optimizer.step()
            scheduler.step()


def test_matches_reference_loop() -> None:
    train, test, view = splits()
    model = tiny_vit()
    run = train_on_device(model, train, test, view, RECIPE, dtype=torch.float32, seed=5)
    reference = tiny_vit()
    reference_loop(reference, train, view, RECIPE, seed=5)
    assert run.result.status == "ok" and run.result.best_accuracy is None
    assert run.val_samples == round(RECIPE.val_fraction * N_TRAIN) and run.result.train_samples == N_TRAIN - run.val_samples
    assert 0 <= run.val_accuracy <= 1 and 0 <= run.result.accuracy <= 1 and run.result.train_img_s > 0
    assert_same_weights(weights(model), weights(reference))


def test_same_seed_same_weights_other_seed_differs() -> None:
    train, test, view = splits()
    a, b, c = tiny_vit(), tiny_vit(), tiny_vit()
    for model, seed in ((a, 1), (b, 1), (c, 2)):
        train_on_device(model, train, test, view, RECIPE, dtype=torch.float32, seed=seed)
    assert_same_weights(weights(a), weights(b))
    assert not torch.equal(weights(a)["head.weight"], weights(c)["head.weight"])


def test_resume_after_interrupt_is_bit_exact(tmp_path: Path) -> None:
    recipe = dataclasses.replace(RECIPE, epochs=3)
    train, test, view = splits()
    straight = tiny_vit()
    expected = train_on_device(straight, train, test, view, recipe, dtype=torch.float32, seed=0)

    crashing, calls = tiny_vit(), [0]
    original = crashing.forward

    def forward(x: Tensor) -> Tensor:  # a job killed half-way through epoch 2
        calls[0] += 1
        if calls[0] > 6:
            raise RuntimeError("simulated crash")
        return original(x)

    crashing.forward = forward
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_on_device(crashing, train, test, view, recipe, dtype=torch.float32, seed=0, checkpoint_dir=tmp_path,
                        checkpoint_every_s=0)
    # Tensors and plain values only: the checkpoint loads without unpickling arbitrary objects.
    assert 0 < torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)["step"] <= 6

    resumed_model = tiny_vit(seed=123)  # other initial weights: the result must come from the checkpoint
    resumed = train_on_device(resumed_model, train, test, view, recipe, dtype=torch.float32, seed=0,
                              checkpoint_dir=tmp_path)
    assert_same_weights(weights(resumed_model), weights(straight))
    assert resumed.result.accuracy == expected.result.accuracy and resumed.val_accuracy == expected.val_accuracy
    assert resumed.result.final_train_loss == expected.result.final_train_loss
    assert not [p for p in tmp_path.iterdir() if p.name != CHECKPOINT_NAME]  # no temp files left behind


def test_damaged_checkpoint_is_moved_aside(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"not a checkpoint")
    train, test, view = splits()
    run = train_on_device(tiny_vit(), train, test, view, RECIPE, dtype=torch.float32, seed=0, checkpoint_dir=tmp_path)
    assert run.result.status == "ok"
    (aside,) = tmp_path.glob(f"{CHECKPOINT_NAME}.bad-*")
    assert aside.read_bytes() == b"not a checkpoint"


def test_checkpoint_of_another_recipe_is_refused(tmp_path: Path) -> None:
    train, test, view = splits()
    train_on_device(tiny_vit(), train, test, view, RECIPE, dtype=torch.float32, seed=0, checkpoint_dir=tmp_path)
    other = dataclasses.replace(RECIPE, lr=1e-3)
    with pytest.raises(ValueError, match="lr: 0.003 -> 0.001"):
        train_on_device(tiny_vit(), train, test, view, other, dtype=torch.float32, seed=0, checkpoint_dir=tmp_path)


def test_divergence_stops_with_status() -> None:
    train, test, view = splits()
    recipe = dataclasses.replace(RECIPE, lr=1e6, grad_clip=None, warmup_epochs=0.0)
    model = tiny_vit()
    with torch.no_grad():
        model.head.weight.fill_(float("inf"))
    run = train_on_device(model, train, test, view, recipe, dtype=torch.float32, seed=0)
    assert run.result.status == "diverged" and "non-finite at epoch 1" in run.result.error
    assert run.rule_columns["stop_reason"] == "diverged" and run.curve[0]["optimizer_steps"] == 0
    assert run.result.accuracy is None and run.val_accuracy is None
