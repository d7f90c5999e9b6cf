"""One tiny step of each mixer on the sweep's CPU, before any point runs.

Some mixer options are valid in general but not on this device: neighborhood's `impl = "flex"` runs forward only on
a CPU (FlexAttention has no CPU backward), a `scan_impl = "triton"` needs Triton's interpreter there. Each would
fail every point of its mixer one by one; a forward (and backward, where the sweep trains or times a training
step) of the mixer alone on a 2 x 2 grid says so once, in one line, in milliseconds. CUDA is left to the points: a
first step there compiles kernels (flex, the Triton scan), which is the cost of a point, not of a check.
"""
from __future__ import annotations

import json

import torch
from torch import nn

from ..measure.point import Point
from ..measure.run import build_model

SMOKE_GRID = (2, 2)


def check_mixer_runs(point: Point, *, backward: bool) -> None:
    """Raises ValueError in one line if the mixer of `point` cannot run one step on the CPU.

    Args:
        point: a point of the sweep (its mixer, preset and overrides; its size is not used).
        backward: also run a backward pass (training points and timed training steps need one).
    """
    model = build_model(point, device="meta")  # sizes only: the mixer is then made real alone, the model never is
    mixer = model.blocks[-1].mixer.to_empty(device="cpu")
    with torch.no_grad():
        for parameter in mixer.parameters():
            nn.init.normal_(parameter, std=0.02)  # to_empty leaves memory as it was: keep the step finite
    x = torch.randn(1, SMOKE_GRID[0] * SMOKE_GRID[1], model.config.dim, requires_grad=backward)  # (B, N, C)
    try:
        out = mixer(x, SMOKE_GRID)
        if backward:
            out.sum().backward()
    except Exception as error:  # noqa: BLE001 - whatever stops one step stops every point of this mixer
        first = (str(error).strip().splitlines() or [""])[0][:300]
        options = json.loads(point.overrides).get("mixer_options", {})
        raise ValueError(f"{point.mixer} with mixer_options {options} cannot run a "
                         f"{'training' if backward else 'forward'} step on the cpu "
                         f"({type(error).__name__}: {first}); change those options or the device") from None


def check_mixers_run(points: list[Point]) -> None:
    """`check_mixer_runs` once per distinct CPU (mixer, preset, overrides) among `points`, a backward pass where
    any of them trains or times a training step."""
    needs: dict[tuple[str, str, str], tuple[Point, bool]] = {}
    for point in points:
        if point.device != "cpu":
            continue
        key = (point.mixer, point.preset, point.overrides)
        backward = point.epochs > 0 or point.measure_train_step
        first, before = needs.get(key, (point, False))
        needs[key] = (first, before or backward)
    for point, backward in needs.values():
        check_mixer_runs(point, backward=backward)
