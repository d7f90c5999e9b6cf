"""The contract every token mixer keeps."""
from __future__ import annotations

from collections.abc import Callable

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


# MACs of custom ops that the counters cannot see into, by op name ("namespace::name"), as a function of the
# shapes of the op's tensor inputs. A mixer that adds a custom op registers its formula here, so fvcore's
# counter in experiments/measure/counting.py gets a handle for it without that code knowing the mixer.
CUSTOM_OP_MACS: dict[str, Callable[[list[tuple[int, ...] | None]], int]] = {}
