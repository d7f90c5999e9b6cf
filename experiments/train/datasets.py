"""Data sets for training and evaluation, behind one entry point: ``build_dataset``.

Names (``DATASET_NAMES``):

- ``pathfinder`` / ``pathfinder_scaled``: the procedurally generated long-range task of ``experiments.train.pathfinder``
  (variant ``lra`` / ``scaled``), drawn natively at ``img_size``, 1 channel, no augmentation. Cached as .npz under
  ``data_dir`` when given, else under ``experiments.train.pathfinder.default_cache_dir()``. The train split uses
  generator seed ``2 * seed``, the test split ``2 * seed + 1``, so the two never share an image.
- ``cifar10`` / ``cifar100``: torchvision's loaders reading ``data_dir``; they download there when online. Offline
  with the files missing, a ``DatasetError`` says which folder and files to put where, or to use ``npz``.
- ``npz``: a file at ``data_path`` with arrays ``x_train``, ``y_train``, ``x_test``, ``y_test`` (images uint8, HWC
  or HW, labels integer), e.g. ``/work/shared/data/cifar10-subset.npz``. An optional ``classes`` array sets the
  class count.
- ``imagefolder``: a ``train/`` and ``val/`` tree of class folders at ``data_dir`` (torchvision ``ImageFolder``).

Resizing is bilinear with antialiasing everywhere (``antialias=True``; it matters when shrinking). Arrays with no
augmentation are resized once, as a whole, with ``torch.nn.functional.interpolate`` and kept as uint8 (normalised
per item), unless the resized array would pass ``_PRERESIZE_BYTES``, in which case each item is resized when read.
With augmentation (natural images, train split, on by default) each image is augmented at its stored size (random
crop with reflect padding of 1/8 of the side, horizontal flip, timm's RandAugment) and then resized, which keeps
the CPU cost of a 32 px CIFAR image small whatever the model's size. ``imagefolder`` images have no common size:
train uses ``RandomResizedCrop``, test a shorter-side resize and centre crop.

Normalisation: CIFAR-10/100 use their published per-channel mean and std; ``npz`` and ``pathfinder`` compute them
from their own train split (for the CIFAR-10 subset that lands within 0.01 of CIFAR's); ``imagefolder`` uses
ImageNet's (timm's defaults), since computing them would mean decoding every image.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

__all__ = [
    "CIFAR_STATS",
    "DATASET_NAMES",
    "DEFAULT_RAND_AUGMENT",
    "ArrayDataset",
    "AugmentedArrayDataset",
    "DatasetBundle",
    "DatasetError",
    "build_dataset",
    "check_dataset_available",
]

DATASET_NAMES: tuple[str, ...] = ("pathfinder", "pathfinder_scaled", "cifar10", "cifar100", "npz", "imagefolder")
DEFAULT_RAND_AUGMENT = "rand-m9-mstd0.5-inc1"  # DeiT's policy, through timm.data.rand_augment_transform
PATHFINDER_DEFAULT_SAMPLES = (10_000, 2_000)  # (train, test) when not given
CIFAR_STATS: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
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


# ---------------------------------------------------------------------------------------------------------------
# array-backed sets


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


def _check_arrays(path: Path, f: np.lib.npyio.NpzFile) -> tuple[np.ndarray, ...]:
    expected = ("x_train", "y_train", "x_test", "y_test")
    missing = [k for k in expected if k not in f.files]
    if missing:
        raise DatasetError(
            f"{path} lacks the arrays {missing}; an npz data set needs {', '.join(expected)} "
            f"(images uint8 (N, H, W, C) or (N, H, W), labels integer (N,)); it has {sorted(f.files)}"
        )
    out = []
    for split in ("train", "test"):
        x, y = f[f"x_{split}"], f[f"y_{split}"]
        if x.ndim == 3:
            x = x[..., None]
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] not in (1, 3):
            raise DatasetError(
                f"{path}: x_{split} must be uint8 images (N, H, W, C) with C of 1 or 3, or (N, H, W); "
                f"got {x.dtype} {x.shape}"
            )
        if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
            raise DatasetError(
                f"{path}: y_{split} must be integer labels (N,) with N = {len(x)}; got {y.dtype} {y.shape}"
            )
        if len(x) == 0:
            raise DatasetError(f"{path}: x_{split} is empty")
        if y.min() < 0:
            raise DatasetError(f"{path}: y_{split} has negative labels")
        out += [x, y.astype(np.int64)]
    if out[0].shape[1:] != out[2].shape[1:]:
        raise DatasetError(
            f"{path}: train images {out[0].shape[1:]} and test images {out[2].shape[1:]} differ in shape"
        )
    return tuple(out)


def _npz(data_path: str | Path | None, **kw) -> DatasetBundle:
    if data_path is None:
        raise DatasetError(
            "the npz data set needs data_path (--data-path=FILE.npz), a file with arrays x_train, y_train, x_test, "
            "y_test, e.g. /work/shared/data/cifar10-subset.npz"
        )
    path = Path(data_path)
    if not path.is_file():
        raise DatasetError(
            f"no file at {path}: the npz data set reads a .npz with arrays x_train, y_train, x_test, y_test "
            "(uint8 HWC images, integer labels); give its path with --data-path"
        )
    try:
        f = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DatasetError(f"{path} is not a readable .npz file ({err})") from err
    with f:
        arrays = _check_arrays(path, f)
        classes = f["classes"] if "classes" in f.files else None
    top = int(max(arrays[1].max(), arrays[3].max())) + 1
    num_classes = len(classes) if classes is not None else top
    if top > num_classes:
        raise DatasetError(f"{path}: labels reach {top - 1} but the classes array names only {num_classes} classes")
    return _array_bundle("npz", arrays, num_classes=num_classes, stats=None, source=f"npz {path}", **kw)


def _cifar(name: str, data_dir: str | Path | None, **kw) -> DatasetBundle:
    from torchvision import datasets

    cls = {"cifar10": datasets.CIFAR10, "cifar100": datasets.CIFAR100}[name]
    files = [entry[0] for entry in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    layout = f"{cls.base_folder}/ holding {', '.join(files)} (the extracted {cls.filename})"
    if data_dir is None:
        raise DatasetError(
            f"{name} needs data_dir (--data-dir=FOLDER): the folder that holds, or will receive, {layout}"
        )
    root = Path(data_dir)
    try:
        train, test = cls(str(root), train=True, download=False), cls(str(root), train=False, download=False)
    except RuntimeError:  # torchvision: "Dataset not found or corrupted"
        try:
            root.mkdir(parents=True, exist_ok=True)
            train = cls(str(root), train=True, download=True)
            test = cls(str(root), train=False, download=False)
        except Exception as err:  # any download failure: offline, proxy, disk
            raise DatasetError(
                f"{name} is not under {root} and downloading it failed ({type(err).__name__}: {err}). Put the "
                f"folder {layout} at {root / cls.base_folder}; or run this once on a machine with internet, where "
                f"torchvision downloads it into {root}, and copy that folder here; or use --dataset=npz with "
                "--data-path=FILE.npz (arrays x_train, y_train, x_test, y_test)"
            ) from err
    arrays = (train.data, np.asarray(train.targets), test.data, np.asarray(test.targets))
    num_classes = len(train.classes)
    return _array_bundle(name, arrays, num_classes=num_classes, stats=CIFAR_STATS[name], source=f"{name} {root}", **kw)


# ---------------------------------------------------------------------------------------------------------------
# generated and folder-backed sets


def _pathfinder(
    variant: str,
    *,
    img_size: int,
    data_dir: str | Path | None,
    seed: int,
    train_samples: int | None,
    test_samples: int | None,
    workers: int | None,
) -> DatasetBundle:
    from .pathfinder import load_pathfinder, pathfinder_params

    try:
        params = pathfinder_params(img_size, variant)
    except ValueError as err:
        raise DatasetError(str(err)) from err
    n_train = train_samples if train_samples is not None else PATHFINDER_DEFAULT_SAMPLES[0]
    n_test = test_samples if test_samples is not None else PATHFINDER_DEFAULT_SAMPLES[1]
    if n_train <= 0 or n_test <= 0 or seed < 0:
        raise DatasetError(
            f"pathfinder needs positive sample counts and a non-negative seed, got {n_train}, {n_test}, {seed}"
        )
    splits = []
    for split, n in ((0, n_train), (1, n_test)):
        data = load_pathfinder(n, img_size, variant=variant, seed=2 * seed + split, cache_dir=data_dir, workers=workers)
        splits.append((torch.from_numpy(data.images)[:, None], torch.from_numpy(data.labels)))  # (N, 1, H, W)
    mean, std = _channel_stats(splits[0][0].permute(0, 2, 3, 1).numpy())
    train, test = (ArrayDataset(x, y, img_size, mean, std) for x, y in splits)
    origin = f"LRA table row {params.defined_at} px" if variant == "lra" else "scaled scene"
    description = (
        f"pathfinder ({variant}, {origin}, contour {params.contour_length} paddles): {n_train} train / {n_test} test "
        f"generated at {img_size} px (seeds {2 * seed}, {2 * seed + 1}), no resize; normalised with mean {mean} "
        f"std {std} of the train split; no augmentation"
    )
    return DatasetBundle(
        "pathfinder" if variant == "lra" else "pathfinder_scaled",
        train, test, 2, 1, img_size, mean, std, False, description,
    )


def _imagefolder(
    data_dir: str | Path | None,
    *,
    img_size: int,
    augment: bool,
    rand_augment: str,
    seed: int,
    train_samples: int | None,
    test_samples: int | None,
) -> DatasetBundle:
    from torchvision import datasets, transforms

    layout = "train/<class>/<image> and val/<class>/<image> (the same class folder names in both)"
    if data_dir is None:
        raise DatasetError(f"imagefolder needs data_dir (--data-dir=FOLDER) holding {layout}")
    root = Path(data_dir)
    missing = [s for s in ("train", "val") if not (root / s).is_dir()]
    if missing:
        raise DatasetError(f"imagefolder: {root} lacks {' and '.join(s + '/' for s in missing)}; expected {layout}")
    mean, std = _IMAGENET_STATS
    bilinear = transforms.InterpolationMode.BILINEAR
    tail = [transforms.ToTensor(), transforms.Normalize(mean, std)]
    plain = [transforms.Resize(img_size, bilinear, antialias=True), transforms.CenterCrop(img_size)]
    if augment:
        steps = [
            transforms.RandomResizedCrop(img_size, interpolation=bilinear, antialias=True),
            transforms.RandomHorizontalFlip(),
        ]
        if rand_augment:
            steps.append(_rand_augment(rand_augment, img_size, mean, 3))
        train_tf = transforms.Compose(steps + tail)
    else:
        train_tf = transforms.Compose(plain + tail)
    try:
        train = datasets.ImageFolder(str(root / "train"), transform=train_tf)
        test = datasets.ImageFolder(str(root / "val"), transform=transforms.Compose(plain + tail))
    except (FileNotFoundError, RuntimeError) as err:
        raise DatasetError(f"imagefolder: cannot read {root} ({err}); expected {layout}") from err
    if train.classes != test.classes:
        raise DatasetError(
            f"imagefolder: train/ and val/ under {root} have different class folders "
            f"({len(train.classes)} vs {len(test.classes)}: {sorted(set(train.classes) ^ set(test.classes))[:5]})"
        )
    train_set: Dataset = train
    test_set: Dataset = test
    if train_samples is not None:
        train_set = Subset(train, _subset_indices(len(train), train_samples, seed, 0).tolist())
    if test_samples is not None:
        test_set = Subset(test, _subset_indices(len(test), test_samples, seed, 1).tolist())
    aug = (
        f"train: RandomResizedCrop + hflip + RandAugment {rand_augment or 'off'}" if augment
        else "no augmentation"
    )
    description = (
        f"imagefolder {root}: {len(train_set)} train / {len(test_set)} val, {len(train.classes)} classes, "
        f"resize shorter side to {img_size} + centre crop ({_RESIZE}); ImageNet mean/std; {aug}"
    )
    return DatasetBundle(
        "imagefolder", train_set, test_set, len(train.classes), 3, img_size, mean, std, augment, description
    )


def build_dataset(
    name: str,
    *,
    img_size: int,
    data_dir: str | Path | None = None,
    data_path: str | Path | None = None,
    seed: int = 0,
    train_samples: int | None = None,
    test_samples: int | None = None,
    augment: bool | None = None,
    rand_augment: str = DEFAULT_RAND_AUGMENT,
    workers: int | None = None,
) -> DatasetBundle:
    """Build the train and test splits of a data set at one image size.

    Args:
        name: one of ``DATASET_NAMES``.
        img_size: side of the square images yielded.
        data_dir: cifar10/cifar100: their root folder; imagefolder: the folder with train/ and val/; pathfinder:
            the cache folder (default ``experiments.train.pathfinder.default_cache_dir()``).
        data_path: npz: the .npz file.
        seed: subset choice and pathfinder generation.
        train_samples: use this many training images (a seeded random subset; pathfinder: how many to generate,
            default 10000).
        test_samples: the same for the test split (pathfinder default 2000).
        augment: augment the train split; None: on for natural images, off for pathfinder (which has none).
        rand_augment: timm RandAugment config for natural images, "" for crop and flip only.
        workers: processes for pathfinder generation (None: one per core).

    Returns:
        The ``DatasetBundle``.

    Raises:
        DatasetError: unknown name, or data missing or malformed; the message says what to do.
    """
    if name not in DATASET_NAMES:
        raise DatasetError(f"unknown data set {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    if int(img_size) != img_size or img_size < 1:
        raise DatasetError(f"img_size must be a positive integer, got {img_size}")
    img_size = int(img_size)
    if name.startswith("pathfinder"):
        if augment:
            raise DatasetError("pathfinder takes no augmentation: leave augment unset or False")
        variant = "lra" if name == "pathfinder" else "scaled"
        return _pathfinder(
            variant, img_size=img_size, data_dir=data_dir, seed=seed, train_samples=train_samples,
            test_samples=test_samples, workers=workers,
        )
    augment = True if augment is None else bool(augment)
    common = dict(
        img_size=img_size, augment=augment, rand_augment=rand_augment, seed=seed, train_samples=train_samples,
        test_samples=test_samples,
    )
    if name == "npz":
        return _npz(data_path, **common)
    if name == "imagefolder":
        return _imagefolder(data_dir, **common)
    return _cifar(name, data_dir, **common)


def check_dataset_available(
    name: str, *, data_dir: str | Path | None = None, data_path: str | Path | None = None
) -> None:
    """Fail early, before a sweep runs any point, when a data set cannot be built.

    Cheap where it can be: the name is checked; ``npz`` opens the file and checks the array names without reading
    them; ``imagefolder`` checks the folders. ``cifar10``/``cifar100`` load (downloading once when files are missing
    and the machine is online, so that the points do not each try). ``pathfinder`` needs nothing (it is generated).

    Args:
        name: one of ``DATASET_NAMES``.
        data_dir: as for ``build_dataset``.
        data_path: as for ``build_dataset``.

    Raises:
        DatasetError: what is missing and what to do.
    """
    if name not in DATASET_NAMES:
        raise DatasetError(f"unknown data set {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    if name == "npz":
        if data_path is None or not Path(data_path).is_file():
            _npz(data_path)  # raises the message for a missing path or file
        path = Path(data_path)
        try:
            with np.load(path, allow_pickle=False) as f:
                missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in f.files]
        except (OSError, ValueError) as err:
            raise DatasetError(f"{path} is not a readable .npz file ({err})") from err
        if missing:
            raise DatasetError(
                f"{path} lacks the arrays {missing}; an npz data set needs x_train, y_train, x_test, y_test"
            )
    elif name == "imagefolder":
        layout = "train/<class>/<image> and val/<class>/<image>"
        if data_dir is None:
            raise DatasetError(f"imagefolder needs data_dir (--data-dir=FOLDER) holding {layout}")
        missing = [s + "/" for s in ("train", "val") if not (Path(data_dir) / s).is_dir()]
        if missing:
            raise DatasetError(f"imagefolder: {data_dir} lacks {' and '.join(missing)}; expected {layout}")
    elif name in ("cifar10", "cifar100"):
        _cifar(name, data_dir, img_size=32, augment=False, rand_augment="", seed=0, train_samples=1, test_samples=1)
