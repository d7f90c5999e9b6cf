"""No token mixing at all: the negative control every accuracy result is read against (IdentityFormer)."""
from __future__ import annotations

from torch import Tensor

from .base import Grid, TokenMixer, check_tokens
from .registry import register_mixer


@register_mixer("identity")
class IdentityMixer(TokenMixer):
    """Returns its input, so no token ever sees another: the IdentityFormer of "MetaFormer Baselines for Vision"
    (Yu et al., 2022).

    What a trained model with this mixer scores is what the rest of the backbone (patch embedding, position
    embedding, per-token MLPs, pooling, head) gets without any mixing; a task on which it beats chance can be
    solved without relating tokens, so a mixer's score there says nothing about its reach. Under max pooling it
    solves reach, whose label only two tokens together decide (results/reach_pool shows it); under mean pooling and
    a linear head it cannot, since the logit is then a sum of one term per token.

    Args:
        dim: token channels C (unused).
        num_heads: accepted for the common mixer signature and ignored.
        layer_idx: unused.
    """

    impl = "identity"

    def __init__(self, dim: int, num_heads: int, *, layer_idx: int = 0) -> None:
        super().__init__()

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        check_tokens(x, grid)
        return x

    def macs(self, grid: Grid) -> int:
        """No multiply-accumulates: nothing is computed."""
        return 0
