"""build_dataset: every loader on tiny data, and the errors that tell a user what to do."""
from __future__ import annotations

import pickle
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch
from PIL import Image

from experiments.train.datasets import (
    CIFAR_STATS,
    DATASET_NAMES,
    DatasetBundle,
    DatasetError,
    build_dataset,
    check_dataset_available,
)


def check_bundle(bundle: DatasetBundle, img_size: int, in_chans: int, num_classes: int) -> None:
    assert bundle.img_size == img_size and bundle.in_chans == in_chans and bundle.num_classes == num_classes
    assert len(bundle.mean) == len(bundle.std) == in_chans
    for split in (bundle.train, bundle.test):
        for i in (0, len(split) - 1):
            x, y = split[i]
            assert x.shape == (in_chans, img_size, img_size) and x.dtype == torch.float32
            assert isinstance(y, int) and 0 <= y < num_classes
            assert torch.isfinite(x).all()


def write_npz(path: Path, *, gray: bool = False, n_train: int = 40, n_test: int = 12, **extra: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    shape = (8, 10) if gray else (8, 8, 3)
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, *shape), dtype=np.uint8),
        "y_train": rng.integers(0, 3, n_train),
        "x_test": rng.integers(0, 256, (n_test, *shape), dtype=np.uint8),
        "y_test": rng.integers(0, 3, n_test),
    }
    arrays.update(extra)
    np.savez(path, **arrays)


def test_unknown_name_lists_the_names() -> None:
    with pytest.raises(DatasetError, match="cifar10, cifar100, npz, imagefolder") as info:
        build_dataset("mnist", img_size=32)
    assert isinstance(info.value, ValueError)
    assert set(DATASET_NAMES) >= {"pathfinder", "pathfinder_scaled", "npz"}


def test_npz_without_augmentation_is_resized_and_normalised(tmp_path: Path) -> None:
    write_npz(tmp_path / "d.npz")
    bundle = build_dataset("npz", img_size=16, data_path=tmp_path / "d.npz", augment=False)
    check_bundle(bundle, 16, 3, 3)
    assert not bundle.augment and "bilinear" in bundle.description
    raw = np.load(tmp_path / "d.npz")
    assert [bundle.train[i][1] for i in range(5)] == raw["y_train"][:5].tolist()
    # mean/std come from the train split, so at the stored size the split is zero-mean, unit-std per channel
    native = build_dataset("npz", img_size=8, data_path=tmp_path / "d.npz", augment=False)
    xs = torch.stack([native.train[i][0] for i in range(len(native.train))])  # (N, C, H, W)
    assert xs.mean((0, 2, 3)).abs().max() < 1e-2
    assert (xs.std((0, 2, 3)) - 1).abs().max() < 1e-2
    np.testing.assert_allclose(xs[0].permute(1, 2, 0).numpy() * native.std + native.mean, raw["x_train"][0] / 255,
                               atol=1e-3)


def test_npz_augmented_grayscale_and_subsets(tmp_path: Path) -> None:
    write_npz(tmp_path / "g.npz", gray=True, classes=np.array(["a", "b", "c", "d"]))
    bundle = build_dataset("npz", img_size=12, data_path=tmp_path / "g.npz", train_samples=10, test_samples=5, seed=1)
    check_bundle(bundle, 12, 1, 4)  # the classes array sets the count
    assert bundle.augment and "RandAugment" in bundle.description
    assert len(bundle.train) == 10 and len(bundle.test) == 5
    for i in range(10):  # every RandAugment op path on a grayscale image
        bundle.train[i]
    again = build_dataset("npz", img_size=12, data_path=tmp_path / "g.npz", train_samples=10, test_samples=5, seed=1)
    assert torch.equal(bundle.test[3][0], again.test[3][0])


def test_npz_errors_name_the_path_and_arrays(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="data_path"):
        build_dataset("npz", img_size=32)
    with pytest.raises(DatasetError, match="nothere.npz"):
        build_dataset("npz", img_size=32, data_path=tmp_path / "nothere.npz")
    np.savez(tmp_path / "partial.npz", x_train=np.zeros((2, 4, 4, 3), np.uint8), y_train=np.zeros(2, int))
    with pytest.raises(DatasetError, match=r"partial\.npz lacks the arrays \['x_test', 'y_test'\]"):
        build_dataset("npz", img_size=32, data_path=tmp_path / "partial.npz")
    write_npz(tmp_path / "float.npz", x_train=np.zeros((40, 8, 10, 3), np.float32))
    with pytest.raises(DatasetError, match="x_train must be uint8"):
        build_dataset("npz", img_size=32, data_path=tmp_path / "float.npz")
    write_npz(tmp_path / "d.npz")
    with pytest.raises(DatasetError, match="asked for 99 samples"):
        build_dataset("npz", img_size=8, data_path=tmp_path / "d.npz", train_samples=99)


