"""Effective receptive field maps: a window mixer's first layer sees its window only, global attention all."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from experiments.train.erf import METHOD, erf_map, save_erf
from mixers import list_mixers
from models import create_vit

IMG, PATCH, WINDOW = 16, 2, 2  # an 8 x 8 grid; the centre token (4, 4) sits in the window of rows/cols 4-5
EPS = torch.finfo(torch.float32).eps
# A map value is "clearly non-zero" when it stands this far above float32 round-off of the map's largest value;
# the margins below were chosen so that every assertion holds by a factor >= 10 over them, on any CPU.
CLEAR = 1e2 * EPS


def tiny(mixer: str, **mixer_options: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_vit("micro", mixer=mixer, img_size=IMG, patch_size=PATCH, num_classes=2, in_chans=1, depth=2,
                      mixer_options=mixer_options or None)


def images() -> torch.Tensor:
    return torch.randn(4, 1, IMG, IMG, generator=torch.Generator().manual_seed(1))


def centre_window() -> np.ndarray:
    inside = np.zeros((IMG, IMG), dtype=bool)
    inside[4 * PATCH : 6 * PATCH, 4 * PATCH : 6 * PATCH] = True
    return inside


def patch_mass(grad_map: np.ndarray) -> np.ndarray:
    grid = IMG // PATCH
    return grad_map.reshape(grid, PATCH, grid, PATCH).sum((1, 3))  # (grid, grid)


def test_swin_layer0_is_zero_outside_its_window_and_clearly_non_zero_inside() -> None:
    swin = erf_map(tiny("swin", window_size=WINDOW), images(), blocks=1)
    inside = centre_window()
    assert swin[~inside].max() == 0  # no path: exactly zero, not small
    assert swin[inside].min() > CLEAR * swin.max()


@pytest.mark.parametrize("mixer", ["attention", "attention_naive", "linear"])
def test_global_mixers_layer0_reach_every_patch(mixer: str) -> None:
    mass = patch_mass(erf_map(tiny(mixer), images(), blocks=1))
    assert mass.min() > CLEAR * mass.max()


def test_swin_shifted_second_layer_reaches_past_the_first_window() -> None:
    swin = erf_map(tiny("swin", window_size=WINDOW), images())
    assert swin[~centre_window()].sum() > 1e3 * EPS * swin.max()


@pytest.mark.parametrize("mixer", list_mixers())
def test_map_of_every_mixer_has_mass_far_above_round_off_and_leaves_weights_alone(mixer: str) -> None:
    model = tiny(mixer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    x = images()
    out = erf_map(model, x)
    assert out.shape == (IMG, IMG) and (out >= 0).all()
    # At initialisation: the old functional (sum after the final LayerNorm) gave 1e-7..1e-6 here, or exactly 0.
    assert out.sum() > 1e6 * EPS * x.abs().mean().item()
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_save_round_trip(tmp_path) -> None:
    path = tmp_path / "erf" / "abc.npz"
    maps = {"init": np.ones((4, 4)), "trained": np.zeros((4, 4))}
    save_erf(path, maps, {"mixer": "swin", "seed": 1}, 2)
    with np.load(path) as f:
        assert json.loads(str(f["key"])) == {"mixer": "swin", "seed": 1}
        assert str(f["method"]) == METHOD
        assert int(f["patch_size"]) == 2 and f["init"].dtype == np.float32
        np.testing.assert_array_equal(f["trained"], maps["trained"])
    assert [p.name for p in path.parent.iterdir()] == ["abc.npz"]


def test_training_point_writes_bucket_accuracy_and_maps(tmp_path) -> None:
    from experiments.measure.point import Point
    from experiments.measure.run import train_point
    from experiments.train.reach import bucket_names, reach_params

    path = tmp_path / "erf" / "point.npz"
    point = Point(mixer="swin", preset="micro", img_size=16, patch_size=4, batch_size=1, dataset="reach", epochs=1,
                  overrides='{"depth":1}', train='{"batch_size":16,"train_samples":32}', erf_path=str(path))
    row = train_point(point, torch.device("cpu"), torch.float32)
    by_bucket = json.loads(row["accuracy_by_bucket"])
    assert set(by_bucket) == set(bucket_names(reach_params(16, 4)))
    assert all(0 <= v <= 1 for v in by_bucket.values())
    with np.load(path) as f:
        assert f["init"].shape == f["trained"].shape == (16, 16)
        assert json.loads(str(f["key"]))["mixer"] == "swin"
