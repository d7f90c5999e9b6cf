"""Loaders of data sets read from files: ``npz`` arrays, torchvision's CIFAR-10/100 and ``imagefolder`` trees.

Each returns a `DatasetBundle`; `datasets.build_dataset` picks one by name.
"""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset, Subset

from .data_arrays import _RESIZE, DatasetBundle, DatasetError, _array_bundle, _rand_augment, _subset_indices

CIFAR_STATS: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# More classes than any image data set has (ImageNet-21k: 21,841): labels past it are ids, not class indices, and
# would build a head of that many outputs (a label of 5e7 asked for a 5e7-class head).
MAX_CLASSES = 100_000
# What a damaged .npz raises while an array is read: a cut-off member, a bad zip, a bad header.
_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def _read(path: Path, f: np.lib.npyio.NpzFile, name: str) -> np.ndarray:
    """One array of the file, or a DatasetError that says why it cannot be read."""
    try:
        return f[name]
    except ValueError as err:
        if "allow_pickle" not in str(err):
            raise DatasetError(f"{path}: cannot read the array {name} ({err}); save it again with np.savez") from None
        raise DatasetError(f"{path}: {name} is an object array; it is not loaded, since unpickling it could run "
                           "code (np.load with allow_pickle=False): save images and labels as numeric arrays") from None
    except _READ_ERRORS as err:
        raise DatasetError(f"{path}: cannot read the array {name} ({type(err).__name__}: {err}); the file is "
                           "damaged or cut short, save it again with np.savez") from None


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
        x, y = _read(path, f, f"x_{split}"), _read(path, f, f"y_{split}")
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
        if 0 in x.shape[1:3]:
            raise DatasetError(f"{path}: x_{split} holds {x.shape[1]}x{x.shape[2]} images; images need at least "
                               "one pixel a side")
        # Compared in the labels' own dtype, before the cast: uint64 labels past 2**63 would wrap negative.
        if y.min() < 0:
            raise DatasetError(f"{path}: y_{split} has negative labels")
        if y.max() >= MAX_CLASSES:
            raise DatasetError(f"{path}: y_{split} has a label of {int(y.max()):,}; labels are class indices "
                               f"0 .. {MAX_CLASSES - 1:,} at most (a label of N builds a head of N + 1 classes)")
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
        f = np.load(path, allow_pickle=False)  # never unpickle: a pickle in a data file would run code
    except _READ_ERRORS as err:
        raise DatasetError(f"{path} is not a readable .npz file ({type(err).__name__}: {err})") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise DatasetError(f"{path} holds one array, not an .npz archive of x_train, y_train, x_test, y_test")
    with f:
        arrays = _check_arrays(path, f)
        classes = _read(path, f, "classes") if "classes" in f.files else None
    top = int(max(arrays[1].max(), arrays[3].max())) + 1
    num_classes = len(classes) if classes is not None else top
    if num_classes > MAX_CLASSES:
        raise DatasetError(f"{path}: the classes array names {num_classes:,} classes; at most {MAX_CLASSES:,}")
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

