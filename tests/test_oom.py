"""What reads as out of memory: the exact strings CUDA's libraries raise when their own allocation fails, and the
one-way import of the check (run, graphed and throughput each import `experiments.measure.oom`, none another)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from experiments.measure.oom import is_out_of_memory

MEASURE = Path(__file__).resolve().parents[1] / "experiments" / "measure"

# The messages as torch raises them (c10/cuda and ATen's cuBLAS, cuDNN and cuSOLVER checks).
LIBRARY_ALLOCATION_FAILURES = [
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul( ltHandle, computeDesc.descriptor(), ...)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`",
    "cuFFT error: CUFFT_ALLOC_FAILED",
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
]


@pytest.mark.parametrize("message", LIBRARY_ALLOCATION_FAILURES)
def test_cuda_library_allocation_failures_read_as_out_of_memory(message: str) -> None:
    """The batch-`max` search halves on these instead of ending the point with an error (issue 34, item 9)."""
    assert is_out_of_memory(RuntimeError(message))


@pytest.mark.parametrize("message", [
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, ...)`",
    "cuDNN error: CUDNN_STATUS_BAD_PARAM",
    "CUDA error: an illegal memory access was encountered",
])
def test_other_cuda_library_failures_stay_errors(message: str) -> None:
    assert not is_out_of_memory(RuntimeError(message))


def test_cuda_out_of_memory_error_reads_as_out_of_memory() -> None:
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))


@pytest.mark.parametrize("module", ["run.py", "graphed.py", "throughput.py"])
def test_the_out_of_memory_check_is_imported_one_way(module: str) -> None:
    """No import circle: graphed and throughput never import run, and all three take the check from oom."""
    tree = ast.parse((MEASURE / module).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
    assert "oom" in imported
    if module != "run.py":
        assert "run" not in imported
