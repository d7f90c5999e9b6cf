"""runs.csv: append-only, one row per point, safe against being killed at any moment.

Each row is written with a single `write` of a complete line followed by `fsync`, so a run killed mid-sweep
(SIGKILL included) loses no row that was written. If the machine dies inside that write, the half line has no
newline: reading ignores it and the next append cuts it off before writing.
"""
from __future__ import annotations

import csv
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
    """Appends one complete row, writing the header first when the file is new."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"row has columns outside the schema: {sorted(unknown)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    if path.exists():
        _drop_partial_line(path)
        if path.stat().st_size:
            _upgrade_header(path)
    if not path.exists() or path.stat().st_size == 0:
        writer.writeheader()
    writer.writerow({column: _cell(row.get(column)) for column in COLUMNS})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, buffer.getvalue().encode())
        os.fsync(fd)
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
