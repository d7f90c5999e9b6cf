"""`torch.compile` for a point: compiled outside the timed samples, failures reported as compile failures, and an
inductor cache of the point's own.

The cache is per point because a point killed at its time limit while inductor writes a kernel leaves a truncated
shared object in the cache; with the shared default (/tmp/torchinductor_<user>) every later point that needs that
kernel then fails ("file too short"), in this sweep and in any other on the machine. A per-point folder also keeps
one point's compilation from being served from another's, so each compiled row paid its own compile.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from .point import Point

CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


class CompileFailed(RuntimeError):
    """`torch.compile` could not compile the point's model (a bad mode, a backend or C++ compiler error): the row
    is status error with a message that says so, never an eager timing under a compiled key."""


def point_cache_dir(pid: int) -> Path:
    """The inductor cache of the point running in process `pid`; the sweep removes it after a point it killed."""
    return Path(tempfile.gettempdir()) / f"mixerbench-inductor-{pid}"


@contextmanager
def own_inductor_cache() -> Iterator[Path]:
    """Points inductor at a fresh cache folder for this process while the block runs, then removes it and puts
    back the variable as it was."""
    path = point_cache_dir(os.getpid())
    previous = os.environ.get(CACHE_VARIABLE)
    os.environ[CACHE_VARIABLE] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop(CACHE_VARIABLE, None)
        else:
            os.environ[CACHE_VARIABLE] = previous
        shutil.rmtree(path, ignore_errors=True)


def compile_model(model: nn.Module, mode: str) -> nn.Module:
    """`torch.compile(model, mode=mode)`, with a refused mode reported as a compile failure.

    Compilation itself is lazy: it happens at the first call, which `compiled_first_call` makes outside timing.
    """
    try:
        return torch.compile(model, mode=mode)
    except Exception as error:  # noqa: BLE001 - whatever torch.compile raises, the point's compile failed
        raise CompileFailed(f"torch.compile failed (mode={mode}): {type(error).__name__}: {error}") from error


def compiled_first_call(call: Callable[[], object], point: Point,
                        is_out_of_memory: Callable[[BaseException], bool]) -> None:
    """For a compiled point, runs `call` once untimed, so compilation stays out of the timed samples whatever the
    protocol's warm-up count (0 in quick runs); an error dynamo or inductor raises there is a compile failure
    (an out-of-memory stays one). Eager points return at once: their warm-up is the protocol's.
    """
    if not point.compile:
        return
    from torch._dynamo.exc import TorchDynamoException  # loaded only where compilation runs

    try:
        call()
    except TorchDynamoException as error:
        if is_out_of_memory(error):
            raise
        # BackendCompilerFailed's own first line is only "backend='inductor' raised:"; the cause says what failed
        cause = getattr(error, "inner_exception", None) or error
        first = f"{type(cause).__name__}: {cause}".strip().splitlines()[0]
        raise CompileFailed(f"torch.compile failed (mode={point.compile}): {first}") from error
