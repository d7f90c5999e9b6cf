"""Gated linear attention (Yang et al., "Gated Linear Attention Transformers with Hardware-Efficient Training",
ICML 2024), causal: `S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T`, `o_t = scale * q_t^T S_t`."""
from .chunk import chunk_gla, chunk_gla_macs
from .cpp_gla import gla_both_ways_cpp, gla_recurrent_cpp
from .fla_chunk import fla_chunk_gla, fla_unavailable_reason
from .naive import naive_recurrent_gla

__all__ = ["chunk_gla", "chunk_gla_macs", "fla_chunk_gla", "fla_unavailable_reason", "gla_both_ways_cpp",
           "gla_recurrent_cpp", "naive_recurrent_gla"]
