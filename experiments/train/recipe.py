"""Train a classifier from scratch with one fixed recipe, so accuracy differences come from the token mixer.

The recipe is DeiT's in miniature: AdamW without weight decay on biases, norms and position embeddings, a
cosine schedule with linear warm-up stepped per iteration, label-smoothing cross-entropy and gradient
clipping. On CUDA with `dtype=torch.bfloat16` the forward runs under bf16 autocast with fp32 master weights;
on CPU the same switch turns on CPU bf16 autocast (slow on most CPUs, but allowed so a run can be rehearsed),
and `float32` is plain fp32 everywhere.

Runs are seeded and, on CPU, bit-for-bit repeatable. A checkpoint is written atomically after every epoch;
calling again with the same `checkpoint_dir` resumes from it and ends with the same weights as a run that
was never interrupted.

Checkpoints are data: they hold tensors and plain values only (the RNG states too) and are loaded with
`weights_only=True`, so a file planted in a results folder cannot run code. One that cannot be resumed (damaged,
foreign, or refused by that loader) is named in a warning, moved aside to `last.pt.bad-<time>` and the run starts
from scratch, rather than failing its point on every rerun.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import random
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm.auto import tqdm

CHECKPOINT_NAME = "last.pt"
# What `train_and_evaluate` saves; a checkpoint lacking any of them is not one it wrote.
CHECKPOINT_KEYS = frozenset({"model", "optimizer", "scheduler", "epoch", "rng", "accuracy", "best_accuracy",
                             "final_train_loss", "train_time_s", "recipe", "seed", "train_samples"})
_LOG = logging.getLogger(__name__)
# Parameter names (last dotted component) that are position embeddings; decaying them towards zero erases
# position information, which is why DeiT/timm and Swin list them in `no_weight_decay()`.
POSITION_PARAM_NAMES = frozenset({"pos_embed", "cls_token", "relative_position_bias_table"})
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
TRAINERS = ("loader", "device")


@dataclass(frozen=True)
class TrainRecipe:
    """Hyper-parameters shared by every mixer; validated when built, with errors that name the field.

    Args:
        epochs: passes over the (possibly subsampled) training split.
        batch_size: training images per optimizer step.
        lr: peak learning rate, reached at the end of warm-up; not rescaled with `batch_size`.
        min_lr: learning rate the cosine decays to at the last step.
        weight_decay: AdamW decoupled weight decay on matrices and convolution kernels only.
        warmup_epochs: linear warm-up length in epochs; may be fractional (converted to optimizer steps).
        label_smoothing: cross-entropy label smoothing.
        grad_clip: maximum global gradient norm; None disables clipping.
        num_workers: DataLoader worker processes (0 loads in the training process).
        eval_batch_size: images per forward at evaluation.
        train_samples: if set, train on this many images drawn once (seeded) from the training split.
        val_fraction: share of the training images held out (seeded) as a validation split, on which a
            learning-rate grid chooses (experiments/lr_grid.py); 0 holds none out.
        trainer: "loader" (a DataLoader of per-image transforms, this module) or "device" (data held and
            augmented in batches on the device, experiments/train/device_trainer.py).
    """

    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    label_smoothing: float = 0.1
    grad_clip: float | None = 1.0
    num_workers: int = 0
    eval_batch_size: int = 256
    train_samples: int | None = None
    val_fraction: float = 0.0
    trainer: str = "loader"

    def __post_init__(self) -> None:
        if self.trainer not in TRAINERS:
            raise ValueError(f"TrainRecipe.trainer must be one of {', '.join(TRAINERS)}, got {self.trainer!r}")
        _check_float("val_fraction", self.val_fraction)
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"TrainRecipe.val_fraction must be in [0, 1), got {self.val_fraction}")
        for name in ("epochs", "batch_size", "eval_batch_size"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("num_workers", self.num_workers, minimum=0)
        if self.train_samples is not None:
            _check_int("train_samples", self.train_samples, minimum=1)
        for name in ("lr", "min_lr", "weight_decay", "warmup_epochs", "label_smoothing"):
            _check_float(name, getattr(self, name))
        if self.grad_clip is not None:
            _check_float("grad_clip", self.grad_clip)
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
        accuracy: top-1 on the test split after the last epoch, in [0, 1]; None if training stopped early.
        best_accuracy: None: no per-epoch test accuracy is taken (its maximum would select on the test split, and
            each pass cost a fifth of a short CPU run); kept for the rows and checkpoints of earlier versions.
        final_train_loss: mean label-smoothed training loss over the last epoch trained (partial if diverged).
        train_time_s: wall time spent training, summed over resumed segments; evaluation and checkpoints excluded.
        train_img_s: training images processed per second of `train_time_s`.
        train_samples: size of the training split actually used.
        epochs_done: epochs completed.
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


class WarmupCosine:
    """Per-step LR multiplier: linear warm-up from ~0 to 1, then cosine down to `min_ratio`.

    A class rather than a lambda so `LambdaLR.state_dict()` can save it, and so resuming a checkpoint made
    with a different schedule is visible.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_ratio: float) -> None:
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_ratio = min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            # (step + 1) so the first update already moves; a zero LR step would waste a batch.
            return (step + 1) / self.warmup_steps
        decay_steps = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / decay_steps, 1.0)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _autocast(device: torch.device, dtype: torch.dtype) -> torch.autocast:
    # Parameters stay fp32 (master weights); only the forward's matmuls run in bf16, so no loss scaler is needed.
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)


