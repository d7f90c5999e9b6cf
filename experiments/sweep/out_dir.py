"""The results folder of a sweep: checked before any point runs, and held by one sweep at a time.

Two sweeps appending to one runs.csv would measure each point twice, time each against the other and write the
same checkpoints; the second one is refused with who holds the folder. The lock is `fcntl.flock` on
`<out>/.sweep.lock`, so it is released by the kernel when its holder exits, however it exits (SIGKILL included),
and a stale lock file never blocks a later sweep.

A sweep never deletes or overwrites a file it did not write: it refuses a folder that holds files but no runs.csv
(unless told to reuse it), and any runs.csv, tables/, figures/ or summary.md there that is a symbolic link.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import os
import re
import socket
from pathlib import Path

from ..report.manifest import (
    MANIFEST_NAME, SUMMARY_NAME, ForeignFileError, check_overwrites, read_manifest, refuse_special_files,
    refuse_symlinks,
)

LOCK_NAME = ".sweep.lock"
# What a sweep leaves in its folder before the first row of runs.csv: the lock, submitit's job folder, a report's
# manifest or staging folder (".report-..."), and a killed first training point's checkpoints/ and erf/ (named by
# point digests). A folder holding only these counts as empty, so the killed sweep resumes without --reuse-out.
_HIDDEN_NAMES = (LOCK_NAME, ".submitit", MANIFEST_NAME)
_SWEEP_DIRS = ("checkpoints", "erf")
_DIGEST_NAME = re.compile(r"^\.?[0-9a-f]{16}(\.|$)")


class OutDirError(ValueError):
    """The results folder cannot be used; the message says why and what to do, in one line."""


def check_out_dir(out_dir: Path, *, reuse: bool = False, report: bool = True) -> None:
    """Refuses a folder that cannot hold results, or whose files the sweep could damage, without creating anything.

    Args:
        out_dir: the sweep's results folder.
        reuse: accept a folder that holds files but no runs.csv (the user's `--reuse-out`); its files are kept.
        report: the sweep ends with a report, so a summary.md there must be one the report wrote.

    Raises:
        OutDirError: `out_dir` is a file, lies under a file, or is not writable (nor creatable); holds files but
            no runs.csv and `reuse` is off; has a symbolic link at runs.csv, tables/, figures/ or summary.md; or
            holds a summary.md that the report did not write.
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
    if existing != out_dir:
        return  # a new folder: nothing in it to protect
    try:
        refuse_symlinks(out_dir)
        refuse_special_files(out_dir)
    except ForeignFileError as error:
        raise OutDirError(str(error).replace("choose another folder", "choose another --out")) from None
    runs = out_dir / "runs.csv"
    if not runs.exists() and not reuse:
        foreign = sorted(entry.name for entry in out_dir.iterdir() if not _left_by_a_sweep(entry))
        if foreign:
            raise OutDirError(f"--out {out_dir} holds files but no runs.csv ({', '.join(foreign[:3])}"
                              f"{', ...' if len(foreign) > 3 else ''}); choose an empty or new folder, or add "
                              "--reuse-out to write the sweep beside them (none is deleted)")
    if runs.exists() and not os.access(runs, os.W_OK):
        raise OutDirError(f"{runs} is read-only; make it writable or choose another --out")
    if report:
        try:
            check_overwrites(out_dir, [SUMMARY_NAME], read_manifest(out_dir))
        except ForeignFileError:
            raise OutDirError(f"{out_dir / SUMMARY_NAME} was not written by the report, which would overwrite it; "
                              "move it away, choose another --out, or add --no-report") from None
        # A table of the report's name that the report did not write (--reuse-out beside a user's
        # tables/costs.csv) is refused now, not after every point ran; other names there are the user's to keep.
        from ..report.build import TABLE_CAPTIONS

        tables = [f"tables/{stem}{suffix}" for stem in TABLE_CAPTIONS for suffix in (".csv", ".md", ".tex")]
        try:
            check_overwrites(out_dir, tables, read_manifest(out_dir))
        except ForeignFileError as error:
            raise OutDirError(f"{str(error).split('; move it', 1)[0]}; move it away, choose another --out, or add "
                              "--no-report") from None


def _left_by_a_sweep(entry: Path) -> bool:
    """Whether a folder entry is one a sweep writes before its first row (see `_SWEEP_DIRS`)."""
    if entry.is_symlink():
        return False
    if entry.name in _HIDDEN_NAMES or entry.name.startswith(".report-"):
        return True
    if entry.name in _SWEEP_DIRS and entry.is_dir():
        return all(_DIGEST_NAME.match(child.name) for child in entry.iterdir())
    return False


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
