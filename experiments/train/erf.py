"""Effective receptive field maps (Luo et al. 2016, as RepLKNet and VMamba draw them).

The map of a model is the gradient of its centre output token with respect to the input pixels, its absolute
value summed over channels and averaged over a batch of real task images: how much each pixel moves the token
at the centre of the grid. At initialisation it shows what the architecture lets a token see; after training,
what it learnt to look at. Radii holding 50% and 90% of the map's mass summarise it in one number each (computed
by the report from the saved maps, `experiments.report.erf`).

The token is read *before* the final LayerNorm and its features enter as a ReLU'd sum (``METHOD``); see
`erf_map` for why. Maps saved by an earlier method are not comparable and the report leaves them out.

Saved per point as an .npz named by the point key's hash, beside runs.csv (``<sweep>/erf/<hash>.npz``), holding
``init`` and ``trained`` (H, W) float32 maps, the point's key columns as JSON (``key``), ``patch_size`` and
``method``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..schema import ERF_METHOD as METHOD

__all__ = ["METHOD", "erf_map", "save_erf"]


def erf_map(model: nn.Module, images: Tensor, *, blocks: int | None = None) -> np.ndarray:
    """The effective receptive field of the centre token of `model`'s output grid.

    The scalar differentiated is ``relu(t).sum()`` over the features of the centre token ``t`` taken from the
    residual stream *before* the final LayerNorm, as RepLKNet and VMamba's ERF analyses do. Two choices, both
    forced by what the alternatives measure:

    - Before the final norm: the features of a LayerNorm output with gain 1 and bias 0 sum to exactly zero for
      any input, so the gradient of their sum is identically zero at initialisation (the map is float32
      round-off, and its sign of zero differs between CPUs). The residual stream carries no such constraint.
    - A ReLU'd sum: a plain sum lets features of opposite sign cancel their gradients; keeping the active
      features measures how much each pixel moves what the token expresses, without C backward passes.

    The model is put in eval mode and its weights are left untouched (the gradient is taken with respect to the
    input alone, so no parameter's `.grad` changes).

    Args:
        model: a `models.ViT`.
        images: (B, C, H, W) task images, normalised as in training.
        blocks: use the tokens after this many blocks; None: after every block. `blocks=1` shows one mixer's
            own reach.

    Returns:
        (H, W) float32 map: |d relu-sum of the centre token / d pixel|, summed over channels, averaged over the
        batch. Its sum is not normalised.
    """
    was_training = model.training
    model.eval()
    x = images.detach().clone().requires_grad_(True)
    tokens = model.patch_embed(x) + model.pos_embed  # (B, N, C)
    depth = len(model.blocks) if blocks is None else blocks
    for block in model.blocks[:depth]:
        tokens = block(tokens, model.grid)
    grid_h, grid_w = model.grid
    centre = (grid_h // 2) * grid_w + grid_w // 2
    (grad,) = torch.autograd.grad(torch.relu(tokens[:, centre]).sum(), x)
    model.train(was_training)
    return grad.abs().sum(1).mean(0).float().cpu().numpy()  # (H, W)


def save_erf(path: Path, maps: dict[str, np.ndarray], key: dict[str, object], patch_size: int) -> None:
    """Write the maps of one point atomically (a killed point leaves no half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:  # a file object keeps np.savez from appending a second .npz
        np.savez(handle, key=np.array(json.dumps(key, sort_keys=True)), patch_size=np.array(patch_size),
                 method=np.array(METHOD),
                 **{name: value.astype(np.float32) for name, value in maps.items()})
    os.replace(tmp, path)
