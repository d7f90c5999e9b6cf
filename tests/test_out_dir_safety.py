"""A sweep or a report never deletes, overwrites or writes through what the project did not write (issue 20):
the report removes only the files its manifest lists, a folder that is not a sweep's is refused unless reused,
links at runs.csv, tables/, figures/ and summary.md are refused rather than followed, and a config name cannot
point the results folder elsewhere."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from experiments.report.__main__ import main as report_main
from experiments.report.build import build_report
from experiments.report.manifest import MANIFEST_NAME, read_manifest
from experiments.runs_csv import RunsFileError
from experiments.sweep.__main__ import main as sweep_main
from experiments.sweep.config import ConfigError, config_from_dict
from experiments.sweep.out_dir import LOCK_NAME, OutDirError, check_out_dir
from experiments.sweep.runs_file import append_row

import tiny_sweep
from tiny_sweep import tiny_config
from messages import one_line_error

TINY = tiny_config(["linear"], [16, 32])
USER_FILES = {"tables/results_2023.csv": b"year,score\n2023,1\n", "figures/fig1.png": b"\x89PNG my figure"}


def cost_row(img_size: int, patch_size: int = 8) -> dict[str, object]:
    """A cost row of `linear` whose costs grow with the image, so the report draws every cost figure."""
    return {"mixer": "linear", "preset": "micro", "overrides": "{}", "img_size": img_size, "patch_size": patch_size,
            "batch_size": 1, "device": "cpu", "dtype": "float32", "dataset": "", "epochs": 0, "seed": 0,
            "train": "{}", "tokens": (img_size // patch_size) ** 2, "status": "ok", "params": 10,
            "gmacs": 0.001 * img_size, "latency_ms": 0.1 * img_size, "peak_mem_mb": 1.0}


def write_runs(folder: Path, rows: list[dict[str, object]]) -> None:
    (folder / "runs.csv").unlink(missing_ok=True)
    for row in rows:
        append_row(folder / "runs.csv", row)


def plant_user_files(folder: Path, summary: bytes | None = None) -> dict[Path, bytes]:
    """The files of the issue's reproducer; returns them with their bytes."""
    files = {folder / name: data for name, data in USER_FILES.items()}
    if summary is not None:
        files[folder / "summary.md"] = summary
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def unchanged(files: dict[Path, bytes]) -> bool:
    return all(path.is_file() and path.read_bytes() == data for path, data in files.items())


# --- the report removes and overwrites only its own files --------------------------------------------------------

def test_report_keeps_files_it_did_not_write_and_removes_only_its_own(tmp_path: Path) -> None:
    user = plant_user_files(tmp_path)
    write_runs(tmp_path, [cost_row(16), cost_row(32), cost_row(64), cost_row(32, 16), cost_row(64, 16)])
    build_report(tmp_path)
    patch_figures = sorted(tmp_path.glob("figures/patch_resolution*"))
    assert patch_figures and unchanged(user)
    assert {p.relative_to(tmp_path).as_posix() for p in patch_figures} <= set(read_manifest(tmp_path))

    write_runs(tmp_path, [cost_row(16), cost_row(32), cost_row(64)])  # one patch size: no patch figure now
    build_report(tmp_path)
    assert not any(p.exists() for p in patch_figures)  # the report's own stale figures are gone
    assert unchanged(user)  # the user's files are not
    assert not set(USER_FILES) & set(read_manifest(tmp_path))


def test_report_without_manifest_deletes_nothing(tmp_path: Path) -> None:
    # A folder from before manifests: a file named as the report names them may still be anyone's.
    write_runs(tmp_path, [cost_row(16), cost_row(32)])
    old = tmp_path / "figures" / "wall_old-setting.png"
    old.parent.mkdir()
    old.write_bytes(b"old")
    build_report(tmp_path)
    assert old.read_bytes() == b"old"
    assert (tmp_path / MANIFEST_NAME).is_file() and "figures/wall_old-setting.png" not in read_manifest(tmp_path)


def test_report_refuses_a_summary_it_did_not_write(tmp_path: Path, capsys) -> None:
    user = plant_user_files(tmp_path, summary=b"# My notes\n")
    write_runs(tmp_path, [cost_row(16), cost_row(32)])
    assert report_main([str(tmp_path)]) == 2
    one_line_error(capsys, str(tmp_path / "summary.md"), "not written by the report", "move it away")
    assert unchanged(user)
    assert not (tmp_path / "tables" / "costs.csv").exists() and not (tmp_path / MANIFEST_NAME).exists()


def test_report_refuses_a_file_of_its_name_it_did_not_write(tmp_path: Path, capsys) -> None:
    write_runs(tmp_path, [cost_row(16), cost_row(32)])
    build_report(tmp_path)
    (tmp_path / "tables" / "costs.csv").unlink()
    mine = tmp_path / "tables" / "costs.csv"  # the user's own table, under a name the report writes
    mine.write_text("mine\n")
    manifest = set(read_manifest(tmp_path)) - {"tables/costs.csv"}  # ... and so not in the report's manifest
    (tmp_path / MANIFEST_NAME).write_text('{"files": ' + str(sorted(manifest)).replace("'", '"') + "}")
    assert report_main([str(tmp_path)]) == 2
    one_line_error(capsys, str(mine), "not written by the report")
    assert mine.read_text() == "mine\n"


