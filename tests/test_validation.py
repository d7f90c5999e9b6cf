"""Issue 20's hostile inputs: each ends in one clear line and exit status 2 with nothing written, or in the
right result (a report that builds, a memory wall labelled as one)."""
from __future__ import annotations

from pathlib import Path

import pytest

from experiments.report.build import build_report
from experiments.sweep.runs_file import append_row


def _cost_row(mixer: str, img_size: int, patch_size: int, overrides: str, status: str) -> dict[str, object]:
    row: dict[str, object] = {
        "mixer": mixer, "preset": "micro", "overrides": overrides, "img_size": img_size, "patch_size": patch_size,
        "batch_size": 1, "device": "cpu", "dtype": "float32", "dataset": "", "epochs": 0, "seed": 0,
        "train": "{}", "tokens": (img_size // patch_size) ** 2, "status": status,
    }
    if status == "ok":
        row.update(params=10, gmacs=0.001 * img_size, latency_ms=0.1 * img_size, peak_mem_mb=1.0 * img_size)
    else:
        row["error"] = "RuntimeError: forced"
    return row


# --- defect 4: a setting that failed at every point --------------------------------------------------------------

def test_report_builds_when_one_override_setting_failed_everywhere(tmp_path: Path) -> None:
    """Two override settings of one mixer, two patch sizes, and one setting erroring at every point: the patch
    figure of that setting has no line to draw, and must be left out rather than crash the report."""
    for overrides, status in (('{"depth":1}', "ok"), ('{"depth":2}', "error")):
        for patch in (8, 16):
            for img in (16, 32, 64):
                append_row(tmp_path / "runs.csv", _cost_row("linear", img, patch, overrides, status))
    written = build_report(tmp_path)
    names = {p.name for p in written}
    assert "patch_resolution_depth-1.png" in names
    assert not any("depth-2" in name and name.startswith("patch_resolution") for name in names)
    costs = (tmp_path / "tables" / "costs.csv").read_text()
    assert costs.count("error") >= 6  # the failed rows stay in the tables
