"""The one reader of `runs.csv`, used by the sweep (what to skip, what to resume) and by the report (what to draw).

Standard library only, like `schema.py`, so the report can read a sweep's rows without importing torch.

One reader for both means they agree on every file: a torn last line (a sweep killed inside a write leaves a
line without its newline) is dropped by both, and a file the report could not use (a stray line, a cell that
breaks a key column, bytes that are not UTF-8) stops the sweep before it runs a point, not after the last one.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from .schema import COLUMNS, KEY_COLUMNS, OPTIONAL_KEY_COLUMNS

# Key columns added after the first sweeps were recorded, with the value an older runs.csv implies.
OPTIONAL_KEYS: dict[str, str] = {"train": "{}", **OPTIONAL_KEY_COLUMNS}

# Key columns that must hold an integer on every row: a row without them cannot be placed.
INTEGER_KEYS: tuple[str, ...] = ("img_size", "patch_size", "batch_size", "epochs", "seed")

_MOVE_AWAY = "move it away or choose another --out"


class RunsFileError(ValueError):
    """runs.csv cannot be used as it is; the message says where and what to do, in one line."""


def _check_header(path: Path, header: tuple[str, ...]) -> None:
    """An older version's header (a subset of today's columns with every key column) is readable; others not."""
    unknown = [c for c in header if c not in COLUMNS]
    missing_keys = [c for c in KEY_COLUMNS if c not in header and c not in OPTIONAL_KEYS]
    if unknown or missing_keys:
        raise RunsFileError(
            f"{path} was written with other columns (unknown: {', '.join(unknown) or 'none'}; missing key "
            f"columns: {', '.join(missing_keys) or 'none'}); {_MOVE_AWAY}"
        )


def _complete_text(path: Path) -> str:
    """The file's text up to its last newline: a torn last line (killed inside a write) is not a row."""
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        # A write cut inside a multi-byte character leaves at most 3 undecodable bytes at the very end.
        if error.start < len(data) - 3 or error.reason != "unexpected end of data":
            line = data[: error.start].count(b"\n") + 1
            raise RunsFileError(f"cannot parse {path}: line {line} is not UTF-8 text; {_MOVE_AWAY}") from None
    return complete.decode("utf-8")


def read_table(path: Path) -> tuple[tuple[str, ...], list[dict[str, str]]]:
    """The header and complete rows of `path`, each row a dict over the header's columns (cells as text).

    A missing or empty file is `((), [])`. Key columns an older version did not write (`OPTIONAL_KEYS`) are added
    with the value such a file implies.

    Raises:
        RunsFileError: the file is not UTF-8, not CSV, has columns of no version, a line whose cell count is not
            the header's, or a key column that is not an integer; the message names the line.
    """
    if not path.exists():
        return (), []
    if not path.is_file():
        raise RunsFileError(f"{path} is not a file; {_MOVE_AWAY}")
    text = _complete_text(path)
    reader = csv.reader(io.StringIO(text), strict=True, skipinitialspace=True)
    try:
        header = tuple(c.strip() for c in next(reader, ()))
        if not header:
            return (), []
        _check_header(path, header)
        rows = []
        for values in reader:
            if len(values) != len(header):
                if not values:  # a blank line
                    continue
                raise RunsFileError(f"cannot parse {path}: line {reader.line_num} has {len(values)} cells where the "
                                    f"header has {len(header)}; remove that line or {_MOVE_AWAY}")
            rows.append((reader.line_num, dict(zip(header, values))))
    except csv.Error as error:
        raise RunsFileError(f"cannot parse {path}: line {reader.line_num}: {error}; {_MOVE_AWAY}") from None
    for column in INTEGER_KEYS:
        bad = [line for line, row in rows if not _is_integer(row.get(column, "0"))]
        if bad:
            lines = ", ".join(str(line) for line in bad[:5])
            raise RunsFileError(f"{path}: column {column!r} is empty or not a number on line(s) {lines}; fix or "
                                f"remove those lines, or {_MOVE_AWAY}")
    for column, default in OPTIONAL_KEYS.items():
        for _, row in rows:
            if not row.get(column, "").strip():
                row[column] = default
    return header + tuple(c for c in OPTIONAL_KEYS if c not in header), [row for _, row in rows]


def _is_integer(cell: str) -> bool:
    try:
        return float(cell).is_integer()
    except ValueError:
        return False


def read_rows(path: Path) -> list[dict[str, str]]:
    """Complete rows of `path` (none if it does not exist), each with every one of today's columns.

    A file written by an earlier version, which lacked some of today's columns, reads with those cells empty.
    """
    _, rows = read_table(path)
    return [{column: row.get(column) or "" for column in COLUMNS} for row in rows]
