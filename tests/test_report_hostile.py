"""The report and the sweep's results folder against hostile input (issue 35): one line where a traceback was
owed, no hang on what is not a regular file, and nothing of a user's deleted or overwritten, even through an
edited manifest or in a folder from before manifests."""
from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from experiments.report import tables as report_tables
from experiments.report.__main__ import main as report_main
from experiments.report.build import build_report
from experiments.report.manifest import MANIFEST_NAME, SUMMARY_MARKER, content_hash, read_manifest
from experiments.schema import KEY_COLUMNS
from experiments.sweep.__main__ import main as sweep_main

import tiny_sweep
from messages import one_line_error
from test_out_dir_safety import cost_row, write_runs


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    write_runs(tmp_path, [cost_row(16), cost_row(32), cost_row(64)])
    return tmp_path


# --- one line where a traceback was owed ---------------------------------------------------------------------

def test_truncated_and_foreign_erf_maps_are_skipped(sweep: Path) -> None:
    erf = sweep / "erf"
    erf.mkdir()
    key = {c: str(v) for c, v in cost_row(16).items() if c in KEY_COLUMNS}
    np.savez(erf / "good.npz", key=json.dumps(key), patch_size=8, init=np.ones((2, 2)))
    (erf / "truncated.npz").write_bytes((erf / "good.npz").read_bytes()[:40])  # BadZipFile before the fix
    np.savez(erf / "list_key.npz", key="[1, 2]", patch_size=8, init=np.ones((2, 2)))  # AttributeError before
    (erf / "good.npz").unlink()
    assert build_report(sweep)


def test_infinite_token_count_is_one_line(sweep: Path, capsys) -> None:
    text = (sweep / "runs.csv").read_text().splitlines()
    header = text[0].split(",")
    cells = text[1].split(",")
    cells[header.index("tokens")] = "1e400"  # IntCastingNaNError before the fix
    (sweep / "runs.csv").write_text("\n".join([text[0], ",".join(cells), *text[2:]]) + "\n")
    assert report_main([str(sweep)]) == 2
    one_line_error(capsys, "tokens", "line(s) 2")


def test_full_disk_is_one_line_and_the_previous_report_stays(sweep: Path, capsys, monkeypatch) -> None:
    build_report(sweep)
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report_tables, "write_table", no_space)
    assert report_main([str(sweep)]) == 2
    one_line_error(capsys, "No space left on device", "as they were")
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("name", [MANIFEST_NAME, "summary.md"])
@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_manifest_or_summary_that_is_no_regular_file_is_refused_unopened(sweep: Path, capsys, name: str,
                                                                           kind: str) -> None:
    path = sweep / name
    path.mkdir() if kind == "folder" else os.mkfifo(path)  # a FIFO hung the report; a folder failed it midway
    assert report_main([str(sweep)]) == 2
    one_line_error(capsys, str(path), "not a regular file")
    config = tiny_sweep.write_config(sweep, tiny_sweep.tiny_config(["linear"], [16]))
    assert sweep_main(["--config", str(config), "--out", str(sweep), "--quiet", "--no-plan"]) == 2
    one_line_error(capsys, str(path), "not a regular file")


# --- nothing of a user's is deleted or overwritten ----------------------------------------------------------------

def test_an_edited_manifest_cannot_delete_or_overwrite_a_users_file(sweep: Path, capsys) -> None:
    build_report(sweep)
    mine = sweep / "figures" / "mine.png"
    mine.write_bytes(b"my figure")
    manifest = read_manifest(sweep)
    # listed by name alone (the old format) and with a made-up hash: neither is proof it is the report's
    for recorded in (None, "0" * 64):
        (sweep / MANIFEST_NAME).write_text(json.dumps({"files": {**manifest, "figures/mine.png": recorded}}))
        build_report(sweep)
        assert mine.read_bytes() == b"my figure"
    assert "figures/mine.png" not in read_manifest(sweep)


def test_a_users_summary_listed_in_the_manifest_is_not_overwritten(sweep: Path, capsys) -> None:
    build_report(sweep)
    (sweep / "summary.md").write_text("# My notes\n")
    files = read_manifest(sweep)
    (sweep / MANIFEST_NAME).write_text(json.dumps({"files": sorted(files)}))  # lists summary.md, no hashes
    assert report_main([str(sweep)]) == 2
    one_line_error(capsys, "summary.md", "not written by the report")
    assert (sweep / "summary.md").read_text() == "# My notes\n"


def test_before_manifests_a_users_table_written_after_the_report_is_kept(sweep: Path, capsys) -> None:
    build_report(sweep)
    (sweep / MANIFEST_NAME).unlink()  # a folder from before manifests: the summary's marker alone says "report"
    assert SUMMARY_MARKER in (sweep / "summary.md").read_text()
    past = time.time() - 60
    for path in sweep.rglob("*"):  # the old report ran a minute ago, its summary.md last
        os.utime(path, (past, past + (path.name == "summary.md")))
    (sweep / "tables" / "costs.md").write_text("my own costs\n")  # written after the report ran
    assert report_main([str(sweep)]) == 2
    one_line_error(capsys, "costs.md", "not written by the report")
    assert (sweep / "tables" / "costs.md").read_text() == "my own costs\n"


def test_reuse_out_refuses_a_users_costs_table_before_any_point_runs(tmp_path: Path, capsys) -> None:
    (tmp_path / "out" / "tables").mkdir(parents=True)
    (tmp_path / "out" / "tables" / "costs.csv").write_text("mine\n")
    config = tiny_sweep.write_config(tmp_path, tiny_sweep.tiny_config(["linear"], [16]))
    assert sweep_main(["--config", str(config), "--out", str(tmp_path / "out"), "--quiet", "--no-plan",
                       "--reuse-out"]) == 2
    one_line_error(capsys, "costs.csv", "not written by the report", "--no-report")
    assert not (tmp_path / "out" / "runs.csv").exists()
    assert (tmp_path / "out" / "tables" / "costs.csv").read_text() == "mine\n"


def test_a_bad_out_is_refused_before_the_plan(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("")
    config = tiny_sweep.write_config(tmp_path, tiny_sweep.tiny_config(["linear"], [16]))
    assert sweep_main(["--config", str(config), "--out", str(tmp_path / "file" / "out"), "--dry-run"]) == 2
    out = capsys.readouterr()
    assert "calibration" not in out.out and "is a file" in out.err and len(out.err.strip().splitlines()) == 1


def test_report_hashes_what_it_wrote(sweep: Path) -> None:
    written = build_report(sweep)
    manifest = read_manifest(sweep)
    assert all(manifest[p.relative_to(sweep).as_posix()] == content_hash(p) for p in written)
