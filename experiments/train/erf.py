"""Effective receptive field maps (Luo et al. 2016, as RepLKNet and VMamba draw them).

The map of a model is the gradient of its centre output token with respect to the input pixels, its absolute
value summed over channels and averaged over a batch of real task images: how much each pixel moves the token
at the centre of the grid. At initialisation it shows what the architecture lets a token see; after training,
what it learnt to look at. Radii holding 50% and 90% of the map's mass summarise it in one number each (computed
by the report from the saved maps, `experiments.report.erf`).

Saved per point as an .npz named by the point key's hash, beside runs.csv (``<sweep>/erf/<hash>.npz``), holding
``init`` and ``trained`` (H, W) float32 maps, the point's key columns as JSON (``key``), and ``patch_size``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["erf_map", "save_erf"]


def erf_map(model: nn.Module, images: Tensor, *, blocks: int | None = None) -> np.ndarray:
    """The effective receptive field of the centre token of `model`'s output grid.

    The model is put in eval mode and its weights are left untouched (the gradient is taken with respect to the
    input alone, so no parameter's `.grad` changes).

    Args:
        model: a `models.ViT`.
        images: (B, C, H, W) task images, normalised as in training.
        blocks: use the tokens after this many blocks (before the final norm); None: the whole backbone's
            output tokens (after the final norm). `blocks=1` shows one mixer's own reach.

    Returns:
        (H, W) float32 map: |d centre token / d pixel|, summed over channels and the token's features, averaged
        over the batch. Its sum is not normalised.
    """
    was_training = model.training
    model.eval()
    x = images.detach().clone().requires_grad_(True)
    tokens = model.patch_embed(x) + model.pos_embed  # (B, N, C)
    depth = len(model.blocks) if blocks is None else blocks
    for block in model.blocks[:depth]:
        tokens = block(tokens, model.grid)
    if blocks is None:
        tokens = model.norm(tokens)
    grid_h, grid_w = model.grid
    centre = (grid_h // 2) * grid_w + grid_w // 2
    # Summing a token's features before the gradient lets opposite-signed features cancel; summing |grad| per
    # feature would need C backward passes. RepLKNet sums the (relu'd) centre features too.
    (grad,) = torch.autograd.grad(tokens[:, centre].sum(), x)
    model.train(was_training)
    return grad.abs().sum(1).mean(0).float().cpu().numpy()  # (H, W)


def save_erf(path: Path, maps: dict[str, np.ndarray], key: dict[str, object], patch_size: int) -> None:
    """Write the maps of one point atomically (a killed point leaves no half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:  # a file object keeps np.savez from appending a second .npz
        np.savez(handle, key=np.array(json.dumps(key, sort_keys=True)), patch_size=np.array(patch_size),
                 **{name: value.astype(np.float32) for name, value in maps.items()})
    os.replace(tmp, path)
