"""The report's own files in a sweep folder, so that it removes and overwrites only what it wrote itself.

A report lists every file it wrote in `<sweep>/.report-manifest.json`, with a SHA-256 of its content. A rebuild
removes the files the previous report listed that it no longer writes (no figure outlives the data it came from)
and whose content is still what the report wrote, and refuses to write over a file it cannot show to be its own:
one in the manifest whose content still matches (an edited manifest that lists a user's file cannot make the
report delete or overwrite it), a summary.md that carries the report's marker, or, in a folder from before
manifests (whose summary.md carries that marker), a file the report names that is not newer than that summary.md
(a user's file put there after the report ran is).

The manifest also records the claims file a report checked (--claims), so that a plain rebuild checks it again
rather than dropping the summary's section and its tables.

A folder without a manifest loses nothing: the report cannot tell its old files from a user's there, so it
deletes none; the manifest it writes lets every later rebuild clean up after it. The price is that a figure from
a report built before manifests existed (or before they held hashes), which the new report no longer draws, stays
until removed by hand.

The folder's own entries (runs.csv, tables/, figures/, summary.md and the manifest) are never followed when they
are symbolic links: a link would send the report's writes and deletions into whatever folder it points at.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
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


def refuse_special_files(sweep_dir: Path) -> None:
    """Refuses a runs.csv, summary.md or manifest that is there but not a regular file (a FIFO would hang the
    report on opening it, a folder would fail it midway): never opened.

    Raises:
        ForeignFileError: naming the first such entry.
    """
    for name in ("runs.csv", SUMMARY_NAME, MANIFEST_NAME):
        path = sweep_dir / name
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        except OSError as error:
            raise ForeignFileError(f"{path} cannot be examined ({error.strerror or error}); fix it or choose "
                                   "another folder") from None
        if not stat.S_ISREG(mode):
            raise ForeignFileError(f"{path} is not a regular file (a folder, a pipe or a device); the report reads "
                                   "and writes only regular files there: move it away, or choose another folder")


def content_hash(path: Path) -> str | None:
    """SHA-256 of a regular file's content; None for anything else or a file that cannot be read."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def is_report_summary(path: Path) -> bool:
    """Whether `path` is a summary.md the report wrote (its marker in the first lines); never opens anything but
    a regular file."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return False
        with path.open(encoding="utf-8", errors="replace") as handle:
            head = "".join(handle.readline() for _ in range(_MARKER_LINES))
    except OSError:
        return False
    return SUMMARY_MARKER in head


def read_manifest(sweep_dir: Path) -> dict[str, str | None] | None:
    """The files (relative POSIX paths) the previous report listed, each with the SHA-256 it wrote (None in a
    manifest from before hashes), or None without a readable manifest.

    A damaged manifest reads as none, so the report deletes nothing rather than guess; one that is not a regular
    file is never opened (`refuse_special_files` refuses it first).
    """
    data = _manifest_data(sweep_dir)
    files = data.get("files")
    if isinstance(files, list):  # before hashes: names alone
        files = {name: None for name in files if isinstance(name, str)}
    if not isinstance(files, dict):
        return None
    return {name: digest if isinstance(digest, str) else None
            for name, digest in files.items() if isinstance(name, str) and _is_output_name(name)}


def _manifest_data(sweep_dir: Path) -> dict:
    """The manifest's JSON object; empty where there is none, it is damaged, or it is not a regular file (never
    opened then)."""
    path = sweep_dir / MANIFEST_NAME
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_claims(sweep_dir: Path) -> str | None:
    """The claims (a name or TOML path, as given to --claims) the previous report checked, as its manifest
    records them; None where it checked none, recorded none, or there is no readable manifest."""
    claims = _manifest_data(sweep_dir).get("claims")
    return claims if isinstance(claims, str) and claims else None


def matches(path: Path, recorded: str | None) -> bool:
    """Whether a file's content is what the report recorded writing (never, without a recorded hash)."""
    return recorded is not None and content_hash(path) == recorded


def write_manifest(sweep_dir: Path, files: dict[str, str | None], claims: str | None = None) -> None:
    """Writes the manifest (name -> SHA-256, and the claims the report checked, if any) atomically (a temporary
    file renamed over it), so a kill leaves the old one or the new."""
    data: dict[str, object] = {"written_by": "python -m experiments.report", "files": dict(sorted(files.items()))}
    if claims:
        data["claims"] = claims
    text = json.dumps(data, indent=1) + "\n"
    fd, temporary = tempfile.mkstemp(dir=sweep_dir, prefix=f"{MANIFEST_NAME}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, sweep_dir / MANIFEST_NAME)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def check_overwrites(sweep_dir: Path, names: Iterable[str], previous: dict[str, str | None] | None) -> None:
    """Refuses to write any of `names` (relative POSIX paths) over a file the report cannot show to be its own.

    Raises:
        ForeignFileError: naming the first such file and what to do.
    """
    summary = sweep_dir / SUMMARY_NAME
    summary_is_ours = is_report_summary(summary)
    for name in names:
        path = sweep_dir / name
        if not os.path.lexists(path):
            continue
        if path.is_symlink() or not stat.S_ISREG(path.lstat().st_mode):
            raise ForeignFileError(f"{path} is not a plain file the report wrote; move it away (or choose another "
                                   "folder) and rerun")
        # A manifest from before hashes vouches for a table or figure by name (its own files keep rebuilding); a
        # hashed entry only while the content is unchanged. summary.md needs its marker or a matching hash.
        listed = previous is not None and name in previous and (previous[name] is None or matches(path, previous[name]))
        if name == SUMMARY_NAME:
            ours = summary_is_ours or (previous is not None and matches(path, previous.get(name)))
        elif previous is not None:
            ours = listed
        else:  # before manifests: the report's summary.md marks the folder, and the report wrote it last
            ours = summary_is_ours and path.stat().st_mtime <= summary.stat().st_mtime
        if not ours:
            raise ForeignFileError(f"{path} was not written by the report, which would overwrite it; move it away "
                                   "(or choose another folder) and rerun")


def remove_stale(sweep_dir: Path, previous: dict[str, str | None] | None, written: Iterable[str]) -> None:
    """Removes the files the previous report listed that this one did not write and whose content is still what
    it wrote (a user's file an edited manifest names stays, and so does one listed without a hash: a deletion
    needs proof); without a manifest, none."""
    previous = previous or {}
    for name in sorted(set(previous) - set(written)):
        path = sweep_dir / name
        if path.is_symlink():  # a link is removed, never what it points to
            path.unlink()
        elif matches(path, previous[name]):
            path.unlink()


def _is_output_name(name: str) -> bool:
    """A relative path the report may write: summary.md, or a file directly in tables/ or figures/."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name:
        return False
    return name == SUMMARY_NAME or (len(path.parts) == 2 and path.parts[0] in OUTPUT_DIRS)
