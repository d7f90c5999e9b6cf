"""One ViT backbone whose token mixer is pluggable."""
from .vit import PRESETS, Block, ViT, ViTConfig, create_vit, resolve_img_size

__all__ = ["PRESETS", "Block", "ViT", "ViTConfig", "create_vit", "resolve_img_size"]
from . import timm_registry  # noqa: E402,F401  (registers every preset x mixer in timm's model registry)
