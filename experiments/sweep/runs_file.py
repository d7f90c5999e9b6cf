"""runs.csv: append-only, one row per point, safe against being killed at any moment.

Each row is written with a single `write` of a complete line followed by `fsync`, so a run killed mid-sweep
(SIGKILL included) loses no row that was written. If the machine dies inside that write, the half line has no
newline: reading ignores it and the next append cuts it off before writing. A write that fails (a full disk)
cuts the file back to its earlier rows and stops the sweep with one line. A runs.csv that is a symbolic link (a
dangling one included) is refused, never followed: it would write rows, or create a file, wherever it points.
"""
from __future__ import annotations

import csv
import errno
import io
import os
from pathlib import Path

from ..measure.point import point_key
from ..runs_csv import RunsFileError, read_rows
from ..schema import COLUMNS

__all__ = ["RunsFileError", "append_row", "latest_by_key", "read_rows"]


def _upgrade_header(path: Path) -> None:
    """Rewrites a file of an earlier version with today's header (old rows get empty new cells), atomically."""
    with path.open(newline="") as f:
        header = tuple(next(csv.reader(f), ()))
    if header == COLUMNS:
        return
    rows = read_rows(path)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    temporary = path.with_name(path.name + ".upgrade")
    temporary.write_text(buffer.getvalue())
    os.replace(temporary, path)


def _drop_partial_line(path: Path) -> None:
    with path.open("rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def append_row(path: Path, row: dict[str, object]) -> None:
    """Appends one complete row, writing the header first when the file is new.

    Raises:
        RunsFileError: the row could not be written whole (disk full, a write error); the file is cut back to
            the rows before it, so nothing written earlier is lost and no half row is left. Or `path` is a
            symbolic link, which is never followed.
    """
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"row has columns outside the schema: {sorted(unknown)}")
    if path.is_symlink():
        raise RunsFileError(f"{path} is a symbolic link; rows are never written through links: replace it with "
                            "a real file or choose another --out")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            _drop_partial_line(path)
            if path.stat().st_size:
                _upgrade_header(path)
        if not path.exists() or path.stat().st_size == 0:
            writer.writeheader()
        writer.writerow({column: _cell(row.get(column)) for column in COLUMNS})
        _write_all(path, buffer.getvalue().encode())
    except OSError as error:
        raise RunsFileError(f"cannot write a row to {path}: {error.strerror or error}; the sweep stopped, every "
                            "earlier row is kept; free space (or fix the folder) and rerun to resume") from None


def _write_all(path: Path, data: bytes) -> None:
    """Appends `data` whole and syncs it, or cuts the file back to where it was and raises OSError.

    `os.write` may write less than asked (a full disk, a signal); the rest is written in further calls, and a
    call that writes nothing is a failure, never a silent loss.
    """
    # O_NOFOLLOW: a link put in place after the check above fails here (ELOOP) rather than being followed.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(errno.ENOSPC, f"wrote {len(data) - len(view)} of {len(data)} bytes")
                view = view[written:]
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def _cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def latest_by_key(rows: list[dict[str, str]]) -> dict[tuple[str, ...], dict[str, str]]:
    """The last row written for each point (a retried point appends a newer row)."""
    return {point_key(row): row for row in rows}
