"""What a kernel benchmark's numbers need to be cited: the provenance columns of runs.csv (commit, dirty, torch,
triton and mamba-ssm versions, device) and the repeat count, in the CSV it writes and in its text table."""
from __future__ import annotations

import csv
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


def write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    """Writes `rows` (same columns each) as CSV at `path`, creating its folder; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else list(PROVENANCE), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path
