"""One ViT backbone whose token mixer is pluggable."""
from .vit import PRESETS, Block, ViT, ViTConfig, create_vit, resolve_img_size

__all__ = ["PRESETS", "Block", "ViT", "ViTConfig", "create_vit", "resolve_img_size"]
