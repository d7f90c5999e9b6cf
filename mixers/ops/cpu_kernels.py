"""Builds and loads the project's compiled CPU kernels: plain C++ on raw pointers, no torch headers, called
through ctypes (which releases the GIL).

Each kernel's source is built on first use by `torch.utils.cpp_extension.load` into torch's extension cache
(`TORCH_EXTENSIONS_DIR`, else ~/.cache/torch_extensions): about a second with g++, then reused until the source
changes. The library's name carries its ABI version, the vector instructions it was built for and its threading,
so a cache shared by two CPUs or two versions never loads the wrong build. Where nothing can be built (no
compiler, or `MIXERBENCH_CPP_SCAN=0`) `build` returns the reason and the callers run their PyTorch forms.
"""
from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import torch

# Set to 0 to never build or load a compiled CPU kernel (the scan's `auto` then picks `torch_stream`, the conv
# runs as PyTorch ops). Named for the first kernel it switched off.
ENABLE_ENV = "MIXERBENCH_CPP_SCAN"

# Builds tried in order: with OpenMP, so the kernels run on torch's own OpenMP pool where torch has loaded
# libgomp.so.1 (cpp_scan.cpp's parallel_items says why that matters), else without it (the scan then starts
# std::threads; an `omp parallel` loop runs on one thread).
THREADING: tuple[tuple[str, list[str]], ...] = (("omp", ["-fopenmp"]), ("threads", ["-fopenmp-simd"]))


def vector_isa() -> tuple[str, list[str]]:
    """The vector instructions to build for, from torch's own dispatch on this CPU: AVX-512 (16 floats a vector,
    one per block of the scan) where it found AVX-512, AVX2 with FMA (8 floats) where it found AVX2, else the
    compiler's baseline (SSE2 on x86-64, 4 floats; NEON on arm64). The name goes into the cached library's name.

    AVX-512 is taken where there is one: even on AMD's Zen 4, which splits a 512-bit operation in two, the scan's
    forward at long L ran faster than the AVX2 build (both timed side by side on one quiet machine; the exactness
    tests are the same for every build).
    """
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":
        return "avx512", ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma"]
    if capability == "AVX2":
        return "avx2", ["-mavx2", "-mfma"]
    return "baseline", []


def build(what: str, stem: str, source: Path, abi_version: int, abi_symbol: str, entry_points: Sequence[str],
          threading: Sequence[tuple[str, list[str]]] = THREADING) -> ctypes.CDLL | str:
    """The library built from `source`, or why it cannot be had (one line).

    Args:
        what: the kernel's name in messages ("C++ scan").
        stem: the library's name before its version, ISA and threading.
        source: the C++ file.
        abi_version: what `abi_symbol()` must return; bumped with the entry points' signatures, so a stale cached
            build is never called.
        abi_symbol: the library's function that reports its ABI version.
        entry_points: functions returning nothing, whose restype is set so.
        threading: the builds to try, in order (a test breaks the first).
    """
    if os.environ.get(ENABLE_ENV, "1").strip() == "0":
        return f"disabled by {ENABLE_ENV}=0"
    # cpp_extension logs a CUDA_HOME warning on import on a CUDA build without a GPU; it concerns nvcc only.
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension

        isa, isa_flags = vector_isa()
        errors = []
        for name, flags in threading:
            try:
                path = cpp_extension.load(
                    name=f"{stem}_v{abi_version}_{isa}_{name}",
                    sources=[str(source)],
                    extra_cflags=["-O3", "-std=c++17", "-fno-trapping-math", *flags, *isa_flags],
                    extra_ldflags=flags,
                    is_python_module=False,
                    verbose=False,
                )
                lib = ctypes.CDLL(str(path))
                break
            except Exception as err:  # noqa: BLE001 - any build or load failure: try the next, then PyTorch
                errors.append(f"{name}: {type(err).__name__}: {str(err).strip()[:300]}")
        else:
            return f"the {what} could not be built or loaded ({'; '.join(errors)})"
    finally:
        logger.setLevel(level)
    found = getattr(lib, abi_symbol)()
    if found != abi_version:
        return f"the cached {what} library has ABI {found}, expected {abi_version}"
    for entry in entry_points:
        getattr(lib, entry).restype = None
    return lib


def last_adjacent(t: torch.Tensor) -> torch.Tensor:
    """t as it is where its last dimension is adjacent (stride 1, or a size of 1), else a contiguous copy: the
    kernels read any strides but the last dimension's. The caller holds the result while the kernel runs (a copy
    made inside a call's arguments would be freed before it)."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def threads() -> ctypes.c_int:
    """The thread count a kernel call is given: torch's own (`torch.get_num_threads()`), at least one."""
    return ctypes.c_int(max(1, torch.get_num_threads()))


def pointer(t: torch.Tensor | None) -> ctypes.c_void_p:
    """t's data as a kernel's argument; null for an absent optional tensor."""
    return ctypes.c_void_p(None if t is None else t.data_ptr())


def takes(tensors: Sequence[torch.Tensor | None], dtypes: Collection[torch.dtype], unavailable: Callable[[], str | None]
          ) -> bool:
    """Whether a compiled kernel takes these tensors (None for absent optional ones): all on the CPU in one dtype of
    `dtypes`, and its library built (`unavailable`, the kernel's `unavailable_reason`, gives None)."""
    given = [t for t in tensors if t is not None]
    dtype = given[0].dtype
    return dtype in dtypes and all(t.device.type == "cpu" and t.dtype == dtype for t in given) and unavailable() is None


def failure(lib: ctypes.CDLL | str) -> str | None:
    """None where `build` gave a library, else the reason it gave (each kernel's `unavailable_reason`)."""
    return lib if isinstance(lib, str) else None


def loaded(lib: ctypes.CDLL | str) -> ctypes.CDLL:
    """`lib` where `build` gave a library, else a RuntimeError with the reason it gave."""
    if isinstance(lib, str):
        raise RuntimeError(lib)
    return lib
