"""The one training recipe every mixer shares, so accuracy differences come from the token mixer.

The recipe is DeiT's in miniature: AdamW without weight decay on biases, norms and position embeddings, a linear
warm-up then a constant rate and a short linear decay (experiments/train/schedule.py says why not a cosine),
label-smoothing cross-entropy and gradient clipping. On CUDA with `dtype=torch.bfloat16` the forward runs under
bf16 autocast with fp32 master weights; on CPU the same switch turns on CPU bf16 autocast (slow on most CPUs, but
allowed so a run can be rehearsed), and `float32` is plain fp32 everywhere.

One loop trains with it, on a CPU or a GPU: experiments/train/device_trainer.py (data held and augmented in whole
batches on the device). It replaced a DataLoader of per-image transforms: on 2 busy CPU cores the two were level
on reach (micro, 32 px) and the device loop was faster on CIFAR with crop and flip, and only the device loop keeps
a GPU fed, so it is the one kept. This module holds what any loop needs: the
recipe, the result, the parameter groups and the checkpoint helpers.

Checkpoints are data: they hold tensors and plain values only (the RNG states too) and are loaded with
`weights_only=True`, so a file planted in a results folder cannot run code. One that cannot be resumed (damaged,
foreign, or refused by that loader) is named in a warning, moved aside to `last.pt.bad-<time>` and the run starts
from scratch, rather than failing its point on every rerun.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

CHECKPOINT_NAME = "last.pt"
_LOG = logging.getLogger(__name__)
# Parameter names (last dotted component) that are position embeddings; decaying them towards zero erases
# position information, which is why DeiT/timm and Swin list them in `no_weight_decay()`.
POSITION_PARAM_NAMES = frozenset({"pos_embed", "cls_token", "relative_position_bias_table"})
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
# What the rows' `trainer` column says: one loop trains everything now (kept so older rows stay comparable).
TRAINER = "device"
STOP_REASONS = ("plateau", "ceiling", "max_budget", "diverged")


@dataclass(frozen=True)
class TrainRecipe:
    """Hyper-parameters shared by every mixer; validated when built, with errors that name the field.

    Args:
        epochs: the maximum budget, in passes over the training split (the point's epochs).
        batch_size: training images per optimizer step.
        lr: peak learning rate, reached at the end of warm-up; not rescaled with `batch_size`.
        min_lr: learning rate the final decay ends at.
        weight_decay: AdamW decoupled weight decay on matrices and convolution kernels only.
        warmup_epochs: linear warm-up length in epochs; may be fractional (converted to optimizer steps).
        label_smoothing: cross-entropy label smoothing.
        grad_clip: maximum global gradient norm; None disables clipping.
        eval_batch_size: images per forward at evaluation (the larger of it and `batch_size` is used).
        train_samples: if set, train on this many images drawn once (seeded) from the training split.
        val_fraction: share of the training images held out (seeded) as a validation split, on which the learning
            curve, the convergence rule and a learning-rate grid (experiments/lr_grid.py) read; 0 holds none out.
        patience: the convergence rule (experiments/train/convergence.py): stop once the validation accuracy has
            not improved by `min_delta` over this share of the maximum budget's samples, in (0, 1]; None: no
            rule, the training runs its whole budget. Needs `val_fraction` > 0.
        min_delta: the smallest gain in validation accuracy (in [0, 1)) that counts as an improvement.
        stop_at_ceiling: with the rule, also end a training as soon as its validation accuracy is perfect
            (`convergence.ceiling_reached`), rather than wait out a patience that could only confirm it (stop
            reason `ceiling`).
        target_accuracy: the validation accuracy whose first reach the row times in samples and FLOPs (how fast
            a mixer learns); None: not timed.
        eval_points: evaluations of the learning curve over the span the rule needs to see (the maximum budget,
            or `patience` of it when a rule is set, so a training that stops at the earliest still has this
            many), evenly spaced in optimizer steps, plus one before the first step.
        decay_fraction: the final linear decay's length as a share of the steps trained when it begins
            (experiments/train/schedule.py), in (0, 0.5].
    """

    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    label_smoothing: float = 0.1
    grad_clip: float | None = 1.0
    eval_batch_size: int = 256
    train_samples: int | None = None
    val_fraction: float = 0.0
    patience: float | None = None
    min_delta: float = 0.005
    stop_at_ceiling: bool = False
    target_accuracy: float | None = None
    eval_points: int = 20
    decay_fraction: float = 0.15

    def __post_init__(self) -> None:
        _check_float("val_fraction", self.val_fraction)
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"TrainRecipe.val_fraction must be in [0, 1), got {self.val_fraction}")
        for name in ("epochs", "batch_size", "eval_batch_size"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("eval_points", self.eval_points, minimum=2)
        if self.train_samples is not None:
            _check_int("train_samples", self.train_samples, minimum=1)
        for name in ("lr", "min_lr", "weight_decay", "warmup_epochs", "label_smoothing", "min_delta",
                     "decay_fraction"):
            _check_float(name, getattr(self, name))
        for name in ("grad_clip", "patience", "target_accuracy"):
            if getattr(self, name) is not None:
                _check_float(name, getattr(self, name))
        if self.lr <= 0:
            raise ValueError(f"TrainRecipe.lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"TrainRecipe.min_lr must be in [0, lr={self.lr}], got {self.min_lr}")
        if self.weight_decay < 0:
            raise ValueError(f"TrainRecipe.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup_epochs <= self.epochs:
            raise ValueError(
                f"TrainRecipe.warmup_epochs must be in [0, epochs={self.epochs}], got {self.warmup_epochs}"
            )
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"TrainRecipe.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"TrainRecipe.grad_clip must be > 0 or None, got {self.grad_clip}")
        if self.patience is not None:
            if not 0 < self.patience <= 1:
                raise ValueError(f"TrainRecipe.patience must be a share of the budget in (0, 1], got {self.patience}")
            if self.val_fraction <= 0:
                raise ValueError("TrainRecipe.patience: the rule reads a validation split; set val_fraction > 0")
        if not isinstance(self.stop_at_ceiling, bool):
            raise ValueError(f"TrainRecipe.stop_at_ceiling must be true or false, got {self.stop_at_ceiling!r}")
        if self.stop_at_ceiling and self.patience is None:
            raise ValueError("TrainRecipe.stop_at_ceiling is part of the convergence rule; set patience too")
        if not 0 <= self.min_delta < 1:
            raise ValueError(f"TrainRecipe.min_delta must be in [0, 1), got {self.min_delta}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"TrainRecipe.target_accuracy must be in (0, 1], got {self.target_accuracy}")
        if not 0 < self.decay_fraction <= 0.5:
            raise ValueError(f"TrainRecipe.decay_fraction must be in (0, 0.5], got {self.decay_fraction}")


def _check_int(name: str, value: object, *, minimum: int) -> None:
    # bool is an int subclass; `epochs=True` is a typo, not a request for one epoch.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"TrainRecipe.{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"TrainRecipe.{name} must be >= {minimum}, got {value}")


def _check_float(name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"TrainRecipe.{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"TrainRecipe.{name} must be finite, got {value}")


@dataclass(frozen=True)
class TrainResult:
    """Outcome of one training run.

    Args:
        status: "ok", or "diverged" when the loss or gradient norm became NaN/Inf (training stopped there).
        accuracy: top-1 on the test split after training ended, in [0, 1]; None if training diverged.
        best_accuracy: None: no per-epoch test accuracy is taken (its maximum would select on the test split, and
            each pass cost a fifth of a short CPU run); kept for the rows and checkpoints of earlier versions.
        final_train_loss: mean label-smoothed training loss since the last evaluation but one (the last
            learning-curve interval), or up to the divergence.
        train_time_s: wall time spent training, summed over resumed segments; evaluation and checkpoints excluded.
        train_img_s: training images processed per second of `train_time_s`.
        train_samples: size of the training split actually used.
        epochs_done: whole epochs completed.
        error: why the run stopped early, or "".
    """

    status: str
    accuracy: float | None
    best_accuracy: float | None
    final_train_loss: float | None
    train_time_s: float
    train_img_s: float
    train_samples: int
    epochs_done: int
    error: str = ""

    def to_row(self) -> dict[str, object]:
        """The dataset-independent result columns of a runs table."""
        return {
            "train_samples": self.train_samples,
            "accuracy": self.accuracy,
            "best_accuracy": self.best_accuracy,
            "final_train_loss": self.final_train_loss,
            "train_time_s": self.train_time_s,
            "train_img_s": self.train_img_s,
        }


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """Names of parameters that AdamW must not decay.

    Excluded: every parameter with fewer than two dimensions (biases, norm scales, per-channel vectors such as
    Mamba's `D`), position embeddings (`POSITION_PARAM_NAMES`), parameters flagged `p._no_weight_decay = True`
    (mamba_ssm's convention for `A_log` and `D`), and names a module lists in a `_no_weight_decay` collection
    or returns from `no_weight_decay()` (timm's convention), taken relative to that module.
    """
    names: set[str] = set()
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        listed: Iterable[str] = ()
        if callable(getattr(module, "no_weight_decay", None)):
            listed = module.no_weight_decay()
        flagged = getattr(module, "_no_weight_decay", ())
        if isinstance(flagged, (set, frozenset, list, tuple)):
            listed = [*listed, *flagged]
        names.update(prefix + name for name in listed)
    for name, param in model.named_parameters():
        is_position = name.rsplit(".", 1)[-1] in POSITION_PARAM_NAMES
        if param.ndim <= 1 or is_position or getattr(param, "_no_weight_decay", False):
            names.add(name)
    return names


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    """AdamW parameter groups: decayed matrices/kernels and the undecayed rest (see `no_weight_decay_names`)."""
    skip = no_weight_decay_names(model)
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if name in skip else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def _autocast(device: torch.device, dtype: torch.dtype) -> torch.autocast:
    # Parameters stay fp32 (master weights); only the forward's matmuls run in bf16, so no loss scaler is needed.
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)


def _epoch_seed(seed: int, epoch: int) -> int:
    # Derived from (seed, epoch) alone, so a resumed run shuffles epoch k exactly as an uninterrupted one.
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def _save_atomic(payload: dict[str, object], path: Path) -> None:
    # Write beside the target, then rename: a run killed mid-write leaves the previous checkpoint intact.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _move_aside(path: Path, reason: str) -> None:
    """Renames a checkpoint that cannot be resumed to `<name>.bad-<time>`, with one warning line naming both.

    Kept rather than deleted: it is evidence (a damaged disk, a planted file) and may not be ours to delete.

    Raises:
        RuntimeError: it cannot be moved (a read-only folder), so training from scratch could not save either.
    """
    reason = (reason.strip().splitlines() or ["unreadable"])[0][:200]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = path.with_name(f"{path.name}.bad-{stamp}")
    for attempt in range(1, 100):
        if not os.path.lexists(aside):
            break
        aside = path.with_name(f"{path.name}.bad-{stamp}-{attempt}")
    try:
        os.rename(path, aside)
    except OSError as error:
        raise RuntimeError(f"checkpoint {path} cannot be resumed ({reason}) nor moved aside "
                           f"({error.strerror or error}); remove it and rerun") from None
    _LOG.warning("checkpoint %s cannot be resumed (%s); moved it to %s and training from scratch",
                 path, reason, aside.name)


# Recipe fields that leave the trajectory alone, so a checkpoint written under another value resumes.
_RESUMABLE_ACROSS = frozenset({"eval_batch_size", "target_accuracy"})


def load_checkpoint(path: Path, required: Iterable[str], recipe: TrainRecipe, seed: int,
                    train_samples: int) -> dict | None:
    """The checkpoint at `path` as plain data, or None when there is none or it is not one this loop wrote.

    `weights_only=True` refuses anything but tensors and plain values, so a planted pickle runs no code. A file
    that cannot be loaded or lacks a `required` key (a damaged file, or one of an earlier version) is moved aside
    (`_move_aside`) and the caller trains from scratch.

    Raises:
        ValueError: the checkpoint is this loop's but of another recipe, seed or training-split size: resuming
            would splice two runs into one row.
    """
    if not os.path.lexists(path):
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - refused, truncated, not a checkpoint at all: all the same here
        _move_aside(path, f"{type(error).__name__}: {error}")
        return None
    required = {*required, "recipe", "seed", "train_samples"}
    missing = sorted(required - set(ckpt)) if isinstance(ckpt, dict) else ["(not a dict)"]
    if not missing and not isinstance(ckpt["recipe"], dict):
        missing = ["(recipe not a dict)"]
    if missing:
        _move_aside(path, f"missing key(s) {', '.join(missing)}")
        return None
    saved, current = ckpt["recipe"], dataclasses.asdict(recipe)
    differing = [k for k in current if k not in _RESUMABLE_ACROSS and current[k] != saved.get(k)]
    if differing:
        fields = ", ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in differing)
        raise ValueError(f"checkpoint {path} was written with a different recipe ({fields}); "
                         "use a fresh checkpoint_dir")
    if ckpt["seed"] != seed or ckpt["train_samples"] != train_samples:
        raise ValueError(f"checkpoint {path} was written with seed={ckpt['seed']}, train_samples="
                         f"{ckpt['train_samples']}; this run has seed={seed}, train_samples={train_samples}")
    return ckpt
