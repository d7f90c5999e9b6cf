"""The validation split: images held out of the training split, on which a learning-rate grid chooses.

Carved from the training images a point was given (never from the test split), by a permutation seeded with the
point's seed on a stream of its own, so it does not move when the training subset or the test split are drawn.
"""
from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset, Subset

from .data_arrays import ArrayDataset, AugmentedArrayDataset, DatasetError, _to_model_size

# Stream of the seeded permutation, apart from those of the train (0) and test (1) subsets in data_arrays.
VALIDATION_STREAM = 2


def validation_count(n: int, fraction: float) -> int:
    """How many of `n` training images the split holds out: at least one when `fraction` is above 0."""
    return max(1, round(fraction * n)) if fraction > 0 else 0


def validation_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, validation indices) of a split of `n` images, disjoint, each ascending.

    Args:
        n: images in the training split.
        fraction: share held out for validation, in [0, 1); at least one image when above 0.
        seed: the point's seed.

    Raises:
        DatasetError: the split would leave no training image.
    """
    if fraction <= 0:
        return np.arange(n), np.arange(0)
    n_val = validation_count(n, fraction)
    if n_val >= n:
        raise DatasetError(f"val_fraction={fraction} of {n} training images leaves none to train on; lower it")
    order = np.random.default_rng([seed, VALIDATION_STREAM]).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def split_validation(train: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset | None]:
    """The training split without its validation images, and those images un-augmented (None when none).

    Raises:
        DatasetError: the data set is not array-backed (its augmentation could not be left off the held-out
            images), or the split leaves no training image.
    """
    train_idx, val_idx = validation_indices(len(train), fraction, seed)
    if not len(val_idx):
        return train, None
    if isinstance(train, AugmentedArrayDataset):
        images = _to_model_size(train.images[val_idx], train.img_size)
        mean, std = tuple(train.mean.flatten().tolist()), tuple(train.std.flatten().tolist())
        held_out: Dataset = ArrayDataset(images, train.labels[val_idx], train.img_size, mean, std)
    elif isinstance(train, ArrayDataset):
        held_out = Subset(train, val_idx.tolist())
    else:
        raise DatasetError(f"val_fraction needs an array-backed data set (npz, cifar, pathfinder, reach), got "
                           f"{type(train).__name__}")
    return Subset(train, train_idx.tolist()), held_out
