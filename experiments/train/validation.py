"""The validation split: images held out of the training split, on which a learning-rate grid chooses.

Carved from the training images a point was given (never from the test split), by a permutation seeded with the
point's seed on a stream of its own, so it does not move when the training subset or the test split are drawn.
"""
from __future__ import annotations

import numpy as np
from .data_arrays import DatasetError

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
