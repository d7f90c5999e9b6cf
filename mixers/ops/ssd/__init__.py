"""Mamba-2's state-space duality (Dao & Gu, "Transformers are SSMs", ICML 2024), causal, one scalar decay per head
and step: `h_t = exp(a_t) h_{t-1} + x_t b_t^T`, `y_t = h_t c_t`, with B and C shared by all heads (one group)."""
from .chunk import chunk_ssd, chunk_ssd_macs, decay_matrix, segsum
from .cpp_ssd import ssd_hydra_cpp, ssd_recurrent_cpp
from .matrix import HydraMatrix, hydra_matrix, ssd_matrix
from .naive import naive_ssd

__all__ = ["HydraMatrix", "chunk_ssd", "chunk_ssd_macs", "decay_matrix", "hydra_matrix", "naive_ssd", "segsum",
           "ssd_hydra_cpp", "ssd_matrix", "ssd_recurrent_cpp"]
