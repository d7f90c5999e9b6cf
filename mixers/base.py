"""The contract every token mixer keeps."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

Grid = tuple[int, int]

# Changes of a mixer's input that its output may ignore, by the name a mixer declares in `invariant_to`.
INVARIANCES: dict[str, str] = {
    "channel_shift": "adding one constant per channel to every token leaves the output unchanged "
                     "(PoolFormer's pooling minus identity), so the bias of the norm feeding the mixer gets no gradient",
}


class TokenMixer(nn.Module):
    """Mixes information across tokens, and nothing else.

    A mixer sees `x` of shape `(B, N, C)` with `N == H * W` tokens in row-major order of `grid = (H, W)`
    and returns the same shape. The block around it owns norms, residuals, drop-path and the MLP, so every
    mixer is timed inside the same block.

    Subclasses set `impl` in `forward` to name the implementation that actually ran (an SDPA backend,
    `naive`, a scan kernel); the sweep records it in every result row.

    Gradient contract: in a training step every parameter of the mixer itself, and every parameter on the path
    from the patch embedding through every block to the head, gets a gradient clearly above round-off; a mixer
    that silently drops its input is a bug. The one exception is a parameter the mixer's function cannot see:
    a mixer whose output is unchanged by some change of its input names it in `invariant_to` (keys of
    `INVARIANCES`), the tests check that the mixer really is invariant to it, and then excuse the parameter it
    hides (for `channel_shift`, the bias of the norm before the mixer). Options are checked in `__init__`: a
    wrong type or range is a `TypeError`/`ValueError` that names the option, so a sweep refuses a config before
    any point runs.
    """

    impl: str = "torch"
    invariant_to: frozenset[str] = frozenset()

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


def grid_cached(cache: dict, key: tuple, build: Callable[[], object]) -> object:
    """`cache[key]`, built by `build()` on first use: the per-grid tensors (indices, masks) a mixer keeps out of its
    state dict.

    Built outside inference mode, and kept apart per inference mode: eagerly, `inference_mode(False)` makes the
    tensor usable by a training step later; compiled, Dynamo traces the build into the graph and the tensor comes
    out of a graph run in the caller's mode, so an entry made under a compiled `inference_mode` forward is an
    inference tensor that a compiled training step could not save for backward (it failed so for swin and
    neighborhood). The mode in the key gives each its own.
    """
    key = (*key, torch.is_inference_mode_enabled())
    if key not in cache:
        with torch.inference_mode(False):
            cache[key] = build()
    return cache[key]


# MACs of custom ops that the counters cannot see into, by op name ("namespace::name"), as a function of the
# shapes of the op's tensor inputs. A mixer that adds a custom op registers its formula here, so fvcore's
# counter in experiments/measure/counting.py gets a handle for it without that code knowing the mixer.
CUSTOM_OP_MACS: dict[str, Callable[[list[tuple[int, ...] | None]], int]] = {}


def check_int_option(mixer: str, name: str, value: object, *, minimum: int = 1, odd: bool = False) -> None:
    """Raises unless `value` is an int >= `minimum` (odd if asked), naming the option.

    A bool is refused although Python counts it an int: TOML's `true` is a typo, not a window of 1.

    Args:
        mixer: the registry key, for the message.
        name: the option's name, as the config spells it.
        value: what the config gave.
        minimum: the smallest value that builds a working mixer.
        odd: whether the value must be odd (a window centred on its token).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{mixer}: option {name} must be an integer, got {value!r}")
    if value < minimum or (odd and value % 2 == 0):
        raise ValueError(f"{mixer}: option {name} must be {'an odd integer' if odd else 'an integer'} >= {minimum}, "
                         f"got {value}")


def check_positive_option(mixer: str, name: str, value: object) -> None:
    """Raises unless `value` is a finite number > 0 (not a bool), naming the option: a zero or negative scale,
    rate or epsilon gives a non-finite or degenerate output that would still make an `ok` row."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{mixer}: option {name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{mixer}: option {name} must be a finite number > 0, got {value}")


def check_bool_option(mixer: str, name: str, value: object) -> None:
    """Raises unless `value` is True or False, naming the option (a 0 or "no" is a typo to say, not to guess)."""
    if not isinstance(value, bool):
        raise TypeError(f"{mixer}: option {name} must be true or false, got {value!r}")
