"""Training data held on the device as uint8 tensors, augmented and normalised there in whole batches.

On a GPU a tiny ViT at 64-256 tokens trains faster than a DataLoader of per-image Python transforms can feed it;
here a batch is one gather from the uint8 images on the device, then a batched random crop (reflect padding of
1/8 of the side, as `data_arrays.AugmentedArrayDataset`), a batched horizontal flip, a resize to the model's size
and the normalisation. The random draws of an epoch (order, crop offsets, flips) come from one CPU generator
seeded by (seed, epoch), so they are the same on every device and after a resume.

It is the only input path of training (the DataLoader of per-image transforms is gone), so training applies no
RandAugment (per-image PIL operations): random crop and flip are the augmentation, as `data_files` describes
with `rand_augment=""`. Data sets that are not arrays (imagefolder) cannot train.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from .data_arrays import ArrayDataset, AugmentedArrayDataset, DatasetError, _resize


@dataclass(frozen=True)
class DeviceSplit:
    """One split as tensors on the device.

    Attributes:
        images: (N, C, H, W) uint8 at the stored size.
        labels: (N,) int64.
    """

    images: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: np.ndarray) -> DeviceSplit:
        index = torch.as_tensor(indices, dtype=torch.long, device=self.labels.device)
        return DeviceSplit(self.images[index], self.labels[index])


@dataclass(frozen=True)
class DeviceView:
    """How stored images become model inputs: size, normalisation, and whether training batches are augmented.

    Attributes:
        img_size: side of the model's input.
        mean: (C, 1, 1) mean on the [0, 1] scale, on the device.
        std: (C, 1, 1) std.
        augment: training batches get a random crop and a horizontal flip.
        pad: reflect padding of the random crop, px (1/8 of the stored side, at least 1).
    """

    img_size: int
    mean: Tensor
    std: Tensor
    augment: bool
    pad: int


@dataclass(frozen=True)
class EpochDraws:
    """The random choices of one epoch: image order, crop offsets and flips, for every image at once."""

    order: Tensor  # (N,) int64
    offsets: Tensor  # (N, 2) int64, row and column offset into the padded image, in [0, 2 * pad]
    flips: Tensor  # (N,) bool


def _arrays(dataset: Dataset) -> tuple[Tensor, Tensor, bool]:
    """(uint8 (N, C, H, W) images, labels, augmented) of an array-backed split."""
    if isinstance(dataset, AugmentedArrayDataset):
        images = torch.from_numpy(np.ascontiguousarray(dataset.images)).permute(0, 3, 1, 2)  # (N, C, H, W)
        return images.contiguous(), dataset.labels, True
    if isinstance(dataset, ArrayDataset):
        return dataset.images, dataset.labels, False
    raise DatasetError(f"training needs an array-backed data set (npz, cifar, pathfinder, reach), got "
                       f"{type(dataset).__name__}; convert the images to an npz file (dataset = \"npz\")")


def to_device(train: Dataset, test: Dataset, device: torch.device) -> tuple[DeviceSplit, DeviceSplit, DeviceView]:
    """The two splits of a `DatasetBundle` on `device` and how to turn them into model inputs."""
    train_images, train_labels, augment = _arrays(train)
    test_images, test_labels, _ = _arrays(test)
    side = min(train_images.shape[-2:])
    view = DeviceView(train.img_size, train.mean.to(device), train.std.to(device), augment, max(1, side // 8))
    return (DeviceSplit(train_images.to(device), train_labels.long().to(device)),
            DeviceSplit(test_images.to(device), test_labels.long().to(device)), view)


def fresh_on_device(fresh: Callable[[int, int], tuple[Tensor, Tensor]] | None,
                    device: torch.device) -> Callable[[int, int], DeviceSplit] | None:
    """A bundle's `fresh_train` (epoch, n) -> uint8 images and labels, as a function returning a `DeviceSplit`."""
    if fresh is None:
        return None

    def on_device(epoch: int, n: int) -> DeviceSplit:
        images, labels = fresh(epoch, n)
        return DeviceSplit(images.to(device), labels.long().to(device))

    return on_device


def epoch_draws(n: int, pad: int, seed: int) -> EpochDraws:
    """Every random choice of an epoch of `n` images, from a CPU generator seeded with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator)
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator)
    flips = torch.rand(n, generator=generator) < 0.5
    return EpochDraws(order, offsets, flips)


def crop_flip(images: Tensor, offsets: Tensor, flips: Tensor, pad: int) -> Tensor:
    """Random crop with reflect padding and horizontal flip of a whole batch, as gathers (no per-image loop).

    Args:
        images: (B, C, H, W) float.
        offsets: (B, 2) row and column of each crop in the padded image.
        flips: (B,) bool.
        pad: reflect padding on every side, px.

    Returns:
        (B, C, H, W) float.
    """
    b, c, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="reflect")  # (B, C, H + 2p, W + 2p)
    rows = offsets[:, 0, None] + torch.arange(h, device=images.device)  # (B, H)
    cols = offsets[:, 1, None] + torch.arange(w, device=images.device)  # (B, W)
    out = padded.gather(2, rows[:, None, :, None].expand(b, c, h, w + 2 * pad))  # (B, C, H, W + 2p)
    out = out.gather(3, cols[:, None, None, :].expand(b, c, h, w))  # (B, C, H, W)
    return torch.where(flips[:, None, None, None], out.flip(-1), out)


def model_inputs(images: Tensor, view: DeviceView, draws: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """uint8 (B, C, H, W) -> normalised float32 (B, C, img_size, img_size), augmented when `draws` (offsets,
    flips) are given: crop and flip at the stored size, then resize, as `data_arrays.AugmentedArrayDataset` does."""
    x = images.float().div_(255)
    if draws is not None:
        x = crop_flip(x, draws[0], draws[1], view.pad)
    x = _resize(x, view.img_size)
    return (x - view.mean) / view.std
