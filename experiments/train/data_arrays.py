"""Images held in memory as uint8 arrays: the Dataset classes, their resizing and augmentation, and the
bundle an array-backed set is built into. Every loader in `data_files` and `datasets` returns a `DatasetBundle`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

DEFAULT_RAND_AUGMENT = "rand-m9-mstd0.5-inc1"  # DeiT's policy, through timm.data.rand_augment_transform
_PRERESIZE_BYTES = 1 << 30  # above this, resize per item instead of holding the whole resized array
_RESIZE = "bilinear, antialias=True"
# timm's "increasing" RandAugment ops, except that posterize keeps 4..8 bits (timm's PosterizeOriginal): the
# increasing variant asks for 0 bits at full magnitude, which Pillow >= 10 rejects with a ValueError.
_RAND_AUGMENT_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeOriginal", "SolarizeIncreasing", "SolarizeAdd",
    "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY",
    "TranslateXRel", "TranslateYRel",
)



class DatasetError(ValueError):
    """A data set cannot be built; the message says what is missing and what to do."""


@dataclasses.dataclass(frozen=True)
class DatasetBundle:
    """Train and test splits with what a model and a results row need to know about them.

    Attributes:
        name: the ``build_dataset`` name.
        train: yields ``(image, label)``: a float32 (in_chans, img_size, img_size) tensor, normalised, and an int.
        test: the same, never augmented.
        num_classes: labels lie in ``[0, num_classes)``.
        in_chans: image channels.
        img_size: image side the splits yield.
        mean: per-channel mean subtracted (on the [0, 1] scale).
        std: per-channel std divided by.
        augment: whether the train split is augmented.
        description: one line on source, sizes, interpolation, normalisation and augmentation.
        test_buckets: for tasks that sort their test images into buckets (reach: direction and distance), the
            bucket label of each test image, so evaluation can report accuracy per bucket; None otherwise.
        train_buckets: the same for the training images (the validation split is held out of them).
        fresh_train: for generated tasks, `fresh_train(epoch, n)` -> (uint8 (n, C, H, W) images, (n,) labels),
            a new training set for that epoch, deterministic in (the bundle's seed, epoch); None for fixed data.
    """

    name: str
    train: Dataset
    test: Dataset
    num_classes: int
    in_chans: int
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: bool
    description: str
    test_buckets: tuple[str, ...] | None = None
    train_buckets: tuple[str, ...] | None = None
    fresh_train: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]] | None = None


def _resize(x: torch.Tensor, img_size: int) -> torch.Tensor:
    """Bilinear antialiased resize of a float (N, C, H, W) batch to (N, C, img_size, img_size)."""
    if x.shape[-2:] == (img_size, img_size):
        return x
    return F.interpolate(x, size=(img_size, img_size), mode="bilinear", antialias=True, align_corners=False)


def _stats_tensors(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)


class ArrayDataset(Dataset):
    """uint8 images held in memory, normalised (and resized, if not done already) when read.

    Args:
        images: (N, C, H, W) uint8.
        labels: (N,) integer labels.
        img_size: side of the images yielded; items of another size are resized when read.
        mean: per-channel mean on the [0, 1] scale.
        std: per-channel std.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        img_size: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
    ) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or len(images) != len(labels):
            raise ValueError(f"expected uint8 (N, C, H, W) images matching labels, got {images.dtype} {images.shape}")
        self.images = images
        self.labels = labels.long()
        self.img_size = img_size
        self.mean, self.std = _stats_tensors(mean, std)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = self.images[index].float().div_(255)
        if x.shape[-1] != self.img_size or x.shape[-2] != self.img_size:
            x = _resize(x[None], self.img_size)[0]
        return (x - self.mean) / self.std, int(self.labels[index])


