"""The convergence rule and the two numbers of a training, as pure functions of its learning curve.

A training has converged when its validation accuracy, having improved on its first evaluation, has not improved
by at least `min_delta` over the last `patience` samples (Keras' EarlyStopping, counted in samples seen rather
than epochs so that trainings of different lengths compare). A curve that never rose above its first evaluation,
or above chance (the majority class's share of the validation split), is not a plateau: tasks such as reach are learnt in a sudden drop of the loss after a flat stretch at chance whose
length varies by mixer and seed, and a rule that stopped there would report chance as what the mixer converged to
(a default sweep with that rule stopped every mixer but attention at chance after two of eight epochs). Such a
training runs to its maximum budget and says it did not converge. The rule only decides when the end begins: the training then anneals its rate
(experiments/train/schedule.py) and stops. From the finished curve come the two numbers a row reports: where the
best accuracy was first reached (within `min_delta`) and where a stated target accuracy was first reached.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def last_improvement(samples: Sequence[int], accuracies: Sequence[float], min_delta: float) -> int:
    """Samples seen at the last evaluation that beat every earlier one by at least `min_delta` (the first
    evaluation counts as one).

    Args:
        samples: samples seen at each evaluation, ascending.
        accuracies: validation accuracy at each evaluation.
        min_delta: the smallest gain that counts as an improvement.
    """
    if not samples:
        raise ValueError("an empty curve has no improvement")
    best, at = accuracies[0], samples[0]
    for seen, accuracy in zip(samples[1:], accuracies[1:], strict=True):
        if accuracy >= best + min_delta:
            best, at = accuracy, seen
    return at


def plateau_seen(samples: Sequence[int], accuracies: Sequence[float], *, patience_samples: int,
                 min_delta: float, chance: float = 0.0) -> bool:
    """True when the curve improved on its first evaluation, has stood at least `min_delta` above `chance` (what a
    constant prediction scores) at every evaluation of the last `patience_samples`, and has gone that long without
    an improvement of `min_delta`. A noisy blip above chance early on (a 400-image split's accuracy has a standard
    error of 2.5 points at 50%) is not learning, nor is collapsing onto the majority class from a below-chance
    start; and the patience counts from the rise off chance, not from such a blip, which would otherwise stop a
    training just as its accuracy takes off after a long flat stretch."""
    at = last_improvement(samples, accuracies, min_delta)
    off_chance = len(accuracies)  # the first evaluation of the last stretch at or above chance + min_delta
    while off_chance and accuracies[off_chance - 1] >= chance + min_delta:
        off_chance -= 1
    if off_chance == len(accuracies) or at == samples[0]:
        return False
    return samples[-1] - max(at, samples[off_chance]) >= patience_samples


def ceiling_reached(accuracies: Sequence[float]) -> bool:
    """True when the latest evaluation got every validation image right (and the first did not): nothing is left
    to gain, so `plateau_seen` could only confirm it a patience later; a recipe with `stop_at_ceiling` does not wait
    (Lightning's EarlyStopping has the idea as `stopping_threshold`).

    The ceiling is a perfect score, not a score within `min_delta` of it: a default sweep stopped within min_delta
    of it saw a swin seed's validation accuracy fall during the final decay, and reported a test accuracy points
    below the one the plateau rule, two epochs later, had reported (issue 33's note has the rows).
    """
    return len(accuracies) > 1 and accuracies[0] < 1.0 and accuracies[-1] >= 1.0


@dataclass(frozen=True)
class CurveNumbers:
    """What a finished curve says, in the row's columns (schema.py); None is an empty cell."""

    converged_samples: int | None
    samples_to_target: int | None
    flops_to_target: float | None


def curve_numbers(samples: Sequence[int], accuracies: Sequence[float | None], *, min_delta: float,
                  target_accuracy: float | None, flops_per_sample: float | None) -> CurveNumbers:
    """The samples at which the best validation accuracy was first reached within `min_delta`, and those (and
    training FLOPs) at which `target_accuracy` was first reached; None where the curve has no accuracy, never
    reached the target, or no target was set."""
    points = [(s, a) for s, a in zip(samples, accuracies, strict=True) if a is not None]
    if not points:
        return CurveNumbers(None, None, None)
    best = max(a for _, a in points)
    converged = next(s for s, a in points if a >= best - min_delta)
    reached = None if target_accuracy is None else next((s for s, a in points if a >= target_accuracy), None)
    flops = reached * flops_per_sample if reached is not None and flops_per_sample else None
    return CurveNumbers(converged, reached, flops)
