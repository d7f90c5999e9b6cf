"""Pathfinder generator: parameters, determinism, balance, cache, and the absence of trivial shortcuts."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from experiments.train import pathfinder as pf


def best_threshold_accuracy(feature: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of the best single threshold on one feature, either direction (0.5 = chance)."""
    order = np.argsort(feature, kind="stable")
    y = labels[order]
    zeros_below = np.concatenate([[0], np.cumsum(y == 0)])
    ones_below = np.concatenate([[0], np.cumsum(y == 1)])
    acc = (zeros_below + (ones_below[-1] - ones_below)) / len(y)  # predict 1 above the cut
    return float(max(acc.max(), 1 - acc.min()))


def test_lra_table_and_nearest_size() -> None:
    p = pf.pathfinder_params(128, "lra")
    assert (p.paddle_length, p.paddle_margin, p.paddle_thickness, p.marker_radius) == (5.0, (2.0, 3.0), 1.5, 3.0)
    assert (p.seed_distance, p.continuity, p.num_distractors, p.distractor_length) == (20.0, 1.8, 8, 4)
    assert p.contour_length == 14
    assert pf.pathfinder_params(48).defined_at == 64
    assert pf.pathfinder_params(100).defined_at == 128
    assert pf.pathfinder_params(512).defined_at == 256
    with pytest.raises(ValueError, match="32, 64, 128, 256"):
        pf.pathfinder_params(16)
    with pytest.raises(ValueError, match="lra, scaled"):
        pf.pathfinder_params(32, "pathx")


def test_scaled_matches_lra_at_32_and_grows() -> None:
    lra, scaled = pf.pathfinder_params(32, "lra"), pf.pathfinder_params(32, "scaled")
    assert dataclasses.replace(scaled, variant="lra") == lra
    p128 = pf.pathfinder_params(128, "scaled")
    assert p128.contour_length == 28 and p128.paddle_length == pytest.approx(4.0)
    assert p128.num_distractors == 10 and p128.distractor_length == 8


@pytest.mark.parametrize(("img_size", "n"), [(32, 24), (128, 8)])
def test_deterministic_balanced_and_well_formed(img_size: int, n: int) -> None:
    a = pf.generate_pathfinder_set(n, img_size, seed=3, workers=1)
    b = pf.generate_pathfinder_set(n, img_size, seed=3, workers=1)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    other = pf.generate_pathfinder_set(n, img_size, seed=4, workers=1)
    assert not np.array_equal(a.images, other.images)

    assert a.images.shape == (n, img_size, img_size) and a.images.dtype == np.uint8
    assert a.labels.dtype == np.uint8 and set(np.unique(a.labels)) == {0, 1}
    assert abs(int(a.labels.sum()) * 2 - n) <= 1
    p = pf.pathfinder_params(img_size)
    assert ((a.markers >= p.marker_radius) & (a.markers <= img_size - 1 - p.marker_radius)).all()
    # markers are solid discs; their distance respects the seed distance
    centre = np.rint(a.markers).astype(int)  # (n, 2, 2) as (x, y)
    rows = np.arange(n)[:, None]
    assert (a.images[rows, centre[..., 1], centre[..., 0]] >= 200).all()
    assert (np.linalg.norm(a.markers[:, 0] - a.markers[:, 1], axis=-1) >= p.seed_distance).all()
    images, labels = pf.generate_pathfinder(n, img_size, seed=3, workers=1)
    np.testing.assert_array_equal(images, a.images)
    np.testing.assert_array_equal(labels, a.labels)


def test_output_does_not_depend_on_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pf, "_chunk_size", lambda img_size: 8)  # several chunks from a tiny request
    serial = pf.generate_pathfinder_set(21, 32, seed=1, workers=1)
    parallel = pf.generate_pathfinder_set(21, 32, seed=1, workers=2)
    for x, y in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(x, y)
    assert abs(int(serial.labels.sum()) * 2 - 21) <= 1


def test_cache_written_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = pf.load_pathfinder(10, 32, seed=2, cache_dir=tmp_path, workers=1)
    files = list(tmp_path.glob("*.npz"))
    assert files == [pf.pathfinder_cache_path(10, 32, seed=2, cache_dir=tmp_path)]

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("regenerated although the cache file exists")

    monkeypatch.setattr(pf, "generate_pathfinder_set", fail)
    again = pf.load_pathfinder(10, 32, seed=2, cache_dir=tmp_path)
    for x, y in zip(first, again, strict=True):
        np.testing.assert_array_equal(x, y)
    # every parameter is in the key
    keys = {
        pf.pathfinder_cache_path(10, 32, seed=2),
        pf.pathfinder_cache_path(11, 32, seed=2),
        pf.pathfinder_cache_path(10, 32, seed=3),
        pf.pathfinder_cache_path(10, 64, seed=2),
        pf.pathfinder_cache_path(10, 32, seed=2, variant="scaled"),
    }
    assert len(keys) == 5


def test_default_cache_dir_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIXERBENCH_CACHE", str(tmp_path))
    assert pf.default_cache_dir() == tmp_path / "pathfinder"
    monkeypatch.delenv("MIXERBENCH_CACHE")
    monkeypatch.chdir(tmp_path)
    assert pf.default_cache_dir() == tmp_path / ".cache" / "pathfinder"


@pytest.mark.parametrize(("img_size", "n"), [(32, 600), (128, 300)])
def test_trivial_cues_do_not_predict_the_label(img_size: int, n: int) -> None:
    data = pf.generate_pathfinder_set(n, img_size, seed=11)
    y = data.labels
    ink = data.images.reshape(n, -1).sum(1, dtype=np.int64).astype(np.float64)
    distance = np.linalg.norm(data.markers[:, 0] - data.markers[:, 1], axis=-1)
    second = data.markers[:, 1]
    border = np.minimum(second, img_size - 1 - second).min(1)
    cues = {"ink": ink, "marker distance": distance, "second marker to border": border}
    for name, feature in cues.items():
        assert best_threshold_accuracy(feature, y) < 0.6, name
    # the two main cues together, through a least-squares linear classifier
    feats = np.stack([ink, distance], 1)
    feats = (feats - feats.mean(0)) / feats.std(0)
    design = np.concatenate([feats, np.ones((n, 1))], 1)
    w, *_ = np.linalg.lstsq(design, y * 2.0 - 1, rcond=None)
    assert ((design @ w > 0) == (y == 1)).mean() < 0.6