@pytest.mark.parametrize("name", ["runs.csv", "tables", "figures", "summary.md"])
def test_report_refuses_symlinks(tmp_path: Path, capsys, name: str) -> None:
    sweep, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    sweep.mkdir()
    elsewhere.mkdir()
    write_runs(sweep, [cost_row(16), cost_row(32)])
    build_report(sweep)
    target = elsewhere / name
    os.replace(sweep / name, target)
    target_files = {p: p.read_bytes() for p in [target, *target.rglob("*")] if p.is_file()}
    theirs = elsewhere / "theirs.png"
    theirs.write_bytes(b"theirs")
    if target.is_dir():
        theirs = target / "theirs.png"  # a file of the link's target that a report must never delete
        theirs.write_bytes(b"theirs")
    (sweep / name).symlink_to(target)
    assert report_main([str(sweep)]) == 2
    one_line_error(capsys, str(sweep / name), "symbolic link")
    assert unchanged(target_files) and theirs.read_bytes() == b"theirs"


# --- the sweep refuses a folder that is not a sweep's, and links ------------------------------------------------

def test_sweep_refuses_a_folder_that_is_not_a_sweeps(tmp_path: Path, capsys) -> None:
    out = tmp_path / "old"
    user = plant_user_files(out, summary=b"# My notes\n")
    args = ["--config", str(tiny_sweep.write_config(tmp_path, TINY)), "--out", str(out), "--quiet"]
    assert sweep_main(args) == 2
    one_line_error(capsys, f"--out {out} holds files but no runs.csv", "--reuse-out")
    assert unchanged(user) and sorted(p.name for p in out.iterdir()) == ["figures", "summary.md", "tables"]
    # Reused, its summary.md is still not the report's to overwrite: refused before any point runs.
    assert sweep_main([*args, "--reuse-out"]) == 2
    one_line_error(capsys, str(out / "summary.md"), "not written by the report")
    assert unchanged(user) and not (out / "runs.csv").exists()


def test_reused_folder_keeps_the_users_files(tmp_path: Path, capsys) -> None:
    out = tmp_path / "old"
    user = plant_user_files(out)
    args = ["--config", str(tiny_sweep.write_config(tmp_path, TINY)), "--out", str(out), "--quiet", "--reuse-out"]
    assert sweep_main(args) == 0
    assert unchanged(user)
    assert (out / "runs.csv").is_file() and (out / "tables" / "costs.csv").is_file()
    assert sweep_main(args[:-1]) == 0  # a sweep's folder now: a rerun needs no flag


def test_folder_left_by_a_killed_sweep_counts_as_empty(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text("")
    (tmp_path / MANIFEST_NAME).write_text("{}")
    (tmp_path / "checkpoints" / "0123456789abcdef").mkdir(parents=True)  # a training point killed before its row
    check_out_dir(tmp_path)
    (tmp_path / "checkpoints" / "my_model.pt").write_bytes(b"")  # not a point's: someone else's checkpoints
    with pytest.raises(OutDirError, match="checkpoints"):
        check_out_dir(tmp_path)
    check_out_dir(tmp_path, reuse=True)


def test_a_repository_is_not_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()  # `--out .` in a checkout
    with pytest.raises(OutDirError, match=r"\.git.*--reuse-out"):
        check_out_dir(tmp_path)


@pytest.mark.parametrize("name", ["runs.csv", "tables", "figures", "summary.md"])
def test_sweep_refuses_dangling_symlinks(tmp_path: Path, capsys, name: str) -> None:
    out, target = tmp_path / "out", tmp_path / "elsewhere" / name
    out.mkdir()
    (out / name).symlink_to(target)  # dangling: following it would create the target
    args = ["--config", str(tiny_sweep.write_config(tmp_path, TINY)), "--out", str(out), "--quiet", "--reuse-out"]
    assert sweep_main(args) == 2
    one_line_error(capsys, str(out / name), "symbolic link")
    assert not target.parent.exists() and [p.name for p in out.iterdir()] == [name]


def test_rows_are_never_appended_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.csv"
    (tmp_path / "runs.csv").symlink_to(target)
    with pytest.raises(RunsFileError, match="symbolic link"):
        append_row(tmp_path / "runs.csv", cost_row(16))
    assert not target.exists()


# --- a config name is a folder name, never a path ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../escaped", "a/b", "/tmp/x", ".hidden", "a..b", "", "x" * 101])
def test_config_name_must_be_a_plain_name(name: str) -> None:
    with pytest.raises(ConfigError, match=r"^t\.toml: name names the results folder"):
        config_from_dict({"name": name}, "t.toml")


@pytest.mark.parametrize("name", ["default", "vim_1248", "cpu-tiny.v2"])
def test_plain_config_names_are_accepted(name: str) -> None:
    assert config_from_dict({"name": name}, "t.toml").out_dir == Path("results/local") / name


def test_config_name_cannot_move_the_results_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = tiny_sweep.write_config(tmp_path, TINY.replace('name = "tiny"', 'name = "../../escaped"'))
    assert sweep_main(["--config", str(config), "--quiet", "--no-report"]) == 2
    one_line_error(capsys, "name names the results folder", "'../../escaped'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]
