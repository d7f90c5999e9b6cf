"""Learning curves in the report: `<sweep>/curves/<key hash>.csv` (`schema.CURVES_DIR`, written by the training),
read with the standard library and pandas, joined to runs.csv by key, and the first evaluation at which a curve
(or one reach bucket of it) reaches an accuracy.

A file counts only when every row carries the key of one ok row of runs.csv (`point_keys`), as erf maps do; a
truncated, foreign or unreadable file is skipped and named in a note, never a traceback, so a sweep killed inside a
write still gets its report.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..runs_csv import OPTIONAL_KEYS
from ..schema import CURVE_COLUMNS, CURVES_DIR, KEY_COLUMNS
from .point_keys import key_tuple, ok_row_keys

# Curve columns a file must hold to be drawn; the rest may be empty (train_loss at evaluation 0, buckets).
REQUIRED_CURVE_COLUMNS: tuple[str, ...] = ("eval_index", "samples_seen", "train_flops", "val_accuracy")
# Curve columns read as numbers (the bucket column is JSON text).
NUMERIC_CURVE_COLUMNS: tuple[str, ...] = tuple(c for c in CURVE_COLUMNS if c != "val_accuracy_by_bucket")


@dataclass(frozen=True)
class Curves:
    """The curves of a sweep's ok rows and what was left out.

    Attributes:
        points: one row per evaluation: `row` (the runs.csv index it belongs to) and the curve columns (numbers;
            `val_accuracy_by_bucket` as text), sorted by row and evaluation.
        notes: one line per curve file skipped, saying which and why.
    """

    points: pd.DataFrame
    notes: tuple[str, ...] = ()


def load_curves(sweep_dir: Path, runs: pd.DataFrame) -> Curves:
    """Every readable curve file of `sweep_dir` whose key is an ok row of `runs`.

    Args:
        sweep_dir: the sweep folder (its `curves/` may be absent: then there are no curves).
        runs: the loaded runs (`build.load_runs`), whose index `points.row` refers to.
    """
    folder = sweep_dir / CURVES_DIR
    empty = pd.DataFrame(columns=["row", *CURVE_COLUMNS])
    if not folder.is_dir() or folder.is_symlink():
        return Curves(empty)
    known = ok_row_keys(runs)
    frames, notes = [], []
    for path in sorted(folder.glob("*.csv")):
        try:
            frame = _read_curve(path, known)
        except _SkippedCurve as skipped:
            notes.append(f"{CURVES_DIR}/{path.name}: {skipped}")
            continue
        if frame is None:
            continue
        expected = runs.at[frame["row"].iloc[0], "curve_points"] if "curve_points" in runs else math.nan
        if math.isfinite(expected) and len(frame) < expected:  # cut at a line's end: complete lines, too few
            notes.append(f"{CURVES_DIR}/{path.name}: truncated (holds {len(frame)} of the {int(expected)} "
                         "evaluations its row records)")
            continue
        frames.append(frame)
    points = pd.concat(frames, ignore_index=True) if frames else empty
    points = points.sort_values(["row", "eval_index"], ignore_index=True)
    return Curves(points, tuple(notes))


class _SkippedCurve(ValueError):
    """A curve file the report cannot use; the message says why, for the summary's note."""


def _read_curve(path: Path, known: dict[tuple[str, ...], int]) -> pd.DataFrame | None:
    """The file's evaluations with the runs.csv index of its row, or None when its key is no ok row here (a point
    since removed or rerun: not ours to report, as with erf maps)."""
    if path.is_symlink() or not path.is_file():
        raise _SkippedCurve("not a plain file")
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except OSError as error:
        raise _SkippedCurve(f"cannot be read ({error.strerror or type(error).__name__})") from None
    except UnicodeDecodeError:
        raise _SkippedCurve("not UTF-8 text") from None
    if text and not text.endswith("\n"):
        raise _SkippedCurve("truncated (its last line has no end: the training was killed inside a write)")
    try:
        rows = list(csv.reader(io.StringIO(text), strict=True))
    except csv.Error as error:
        raise _SkippedCurve(f"not CSV ({error})") from None
    if len(rows) < 2:
        raise _SkippedCurve("no evaluations")
    header = [c.strip() for c in rows[0]]
    missing = [c for c in (*KEY_COLUMNS, *REQUIRED_CURVE_COLUMNS) if c not in header and c not in OPTIONAL_KEYS]
    if missing:
        raise _SkippedCurve(f"not a learning curve of this suite (missing column(s) {', '.join(missing)})")
    if any(len(r) != len(header) for r in rows[1:] if r):
        raise _SkippedCurve("truncated or damaged (a line whose cell count is not the header's)")
    records = [dict(zip(header, r)) for r in rows[1:] if r]
    keys = {key_tuple(r) for r in records}
    if len(keys) != 1:
        raise _SkippedCurve("its lines carry more than one point's key")
    row = known.get(keys.pop())
    if row is None:
        return None
    frame = pd.DataFrame.from_records(records)
    for column in CURVE_COLUMNS:
        if column not in frame:
            frame[column] = ""
    for column in NUMERIC_CURVE_COLUMNS:
        frame[column] = pd.to_numeric(frame[column].astype(str).str.strip(), errors="coerce")
    bad = frame[list(REQUIRED_CURVE_COLUMNS)].isna().any(axis=1)
    if bad.any():
        raise _SkippedCurve(f"{int(bad.sum())} evaluation(s) without {', '.join(REQUIRED_CURVE_COLUMNS)}")
    frame["val_accuracy_by_bucket"] = frame["val_accuracy_by_bucket"].fillna("").astype(str)
    frame.insert(0, "row", row)
    return frame[["row", *CURVE_COLUMNS]]


def bucket_curves(points: pd.DataFrame) -> pd.DataFrame:
    """The reach evaluations split into buckets: `row`, `eval_index`, `samples_seen`, `train_flops`, `direction`,
    `distance` and `val_accuracy` (of that bucket); evaluations without a readable bucket JSON are left out."""
    records = []
    for record in points.to_dict("records"):
        buckets = _bucket_json(record["val_accuracy_by_bucket"])
        for bucket, value in buckets.items():
            direction, _, distance = bucket.rpartition(":")
            try:
                records.append({"row": record["row"], "eval_index": record["eval_index"],
                                "samples_seen": record["samples_seen"], "train_flops": record["train_flops"],
                                "direction": direction, "distance": int(distance), "val_accuracy": float(value)})
            except (TypeError, ValueError):
                continue  # a bucket name or value not of this suite
    return pd.DataFrame.from_records(records, columns=["row", "eval_index", "samples_seen", "train_flops",
                                                       "direction", "distance", "val_accuracy"])


def _bucket_json(text: str) -> dict:
    """The bucket accuracies of one evaluation, {} for none or for text that is not a JSON object."""
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def first_reach(curve: pd.DataFrame, target: float, column: str = "val_accuracy") -> tuple[float, float]:
    """(samples seen, training FLOPs) at the first evaluation of one curve with `column` >= `target`; NaN, NaN
    when it never did (or there is no target)."""
    if not math.isfinite(target):
        return math.nan, math.nan
    reached = curve[curve[column] >= target].sort_values("eval_index")
    if reached.empty:
        return math.nan, math.nan
    first = reached.iloc[0]
    return float(first["samples_seen"]), float(first["train_flops"])
