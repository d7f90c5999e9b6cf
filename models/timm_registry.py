"""The backbone in timm's model registry, so timm's scripts and utilities can build it.

Once `models` is imported, every (preset, mixer) is a timm model named `mixerbench_<preset>_<mixer>`:

    timm.create_model("mixerbench_tiny_neighborhood", img_size=224, patch_size=16, num_classes=1000,
                      mixer_options={"kernel_size": 7})

Keyword arguments go to `models.create_vit` (`img_size`, `patch_size`, `num_classes`, `in_chans`, `mixer_options`
and any `ViTConfig` field such as `depth` or `drop_path_rate`). The model's `pretrained_cfg` (input size of the
model as built, ImageNet mean and std, no weights) lets `timm.data.resolve_data_config` and `create_transform` work.

Mixers registered after `models` was imported (a user's mixer outside `mixers/__init__.py`) get their names from
`register_timm_models()`, and are reachable at once through the generic entry `mixerbench_<preset>` with a
`mixer=` keyword. Names are registered eagerly rather than resolved on demand because timm looks a name up in its
own registry before calling anything of ours, and it offers no hook for names it does not know.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import is_model, register_model, resolve_pretrained_cfg

from mixers import list_mixers

from .vit import PRESETS, ViT, create_vit

PREFIX = "mixerbench"

# Read by timm's `register_model` from this module: model name -> pretrained cfg. No weights: `url` is empty.
default_cfgs: dict[str, dict] = {}


def timm_model_name(preset: str, mixer: str | None = None) -> str:
    """The timm name of a preset with a mixer (`mixerbench_tiny_swin`), or of the generic entry (`mixerbench_tiny`)."""
    return f"{PREFIX}_{preset}" if mixer is None else f"{PREFIX}_{preset}_{mixer}"


def _cfg(img_size: int = 224, in_chans: int = 3, num_classes: int = 1000) -> dict:
    return dict(
        url="",
        num_classes=num_classes,
        input_size=(in_chans, img_size, img_size),
        pool_size=None,
        crop_pct=0.9,
        interpolation="bicubic",
        fixed_input_size=True,  # the learned position embedding is built for one grid
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
        first_conv="patch_embed.proj",
        classifier="head",
    )


def _build(name: str, preset: str, mixer: str, pretrained: bool, pretrained_cfg, pretrained_cfg_overlay,
           kwargs: dict) -> ViT:
    if pretrained:
        raise ValueError(f"{name}: mixerbench models have no pretrained weights; use pretrained=False")
    kwargs.pop("cache_dir", None)  # timm passes it to every entry; there is nothing to download
    drop_rate = kwargs.pop("drop_rate", 0.0)  # timm's train.py always passes it
    if drop_rate:
        raise ValueError(f"{name}: the backbone has no dropout (drop_rate={drop_rate}); use drop_path_rate")
    model = create_vit(preset, mixer=mixer, **kwargs)
    cfg = resolve_pretrained_cfg(name, pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=pretrained_cfg_overlay)
    # The input size and classes of the model as built, so resolve_data_config sizes the transforms for it.
    cfg = dataclasses.replace(cfg, input_size=(model.in_chans, *model.img_size), num_classes=model.num_classes)
    model.pretrained_cfg = model.default_cfg = cfg.to_dict()
    return model


def _entry(name: str, preset: str, mixer: str | None) -> Callable[..., ViT]:
    """A timm entry point called `name`; with `mixer=None` the caller names the mixer (`mixer=...`)."""

    def entry(pretrained: bool = False, pretrained_cfg=None, pretrained_cfg_overlay=None, **kwargs) -> ViT:
        chosen = kwargs.pop("mixer", None) if mixer is None else mixer
        if chosen is None:
            raise ValueError(f"{name} needs mixer=<name>; registered mixers: {', '.join(list_mixers())}")
        return _build(name, preset, chosen, pretrained, pretrained_cfg, pretrained_cfg_overlay, kwargs)

    entry.__name__ = entry.__qualname__ = name
    entry.__module__ = __name__
    entry.__doc__ = f"mixerbench ViT, preset {preset!r}, mixer {mixer or '(given as mixer=...)'!r}."
    return entry


def register_timm_models() -> list[str]:
    """Registers `mixerbench_<preset>_<mixer>` for every preset and every mixer registered now, and the generic
    `mixerbench_<preset>` entries; names already in timm's registry are left alone, so calling it again after
    registering a mixer adds only that mixer's names.

    Returns:
        The names registered by this call.
    """
    added = []
    for preset in PRESETS:
        for mixer in [None, *list_mixers()]:
            name = timm_model_name(preset, mixer)
            if is_model(name):
                continue
            default_cfgs[name] = _cfg()
            entry = _entry(name, preset, mixer)
            setattr(sys.modules[__name__], name, entry)
            register_model(entry)
            added.append(name)
    return added


register_timm_models()
