"""The two calls a cost point times, built once per model: one forward, and one training step.

`experiments/measure/run.py` times them alone; `experiments/measure/paired.py` times a point's and a reference
mixer's in alternation. Both must time the same call, so it is written here once.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from models import ViT


def random_images(model: ViT, batch: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(batch, model.in_chans, *model.img_size, device=device, dtype=dtype)


def forward_call(model: ViT, x: torch.Tensor) -> Callable[[], None]:
    """One forward of `x` in inference mode; puts the model in eval mode and x's dtype."""
    model.eval().to(x.dtype)

    def forward() -> None:
        with torch.inference_mode():
            model(x)

    return forward


@dataclass(frozen=True)
class TrainStepCalls:
    """A training step on one random batch, in the two forms the timing regimes need.

    step: zeroes the gradients (set to None), then `forward_backward`: what eager and compiled points time.
    forward_backward: the forward under autocast, the loss's backward and the optimizer's step: what a CUDA graph
        captures whole, with `zero_grad` called once before capture, so each replay rewrites the gradients.
    zero_grad: the optimizer's zero_grad(set_to_none=True).
    """

    step: Callable[[], None]
    forward_backward: Callable[[], None]
    zero_grad: Callable[[], None]


def train_step_calls(model: ViT, dtype: torch.dtype, device: torch.device, batch: int,
                     graphed: bool = False) -> TrainStepCalls:
    """One optimizer step on random data: fp32 master weights, autocast to `dtype` when it is not float32.

    On CUDA AdamW steps with `capturable=True` (its step count and bias corrections on the device), in both
    regimes, so eager and graphed rows time the same kernels; on the CPU the fused AdamW the trainers step
    (`experiments.train.device_trainer.make_optimizer`), not PyTorch's CPU default, a Python loop over the
    parameters that charged a mixer for how many tensors its parameters are split into (the foreach form still
    did, less); elsewhere the foreach one. `graphed`: autocast without its weight cache, which a graph cannot
    hold.
    """
    model.train().float()
    x = random_images(model, batch, device)
    y = torch.randint(0, model.num_classes, (batch,), device=device)
    kind = {"cuda": {"capturable": True}, "cpu": {"fused": True}}.get(device.type, {"foreach": True})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **kind)

    def autocast() -> AbstractContextManager:
        if dtype == torch.float32:
            return nullcontext()
        return torch.autocast(device.type, dtype=dtype, cache_enabled=not graphed)

    def forward_backward() -> None:
        with autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    def zero_grad() -> None:
        optimizer.zero_grad(set_to_none=True)

    def step() -> None:
        zero_grad()
        forward_backward()

    return TrainStepCalls(step=step, forward_backward=forward_backward, zero_grad=zero_grad)