def _epoch_seed(seed: int, epoch: int) -> int:
    # Derived from (seed, epoch) alone, so a resumed run shuffles epoch k exactly as an uninterrupted one.
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def _rng_state(device: torch.device) -> dict[str, object]:
    """Every global RNG's state as tensors and plain values, so that `weights_only=True` can load it."""
    _, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state: dict[str, object] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),  # (version, 625 ints, float or None): plain values already
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, object], device: torch.device) -> None:
    numpy_state = state["numpy"]
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(("MT19937", numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


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


def _subsample(train_set: Dataset, train_samples: int | None, seed: int) -> Dataset:
    if train_samples is None:
        return train_set
    available = len(train_set)
    if train_samples > available:
        # Silently training on fewer images would put a wrong `train_samples` in the results.
        raise ValueError(f"TrainRecipe.train_samples={train_samples} exceeds the {available} training images")
    indices = torch.randperm(available, generator=torch.Generator().manual_seed(seed))[:train_samples]
    return Subset(train_set, indices.tolist())


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, *, device: torch.device, dtype: torch.dtype) -> float:
    """Top-1 accuracy in [0, 1] of `model` over `loader`."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    total = 0
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with _autocast(device, dtype):
            logits = model(images)
        correct += (logits.argmax(dim=-1) == labels).sum()
        total += labels.numel()
    return correct.item() / max(total, 1)


@torch.no_grad()
def evaluate_by_bucket(
    model: nn.Module, dataset: Dataset, buckets: Iterable[str], *, device: torch.device, dtype: torch.dtype,
    batch_size: int = 256,
) -> dict[str, float]:
    """Top-1 accuracy in [0, 1] per bucket: `buckets` gives each item of `dataset` its bucket label.

    Returns:
        {bucket: accuracy}, buckets in order of first appearance.
    """
    model.eval()
    labels = list(buckets)
    correct: list[bool] = []
    for images, targets in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        with _autocast(device, dtype):
            logits = model(images.to(device))
        correct += (logits.argmax(dim=-1).cpu() == targets).tolist()
    if len(correct) != len(labels):
        raise ValueError(f"{len(labels)} bucket labels for {len(correct)} items")
    hits: dict[str, list[int]] = {}
    for bucket, ok in zip(labels, correct, strict=True):
        hits.setdefault(bucket, []).append(ok)
    return {bucket: sum(oks) / len(oks) for bucket, oks in hits.items()}


def train_and_evaluate(
    model: nn.Module,
    train_set: Dataset,
    test_set: Dataset,
    recipe: TrainRecipe,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    seed: int,
    checkpoint_dir: Path | None = None,
    progress: bool = False,
) -> TrainResult:
    """Trains `model` in place with `recipe`, evaluating top-1 on `test_set` after the last epoch.

    The model's initial weights are the caller's (seed before building it); `seed` fixes everything after:
    the train subsample, the shuffle of every epoch, and the global RNGs that dropout, drop-path and
    augmentation draw from. Training stops at once with status "diverged", without applying the offending
    update, when the loss or gradient norm is NaN/Inf.

    Args:
        model: classifier mapping (B, C, H, W) images to (B, num_classes) logits; moved to `device` in fp32.
        train_set: dataset of (CHW float tensor, int label).
        test_set: dataset of (CHW float tensor, int label), evaluated once, after the last epoch.
        recipe: hyper-parameters.
        device: where to train.
        dtype: `torch.float32`, or `torch.bfloat16` for bf16 autocast with fp32 master weights.
        seed: seed for data order, subsampling and the global RNGs.
        checkpoint_dir: if set, a checkpoint is written there after every epoch, and an existing one is
            resumed from (its recipe and seed must match).
        progress: show a tqdm bar per epoch with the running loss.

    Returns:
        The run's `TrainResult`.
    """
    device = torch.device(device)
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype}; fp16 would need a loss scaler")
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)

    train_subset = _subsample(train_set, recipe.train_samples, seed)
    n_train = len(train_subset)
    pin = device.type == "cuda"
    # One generator, re-seeded per epoch: the DataLoader draws both the shuffle and worker seeds from it.
    shuffle_gen = torch.Generator()
    train_loader = DataLoader(
        train_subset,
        batch_size=recipe.batch_size,
        shuffle=True,
        generator=shuffle_gen,
        num_workers=recipe.num_workers,
        pin_memory=pin,
        drop_last=False,
    )
    test_loader = DataLoader(
        test_set, batch_size=recipe.eval_batch_size, shuffle=False, num_workers=recipe.num_workers, pin_memory=pin
    )
    steps_per_epoch = len(train_loader)
    total_steps = recipe.epochs * steps_per_epoch

    model.to(device=device, dtype=torch.float32)

    def fresh_optimizer() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        optimizer = torch.optim.AdamW(
            param_groups(model, recipe.weight_decay), lr=recipe.lr, betas=(0.9, 0.999), fused=device.type == "cuda"
        )
        schedule = WarmupCosine(round(recipe.warmup_epochs * steps_per_epoch), total_steps, recipe.min_lr / recipe.lr)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    optimizer, scheduler = fresh_optimizer()
    criterion = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)

    start_epoch, best, accuracy, last_loss, train_time = 0, None, None, None, 0.0
    ckpt_path = checkpoint_dir / CHECKPOINT_NAME if checkpoint_dir is not None else None
    if ckpt_path is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        ckpt = _load_checkpoint(ckpt_path, device) if os.path.lexists(ckpt_path) else None
        if ckpt is not None:
            _check_resumable(ckpt, recipe, seed, n_train, ckpt_path)
            initial = copy.deepcopy(model.state_dict())
            try:
                model.load_state_dict(ckpt["model"])
                optimizer.load_state_dict(ckpt["optimizer"])
                scheduler.load_state_dict(ckpt["scheduler"])
                _set_rng_state(ckpt["rng"], device)
                start_epoch, best, accuracy = int(ckpt["epoch"]), ckpt["best_accuracy"], ckpt["accuracy"]
                last_loss, train_time = ckpt["final_train_loss"], float(ckpt["train_time_s"])
            except Exception as error:  # noqa: BLE001 - well-formed but not this model's: start over
                _move_aside(ckpt_path, f"{type(error).__name__}: {error}")
                model.load_state_dict(initial)  # undo whatever was loaded before the failure
                optimizer, scheduler = fresh_optimizer()
                torch.manual_seed(seed)
                random.seed(seed)
                np.random.seed(seed)
                start_epoch, best, accuracy, last_loss, train_time = 0, None, None, None, 0.0

    def result(status: str, epochs_done: int, images: int, error: str = "") -> TrainResult:
        return TrainResult(
            status=status,
            accuracy=accuracy,
            best_accuracy=best,
            final_train_loss=last_loss,
            train_time_s=train_time,
            train_img_s=images / train_time if train_time > 0 else 0.0,
            train_samples=n_train,
            epochs_done=epochs_done,
            error=error,
        )

    for epoch in range(start_epoch, recipe.epochs):
        model.train()
        shuffle_gen.manual_seed(_epoch_seed(seed, epoch))
        loss_sum, seen = 0.0, 0
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        tic = time.perf_counter()
        batches = tqdm(train_loader, desc=f"epoch {epoch + 1}/{recipe.epochs}", leave=False, disable=not progress)
        for step, (images, labels) in enumerate(batches):
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            with _autocast(device, dtype):
                logits = model(images)
            # Loss in fp32: bf16 log-softmax over many classes loses the small label-smoothing terms.
            loss = criterion(logits.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if recipe.grad_clip is not None:
                grad_norm = nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
            else:
                grad_norm = torch.zeros((), device=device)
            # One host sync per step for both checks; the finiteness test must precede the update.
            loss_value, norm_value = torch.stack([loss.detach().float(), grad_norm.float()]).tolist()
            loss_sum += loss_value * labels.numel()
            seen += labels.numel()
            if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
                train_time += time.perf_counter() - tic
                last_loss = loss_sum / seen
                what = "loss" if not math.isfinite(loss_value) else "gradient norm"
                value = loss_value if what == "loss" else norm_value
                error = f"{what} became {value} at epoch {epoch + 1}, step {step + 1}"
                return result("diverged", epoch, epoch * n_train + seen, error)
            optimizer.step()
            scheduler.step()
            if progress:
                batches.set_postfix(loss=f"{loss_value:.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train_time += time.perf_counter() - tic
        last_loss = loss_sum / max(seen, 1)

        if ckpt_path is not None:
            _save_atomic(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "epoch": epoch + 1,
                    "rng": _rng_state(device),
                    "accuracy": accuracy,
                    "best_accuracy": best,
                    "final_train_loss": last_loss,
                    "train_time_s": train_time,
                    "recipe": dataclasses.asdict(recipe),
                    "seed": seed,
                    "train_samples": n_train,
                },
                ckpt_path,
            )
    # The test split is read once, after the last epoch (also when resuming a finished run, which is repeatable).
    accuracy = evaluate(model, test_loader, device=device, dtype=dtype)
    return result("ok", recipe.epochs, recipe.epochs * n_train)


def _load_checkpoint(path: Path, device: torch.device) -> dict | None:
    """The checkpoint at `path` as plain data, or None when it is not one `train_and_evaluate` wrote.

    `weights_only=True` refuses anything but tensors and plain values, so a planted pickle runs no code. A file
    that cannot be loaded or lacks a key is moved aside (`_move_aside`) and the caller trains from scratch.
    """
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # noqa: BLE001 - refused, truncated, not a checkpoint at all: all the same here
        _move_aside(path, f"{type(error).__name__}: {error}")
        return None
    missing = sorted(CHECKPOINT_KEYS - set(ckpt)) if isinstance(ckpt, dict) else ["(not a dict)"]
    if not missing and not (isinstance(ckpt["recipe"], dict) and isinstance(ckpt["rng"], dict)):
        missing = ["(recipe or rng not a dict)"]
    if missing:
        _move_aside(path, f"missing key(s) {', '.join(missing)}")
        return None
    return ckpt


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


def _check_resumable(ckpt: dict, recipe: TrainRecipe, seed: int, n_train: int, path: Path) -> None:
    # Resuming under another recipe would silently splice two different runs into one result row.
    saved = ckpt["recipe"]
    current = dataclasses.asdict(recipe)
    # eval_batch_size alone does not change the training trajectory (num_workers does: it reseeds augmentation).
    differing = [k for k in current if k != "eval_batch_size" and current[k] != saved.get(k)]
    if differing:
        fields = ", ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in differing)
        raise ValueError(
            f"checkpoint {path} was written with a different recipe ({fields}); use a fresh checkpoint_dir"
        )
    if ckpt["seed"] != seed or ckpt["train_samples"] != n_train:
        raise ValueError(
            f"checkpoint {path} was written with seed={ckpt['seed']}, train_samples={ckpt['train_samples']}; "
            f"this run has seed={seed}, train_samples={n_train}"
        )
