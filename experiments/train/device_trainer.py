"""The one training loop: data held on the device, augmented there in whole batches, no per-image Python.

Every training, on a CPU or a GPU, runs here. Each step gathers a batch of uint8 images on the device, augments
and normalises it there (`device_data`), runs the forward under bf16 autocast when asked (fp32 master weights),
and steps a fused AdamW (CUDA and CPU; foreach elsewhere). `torch.compile` is optional. The loss and the gradient norm
stay on the device; the host reads them every `DIVERGENCE_CHECK_STEPS` steps and at each evaluation, so the GPU
is not stalled once per step.

The learning curve: the validation split (held out of the training split, fixed, never augmented) is evaluated
before the first step and every `eval_every` optimizer steps (`eval_interval`: `recipe.eval_points` evaluations
over the span the convergence rule needs), and at the last step. Each evaluation is one row of the curve
(`schema.CURVE_COLUMNS`), written to the point's curve file as it is taken (experiments/train/curve.py). With a
convergence rule (`recipe.patience`), a plateau seen at an evaluation starts the final decay of the rate, and the
training stops when it ends (experiments/train/schedule.py, convergence.py); otherwise the training runs its
maximum budget, decaying over the budget's last `decay_fraction`. The test split is read once, at the end.

Generated tasks (reach, pathfinder) can draw a fresh training set every epoch: `fresh_train(epoch)` returns it
(epoch 0 trains on the data set's own training images); validation and test stay fixed.

On a CPU the run is bit-for-bit repeatable, and a checkpoint resumes to the same weights and the same curve (wall
times aside) as a run never interrupted: the epoch's random draws and fresh images derive from (seed, epoch)
alone, the global RNG state (drop-path) is saved, and so is the curve so far. A checkpoint is written at an
evaluation once `checkpoint_every_s` of training has passed since the last one, and at the end, so a killed run
loses at most that much (saved at every evaluation, a short CPU training spent a tenth of its time saving).
Checkpoints hold tensors and plain values only, so they load with `weights_only=True`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from .convergence import ceiling_reached, curve_numbers, plateau_seen
from .curve import write_curve
from .device_data import DeviceSplit, DeviceView, epoch_draws, model_inputs
from .recipe import (
    CHECKPOINT_NAME, SUPPORTED_DTYPES, TRAINER, TrainRecipe, TrainResult, _autocast, _epoch_seed, _save_atomic,
    load_checkpoint, param_groups,
)
from .schedule import WarmupConstantDecay
from .validation import validation_indices

DIVERGENCE_CHECK_STEPS = 16
# Seconds of training between two checkpoints (at the evaluation that follows); 0 saves at every evaluation.
CHECKPOINT_EVERY_S = 60.0
# What a checkpoint of this loop holds besides the recipe, seed and training-split size.
CHECKPOINT_KEYS = ("model", "optimizer", "rng_cpu", "step", "samples", "train_time_s", "final_train_loss",
                   "curve", "schedule", "stop_reason")


@dataclasses.dataclass(frozen=True)
class SplitScore:
    """One evaluation of a split: top-1 in [0, 1], mean label-smoothed loss, and top-1 per bucket ({} when the
    split has no buckets)."""

    accuracy: float
    loss: float
    by_bucket: dict[str, float]


@dataclasses.dataclass(frozen=True)
class DeviceRun:
    """A finished (or diverged) training: the recipe's result, the validation split, the curve and the rule.

    Attributes:
        result: the `TrainResult`.
        val_samples: images held out for validation (0: none).
        val_accuracy: validation top-1 at the last evaluation; None without a validation split or if diverged.
        accuracy_by_bucket: test top-1 per bucket (reach), {} otherwise or if diverged.
        curve: the learning curve, one dict of `schema.CURVE_COLUMNS` per evaluation.
        rule_columns: the row's convergence columns (`converged` ... `curve_points`).
    """

    result: TrainResult
    val_samples: int
    val_accuracy: float | None
    accuracy_by_bucket: dict[str, float]
    curve: list[dict[str, object]]
    rule_columns: dict[str, object]

    def to_row(self) -> dict[str, object]:
        """Every training column of a runs row this loop knows (the caller adds the rate's provenance)."""
        return {**self.result.to_row(), "val_samples": self.val_samples, "val_accuracy": self.val_accuracy,
                "trainer": TRAINER, **self.rule_columns}


def make_optimizer(model: nn.Module, recipe: TrainRecipe, device: torch.device) -> torch.optim.AdamW:
    """AdamW over `recipe.param_groups`: the fused kernel on CUDA and on the CPU, the foreach one elsewhere.

    On the CPU the foreach AdamW spends Python per parameter tensor on every step (reading each step count, its bias
    corrections), so a mixer's step grew with how many tensors its parameters are split into (Mamba's are nearly
    twice attention's at the micro preset; issue 33's note has the A/B).
    """
    fused = device.type in ("cuda", "cpu")
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


def make_schedule(recipe: TrainRecipe, steps_per_epoch: int) -> WarmupConstantDecay:
    """The recipe's schedule over its maximum budget, in optimizer steps."""
    return WarmupConstantDecay(round(recipe.warmup_epochs * steps_per_epoch), recipe.epochs * steps_per_epoch,
                               recipe.decay_fraction, recipe.min_lr / recipe.lr)


def eval_interval(recipe: TrainRecipe, total_steps: int) -> int:
    """Optimizer steps between two evaluations: `eval_points` over the maximum budget, or over `patience` of it
    when a rule is set (the earliest a plateau can be declared), so every curve has at least that many points."""
    span = total_steps * (recipe.patience if recipe.patience is not None else 1.0)
    return max(1, math.floor(span / recipe.eval_points))


@torch.no_grad()
def evaluate_split(model: nn.Module, split: DeviceSplit, view: DeviceView, *, batch_size: int, dtype: torch.dtype,
                   label_smoothing: float = 0.0, buckets: Sequence[str] | None = None) -> SplitScore:
    """Top-1 accuracy, mean loss and per-bucket accuracy over a device split, never augmented; one host read.

    Args:
        model: the classifier; left in eval mode.
        split: images and labels on the device.
        view: how stored images become model inputs.
        batch_size: images per forward.
        dtype: as trained (bf16 autocast or fp32).
        label_smoothing: of the loss, as the training loss has it, so the two curves compare.
        buckets: a bucket label per image of `split` (reach's "direction:distance"), or None.
    """
    model.eval()
    device = split.labels.device
    hits, loss_sum = [], torch.zeros((), device=device)
    for start in range(0, len(split), batch_size):
        labels = split.labels[start:start + batch_size]
        with _autocast(device, dtype):
            logits = model(model_inputs(split.images[start:start + batch_size], view))
        loss_sum += nn.functional.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing,
                                                reduction="sum")
        hits.append(logits.argmax(dim=-1) == labels)
    n = max(len(split), 1)
    correct = torch.cat(hits).cpu() if hits else torch.zeros(0, dtype=torch.bool)
    by_bucket: dict[str, float] = {}
    if buckets is not None:
        if len(buckets) != len(correct):
            raise ValueError(f"{len(buckets)} bucket labels for {len(correct)} images")
        tally: dict[str, list[int]] = {}
        for bucket, ok in zip(buckets, correct.tolist(), strict=True):
            tally.setdefault(bucket, []).append(ok)
        by_bucket = {bucket: sum(oks) / len(oks) for bucket, oks in tally.items()}
    return SplitScore(int(correct.sum()) / n, loss_sum.item() / n, by_bucket)


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
    checkpoint_every_s: float = CHECKPOINT_EVERY_S,
    compile_mode: str = "",
    fresh_train: Callable[[int, int], DeviceSplit] | None = None,
    train_buckets: Sequence[str] | None = None,
    test_buckets: Sequence[str] | None = None,
    curve_path: Path | None = None,
    curve_key: dict[str, object] | None = None,
    flops_per_sample: float | None = None,
) -> DeviceRun:
    """Trains `model` in place on `train` (minus the recipe's validation split), recording its learning curve.

    Args:
        model: classifier of (B, C, H, W) images; moved to the splits' device in fp32.
        train: the training split on the device (`recipe.train_samples`, when set, already drawn).
        test: the test split on the device.
        view: input size, normalisation and augmentation.
        recipe: hyper-parameters; `val_fraction` of `train` is held out (seeded by `seed`).
        dtype: `torch.float32`, or `torch.bfloat16` for bf16 autocast with fp32 master weights.
        seed: seed of the validation split, of every epoch's draws and of the global RNGs.
        checkpoint_dir: if set, checkpoints are written there and an existing one is resumed from.
        checkpoint_every_s: training seconds between two checkpoints, each written at the next evaluation (and one
            at the first evaluation and at the end); 0 writes one at every evaluation.
        compile_mode: a `torch.compile` mode for the forward ("" runs eager).
        fresh_train: `fresh_train(epoch, n)` -> n new training images for epoch >= 1 (generated tasks); None
            trains every epoch on the same images.
        train_buckets: a bucket label per image of `train`, so each evaluation records validation accuracy per
            bucket; None: no buckets.
        test_buckets: the same for `test`, for the final per-bucket test accuracy.
        curve_path: where the curve file is written at every evaluation; None keeps it in memory only.
        curve_key: the point's key columns, repeated on every curve row.
        flops_per_sample: one image's training FLOPs (forward + backward, counted), for the curve's train_flops.

    Returns:
        The run; `best_accuracy` is None (no per-epoch test accuracy is taken).
    """
    device = train.labels.device
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype}; fp16 would need a loss scaler")
    torch.manual_seed(seed)
    train_idx, val_idx = validation_indices(len(train), recipe.val_fraction, seed)
    fit, val = (train.subset(train_idx), train.subset(val_idx)) if len(val_idx) else (train, None)
    val_buckets = [train_buckets[i] for i in val_idx] if train_buckets is not None and val is not None else None
    n_train = len(fit)
    batch = recipe.batch_size
    steps_per_epoch = math.ceil(n_train / batch)
    eval_batch = max(recipe.batch_size, recipe.eval_batch_size)

    model.to(device=device, dtype=torch.float32)
    forward = torch.compile(model, mode=compile_mode) if compile_mode else model
    optimizer = make_optimizer(model, recipe, device)
    schedule = make_schedule(recipe, steps_per_epoch)
    eval_every = eval_interval(recipe, schedule.total_steps)
    patience_samples = math.ceil(recipe.patience * recipe.epochs * n_train) if recipe.patience is not None else None
    # What a constant prediction scores on the validation split: the rule does not call a curve there converged.
    chance = (int(torch.bincount(val.labels.cpu()).max()) / len(val)) if val is not None and len(val) else 0.0
    criterion = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    params = [p for p in model.parameters() if p.requires_grad]

    state: dict[str, object] = {"step": 0, "samples": 0, "train_time_s": 0.0, "final_train_loss": None,
                                "curve": [], "stop_reason": ""}
    path = checkpoint_dir / CHECKPOINT_NAME if checkpoint_dir is not None else None
    if path is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        saved = load_checkpoint(path, CHECKPOINT_KEYS, recipe, seed, n_train)
        if saved is not None:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            restore_rng_state(saved, device)
            schedule = dataclasses.replace(schedule, **saved["schedule"])
            state = {k: saved[k] for k in state}
    # Training seconds (`train_time_s`) at the last checkpoint; None: none written by this run or resumed from.
    saved_at: float | None = float(state["train_time_s"]) if state["step"] else None
    # The checkpoint holds the curve as JSON text (see `record`); a list is what checkpoints before that held.
    curve: list[dict[str, object]] = (json.loads(state["curve"]) if isinstance(state["curve"], str)
                                      else list(state["curve"]))

    def record(loss_sum: float | None, window: int) -> None:
        """Evaluates the validation split, appends the curve row, writes the file and, when one is due, the
        checkpoint."""
        nonlocal saved_at
        step, samples = int(state["step"]), int(state["samples"])
        score = (evaluate_split(forward, val, view, batch_size=eval_batch, dtype=dtype,
                                label_smoothing=recipe.label_smoothing, buckets=val_buckets)
                 if val is not None else None)
        model.train()
        train_loss = loss_sum / window if loss_sum is not None and window else None
        curve.append({
            "eval_index": len(curve), "epoch": samples / n_train, "optimizer_steps": step, "samples_seen": samples,
            "train_flops": samples * flops_per_sample if flops_per_sample else None,
            "wall_s": state["train_time_s"], "lr": recipe.lr * schedule(max(step - 1, 0)) if step else 0.0,
            "train_loss": train_loss, "val_loss": score.loss if score else None,
            "val_accuracy": score.accuracy if score else None, "val_accuracy_by_bucket": score.by_bucket if score else {},
        })
        if train_loss is not None:
            state["final_train_loss"] = train_loss
        if patience_samples is not None and not schedule.decaying(step):
            seen, accuracies = [r["samples_seen"] for r in curve], [r["val_accuracy"] for r in curve]
            if plateau_seen(seen, accuracies, patience_samples=patience_samples, min_delta=recipe.min_delta,
                            chance=chance):
                state["stop_reason"] = "plateau"
            elif recipe.stop_at_ceiling and ceiling_reached(accuracies):
                state["stop_reason"] = "ceiling"
            if state["stop_reason"]:
                schedule.begin_decay(step)
        state["curve"] = curve
        if curve_path is not None:
            write_curve(curve_path, curve_key or {}, curve)
        elapsed = float(state["train_time_s"])
        due = (saved_at is None or elapsed - saved_at >= checkpoint_every_s
               or int(state["step"]) >= schedule.end_step)
        if path is not None and due:
            saved_at = elapsed
            _save_atomic({
                "model": model.state_dict(), "optimizer": optimizer.state_dict(), **rng_state(device),
                "schedule": schedule.state(), "recipe": dataclasses.asdict(recipe), "seed": seed,
                # The curve as one JSON string: pickled as a list of dicts it cost torch.save thousands of
                # persistent_id calls per evaluation, growing with the curve (10 s of a 64-s reach training).
                "train_samples": n_train, **state, "curve": json.dumps(curve),
            }, path)

    def finish(status: str, error: str = "", accuracy: float | None = None,
               by_bucket: dict[str, float] | None = None) -> DeviceRun:
        elapsed = float(state["train_time_s"])
        samples = int(state["samples"])
        result = TrainResult(status=status, accuracy=accuracy, best_accuracy=None,
                             final_train_loss=state["final_train_loss"], train_time_s=elapsed,
                             train_img_s=samples / elapsed if elapsed > 0 else 0.0, train_samples=n_train,
                             epochs_done=samples // n_train, error=error)
        val_accuracy = curve[-1]["val_accuracy"] if curve and status == "ok" else None
        return DeviceRun(result, len(val_idx), val_accuracy, by_bucket or {}, curve,
                         rule_columns(recipe, curve, state["stop_reason"] or "max_budget", flops_per_sample))

    if not curve:
        record(None, 0)
    data, draws, data_epoch = fit, None, -1
    loss_sum, window = torch.zeros((), device=device), 0
    finite = torch.ones((), dtype=torch.bool, device=device)
    _sync(device)
    tic = time.perf_counter()
    model.train()
    while int(state["step"]) < schedule.end_step:
        step = int(state["step"])
        epoch, within = divmod(step, steps_per_epoch)
        if epoch != data_epoch:
            data = fit if epoch == 0 or fresh_train is None else fresh_train(epoch, n_train)
            draws = epoch_draws(n_train, view.pad, _epoch_seed(seed, epoch))
            order, offsets, flips = (t.to(device, non_blocking=True)
                                     for t in (draws.order, draws.offsets, draws.flips))
            data_epoch = epoch
        index = order[within * batch:(within + 1) * batch]
        augment = (offsets[index], flips[index]) if view.augment else None
        images = model_inputs(data.images[index], view, augment)
        labels = data.labels[index]
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
        window += len(index)
        evaluate_now = (step + 1) % eval_every == 0 or step + 1 == schedule.end_step
        if ((step + 1) % DIVERGENCE_CHECK_STEPS == 0 or evaluate_now) and not bool(finite):
            # The host reads the flag here only, not once per step; the offending update is never applied.
            state["train_time_s"] += time.perf_counter() - tic
            state["final_train_loss"] = loss_sum.item() / window
            state["stop_reason"] = "diverged"
            first = max(step + 2 - DIVERGENCE_CHECK_STEPS, step + 2 - window // batch, 1)
            return finish("diverged", f"loss or gradient norm became non-finite at epoch {epoch + 1}, within "
                                      f"optimizer steps {first}-{step + 1}")
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * schedule(step)
        optimizer.step()
        state["step"], state["samples"] = step + 1, int(state["samples"]) + len(index)
        if evaluate_now:
            _sync(device)
            state["train_time_s"] += time.perf_counter() - tic
            record(loss_sum.item(), window)
            loss_sum, window = torch.zeros((), device=device), 0
            _sync(device)
            tic = time.perf_counter()

    score = evaluate_split(forward, test, view, batch_size=eval_batch, dtype=dtype, buckets=test_buckets)
    return finish("ok", accuracy=score.accuracy, by_bucket=score.by_bucket)


def rule_columns(recipe: TrainRecipe, curve: list[dict[str, object]], stop_reason: str,
                 flops_per_sample: float | None) -> dict[str, object]:
    """The row's convergence columns from a curve: `converged` is empty where the recipe sets no rule (nothing
    judged whether it converged), else whether the rule stopped it."""
    numbers = curve_numbers([r["samples_seen"] for r in curve], [r["val_accuracy"] for r in curve],
                            min_delta=recipe.min_delta, target_accuracy=recipe.target_accuracy,
                            flops_per_sample=flops_per_sample)
    return {
        "converged": "" if recipe.patience is None else stop_reason in ("plateau", "ceiling"),
        "stop_reason": stop_reason,
        "converged_samples": numbers.converged_samples,
        "target_accuracy": recipe.target_accuracy,
        "samples_to_target": numbers.samples_to_target,
        "flops_to_target": numbers.flops_to_target,
        "curve_points": len(curve),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
