"""The backbone through timm's registry: every registered mixer by name, options passed through, data config."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config

import models  # noqa: F401  (registers the timm names)
from mixers import list_mixers
from models.timm_registry import timm_model_name
from models.vit import PRESETS

REPO = Path(__file__).resolve().parent.parent


def test_every_preset_and_mixer_has_a_timm_name() -> None:
    names = set(timm.list_models(f"{timm_model_name('*')}"))
    expected = {timm_model_name(p, m) for p in PRESETS for m in list_mixers()} | {timm_model_name(p) for p in PRESETS}
    assert expected <= names


@pytest.mark.parametrize("mixer", list_mixers())
def test_create_model_runs_at_two_image_sizes(mixer: str) -> None:
    for img_size in (16, 24):
        model = timm.create_model(timm_model_name("micro", mixer), img_size=img_size, patch_size=4, num_classes=3,
                                  depth=1).eval()
        assert model.grid == (img_size // 4, img_size // 4) and model.mixer_name == mixer
        with torch.no_grad():
            out = model(torch.randn(2, 3, img_size, img_size))
        assert out.shape == (2, 3) and torch.isfinite(out).all()
        assert model.pretrained_cfg["input_size"] == (3, img_size, img_size)


def test_mixer_options_and_vit_fields_pass_through() -> None:
    model = timm.create_model(timm_model_name("micro", "vmamba"), img_size=32, patch_size=8, num_classes=4,
                              mixer_options={"d_state": 2}, depth=2, drop_path_rate=0.1, in_chans=1)
    assert len(model.blocks) == 2 and model.blocks[0].mixer.d_state == 2
    assert model.in_chans == 1 and model.num_classes == 4 and model.config.drop_path_rate == 0.1


def test_generic_entry_takes_the_mixer_by_keyword() -> None:
    model = timm.create_model(timm_model_name("micro"), mixer="gla", img_size=16, patch_size=4, depth=1)
    assert model.mixer_name == "gla"
    with pytest.raises(ValueError, match="needs mixer=<name>; registered mixers: attention"):
        timm.create_model(timm_model_name("micro"), img_size=16, patch_size=4)


def test_data_config_and_transform_follow_the_model() -> None:
    model = timm.create_model(timm_model_name("micro", "attention"), img_size=48, patch_size=8, num_classes=2)
    config = resolve_data_config(model=model)
    assert config["input_size"] == (3, 48, 48)
    assert config["mean"] == timm.data.IMAGENET_DEFAULT_MEAN and config["std"] == timm.data.IMAGENET_DEFAULT_STD
    transform = create_transform(**config)
    image = transform(Image.new("RGB", (100, 80), (120, 30, 200)))
    assert tuple(image.shape) == (3, 48, 48)
    assert model(image[None]).shape == (1, 2)


def test_refuses_what_it_cannot_give() -> None:
    name = timm_model_name("micro", "attention")
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model(name, pretrained=True)
    with pytest.raises(ValueError, match="no dropout"):
        timm.create_model(name, drop_rate=0.1)
    assert timm.create_model(name, drop_rate=0.0, img_size=16, patch_size=4).num_classes == 1000


def test_a_mixer_registered_later_gets_its_names() -> None:
    """A user's mixer registered after `models` was imported: the generic entry builds it at once, and
    register_timm_models() adds its named entries (in a fresh interpreter, so the registry of this one is clean)."""
    code = """
import timm, torch
import models
from mixers import register_mixer
from mixers.linear import LinearAttention
from models.timm_registry import register_timm_models
register_mixer("mine")(type("Mine", (LinearAttention,), {}))
assert timm.create_model("mixerbench_micro", mixer="mine", img_size=16, patch_size=4, depth=1).mixer_name == "mine"
added = register_timm_models()
assert sorted(added) == sorted(f"mixerbench_{p}_mine" for p in ("micro", "tiny", "small", "base")), added
print("ok", timm.create_model("mixerbench_micro_mine", img_size=16, patch_size=4, depth=1).mixer_name)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok mine"


def test_num_classes_zero_gives_pooled_features() -> None:
    """timm's convention: a model built with num_classes=0 returns its pooled features, (B, dim)."""
    model = timm.create_model("mixerbench_micro_attention", img_size=16, patch_size=4, num_classes=0, depth=1)
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, PRESETS["micro"].dim)


@pytest.mark.parametrize("mixer,options", [("neighborhood", {"kernel_size": True}), ("swin", {"window_size": True}),
                                           ("mamba", {"d_conv": True})])
def test_a_true_option_is_not_taken_as_one(mixer: str, options: dict) -> None:
    with pytest.raises(TypeError, match=next(iter(options))):
        timm.create_model(timm_model_name("micro", mixer), img_size=16, patch_size=4, mixer_options=options)
