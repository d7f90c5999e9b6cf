"""The contract every token mixer keeps."""
from __future__ import annotations

from torch import Tensor, nn

Grid = tuple[int, int]


class TokenMixer(nn.Module):
    """Mixes information across tokens, and nothing else.

    A mixer sees `x` of shape `(B, N, C)` with `N == H * W` tokens in row-major order of `grid = (H, W)`
    and returns the same shape. The block around it owns norms, residuals, drop-path and the MLP, so every
    mixer is timed inside the same block.

    Subclasses set `impl` in `forward` to name the implementation that actually ran (an SDPA backend,
    `naive`, a scan kernel); the sweep records it in every result row.
    """

    impl: str = "torch"

    def forward(self, x: Tensor, grid: Grid) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def macs(self, grid: Grid) -> int:  # pragma: no cover - abstract
        """Forward multiply-accumulates for one image on `grid`, as actually computed (padding included)."""
        raise NotImplementedError


def check_tokens(x: Tensor, grid: Grid) -> None:
    """Raises if `x` does not hold exactly the `H * W` tokens of `grid`."""
    H, W = grid
    if x.dim() != 3 or x.shape[1] != H * W:
        raise ValueError(f"expected x of shape (B, {H}*{W}={H * W}, C) for grid {grid}, got {tuple(x.shape)}")
