"""The Vision Transformer backbone: patch embedding, pre-norm blocks around a pluggable token mixer, pooled head."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from timm.layers import DropPath, Mlp, PatchEmbed, trunc_normal_
from torch import Tensor, nn

from mixers import Grid, create_mixer


# How the head reads the tokens (ViTConfig.pool).
POOLS = ("mean", "max")


@dataclass(frozen=True)
class ViTConfig:
    """Shape of the backbone; the presets below name the usual ones.

    Args:
        dim: token channels.
        depth: number of blocks.
        num_heads: heads of attention-like mixers.
        mlp_ratio: hidden width of the MLP as a multiple of `dim`; 0 gives mixer-only blocks (Vim's shape).
        drop_path_rate: stochastic depth at the last block, linearly increasing from 0 at the first.
        pool: how the head reads the tokens: `mean` (DeiT-III's and Swin's global average) or `max` (the
            channel-wise maximum over tokens). Reach keeps `mean`: with a linear head, the logit of mean-pooled
            tokens is a sum of one term per token, so a label that only two tokens together decide needs the mixer
            to relate them; under `max`, a model with no mixing at all solves reach (the `identity` mixer in
            results/reach_pool), so reach would measure nothing.
    """

    dim: int
    depth: int
    num_heads: int
    mlp_ratio: float = 4.0
    drop_path_rate: float = 0.0
    pool: str = "mean"

    def __post_init__(self) -> None:
        for name in ("dim", "depth", "num_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"ViTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.mlp_ratio < 0:
            raise ValueError(f"ViTConfig.mlp_ratio must be >= 0, got {self.mlp_ratio}")
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ValueError(f"ViTConfig.drop_path_rate must be in [0, 1), got {self.drop_path_rate}")
        if self.pool not in POOLS:
            raise ValueError(f"ViTConfig.pool must be one of {', '.join(POOLS)}, got {self.pool!r}")


# Named like DeiT so rows compare with published models; `micro` is for CPU runs.
PRESETS: dict[str, ViTConfig] = {
    "micro": ViTConfig(dim=64, depth=4, num_heads=2),
    "tiny": ViTConfig(dim=192, depth=12, num_heads=3),
    "small": ViTConfig(dim=384, depth=12, num_heads=6),
    "base": ViTConfig(dim=768, depth=12, num_heads=12),
}


def resolve_img_size(img_size: int | tuple[int, int], patch_size: int) -> Grid:
    """The token grid (H / p, W / p); raises if the patch size does not divide the image, naming sizes that do."""
    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    if patch_size < 1:
        raise ValueError(f"patch_size must be >= 1, got {patch_size}")
    for side in (h, w):
        if side < patch_size or side % patch_size:
            below, above = (side // patch_size) * patch_size, (side // patch_size + 1) * patch_size
            nearest = f"{below} or {above}" if below >= patch_size else f"{above}"
            raise ValueError(
                f"patch_size {patch_size} does not divide img_size {side}; use an image size that is a multiple "
                f"of {patch_size} (nearest: {nearest}) or a patch size that divides {side}"
            )
    return h // patch_size, w // patch_size


class Block(nn.Module):
    """Pre-norm block: x + drop_path(mixer(norm(x), grid)), then x + drop_path(mlp(norm(x))).

    Every mixer runs inside this same block, so latency differences come from the mixers alone.
    """

    def __init__(
        self,
        mixer_name: str,
        dim: int,
        num_heads: int,
        *,
        layer_idx: int,
        mlp_ratio: float,
        drop_path: float,
        mixer_options: dict | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.mixer = create_mixer(mixer_name, dim, num_heads, layer_idx=layer_idx, **(mixer_options or {}))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.mlp_hidden = int(dim * mlp_ratio)
        if self.mlp_hidden:
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = Mlp(dim, hidden_features=self.mlp_hidden, act_layer=nn.GELU)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        x = x + self.drop_path(self.mixer(self.norm1(x), grid))
        if self.mlp_hidden:
            x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x

    def macs(self, grid: Grid) -> int:
        n = grid[0] * grid[1]
        return self.mixer.macs(grid) + 2 * n * self.norm1.normalized_shape[0] * self.mlp_hidden


class ViT(nn.Module):
    """Strided-conv patch embedding, learned absolute position embedding, pre-norm blocks, mean or max pooling, head.

    Args:
        config: backbone shape.
        mixer: registry key of the token mixer used in every block.
        img_size: input side, or (H, W); the patch size must divide both.
        patch_size: patch side in pixels.
        num_classes: classifier outputs.
        in_chans: input channels.
        mixer_options: keyword options for every mixer (e.g. {"window_size": 7}).
    """

    def __init__(
        self,
        config: ViTConfig,
        *,
        mixer: str,
        img_size: int | tuple[int, int],
        patch_size: int,
        num_classes: int = 1000,
        in_chans: int = 3,
        mixer_options: dict | None = None,
    ) -> None:
        super().__init__()
        for name, value, minimum in (("num_classes", num_classes, 0), ("in_chans", in_chans, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        self.config = config
        self.mixer_name = mixer
        self.grid = resolve_img_size(img_size, patch_size)
        self.img_size = (self.grid[0] * patch_size, self.grid[1] * patch_size)
        self.patch_size = patch_size
        self.in_chans = in_chans
        self.num_classes = num_classes
        dim = config.dim
        self.patch_embed = PatchEmbed(self.img_size, patch_size, in_chans, dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid[0] * self.grid[1], dim))
        # Python floats, not torch.linspace, so the model can be built on the meta device for counting.
        drop_rates = [config.drop_path_rate * i / max(config.depth - 1, 1) for i in range(config.depth)]
        self.blocks = nn.ModuleList(
            Block(
                mixer,
                dim,
                config.num_heads,
                layer_idx=i,
                mlp_ratio=config.mlp_ratio,
                drop_path=drop_rates[i],
                mixer_options=mixer_options,
            )
            for i in range(config.depth)
        )
        self.norm = nn.LayerNorm(dim)
        # timm's convention: num_classes=0 returns the pooled features, (B, dim), for a head of the caller's own.
        self.head = nn.Linear(dim, num_classes) if num_classes else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        # Only the parts the backbone owns: each mixer initialises itself (Mamba's dt and A_log must survive).
        trunc_normal_(self.pos_embed, std=0.02)
        for module in [self.head, *(b.mlp for b in self.blocks if b.mlp_hidden)]:
            for m in module.modules():
                if isinstance(m, nn.Linear):
                    trunc_normal_(m.weight, std=0.02)
                    nn.init.zeros_(m.bias)

    @property
    def tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def impl(self) -> str:
        """The implementation(s) the mixers ran in their last forward, e.g. `sdpa_flash` or `torch_loop`."""
        return "+".join(sorted({block.mixer.impl for block in self.blocks}))

    def forward_features(self, x: Tensor) -> Tensor:
        # timm's PatchEmbed gives a (B, N, C) view of the conv's (B, C, H, W) output, channels strided by N, and the
        # residual stream kept that layout through every add: each norm copied it and each add ran on strided
        # memory, a cost every mixer paid (ViTs with a class token escape it: the concatenation is contiguous).
        x = self.patch_embed(x).contiguous() + self.pos_embed  # (B, N, C), token-major
        for block in self.blocks:
            x = block(x, self.grid)
        return self.norm(x)

    def forward(self, x: Tensor) -> Tensor:
        features = self.forward_features(x)  # (B, N, C)
        pooled = features.amax(dim=1) if self.config.pool == "max" else features.mean(dim=1)  # (B, C)
        return self.head(pooled)

    def macs(self, grid: Grid | None = None) -> int:
        """Analytic forward multiply-accumulates for one image: patch conv, every block, head.

        Norms, position embedding, pooling and element-wise ops are not counted (see results/README.md).

        Args:
            grid: the token grid to count at; default the one the model was built for. Blocks fix nothing about
                the grid (the mixer contract), so one build answers for every size (the planner's thousands).
        """
        grid = grid or self.grid
        n, dim, p = grid[0] * grid[1], self.config.dim, self.patch_size
        patch_embed = n * dim * self.in_chans * p * p
        return patch_embed + sum(block.macs(grid) for block in self.blocks) + dim * self.num_classes


def create_vit(
    preset: str,
    *,
    mixer: str,
    img_size: int | tuple[int, int] = 224,
    patch_size: int = 16,
    num_classes: int = 1000,
    in_chans: int = 3,
    mixer_options: dict | None = None,
    **overrides,
) -> ViT:
    """Builds the backbone from a preset, with any `ViTConfig` field overridden (e.g. depth=24, mlp_ratio=0)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ViTConfig)}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown ViT override(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(fields))}")
    config = dataclasses.replace(PRESETS[preset], **overrides)
    return ViT(
        config,
        mixer=mixer,
        img_size=img_size,
        patch_size=patch_size,
        num_classes=num_classes,
        in_chans=in_chans,
        mixer_options=mixer_options,
    )
