"""The results folder of a sweep: checked before any point runs, and held by one sweep at a time.

Two sweeps appending to one runs.csv would measure each point twice, time each against the other and write the
same checkpoints; the second one is refused with who holds the folder. The lock is `fcntl.flock` on
`<out>/.sweep.lock`, so it is released by the kernel when its holder exits, however it exits (SIGKILL included),
and a stale lock file never blocks a later sweep.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import os
import socket
from pathlib import Path

LOCK_NAME = ".sweep.lock"


class OutDirError(ValueError):
    """The results folder cannot be used; the message says why and what to do, in one line."""


def check_out_dir(out_dir: Path) -> None:
    """Refuses a folder that cannot hold results, without creating anything.

    Raises:
        OutDirError: `out_dir` is a file, lies under a file, or is not writable (nor creatable).
    """
    existing = out_dir
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "is a file" if existing == out_dir else f"lies under {existing}, which is a file"
        raise OutDirError(f"--out {out_dir} {where}; choose a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is" if existing == out_dir else f"cannot be created: {existing}"
        raise OutDirError(f"--out {out_dir} {what} not writable; choose a folder you can write to")
    runs = out_dir / "runs.csv"
    if runs.exists() and not os.access(runs, os.W_OK):
        raise OutDirError(f"{runs} is read-only; make it writable or choose another --out")


class SweepLock:
    """An exclusive lock on a results folder for the life of one sweep (a context manager).

    Raises:
        OutDirError: on entry, when another sweep holds the folder (its pid, host and start time) or the lock
            file cannot be written.
    """

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> SweepLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise OutDirError(f"cannot create {self.path}: {error.strerror or error}; choose another --out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "a process that wrote no details"
            os.close(fd)
            raise OutDirError(f"{self.path.parent} is in use by another sweep ({holder}); wait for it to end "
                              "or choose another --out") from None
        started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode(), 0)
        except OSError as error:  # a full disk at the start: nothing has run, say so before anything does
            os.close(fd)
            raise OutDirError(f"cannot write {self.path}: {error.strerror or error}; free space (or choose another "
                              "--out) and rerun") from None
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # a later reader finds no holder's details in a free lock
            os.close(self._fd)  # releases the flock
            self._fd = None
