"""Reach generator: geometry, determinism, balance, the dataset entry, and no single-patch cue."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from experiments.train import reach
from experiments.train.datasets import DatasetError, build_dataset


def best_threshold_accuracy(feature: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of the best single threshold on one feature, either direction (0.5 = chance)."""
    order = np.argsort(feature, kind="stable")
    y = labels[order]
    zeros_below = np.concatenate([[0], np.cumsum(y == 0)])
    ones_below = np.concatenate([[0], np.cumsum(y == 1)])
    acc = (zeros_below + (ones_below[-1] - ones_below)) / len(y)
    return float(max(acc.max(), 1 - acc.min()))


def held_out_lookup_accuracy(keys: np.ndarray, labels: np.ndarray) -> float:
    """Majority label per exact key learnt on one half, scored on the other (0.5 = chance)."""
    half = len(labels) // 2
    table: dict[bytes, list[int]] = {}
    for key, y in zip(keys[:half], labels[:half], strict=True):
        table.setdefault(key.tobytes(), []).append(int(y))
    guesses = [round(np.mean(table.get(k.tobytes(), [0.5]))) for k in keys[half:]]
    return float(np.mean(np.array(guesses) == labels[half:]))


def test_geometry_and_balance() -> None:
    p = reach.reach_params(32, 4)
    assert p.grid == 8 and p.distances == (1, 2, 3, 5, 7)
    data = reach.generate_reach(p, 600, seed=1)
    assert data.images.shape == (600, 32, 32) and data.images.dtype == np.uint8
    counts = np.bincount(data.buckets * 2 + data.labels, minlength=2 * len(p.buckets))
    assert counts.max() - counts.min() <= 1  # balanced over (bucket, label)
    offsets = data.marks[:, 1].astype(int) - data.marks[:, 0]
    for index, (direction, d) in enumerate(p.buckets):
        rows = offsets[data.buckets == index]
        if direction == "horizontal":
            assert (rows[:, 0] == 0).all() and (abs(rows[:, 1]) == d).all()
        elif direction == "vertical":
            assert (rows[:, 1] == 0).all() and (abs(rows[:, 0]) == d).all()
        else:
            assert (abs(rows) == d).all()
    assert ((data.marks >= 0) & (data.marks < p.grid)).all()
    assert ((data.shapes[:, 0] == data.shapes[:, 1]) == (data.labels == 1)).all()
    # each mark is drawn whole inside its own patch: 5 bright pixels there
    patches = data.images.reshape(600, 8, 4, 8, 4).transpose(0, 1, 3, 2, 4)  # (n, row, col, 4, 4)
    for k in range(2):
        inside = patches[np.arange(600), data.marks[:, k, 0], data.marks[:, k, 1]]
        assert ((inside == reach.MARK_VALUE).sum((1, 2)) == 5).all()
    assert ((data.images == reach.MARK_VALUE).sum((1, 2)) == 10).all()


def test_stamps_fixed_in_their_patch_unless_jitter() -> None:
    """Off (the default), a mark is the same pixel pattern wherever it lies, so the patch embedding tells shapes apart
    linearly; with jitter the stamp moves inside its patch and the rest of the image stays as it was."""
    fixed = reach.ReachParams(32, 4, (1, 2))
    moved = dataclasses.replace(fixed, jitter=True)
    a, b = reach.generate_reach(fixed, 400, seed=5), reach.generate_reach(moved, 400, seed=5)
    for name in ("labels", "buckets", "marks", "shapes"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))

    def mark_patches(data: reach.ReachSet) -> np.ndarray:
        cells = data.images.reshape(400, 8, 4, 8, 4).transpose(0, 1, 3, 2, 4)
        return np.stack([cells[np.arange(400), data.marks[:, k, 0], data.marks[:, k, 1]] for k in range(2)], 1)

    inside = (fixed.patch_size - reach.MARK_SIZE) // 2
    stamped = mark_patches(a)[..., inside:inside + reach.MARK_SIZE, inside:inside + reach.MARK_SIZE]
    np.testing.assert_array_equal(stamped == reach.MARK_VALUE, reach.SHAPES[a.shapes])
    assert not np.array_equal(mark_patches(a), mark_patches(b))  # with jitter the stamp moves
    with pytest.raises(ValueError, match="jitter"):
        reach.ReachParams(32, 4, (1,), jitter=1)


def test_deterministic_and_validated() -> None:
    p = reach.reach_params(24, 3)
    a, b = reach.generate_reach(p, 50, seed=3), reach.generate_reach(p, 50, seed=3)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.images, reach.generate_reach(p, 50, seed=4).images)
    with pytest.raises(ValueError, match="distances"):
        reach.ReachParams(32, 4, (8,))
    with pytest.raises(ValueError, match="patch size"):
        reach.ReachParams(32, 2, (1,))


def test_no_single_patch_cue() -> None:
    p = reach.ReachParams(32, 4, (1, 3, 7), num_shapes=4)
    n = 3000
    data = reach.generate_reach(p, n, seed=11)
    y = data.labels
    g = p.grid
    patches = data.images.reshape(n, g, 4, g, 4).transpose(0, 1, 3, 2, 4).reshape(n, g * g, 16).astype(np.int64)
    cues = {"image ink": patches.sum((1, 2)), "bucket": data.buckets}
    for name, feature in cues.items():
        assert best_threshold_accuracy(feature.astype(float), y) < 0.56, name
    for cell in range(g * g):  # ink and brightest pixel of every patch position
        for stat in (patches[:, cell].sum(1), patches[:, cell].max(1)):
            assert best_threshold_accuracy(stat.astype(float), y) < 0.56, cell
    # the exact (binarised) content of either mark's patch, looked up: the shape alone says nothing
    rows = np.arange(n)
    for k in range(2):
        cell = data.marks[:, k, 0] * g + data.marks[:, k, 1]
        content = patches[rows, cell] == reach.MARK_VALUE
        assert held_out_lookup_accuracy(content, y) < 0.56, k
    both = np.concatenate([patches[rows, data.marks[:, k, 0] * g + data.marks[:, k, 1]] == reach.MARK_VALUE
                           for k in range(2)], 1)
    # sanity: the same lookup on the PAIR of marks solves the task
    assert held_out_lookup_accuracy(both, y) > 0.9


def test_dataset_entry_carries_buckets() -> None:
    bundle = build_dataset("reach", img_size=32, patch_size=4, seed=0, train_samples=40, test_samples=30)
    assert bundle.num_classes == 2 and bundle.in_chans == 1 and len(bundle.test) == 30
    x, label = bundle.test[0]
    assert x.shape == (1, 32, 32) and label in (0, 1)
    assert len(bundle.test_buckets) == 30 and set(bundle.test_buckets) <= set(reach.bucket_names(reach.reach_params(32, 4)))
    with pytest.raises(DatasetError, match="patch_size"):
        build_dataset("reach", img_size=32, train_samples=4, test_samples=4)
