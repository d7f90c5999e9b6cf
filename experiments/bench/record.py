"""What a kernel benchmark's numbers need to be cited: the provenance columns of runs.csv (commit, dirty, torch,
triton and mamba-ssm versions, device) and the repeat count, in the CSV it writes and in its text table."""
from __future__ import annotations

import csv
import os
from pathlib import Path

import torch

from ..measure.provenance import device_name, git_state, package_version

PROVENANCE = ("commit", "dirty", "torch_version", "triton_version", "mamba_ssm_version", "device_name", "repeats")


def provenance_columns(device: torch.device, repeats: int) -> dict[str, object]:
    """The provenance cells every row of a benchmark CSV carries."""
    commit, dirty = git_state()
    return {"commit": commit, "dirty": "" if dirty is None else dirty, "torch_version": torch.__version__,
            "triton_version": package_version("triton"), "mamba_ssm_version": package_version("mamba-ssm"),
            "device_name": device_name(device), "repeats": repeats}


def provenance_line(columns: dict[str, object],
                    repeats: str = "timed blocks per case (median and IQR over them)") -> str:
    """One line for the text table: where and with what it ran; `repeats` says what the repeat count counts."""
    return (f"commit {str(columns['commit'])[:10]}{' (dirty tree)' if columns['dirty'] else ''}; torch "
            f"{columns['torch_version']}; triton {columns['triton_version'] or 'not installed'}; mamba-ssm "
            f"{columns['mamba_ssm_version'] or 'not installed'}; {columns['device_name']}; "
            f"{columns['repeats']} {repeats}")


def check_output_path(path: Path) -> None:
    """Raises ValueError (one line) unless a CSV can be written at `path`: checked before a benchmark runs, so a
    folder or an unwritable place there does not lose its results after the run."""
    if path.exists() and not path.is_file():
        raise ValueError(f"--csv {path} exists and is not a regular file (a folder?); give a file path")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"--csv {path} lies under {folder}, which is a file; give a path in a folder")
    target = path if path.exists() else folder
    if not os.access(target, os.W_OK):
        raise ValueError(f"--csv {path}: {target} is not writable; give a path you can write to")


def write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    """Writes `rows` (same columns each) as CSV at `path`, creating its folder; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else list(PROVENANCE), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path
