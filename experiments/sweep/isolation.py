"""Runs one point in a child process, so an out-of-memory, a hang or a hard crash costs only that point.

Children are forked from a fork server that imported torch and the models once and never ran an op: a point
starts in milliseconds instead of paying torch's import again, CUDA is initialised fresh in each child, and no
child inherits an OpenMP thread pool (forking a process that has run torch ops on the CPU can deadlock the child
at its first parallel region, because libgomp's threads do not survive a fork).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable
from functools import lru_cache

from ..measure.point import Point
from .machine import busy_cores, openmp_wait_policy

Row = dict[str, object]


def _limit_address_space(extra_mb: int) -> None:
    """Caps what the child may add to its address space (CPU runs), to emulate a machine with less memory."""
    with open("/proc/self/status") as f:
        current_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    limit = (current_kb * 1024) + extra_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _exit_with(sweep_pid: int) -> None:
    """Ends this point when the sweep that started it is gone (killed with SIGKILL, say).

    The point is a child of the fork server, not of the sweep, so nothing else would stop it: it would train on,
    writing the checkpoint that a resumed sweep is also writing.
    """

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(sweep_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # the pid exists (reused by another user's process): keep going
                pass

    threading.Thread(target=watch, name="exit-with-sweep", daemon=True).start()


def _child(target: Callable[[Point], Row], point: Point, conn, sweep_pid: int) -> None:
    # The point leads its own process group, and pools it starts (data generation) fork from it, so they are in
    # that group: a point killed at its time limit takes them along (pools started through the fork server were
    # its children, outlived the point, and left their semaphores to the resource tracker's shutdown warning).
    os.setpgrp()
    mp.set_start_method("fork", force=True)
    _exit_with(sweep_pid)
    try:
        if point.memory_limit_mb:
            _limit_address_space(point.memory_limit_mb)
        row = target(point)
    except BaseException as error:  # noqa: BLE001 - report, never die silently
        row = {"status": _failure_status(error, point),
               "error": f"worker: {type(error).__name__}: {error}"[:500], "traceback": traceback.format_exc()}
    _send_or_exit(conn, row)


def _send_or_exit(conn, row: Row) -> None:
    """Sends the row; when the sweep is gone (killed: the pipe's other end is closed) nobody reads it, so the
    point exits quietly instead of printing a BrokenPipeError traceback into the user's terminal."""
    try:
        conn.send(row)
    except (BrokenPipeError, ConnectionResetError):
        os._exit(1)
    finally:
        conn.close()


def _failure_status(error: BaseException, point: Point) -> str:
    """oom or error, for what escaped the point's own handling (a thread that could not start, say)."""
    try:
        from ..measure.oom import is_out_of_memory  # loaded in the fork server already: no new allocation
    except BaseException:  # noqa: BLE001 - a child too short of memory to import still reports its row
        return "error"
    return "oom" if is_out_of_memory(error, bool(point.memory_limit_mb)) else "error"


# glibc's malloc, as the fork server's points inherit it: freed blocks under 32 MiB stay in the heap, and the heap
# keeps up to 256 MiB of free space, instead of glibc's own thresholds, which move with what the process happened
# to free before. Left to them, a model whose forward frees many mid-sized tensors (mamba's, at 1,024 tokens)
# gave its pages back after every call and faulted them in again on the next, so it was timed slower in a fresh
# process than after another model had run (results/README.md, "Measurement protocol"). A value the user set is
# kept; other C libraries ignore these names.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(256 * 2**20)}


@lru_cache(maxsize=1)
def _context() -> mp.context.BaseContext:
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    # Set before the fork server starts (it and every point inherit it; OpenMP reads it when torch loads): passive
    # waits where other work keeps a core busy now, the runtime's default on a quiet machine (openmp_wait_policy).
    # A value the user set is kept; rows record what the points ran with (`omp_wait_policy`).
    if "OMP_WAIT_POLICY" not in os.environ and (policy := openmp_wait_policy(busy_cores(0.5))):
        os.environ["OMP_WAIT_POLICY"] = policy
    for name, value in MALLOC_ENV.items():
        os.environ.setdefault(name, value)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["experiments.measure.run"])
    return ctx


def run_isolated(target: Callable[[Point], Row], point: Point, timeout_s: float) -> Row:
    """`target(point)` in a fresh child; a timeout or a dead child becomes a row with that status.

    `target` must be importable by name (a module-level function), as the child unpickles it.
    """
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    # Not a daemon: a point may start worker pools of its own (data generation). It is killed below whatever
    # happens, so it never outlives the sweep.
    process = ctx.Process(target=_child, args=(target, point, send, os.getpid()))
    process.start()
    send.close()
    row: Row | None = None
    try:
        if receive.poll(timeout_s):
            try:
                row = receive.recv()
            except EOFError:
                row = None
        else:
            row = {"status": "timeout", "error": f"no result within {timeout_s:g} s; the worker was killed"}
    finally:
        if process.is_alive():
            process.join(5 if row is not None and row.get("status") != "timeout" else 0)
        if process.is_alive():
            process.kill()
        process.join()
        kill_group(process.pid)
        if getattr(point, "compile", ""):  # a point killed while compiling could not remove its inductor cache itself
            from ..measure.compiled import point_cache_dir

            shutil.rmtree(point_cache_dir(process.pid), ignore_errors=True)
    if row is None:
        row = _death_row(process.exitcode, point.memory_limit_mb)
    row.pop("traceback", None)
    return row


def kill_group(pgid: int) -> None:
    """Ends what is left of a point's process group (worker pools of a point that was killed or exited)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _death_row(exitcode: int | None, memory_limit_mb: int = 0) -> Row:
    if exitcode == -signal.SIGKILL:
        return {"status": "oom", "error": "worker killed by SIGKILL, the usual sign of the kernel's OOM killer"}
    if exitcode == -signal.SIGABRT and memory_limit_mb:
        # Under the cap a C++ allocation or thread start that fails where nothing catches it (std::bad_alloc,
        # std::system_error EAGAIN in a worker thread) ends in std::terminate, that is SIGABRT.
        return {"status": "oom", "error": f"worker aborted (SIGABRT) under the {memory_limit_mb} MiB memory limit, "
                "the usual sign of an allocation or thread start the limit refused"}
    return {"status": "error", "error": f"worker died with exit code {exitcode} before reporting"}
