"""Data sets for training and evaluation, behind one entry point: ``build_dataset``.

Names (``DATASET_NAMES``):

- ``pathfinder`` / ``pathfinder_scaled``: the procedurally generated long-range task of ``experiments.train.pathfinder``
  (variant ``lra`` / ``scaled``), drawn natively at ``img_size``, 1 channel, no augmentation. Cached as .npz under
  ``data_dir`` when given, else under ``experiments.train.pathfinder.default_cache_dir()``. The train split uses
  generator seed ``2 * seed``, the test split ``2 * seed + 1``, so the two never share an image.
- ``reach``: the generated two-mark task of ``experiments.train.reach`` (label: do the marks share a shape), its
  distances counted in patches, so it needs ``patch_size``; 1 channel, no augmentation, generated in memory (fast,
  not cached). Train split seed ``2 * seed``, test ``2 * seed + 1``. The test split carries each image's
  (direction, distance) bucket in ``DatasetBundle.test_buckets`` (the train split in ``train_buckets``).

Generated tasks (pathfinder, reach) also give ``DatasetBundle.fresh_train``: a new training set per epoch, its
generator seed ``fresh_seed(seed, epoch)`` (a hash of both, never one of the small seeds the fixed splits use), so a
long training cannot memorise a fixed set; validation (held out of the fixed train split) and test stay fixed.
A fresh reach set costs about 0.1 s per epoch (6,000 images at 32 px); a fresh pathfinder set is slow to draw
(tens of seconds for 10,000 images at 32 px on one core), so it is generated with the bundle's `workers` (one
process per core by default) and cached like the fixed splits, keyed by its seed: all mixers of a sweep share it.
- ``cifar10`` / ``cifar100``: torchvision's loaders reading ``data_dir``; they download there when online. Offline
  with the files missing, a ``DatasetError`` says which folder and files to put where, or to use ``npz``.
- ``npz``: a file at ``data_path`` with arrays ``x_train``, ``y_train``, ``x_test``, ``y_test`` (images uint8, HWC
  or HW, labels integer), e.g. ``/work/shared/data/cifar10-subset.npz``. An optional ``classes`` array sets the
  class count.
- ``imagefolder``: a ``train/`` and ``val/`` tree of class folders at ``data_dir`` (torchvision ``ImageFolder``).

Resizing is bilinear with antialiasing everywhere (``antialias=True``; it matters when shrinking). Arrays with no
augmentation are resized once, as a whole, with ``torch.nn.functional.interpolate`` and kept as uint8 (normalised
per item), unless the resized array would pass ``data_arrays._PRERESIZE_BYTES``, in which case each item is resized
when read. With augmentation (natural images, train split, on by default) each image is augmented at its stored size
(random crop with reflect padding of 1/8 of the side, horizontal flip, timm's RandAugment) and then resized, which
keeps the CPU cost of a 32 px CIFAR image small whatever the model's size. ``imagefolder`` images have no common
size: train uses ``RandomResizedCrop``, test a shorter-side resize and centre crop.

Normalisation: CIFAR-10/100 use their published per-channel mean and std; ``npz`` and ``pathfinder`` compute them
from their own train split (for the CIFAR-10 subset that lands within 0.01 of CIFAR's); ``imagefolder`` uses
ImageNet's (timm's defaults), since computing them would mean decoding every image.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .data_arrays import (
    DEFAULT_RAND_AUGMENT, ArrayDataset, AugmentedArrayDataset, DatasetBundle, DatasetError, _channel_stats,
)
from .data_files import CIFAR_STATS, _cifar, _imagefolder, _npz

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

DATASET_NAMES: tuple[str, ...] = (
    "pathfinder", "pathfinder_scaled", "reach", "cifar10", "cifar100", "npz", "imagefolder",
)
PATHFINDER_DEFAULT_SAMPLES = (10_000, 2_000)  # (train, test) when not given
FRESH_STREAM = 0xF2E5  # keeps fresh_seed's stream apart from other users of (seed, epoch)
# Test images are split over (direction, distance) buckets: 3000 leave ~200 per bucket of the 32 px task.
REACH_DEFAULT_SAMPLES = (8_000, 3_000)


def fresh_seed(seed: int, epoch: int) -> int:
    """The generator seed of epoch `epoch`'s fresh training set, from (seed, epoch) alone (so a resumed training
    draws the same images), a 32-bit hash far from the small seeds of the fixed splits."""
    return int(np.random.SeedSequence([seed, epoch, FRESH_STREAM]).generate_state(1)[0])


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
    n_train, n_test = _sample_counts("pathfinder", train_samples, test_samples, PATHFINDER_DEFAULT_SAMPLES, seed)
    splits = []
    for split, n in ((0, n_train), (1, n_test)):
        data = load_pathfinder(n, img_size, variant=variant, seed=2 * seed + split, cache_dir=data_dir, workers=workers)
        splits.append((torch.from_numpy(data.images)[:, None], torch.from_numpy(data.labels)))  # (N, 1, H, W)
    mean, std = _channel_stats(splits[0][0].permute(0, 2, 3, 1).numpy())
    train, test = (ArrayDataset(x, y, img_size, mean, std) for x, y in splits)
    def fresh(epoch: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Cached as the fixed splits are: every mixer of a sweep trains on the same (seed, epoch) sets, so they are
        # drawn once per sweep (about as long as a micro model's training epoch on 2 cores), not once per point.
        data = load_pathfinder(n, img_size, variant=variant, seed=fresh_seed(seed, epoch), cache_dir=data_dir,
                               workers=workers)
        return torch.from_numpy(data.images)[:, None], torch.from_numpy(data.labels)  # (n, 1, H, W)

    origin = f"LRA table row {params.defined_at} px" if variant == "lra" else "scaled scene"
    description = (
        f"pathfinder ({variant}, {origin}, contour {params.contour_length} paddles): {n_train} train / {n_test} test "
        f"generated at {img_size} px (seeds {2 * seed}, {2 * seed + 1}), no resize; normalised with mean {mean} "
        f"std {std} of the train split; no augmentation; fresh training images every epoch"
    )
    return DatasetBundle(
        "pathfinder" if variant == "lra" else "pathfinder_scaled",
        train, test, 2, 1, img_size, mean, std, False, description, fresh_train=fresh,
    )


def _sample_counts(task: str, train_samples: int | None, test_samples: int | None, defaults: tuple[int, int],
                   seed: int) -> tuple[int, int]:
    """The train and test sizes of a generated task (its defaults where not given), checked with the seed."""
    n_train = train_samples if train_samples is not None else defaults[0]
    n_test = test_samples if test_samples is not None else defaults[1]
    if n_train <= 0 or n_test <= 0 or seed < 0:
        raise DatasetError(f"{task} needs positive sample counts and a non-negative seed, got {n_train}, {n_test}, {seed}")
    return n_train, n_test


def _reach(
    *, img_size: int, patch_size: int | None, seed: int, train_samples: int | None, test_samples: int | None,
) -> DatasetBundle:
    from .reach import bucket_names, generate_reach, reach_params

    if patch_size is None:
        raise DatasetError("reach counts distances in patches: build_dataset needs patch_size")
    try:
        params = reach_params(img_size, patch_size)
    except ValueError as err:
        raise DatasetError(str(err)) from err
    n_train, n_test = _sample_counts("reach", train_samples, test_samples, REACH_DEFAULT_SAMPLES, seed)
    train_data, test_data = (generate_reach(params, n, seed=2 * seed + split)
                             for split, n in ((0, n_train), (1, n_test)))
    train_x = torch.from_numpy(train_data.images)[:, None]  # (N, 1, H, W)
    mean, std = _channel_stats(train_data.images[..., None])
    train = ArrayDataset(train_x, torch.from_numpy(train_data.labels), img_size, mean, std)
    test = ArrayDataset(torch.from_numpy(test_data.images)[:, None], torch.from_numpy(test_data.labels), img_size,
                        mean, std)
    names = bucket_names(params)
    description = (
        f"reach ({params.num_shapes} shapes, {params.num_distractors} distractors, patch {patch_size} px, "
        f"distances {list(params.distances)} patches, {', '.join(params.directions)}): {n_train} train / "
        f"{n_test} test generated at {img_size} px (seeds {2 * seed}, {2 * seed + 1}); normalised with mean "
        f"{mean} std {std} of the train split; no augmentation; fresh training images every epoch"
    )

    def fresh(epoch: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        data = generate_reach(params, n, seed=fresh_seed(seed, epoch))
        return torch.from_numpy(data.images)[:, None], torch.from_numpy(data.labels)  # (n, 1, H, W)

    return DatasetBundle("reach", train, test, 2, 1, img_size, mean, std, False, description,
                         tuple(names[b] for b in test_data.buckets), tuple(names[b] for b in train_data.buckets),
                         fresh)


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
    patch_size: int | None = None,
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
        patch_size: the model's patch side; reach needs it (its distances are in patches), others ignore it.

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
    if name == "reach":
        if augment:
            raise DatasetError("reach takes no augmentation: leave augment unset or False")
        return _reach(img_size=img_size, patch_size=patch_size, seed=seed, train_samples=train_samples,
                      test_samples=test_samples)
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
    and the machine is online, so that the points do not each try). ``pathfinder`` and ``reach`` need nothing (they are generated).

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
        # Reads the arrays and checks them as a point would (uint8 images, labels >= 0 within the classes):
        # a file every point would reject must stop the sweep once, not fill runs.csv with error rows.
        _npz(data_path, img_size=8, augment=False, rand_augment="", seed=0, train_samples=1, test_samples=1)
    elif name == "imagefolder":
        layout = "train/<class>/<image> and val/<class>/<image>"
        if data_dir is None:
            raise DatasetError(f"imagefolder needs data_dir (--data-dir=FOLDER) holding {layout}")
        missing = [s + "/" for s in ("train", "val") if not (Path(data_dir) / s).is_dir()]
        if missing:
            raise DatasetError(f"imagefolder: {data_dir} lacks {' and '.join(missing)}; expected {layout}")
    elif name in ("cifar10", "cifar100"):
        _cifar(name, data_dir, img_size=32, augment=False, rand_augment="", seed=0, train_samples=1, test_samples=1)
