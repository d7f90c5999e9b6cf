"""The learning-rate schedule every training runs: linear warm-up, a constant rate, then a short linear decay.

Why not a cosine tied to the budget: a cosine's rate depends on how far the training is through its maximum
budget, so a training stopped early by the convergence rule (experiments/train/convergence.py) stops at a high
rate, never annealed, and two mixers that stop at different points are compared at different stages of their
schedules. Here the rate stays constant until the training ends, and ending is what starts the decay: once the
rule sees the validation accuracy plateau, the rate falls linearly to `min_ratio` over a share of what was
trained so far (`decay_fraction`, e.g. 15%), and the training stops when the decay ends. A training that never
plateaus decays over the last `decay_fraction` of its maximum budget instead, so every training ends annealed.
This is the warm-up/stable/decay shape of MiniCPM and of Hägele et al. 2024 ("Scaling laws and compute-optimal
training beyond fixed training durations"), who find a short linear cool-down matches a cosine of the same
length.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WarmupConstantDecay:
    """Per-step multiplier of the peak rate; mutable only through `begin_decay`, and saved in checkpoints.

    Attributes:
        warmup_steps: linear warm-up length in optimizer steps (0: none).
        total_steps: the maximum budget in optimizer steps.
        decay_fraction: the decay's length as a share of the steps trained when it begins, in (0, 1).
        min_ratio: the multiplier the decay ends at (min_lr / lr).
        decay_start: the step the decay began at (a plateau seen), or None: it begins at the maximum budget's
            decay window.
        decay_steps: the decay's length when `decay_start` is set.
    """

    warmup_steps: int
    total_steps: int
    decay_fraction: float
    min_ratio: float
    decay_start: int | None = None
    decay_steps: int = 0

    @property
    def window_start(self) -> int:
        """The step the maximum budget's own decay begins at."""
        return self.total_steps - max(1, round(self.decay_fraction * self.total_steps))

    def decaying(self, step: int) -> bool:
        """Whether the decay has begun by `step` (started by a plateau or by the budget's window)."""
        return self.decay_start is not None or step >= self.window_start

    def begin_decay(self, step: int) -> None:
        """Starts the decay at `step` (a plateau seen there); a no-op once it has begun."""
        if self.decaying(step):
            return
        self.decay_start = step
        self.decay_steps = min(max(1, round(self.decay_fraction * step)), self.total_steps - step)

    @property
    def end_step(self) -> int:
        """The step the training stops at: the decay's end."""
        if self.decay_start is None:
            return self.total_steps
        return self.decay_start + self.decay_steps

    def __call__(self, step: int) -> float:
        # (step + 1) so the first update already moves; a zero-rate step would waste a batch.
        warm = (step + 1) / self.warmup_steps if step < self.warmup_steps else 1.0
        start, length = ((self.decay_start, self.decay_steps) if self.decay_start is not None
                         else (self.window_start, self.total_steps - self.window_start))
        if step < start:
            return warm
        progress = min((step - start + 1) / length, 1.0)
        return min(warm, 1.0 - (1.0 - self.min_ratio) * progress)

    def state(self) -> dict[str, int | None]:
        """What a checkpoint keeps (the rest follows from the recipe)."""
        return {"decay_start": self.decay_start, "decay_steps": self.decay_steps}
