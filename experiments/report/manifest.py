"""The report's own files in a sweep folder, so that it removes and overwrites only what it wrote itself.

A report lists every file it wrote in `<sweep>/.report-manifest.json`. A rebuild removes the files the previous
report listed that it no longer writes (no figure outlives the data it came from), and refuses to write over a
file it cannot show to be its own: one in the manifest, a summary.md that carries the report's marker, or, in a
folder from before manifests, a file the report names in a folder whose summary.md carries that marker.

A folder without a manifest loses nothing: the report cannot tell its old files from a user's there, so it
deletes none; the manifest it writes lets every later rebuild clean up after it. The price is that a figure from
a report built before manifests existed, which the new report no longer draws, stays until removed by hand.

The folder's own entries (runs.csv, tables/, figures/, summary.md and the manifest) are never followed when they
are symbolic links: a link would send the report's writes and deletions into whatever folder it points at.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

MANIFEST_NAME = ".report-manifest.json"
SUMMARY_NAME = "summary.md"
# Subfolders the report writes into; a manifest entry outside them (or summary.md) is ignored, so an edited
# manifest cannot make the report delete anything else.
OUTPUT_DIRS = ("tables", "figures")
# The sentence every summary.md the report writes carries in its first lines (render_summary writes it).
SUMMARY_MARKER = "by `python -m experiments.report`. Do not edit: rerun the command instead."
_MARKER_LINES = 5
# Entries of a sweep folder the sweep and the report read or write by name: never followed when links.
GUARDED_NAMES = ("runs.csv", *OUTPUT_DIRS, SUMMARY_NAME, MANIFEST_NAME)


class ForeignFileError(ValueError):
    """A file or link in a sweep folder the report must not write through or over; the message says what to do."""


def refuse_symlinks(sweep_dir: Path) -> None:
    """Refuses a sweep folder whose runs.csv, tables/, figures/, summary.md or manifest is a symbolic link.

    Raises:
        ForeignFileError: naming the first link found (a dangling one included).
    """
    for name in GUARDED_NAMES:
        path = sweep_dir / name
        if path.is_symlink():
            raise ForeignFileError(f"{path} is a symbolic link; results are never written through links: replace "
                                   "it with a real file or folder, or choose another folder")


def is_report_summary(path: Path) -> bool:
    """Whether `path` is a summary.md the report wrote (its marker in the first lines)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            head = "".join(handle.readline() for _ in range(_MARKER_LINES))
    except OSError:
        return False
    return SUMMARY_MARKER in head


def read_manifest(sweep_dir: Path) -> set[str] | None:
    """The files (relative POSIX paths) the previous report listed, or None without a readable manifest.

    A damaged manifest reads as none, so the report deletes nothing rather than guess.
    """
    try:
        data = json.loads((sweep_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        return None
    return {name for name in files if isinstance(name, str) and _is_output_name(name)}


def write_manifest(sweep_dir: Path, names: Iterable[str]) -> None:
    """Writes the manifest atomically (a temporary file renamed over it), so a kill leaves the old one or the new."""
    text = json.dumps({"written_by": "python -m experiments.report", "files": sorted(set(names))}, indent=1) + "\n"
    fd, temporary = tempfile.mkstemp(dir=sweep_dir, prefix=f"{MANIFEST_NAME}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, sweep_dir / MANIFEST_NAME)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def check_overwrites(sweep_dir: Path, names: Iterable[str], previous: set[str] | None) -> None:
    """Refuses to write any of `names` (relative POSIX paths) over a file the report cannot show to be its own.

    Raises:
        ForeignFileError: naming the first such file and what to do.
    """
    summary_is_ours = is_report_summary(sweep_dir / SUMMARY_NAME)
    for name in names:
        path = sweep_dir / name
        if not os.path.lexists(path):
            continue
        if path.is_symlink() or not path.is_file():
            raise ForeignFileError(f"{path} is not a plain file the report wrote; move it away (or choose another "
                                   "folder) and rerun")
        if name == SUMMARY_NAME:
            ours = summary_is_ours or (previous is not None and name in previous)
        else:  # without a manifest, a report's summary.md marks the folder (from before manifests) as the report's
            ours = name in previous if previous is not None else summary_is_ours
        if not ours:
            raise ForeignFileError(f"{path} was not written by the report, which would overwrite it; move it away "
                                   "(or choose another folder) and rerun")


def remove_stale(sweep_dir: Path, previous: set[str] | None, written: Iterable[str]) -> None:
    """Removes the files the previous report listed that this one did not write; without a manifest, none."""
    for name in sorted((previous or set()) - set(written)):
        path = sweep_dir / name
        if path.is_symlink() or path.is_file():  # a link is removed, never what it points to
            path.unlink()


def _is_output_name(name: str) -> bool:
    """A relative path the report may write: summary.md, or a file directly in tables/ or figures/."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name:
        return False
    return name == SUMMARY_NAME or (len(path.parts) == 2 and path.parts[0] in OUTPUT_DIRS)
