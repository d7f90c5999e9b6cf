"""A point's key as the report compares it, so a side file (an `erf/*.npz` map, a `curves/*.csv` curve) is matched
to its row of runs.csv whatever wrote it: JSON numbers and CSV text, an optional key the file lacks.

Side files are matched by their key columns (`schema.KEY_COLUMNS`), never by their file name: the hash in the
name is the sweep's, and a file copied in from elsewhere must not count as a row of this sweep.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

import pandas as pd

from ..runs_csv import OPTIONAL_KEYS
from ..schema import KEY_COLUMNS


def key_text(value: object) -> str:
    """A key cell as text, integers without ".0", so JSON and CSV values compare equal."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def normalised_key(key: Mapping[str, object]) -> dict[str, object]:
    """The key columns of `key`; an optional key it lacks (written before the column) or left empty reads as
    runs.csv reads it (`runs_csv.OPTIONAL_KEYS`)."""
    return {c: OPTIONAL_KEYS[c] if c in OPTIONAL_KEYS and not str(key.get(c, "")).strip() else key.get(c, "")
            for c in KEY_COLUMNS}


def key_tuple(key: Mapping[str, object]) -> tuple[str, ...]:
    """The key columns of `key` as comparable text, optional keys filled in."""
    normal = normalised_key(key)
    return tuple(key_text(normal[c]) for c in KEY_COLUMNS)


def ok_row_keys(runs: pd.DataFrame) -> dict[tuple[str, ...], int]:
    """The key of every ok row of `runs`, mapped to its index."""
    ok = runs[runs["status"] == "ok"]
    return {key_tuple(row): index for index, row in zip(ok.index, ok.to_dict("records"))}


def json_object(text: str) -> dict | None:
    """The JSON object in a key cell such as `overrides`, {} for empty text, None when it is not an object."""
    if text.strip() in ("", "{}"):
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
