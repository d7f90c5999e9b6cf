"""A training's learning curve on disk: `<sweep>/curves/<key hash>.csv`, one row per evaluation.

Each row repeats the point's key columns, then the `CURVE_COLUMNS` of `experiments/schema.py`. The whole file is
rewritten atomically at every evaluation (write beside it, then rename): a curve holds a few dozen rows, so the
rewrite is cheap, and a training killed at any moment leaves the previous complete file, never a half row. A
resumed training rewrites the file from the curve its checkpoint holds, so rows written after that checkpoint (by
the killed run) are replaced by the resumed run's own, which equal them on a CPU (wall_s aside).
"""
from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..schema import CURVE_COLUMNS, KEY_COLUMNS


def curve_cell(value: object) -> object:
    """A curve value as the CSV holds it: None is empty, a bucket dict is JSON, floats keep full precision."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return json.dumps({k: round(v, 5) for k, v in value.items()}) if value else ""
    return value


def write_curve(path: Path, key: Mapping[str, object], rows: Sequence[Mapping[str, object]]) -> None:
    """Writes the whole curve of one point to `path`, atomically.

    Args:
        path: the curve file (its folder is made).
        key: the point's key columns (`KEY_COLUMNS`), repeated on every row so the report joins by key.
        rows: one mapping of `CURVE_COLUMNS` per evaluation, in order.
    """
    unknown = {name for row in rows for name in row} - set(CURVE_COLUMNS)
    if unknown:
        raise ValueError(f"curve rows have columns outside CURVE_COLUMNS: {sorted(unknown)}")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=KEY_COLUMNS + CURVE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**{k: key.get(k, "") for k in KEY_COLUMNS}, **{k: curve_cell(row.get(k)) for k in CURVE_COLUMNS}})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="") as handle:
            handle.write(buffer.getvalue())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_curve(path: Path) -> list[dict[str, str]]:
    """The rows of a curve file as strings (what the report reads)."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))