def test_imagefolder_tree(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for split, count in (("train", 3), ("val", 2)):
        for cls in ("cat", "dog"):
            folder = tmp_path / split / cls
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 256, (10, 14, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    bundle = build_dataset("imagefolder", img_size=16, data_dir=tmp_path)
    check_bundle(bundle, 16, 3, 2)
    assert len(bundle.train) == 6 and len(bundle.test) == 4
    plain = build_dataset("imagefolder", img_size=8, data_dir=tmp_path, augment=False, train_samples=2)
    check_bundle(plain, 8, 3, 2)
    assert len(plain.train) == 2


def test_imagefolder_missing_folders(tmp_path: Path) -> None:
    (tmp_path / "train" / "a").mkdir(parents=True)
    with pytest.raises(DatasetError, match=r"lacks val/"):
        build_dataset("imagefolder", img_size=16, data_dir=tmp_path)
    with pytest.raises(DatasetError, match="data_dir"):
        build_dataset("imagefolder", img_size=16)


def test_cifar10_offline_says_what_to_put_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision import datasets

    def offline(self: object) -> None:
        raise URLError("no network")

    monkeypatch.setattr(datasets.CIFAR10, "download", offline)
    with pytest.raises(DatasetError) as info:
        build_dataset("cifar10", img_size=32, data_dir=tmp_path)
    message = str(info.value)
    for part in (str(tmp_path / "cifar-10-batches-py"), "data_batch_1", "test_batch", "batches.meta", "npz",
                 "machine with internet", "no network"):
        assert part in message, part
    with pytest.raises(DatasetError, match="cifar-100-python"):
        build_dataset("cifar100", img_size=32)


def test_cifar10_from_a_local_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision import datasets
    from torchvision.datasets import cifar

    # our files are not the real ones, whose checksums torchvision verifies
    monkeypatch.setattr(datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, 4).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    bundle = build_dataset("cifar10", img_size=40, data_dir=tmp_path)
    check_bundle(bundle, 40, 3, 10)
    assert len(bundle.train) == 20 and len(bundle.test) == 4
    assert (bundle.mean, bundle.std) == CIFAR_STATS["cifar10"]


def test_pathfinder_bundle(tmp_path: Path) -> None:
    bundle = build_dataset("pathfinder", img_size=32, data_dir=tmp_path, train_samples=16, test_samples=8, workers=1)
    check_bundle(bundle, 32, 1, 2)
    assert not bundle.augment and "lra" in bundle.description
    assert not torch.equal(bundle.train[0][0], bundle.test[0][0])  # different generator seeds
    assert len(list(tmp_path.glob("*.npz"))) == 2
    scaled = build_dataset("pathfinder_scaled", img_size=64, data_dir=tmp_path, train_samples=4, test_samples=4)
    check_bundle(scaled, 64, 1, 2)
    with pytest.raises(DatasetError, match="no augmentation"):
        build_dataset("pathfinder", img_size=32, augment=True)
    with pytest.raises(DatasetError, match="32, 64, 128, 256"):
        build_dataset("pathfinder", img_size=16, data_dir=tmp_path, train_samples=4, test_samples=4)


def test_check_dataset_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision import datasets

    check_dataset_available("pathfinder")
    with pytest.raises(DatasetError, match="unknown data set"):
        check_dataset_available("mnist")
    write_npz(tmp_path / "d.npz")
    check_dataset_available("npz", data_path=tmp_path / "d.npz")
    with pytest.raises(DatasetError, match="missing.npz"):
        check_dataset_available("npz", data_path=tmp_path / "missing.npz")
    np.savez(tmp_path / "partial.npz", x_train=np.zeros((2, 4, 4, 3), np.uint8))
    with pytest.raises(DatasetError, match="lacks the arrays"):
        check_dataset_available("npz", data_path=tmp_path / "partial.npz")
    with pytest.raises(DatasetError, match="lacks train/ and val/"):
        check_dataset_available("imagefolder", data_dir=tmp_path)

    def offline(self: object) -> None:
        raise URLError("no network")

    monkeypatch.setattr(datasets.CIFAR10, "download", offline)
    with pytest.raises(DatasetError, match="cifar-10-batches-py"):
        check_dataset_available("cifar10", data_dir=tmp_path)
