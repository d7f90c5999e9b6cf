"""Token-to-token mixing matrices: how much each input token feeds one output token of a mixer, for a given input.

Once the input ``x`` (B, N, C) of a mixer is fixed, every built-in mixer mixes tokens linearly: its output is a
matrix over tokens applied to a per-token quantity, followed by per-token work. Each function below (and in
`recurrences.py` for mamba, vmamba and gla) returns that matrix, and each one's docstring says exactly which part
of the mixer it represents (the tests rebuild the mixer's own output from it):

- ``attention`` (and ``attention_naive``, the same module): ``A_h = softmax(q_h k_h^T * scale)`` per head, with
  ``scale = head_dim ** -0.5`` or 1 ("scale removed"); the mixer returns ``proj(concat_h A_h v_h)``.
- ``swin``: the same softmax with the relative position bias, inside the (shifted) window of the layer, over the
  real tokens of the grid; exactly zero outside the window; the mixer returns ``proj(concat_h A_h v_h)``.
- ``neighborhood``: the softmax over each query's k x k neighbourhood with NAT's relative position bias; exactly
  zero outside it; the mixer returns ``proj(concat_h A_h v_h)``.
- ``linear``: ``A_h[i, j] = phi(q_i) . phi(k_j) / (phi(q_i) . sum_j phi(k_j) + N eps)``, the mixer's own ``eps``
  included so that ``A_h v_h`` is the mixer's output before ``proj`` to round-off.
- ``mamba``, ``vmamba``, ``gla``, ``mamba2``: their recurrences unrolled (`recurrences.py`): mamba's two scan
  directions, vmamba's four scans, gla's two directions per head, mamba2's quasiseparable matrix per head (forward,
  backward and diagonal parts).
- any other registered mixer: the gradient fallback, ``||d y_i / d x_j||_F`` over the (C x C) channel block, the
  effective receptive field of one layer for output token i.

`mixing_maps` computes a mixer's whole maps for one input (every query at once, so the app computes them once per
image and layer and a click only reads a row); `mixing_rows` picks the row of one query token in the shape the app
draws.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from mixers import Grid
from mixers.attention import Attention
from mixers.gla import BiGLA
from mixers.linear import LinearAttention
from mixers.mamba import VimMixer
from mixers.mamba2 import HydraMixer
from mixers.neighborhood import NeighborhoodAttention, clipped_kernel, neighbourhood_index
from mixers.swin import SwinAttention, window_groups
from mixers.vmamba import SS2D

from .recurrences import MAMBA2_PARTS, VMAMBA_SCANS, gla_map_rows, mamba2_map_rows, mamba_map_rows, vmamba_map_rows

FAMILIES: tuple[str, ...] = ("attention", "swin", "neighborhood", "linear", "mamba", "vmamba", "gla", "mamba2",
                             "gradient")


@dataclass(frozen=True)
class MixingMaps:
    """Every query's mixing rows of one mixer for one input, ready to be read: what a click reads.

    Attention-like maps are whole (N x N per head) matrices; the recurrences keep their scan inputs and unroll one
    row per call (a row costs 1/N of the matrix), so either way the work that depends only on the image and layer
    is done once.

    Attributes:
        family: how the maps were computed (one of `FAMILIES`).
        heads: heads among the maps (1 for a mixer without heads).
        view_names: a label for each view of a head (a recurrence's directions; one "" view for attention-like
            mixers).
        note: one line on what the values are.
        rows_of: query -> (heads, views, N) float64; ``[h, v, j]``: weight of input token j in the query's output.
    """

    family: str
    heads: int
    view_names: tuple[str, ...]
    note: str
    rows_of: Callable[[int], Tensor]

    def row(self, query: int) -> MixingRows:
        """The rows of token `query`, flattened head-major."""
        with torch.inference_mode():
            rows = self.rows_of(query).reshape(self.heads * len(self.view_names), -1).double()  # (heads * views, N)
        return MixingRows(self.family, rows, map_names(self.heads, self.view_names), self.note, self.heads,
                          self.view_names)


@dataclass(frozen=True)
class MixingRows:
    """What one query token hears, as the app draws it.

    Attributes:
        family: how the rows were computed (one of `FAMILIES`).
        rows: (heads * views, N) float64; ``rows[h * views + v, j]``: weight of input token j in the query's
            output, in view v of head h.
        map_names: a label for each row.
        note: one line on what the values are.
        heads: heads among the rows (1 for a mixer without heads: mamba, vmamba, the gradient).
        view_names: a label for each view of a head (one view for attention-like mixers).
    """

    family: str
    rows: Tensor
    map_names: tuple[str, ...]
    note: str
    heads: int = 1
    view_names: tuple[str, ...] = ("",)


def map_names(heads: int, view_names: tuple[str, ...]) -> tuple[str, ...]:
    """Labels of (head, view) pairs, head-major: "head 1", "forward", "head 0, backward"."""
    names = []
    for h in range(heads):
        for view in view_names:
            parts = ([f"head {h}"] if heads > 1 or view == "" else []) + ([view] if view else [])
            names.append(", ".join(parts))
    return tuple(names)


def family_of(mixer: nn.Module) -> str:
    """The mixing family of a mixer module; `gradient` for any mixer without an exact map."""
    for family, kind in (("swin", SwinAttention), ("attention", Attention), ("neighborhood", NeighborhoodAttention),
                         ("linear", LinearAttention), ("mamba", VimMixer), ("vmamba", SS2D), ("gla", BiGLA),
                         ("mamba2", HydraMixer)):
        if isinstance(mixer, kind):
            return family
    return "gradient"


def attention_matrix(mixer: Attention, x: Tensor, *, scaled: bool = True) -> Tensor:
    """Softmax attention matrices of a global attention mixer.

    Args:
        mixer: an `attention` or `attention_naive` module.
        x: its input tokens (B, N, C).
        scaled: multiply the logits by 1/sqrt(head_dim) as the mixer does; False removes the scale.

    Returns:
        (B, heads, N, N): row i is query token i's softmax over keys; ``A @ v`` is the mixer's output before `proj`.
    """
    q, k, _ = mixer.project_qkv(x)  # (B, heads, N, head_dim)
    scale = mixer.scale if scaled else 1.0
    return ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, heads, N, N)


def swin_matrix(mixer: SwinAttention, x: Tensor, grid: Grid, *, scaled: bool = True) -> Tensor:
    """Window attention matrices of a Swin mixer over the real tokens of the grid.

    The logits are those of the mixer (``q k^T * scale`` plus the relative position bias plus the shift mask),
    gathered from window coordinates to token coordinates; pairs in different windows get no weight at all.

    Args:
        mixer: a `swin` module (its `layer_idx` sets the shift).
        x: its input tokens (B, N, C).
        grid: the token grid (H, W).
        scaled: as `attention_matrix`.

    Returns:
        (B, heads, N, N), exactly zero outside each query's window; ``A @ v`` is the mixer's output before `proj`.
    """
    q, k, _ = rearrange(mixer.qkv(x), "b n (three h d) -> three b h n d", three=3, h=mixer.num_heads)
    scale = (mixer.dim // mixer.num_heads) ** -0.5 if scaled else 1.0  # SDPA's default, as the mixer runs it
    N = q.shape[-2]
    bias = q.new_zeros(mixer.num_heads, N, N)  # (heads, N, N)
    allowed = torch.zeros(N, N, dtype=torch.bool, device=x.device)  # (N, N)
    # The mixer's own windows (real tokens only) and, in shifted layers, its mask between shift regions.
    groups, _ = window_groups(grid, mixer.window_size, mixer.shift, x.device)
    for group in groups:
        query, key = group.tokens[:, :, None], group.tokens[:, None, :]  # (nW, L, 1), (nW, 1, L)
        window_bias = mixer.relative_position_bias_table[group.bias_index]  # (L, L, heads)
        bias[:, query, key] = rearrange(window_bias, "i j h -> h 1 i j")  # the same in every window of the group
        allowed[query, key] = True if group.mask is None else group.mask == 0
    logits = (q * scale) @ k.transpose(-2, -1) + bias  # (B, heads, N, N)
    return logits.masked_fill(~allowed, float("-inf")).softmax(dim=-1)  # (B, heads, N, N)


def neighborhood_matrix(mixer: NeighborhoodAttention, x: Tensor, grid: Grid, *, scaled: bool = True) -> Tensor:
    """Neighbourhood attention matrices over the whole grid: each query's softmax over its k x k keys.

    The logits are the mixer's (``q k^T * scale`` plus NAT's relative position bias ``rpb``) at the pairs
    `mixers.neighborhood.neighbourhood_index` names; every other pair gets no weight at all.

    Args:
        mixer: a `neighborhood` module.
        x: its input tokens (B, N, C).
        grid: the token grid (H, W).
        scaled: as `attention_matrix`.

    Returns:
        (B, heads, N, N), exactly zero outside each query's neighbourhood; ``A @ v`` is the mixer's output before
        `proj`.
    """
    q, k, _ = rearrange(mixer.qkv(x), "b n (three h d) -> three b h n d", three=3, h=mixer.num_heads)
    scale = mixer.scale if scaled else 1.0
    n = grid[0] * grid[1]
    keys, bias_index = neighbourhood_index(grid, mixer.kernel_size, 2 * mixer.kernel_size - 1, x.device)  # (N, kk)
    queries = torch.arange(n, device=x.device)[:, None].expand_as(keys)  # (N, kk)
    logits = (q * scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
    if mixer.rpb is not None:
        bias = torch.zeros(mixer.num_heads, n, n, dtype=logits.dtype, device=x.device)
        bias[:, queries, keys] = mixer.rpb.flatten(1)[:, bias_index].to(logits.dtype)  # (heads, N, kk) scattered
        logits = logits + bias
    allowed = torch.zeros(n, n, dtype=torch.bool, device=x.device)
    allowed[queries, keys] = True
    return logits.masked_fill(~allowed, float("-inf")).softmax(dim=-1)  # (B, heads, N, N)


def linear_matrix(mixer: LinearAttention, x: Tensor) -> Tensor:
    """The N x N matrix that non-causal linear attention applies to its values, never formed by the mixer.

    ``A[i, j] = phi(q_i) . phi(k_j) / (phi(q_i) . sum_j phi(k_j) + N eps)``: the mixer computes
    ``phi(q_i) (mean_j phi(k_j)^T v_j) / (phi(q_i) . mean_j phi(k_j) + eps)``, which is this matrix times v.

    Args:
        mixer: a `linear` module.
        x: its input tokens (B, N, C).

    Returns:
        (B, heads, N, N); each row sums to just under 1 (the eps); ``A @ v`` is the mixer's output before `proj`.
    """
    qkv = rearrange(mixer.qkv(x), "b n (three h d) -> three b h n d", three=3, h=mixer.num_heads)
    compute = torch.promote_types(qkv.dtype, torch.float32)  # the mixer's state is float32 (float64 stays)
    q, k = mixer.feature_map(qkv[0].to(compute)), mixer.feature_map(qkv[1].to(compute))  # (B, heads, N, head_dim)
    scores = q @ k.transpose(-2, -1)  # (B, heads, N, N)
    n = x.shape[1]
    return scores / (scores.sum(dim=-1, keepdim=True) + n * mixer.eps)


def gradient_row(mixer: nn.Module, x: Tensor, grid: Grid, query: int) -> Tensor:
    """The gradient fallback: ``||d y_query / d x_j||_F`` for every input token j (one layer's receptive field).

    All C output channels of the query go back in one batched backward (`is_grads_batched`); a mixer whose ops
    cannot be batched that way falls back to one backward per channel.

    Args:
        mixer: any token mixer (`forward(x, grid)`).
        x: its input tokens (1, N, C).
        grid: the token grid (H, W).
        query: the output token, row-major index into the grid.

    Returns:
        (N,) non-negative Frobenius norms of the (C x C) Jacobian blocks.
    """
    with torch.inference_mode(False), torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)  # a clone: x may be an inference tensor, which autograd refuses
        out = mixer(x, grid)[0, query]  # (C,)
        channels = out.shape[0]
        try:
            eye = torch.eye(channels, dtype=out.dtype, device=out.device)  # (C, C): one output channel each
            (grads,) = torch.autograd.grad(out, x, eye, retain_graph=True, is_grads_batched=True)  # (C, 1, N, C)
            squares = grads[:, 0].double().pow(2).sum((0, 2))  # (N,)
        except RuntimeError:  # an op without a batching rule
            squares = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
            for c in range(channels):
                (grad,) = torch.autograd.grad(out[c], x, retain_graph=c < channels - 1)
                squares += grad[0].double().pow(2).sum(-1)  # (N,)
    return squares.sqrt()


def conv_row(grid: Grid, query: int, kernel_size: int = 3) -> Tensor:
    """The fixed neighbourhood a k x k convolution over the token grid reads for `query`: 1/k^2 inside, 0 out.

    Returns:
        (N,) float64; cropped at the grid's border (zero padding), so a corner token reads 4 of 9 cells.
    """
    H, W = grid
    r, c = divmod(query, W)
    half = kernel_size // 2
    row = torch.zeros(H, W, dtype=torch.float64)
    row[max(r - half, 0):r + half + 1, max(c - half, 0):c + half + 1] = 1.0 / kernel_size**2
    return row.reshape(-1)


def mixing_maps(mixer: nn.Module, x: Tensor, grid: Grid, *, scaled: bool = True) -> MixingMaps | None:
    """Every query's mixing rows of a mixer with an exact map, for one input; None for the gradient fallback.

    Args:
        mixer: a token mixer module.
        x: its input tokens (1, N, C), e.g. the block's norm1 output at one layer.
        grid: the token grid (H, W).
        scaled: keep the 1/sqrt(head_dim) scale of attention, swin and neighborhood; False removes it.

    Returns:
        `MixingMaps`, or None where only the gradient fallback (one query at a time) applies.
    """
    if x.dim() != 3 or x.shape[0] != 1:
        raise ValueError(f"mixing_maps takes one image's tokens (1, N, C), got {tuple(x.shape)}")
    family = family_of(mixer)
    scale_note = "" if scaled else ", 1/sqrt(d) scale removed"
    with torch.inference_mode():
        if family == "attention":
            matrix = attention_matrix(mixer, x, scaled=scaled)
            note = f"softmax(q k^T / sqrt(d)) row per head{scale_note}"
        elif family == "swin":
            matrix = swin_matrix(mixer, x, grid, scaled=scaled)
            shifted = f"shifted by {mixer.shift}" if mixer.shift else "not shifted"
            note = f"softmax row inside the {mixer.window_size} x {mixer.window_size} window ({shifted}), zero " \
                   f"outside{scale_note}"
        elif family == "neighborhood":
            matrix = neighborhood_matrix(mixer, x, grid, scaled=scaled)
            kh, kw = clipped_kernel(grid, mixer.kernel_size)
            note = f"softmax row over the {kh} x {kw} neighbourhood (shifted inwards at the border), zero " \
                   f"outside{scale_note}"
        elif family == "linear":
            matrix = linear_matrix(mixer, x)
            note = "phi(q_i).phi(k_j) / phi(q_i).sum_j phi(k_j), phi = elu + 1 (no scale to remove)"
        elif family == "mamba":
            rows = mamba_map_rows(mixer, x)
            return MixingMaps(family, 1, ("both directions", "forward", "backward"),
                              f"selective scan unrolled, |alpha| averaged over {mixer.d_inner} channels; without "
                              "the causal conv before it and the D skip and silu(z) gate after it",
                              lambda query: rows(query)[None])
        elif family == "vmamba":
            rows = vmamba_map_rows(mixer, x, grid)
            return MixingMaps(family, 1, ("all four scans", *VMAMBA_SCANS),
                              f"each scan unrolled, |alpha| averaged over {mixer.d_inner} channels (all four: "
                              "their sum, as the cross-merge); without the 3 x 3 depthwise conv before and the D "
                              "skip, norm and gate after", lambda query: rows(query)[None])
        elif family == "gla":
            return MixingMaps(family, mixer.num_heads, ("both directions", "forward", "backward"),
                              "|scale q_t.(k_s * decay t<-s)| per head (both: the two directions summed, as the "
                              "mixer does); before the per-head RMSNorm and the output gate", gla_map_rows(mixer, x))
        elif family == "mamba2":
            return MixingMaps(family, mixer.nheads, MAMBA2_PARTS,
                              "|Hydra's quasiseparable matrix| per head: forward SSD below the diagonal, backward "
                              "above, fc_D(u) + D on it; without the conv before and the RMSNorm and silu(z) gate "
                              "after", mamba2_map_rows(mixer, x))
        else:
            return None
        matrix = matrix[0]  # (heads, N, N)
        return MixingMaps(family, matrix.shape[0], ("",), note, lambda query: matrix[:, None, query])


def mixing_rows(mixer: nn.Module, x: Tensor, grid: Grid, query: int, *, scaled: bool = True) -> MixingRows:
    """The mixing row of token `query` for any mixer, by its family (see the module docstring).

    Args:
        mixer: a token mixer module.
        x: its input tokens (1, N, C), e.g. the block's norm1 output at one layer.
        grid: the token grid (H, W).
        query: the query (output) token, row-major index into the grid.
        scaled: as `mixing_maps`.

    Returns:
        `MixingRows`.
    """
    if not 0 <= query < grid[0] * grid[1]:
        raise ValueError(f"query token {query} is outside the {grid[0]} x {grid[1]} grid")
    maps = mixing_maps(mixer, x, grid, scaled=scaled)
    if maps is not None:
        return maps.row(query)
    rows = gradient_row(mixer, x, grid, query)[None]  # (1, N)
    return MixingRows("gradient", rows, ("gradient",), "gradient fallback: ||d y_i / d x_j|| over channels, one layer")
