"""Whether an error is an out-of-memory: the one question the runner, the graphed regime and the batch-`max` search
all ask, kept here so each imports it one way (none of them imports another for it)."""
from __future__ import annotations

import errno

import torch

OOM_MARKERS = (
    "out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory",
    # CUDA libraries that allocate their own workspace report a refusal with their status code, not the words:
    # cuBLAS ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), cuDNN ("cuDNN error:
    # CUDNN_STATUS_ALLOC_FAILED"), cuSOLVER and cuSPARSE likewise, cuFFT as CUFFT_ALLOC_FAILED.
    "status_alloc_failed", "cufft_alloc_failed",
)
# Under an address-space cap (--memory-limit-mb, RLIMIT_AS) a failed allocation often surfaces as something else:
# oneDNN cannot allocate its scratchpad and reports that it "could not create a primitive", and a thread stack
# cannot be mapped, so starting a thread fails with EAGAIN ("Resource temporarily unavailable", Python's "can't
# start new thread"). Without a cap these mean a real fault (an unsupported shape, a process limit), so they are
# read as out of memory only when the point ran under one.
LIMIT_OOM_MARKERS = ("could not create a primitive", "resource temporarily unavailable", "can't start new thread")


def is_out_of_memory(error: BaseException, memory_limited: bool = False) -> bool:
    """CUDA's OutOfMemoryError, a CUDA library's allocation failure, or the CPU allocator's / Python's refusal.

    Args:
        error: what the point raised.
        memory_limited: the point ran under a memory cap; then the ways that cap shows besides an allocator's
            refusal (`LIMIT_OOM_MARKERS`, EAGAIN) count as out of memory too.
    """
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    if not isinstance(error, (RuntimeError, OSError)):
        return False
    message = str(error).lower()
    if any(m in message for m in OOM_MARKERS):
        return True
    if not memory_limited:
        return False
    return any(m in message for m in LIMIT_OOM_MARKERS) or getattr(error, "errno", None) in (errno.EAGAIN,
                                                                                            errno.ENOMEM)