class AugmentedArrayDataset(Dataset):
    """uint8 images augmented at their stored size, then resized and normalised.

    Args:
        images: (N, H, W, C) uint8 with C of 1 or 3.
        labels: (N,) integer labels.
        img_size: side of the images yielded.
        mean: per-channel mean on the [0, 1] scale.
        std: per-channel std.
        rand_augment: a timm RandAugment config string (m, n, mstd, p apply; the ops are ``_RAND_AUGMENT_OPS``),
            or "" for crop and flip only.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        img_size: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        rand_augment: str = DEFAULT_RAND_AUGMENT,
    ) -> None:
        from torchvision import transforms

        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
            raise ValueError(f"expected uint8 (N, H, W, C) images with C in (1, 3), got {images.dtype} {images.shape}")
        self.images = images
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        self.img_size = img_size
        self.mean, self.std = _stats_tensors(mean, std)
        h, w = images.shape[1:3]
        steps: list[Callable] = [
            transforms.RandomCrop((h, w), padding=max(1, min(h, w) // 8), padding_mode="reflect"),
            transforms.RandomHorizontalFlip(),
        ]
        if rand_augment:
            steps.append(_rand_augment(rand_augment, min(h, w), mean, images.shape[-1]))
        steps.append(transforms.PILToTensor())
        self.transform = transforms.Compose(steps)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        img = self.images[index]
        pil = Image.fromarray(img[..., 0], mode="L") if img.shape[-1] == 1 else Image.fromarray(img, mode="RGB")
        x = self.transform(pil).float().div_(255)
        x = _resize(x[None], self.img_size)[0]
        return (x - self.mean) / self.std, int(self.labels[index])


def _rand_augment(config: str, side: int, mean: tuple[float, ...], chans: int) -> Callable:
    from timm.data import rand_augment_transform

    fill = tuple(round(255 * m) for m in mean)
    hparams = {"translate_const": int(side * 0.45), "img_mean": fill if chans == 3 else fill[0]}
    return rand_augment_transform(config, hparams, transforms=list(_RAND_AUGMENT_OPS))




def _channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 (N, H, W, C) images on the [0, 1] scale, in float64 chunks."""
    total = np.zeros(x.shape[-1])
    square = np.zeros(x.shape[-1])
    for s in range(0, len(x), 2048):
        chunk = x[s : s + 2048].reshape(-1, x.shape[-1]).astype(np.float64) / 255
        total += chunk.sum(0)
        square += (chunk * chunk).sum(0)
    count = x.size // x.shape[-1]
    mean = total / count
    std = np.sqrt(np.maximum(square / count - mean * mean, 1e-12))
    return tuple(float(round(v, 4)) for v in mean), tuple(float(round(max(v, 1e-3), 4)) for v in std)


def _to_model_size(x: np.ndarray, img_size: int) -> torch.Tensor:
    """uint8 (N, H, W, C) -> uint8 (N, C, img_size, img_size), resized once in chunks when it fits the budget."""
    n, h, w, c = x.shape
    t = torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2)  # (N, C, H, W)
    if (h, w) == (img_size, img_size) or n * c * img_size * img_size > _PRERESIZE_BYTES:
        return t.contiguous()
    out = torch.empty((n, c, img_size, img_size), dtype=torch.uint8)
    for s in range(0, n, 512):
        out[s : s + 512] = _resize(t[s : s + 512].float(), img_size).round_().clamp_(0, 255).to(torch.uint8)
    return out


def _subset_indices(n: int, k: int | None, seed: int, split: int) -> np.ndarray:
    """The first ``k`` of a seeded permutation of ``range(n)`` (all, in order, when ``k`` is None)."""
    if k is None:
        return np.arange(n)
    if k <= 0 or k > n:
        raise DatasetError(f"asked for {k} samples of a split that has {n}; choose 1..{n}")
    return np.sort(np.random.default_rng([seed, split]).permutation(n)[:k])


def _array_bundle(
    name: str,
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    *,
    img_size: int,
    num_classes: int,
    stats: tuple[tuple[float, ...], tuple[float, ...]] | None,
    augment: bool,
    rand_augment: str,
    seed: int,
    train_samples: int | None,
    test_samples: int | None,
    source: str,
) -> DatasetBundle:
    x_train, y_train, x_test, y_test = arrays
    idx_train = _subset_indices(len(x_train), train_samples, seed, 0)
    idx_test = _subset_indices(len(x_test), test_samples, seed, 1)
    x_train, y_train = x_train[idx_train], y_train[idx_train]
    x_test, y_test = x_test[idx_test], y_test[idx_test]
    mean, std = stats if stats is not None else _channel_stats(x_train)
    chans = x_train.shape[-1]
    if augment:
        train: Dataset = AugmentedArrayDataset(x_train, y_train, img_size, mean, std, rand_augment)
        aug = f"train: RandomCrop(pad 1/8, reflect) + hflip + RandAugment {rand_augment or 'off'}, then resize"
    else:
        train = ArrayDataset(_to_model_size(x_train, img_size), torch.as_tensor(y_train), img_size, mean, std)
        aug = "no augmentation"
    test = ArrayDataset(_to_model_size(x_test, img_size), torch.as_tensor(y_test), img_size, mean, std)
    side = f"{x_train.shape[1]}x{x_train.shape[2]}"
    description = (
        f"{source}: {len(train)} train / {len(test)} test, {num_classes} classes, {side} -> {img_size} px "
        f"({_RESIZE}); normalised with mean {mean} std {std}; {aug}"
    )
    return DatasetBundle(name, train, test, num_classes, chans, img_size, mean, std, augment, description)


