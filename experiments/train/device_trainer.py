"""The recipe of `recipe.py` with the data on the device: no DataLoader, no per-image Python in the loop.

Each step gathers a batch of uint8 images on the device, augments and normalises it there (`device_data`), runs
the forward under bf16 autocast when asked (fp32 master weights), and steps a fused AdamW on CUDA (foreach on a
CPU). `torch.compile` is optional. The loss and the gradient norm stay on the device; the host reads them every
`DIVERGENCE_CHECK_STEPS` steps and at the end of each epoch, so the GPU is not stalled once per step.

Accuracy is read once, after the last epoch, on the test split and (when the recipe holds one out) the
validation split; no per-epoch test accuracy is taken, so nothing can be selected on it.

On a CPU the run is bit-for-bit repeatable, and a checkpoint written after every epoch resumes to the same
weights as a run never interrupted: the epoch's random draws derive from (seed, epoch) alone, and the global RNG
state (drop-path) is saved. Checkpoints hold tensors and plain values only, so they load with `weights_only=True`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch
from torch import nn

from .device_data import DeviceSplit, DeviceView, epoch_draws, model_inputs
from .recipe import (
    CHECKPOINT_NAME, SUPPORTED_DTYPES, TrainRecipe, TrainResult, WarmupCosine, _autocast, _epoch_seed, _save_atomic,
    param_groups,
)
from .validation import validation_indices

DIVERGENCE_CHECK_STEPS = 16


@dataclasses.dataclass(frozen=True)
class DeviceRun:
    """A device-trained run: the recipe's result and the validation split's size and accuracy."""

    result: TrainResult
    val_samples: int
    val_accuracy: float | None


def make_optimizer(model: nn.Module, recipe: TrainRecipe, device: torch.device) -> torch.optim.AdamW:
    """AdamW over `recipe.param_groups`: the fused kernel on CUDA, the foreach one elsewhere."""
    fused = device.type == "cuda"
    return torch.optim.AdamW(param_groups(model, recipe.weight_decay), lr=recipe.lr, betas=(0.9, 0.999),
                             fused=fused or None, foreach=None if fused else True)


def rng_state(device: torch.device, cuda=torch.cuda) -> dict[str, torch.Tensor | None]:
    """The global RNG states a checkpoint keeps: the CPU's, and on CUDA the device's (drop-path draws there).

    Args:
        device: where training runs.
        cuda: `torch.cuda`, or a stand-in with its `get_rng_state` (a CPU test of the CUDA branch).
    """
    return {"rng_cpu": torch.get_rng_state(),
            "rng_cuda": cuda.get_rng_state(device) if device.type == "cuda" else None}


def restore_rng_state(saved: dict, device: torch.device, cuda=torch.cuda) -> None:
    """Puts back what `rng_state` saved; a checkpoint written off CUDA has no device state to restore."""
    torch.set_rng_state(saved["rng_cpu"])
    if device.type == "cuda" and saved.get("rng_cuda") is not None:
        cuda.set_rng_state(saved["rng_cuda"], device)


@torch.no_grad()
def evaluate_split(model: nn.Module, split: DeviceSplit, view: DeviceView, *, batch_size: int,
                   dtype: torch.dtype) -> float:
    """Top-1 accuracy in [0, 1] over a device split, never augmented; one host read at the end."""
    model.eval()
    device = split.labels.device
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, len(split), batch_size):
        images = split.images[start:start + batch_size]
        with _autocast(device, dtype):
            logits = model(model_inputs(images, view))
        correct += (logits.argmax(dim=-1) == split.labels[start:start + batch_size]).sum()
    return correct.item() / max(len(split), 1)


def train_on_device(
    model: nn.Module,
    train: DeviceSplit,
    test: DeviceSplit,
    view: DeviceView,
    recipe: TrainRecipe,
    *,
    dtype: torch.dtype,
    seed: int,
    checkpoint_dir: Path | None = None,
    compile_mode: str = "",
) -> DeviceRun:
    """Trains `model` in place on `train` (minus the recipe's validation split) and evaluates it at the end.

    Args:
        model: classifier of (B, C, H, W) images; moved to the splits' device in fp32.
        train: the training split on the device (`recipe.train_samples`, when set, already drawn).
        test: the test split on the device.
        view: input size, normalisation and augmentation.
        recipe: hyper-parameters; `val_fraction` of `train` is held out (seeded by `seed`).
        dtype: `torch.float32`, or `torch.bfloat16` for bf16 autocast with fp32 master weights.
        seed: seed of the validation split, of every epoch's draws and of the global RNGs.
        checkpoint_dir: if set, a checkpoint after every epoch; an existing one is resumed from.
        compile_mode: a `torch.compile` mode for the forward ("" runs eager).

    Returns:
        The run; `best_accuracy` is None (no per-epoch test accuracy is taken).
    """
    device = train.labels.device
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype}; fp16 would need a loss scaler")
    torch.manual_seed(seed)
    train_idx, val_idx = validation_indices(len(train), recipe.val_fraction, seed)
    fit, val = (train.subset(train_idx), train.subset(val_idx)) if len(val_idx) else (train, None)
    n_train = len(fit)
    steps_per_epoch = math.ceil(n_train / recipe.batch_size)

    model.to(device=device, dtype=torch.float32)
    forward = torch.compile(model, mode=compile_mode) if compile_mode else model
    optimizer = make_optimizer(model, recipe, device)
    schedule = WarmupCosine(round(recipe.warmup_epochs * steps_per_epoch), recipe.epochs * steps_per_epoch,
                            recipe.min_lr / recipe.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    criterion = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    params = [p for p in model.parameters() if p.requires_grad]

    state = {"epoch": 0, "final_train_loss": None, "train_time_s": 0.0}
    path = checkpoint_dir / CHECKPOINT_NAME if checkpoint_dir is not None else None
    if path is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        saved = _load(path, recipe, seed, n_train)
        if saved is not None:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            restore_rng_state(saved, device)
            state = {k: saved[k] for k in state}

    def finish(status: str, epochs_done: int, images: int, error: str = "", accuracy: float | None = None,
               val_accuracy: float | None = None) -> DeviceRun:
        elapsed = state["train_time_s"]
        result = TrainResult(status=status, accuracy=accuracy, best_accuracy=None,
                             final_train_loss=state["final_train_loss"], train_time_s=elapsed,
                             train_img_s=images / elapsed if elapsed > 0 else 0.0, train_samples=n_train,
                             epochs_done=epochs_done, error=error)
        return DeviceRun(result, len(val_idx), val_accuracy)

    for epoch in range(state["epoch"], recipe.epochs):
        model.train()
        draws = epoch_draws(n_train, view.pad, _epoch_seed(seed, epoch))
        order, offsets, flips = (t.to(device, non_blocking=True) for t in (draws.order, draws.offsets, draws.flips))
        loss_sum = torch.zeros((), device=device)
        finite = torch.ones((), dtype=torch.bool, device=device)
        _sync(device)
        tic = time.perf_counter()
        for step in range(steps_per_epoch):
            index = order[step * recipe.batch_size:(step + 1) * recipe.batch_size]
            augment = (offsets[index], flips[index]) if view.augment else None
            images = model_inputs(fit.images[index], view, augment)
            labels = fit.labels[index]
            with _autocast(device, dtype):
                logits = forward(images)
            # Loss in fp32: bf16 log-softmax over many classes loses the small label-smoothing terms.
            loss = criterion(logits.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if recipe.grad_clip is not None:
                norm = nn.utils.clip_grad_norm_(params, recipe.grad_clip, foreach=True)
                finite &= torch.isfinite(norm)
            finite &= torch.isfinite(loss.detach())
            loss_sum += loss.detach() * len(index)
            last = step == steps_per_epoch - 1
            if (step + 1) % DIVERGENCE_CHECK_STEPS == 0 or last:
                if not bool(finite):  # the host reads the flag here only, not once per step
                    state["train_time_s"] += time.perf_counter() - tic
                    seen = min((step + 1) * recipe.batch_size, n_train)
                    state["final_train_loss"] = loss_sum.item() / seen
                    error = (f"loss or gradient norm became non-finite at epoch {epoch + 1}, within steps "
                             f"{max(step + 2 - DIVERGENCE_CHECK_STEPS, 1)}-{step + 1}")
                    return finish("diverged", epoch, epoch * n_train + seen, error)
            optimizer.step()
            scheduler.step()
        _sync(device)
        state["train_time_s"] += time.perf_counter() - tic
        state["final_train_loss"] = loss_sum.item() / n_train
        state["epoch"] = epoch + 1
        if path is not None:
            _save_atomic({
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), **rng_state(device),
                "recipe": dataclasses.asdict(recipe), "seed": seed, "train_samples": n_train, **state,
            }, path)

    accuracy = evaluate_split(forward, test, view, batch_size=recipe.eval_batch_size, dtype=dtype)
    val_accuracy = (evaluate_split(forward, val, view, batch_size=recipe.eval_batch_size, dtype=dtype)
                    if val is not None else None)
    return finish("ok", recipe.epochs, recipe.epochs * n_train, accuracy=accuracy, val_accuracy=val_accuracy)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load(path: Path, recipe: TrainRecipe, seed: int, n_train: int) -> dict | None:
    """The checkpoint at `path` if there is one of this run; a file that does not load is moved aside (named
    `*.damaged`) and the run starts over, since a half-written file can only come from a crash."""
    if not path.exists():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - unreadable for any reason: keep it for inspection, start afresh
        path.replace(path.with_name(path.name + ".damaged"))
        return None
    current = dataclasses.asdict(recipe)
    differing = [k for k in current if k != "eval_batch_size" and current[k] != saved["recipe"].get(k)]
    if differing or saved["seed"] != seed or saved["train_samples"] != n_train:
        fields = ", ".join(f"{k}: {saved['recipe'].get(k)!r} -> {current[k]!r}" for k in differing)
        raise ValueError(f"checkpoint {path} was written by another run ({fields or 'seed or train_samples'}); "
                         "use a fresh checkpoint_dir")
    return saved
