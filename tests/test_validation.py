"""Issue 20's hostile inputs: each ends in one clear line and exit status 2 with nothing written, or in the
right result (a report that builds, a memory wall labelled as one)."""
from __future__ import annotations

from pathlib import Path

import pytest

from experiments.report.build import build_report
from experiments.sweep.runs_file import append_row
from messages import one_line_error


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


# --- defect 7: config values that ran nothing, meant something else, or failed every point -------------------

BASE = 'name = "t"\nmixers = ["linear"]\nimg_sizes = [16]\npatch_sizes = [8]\n'


@pytest.mark.parametrize("text,message", [
    ("seeds = []", "seeds must not be empty"),
    ("presets = []", "presets must not be empty"),
    ("batch_sizes = []", "batch_sizes must not be empty"),
    ("timeout_s = true", "timeout_s must be of type float, got True"),
    ("epochs = true", "epochs must be of type int, got True"),
    ("memory_limit_mb = false", "memory_limit_mb must be of type int, got False"),
    ("[[runs]]\ntimeout_s = true", "runs[0]: timeout_s must be of type float"),
    ("[overrides.mambaa]\ndepth = 1", "overrides.mambaa: no mixer 'mambaa' is registered"),
    ("[overrides.linear]\ndepth = true", "overrides.linear.depth must be a number, got True"),
    ("[overrides.linear]\ndepth = 1000000000000000000000000000000", "overrides.linear.depth must be at most 65,536"),
    ("seeds = [-1]", "seeds must be integers in 0 .. 4294967295"),
    ("seeds = [4294967296]", "seeds must be integers in 0 .. 4294967295"),
    ("seeds = [1.5]", "seeds must be a list of integers"),
    ("img_sizes = [1000000000000000000000000000000]", "img_sizes must be <= 65,536"),
    ("batch_sizes = [100000000000000000000]", "batch_sizes must be <= 1,048,576"),
    ("timeout_s = 100000000000000000000", "timeout_s must be <= 2,592,000"),
    ("timeout_s = 1e300", "timeout_s must be <= 2,592,000"),
    ("epochs = 100000000000000000000", "epochs must be <= 100,000"),
])
def test_bad_config_values_are_refused_once(tmp_path: Path, capsys, text: str, message: str) -> None:
    from experiments.sweep.__main__ import main

    config = tmp_path / "bad.toml"
    lines = [line for line in BASE.splitlines() if line.split(" = ")[0] != text.split(" = ")[0]]
    config.write_text("\n".join(lines) + "\n" + text + "\n")  # tables last, so top-level fields stay top-level
    out = tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-plan"]) == 2
    one_line_error(capsys, message)
    assert not out.exists()


def test_huge_sizes_on_the_command_line_are_refused_with_the_bound(tmp_path: Path, capsys) -> None:
    from experiments.sweep.__main__ import main

    out = tmp_path / "out"
    assert main(["--mixers", "linear", "--img-sizes", str(10**30), "--out", str(out), "--dry-run"]) == 2
    one_line_error(capsys, "img_sizes must be <= 65,536")
    assert main(["--mixers", "linear", "--img-sizes", "16", "--seeds", "-3", "--out", str(out), "--dry-run"]) == 2
    one_line_error(capsys, "seeds must be integers in 0 ..")
    assert not out.exists()


def test_an_override_for_a_registered_mixer_outside_the_selection_is_kept() -> None:
    """One file may hold overrides for every mixer while --mixers picks a few: only unknown names are refused."""
    from experiments.sweep.config import SweepConfig

    config = SweepConfig(mixers=("linear",), img_sizes=(16,), patch_sizes=(8,),
                         overrides={"*": {"depth": 1}, "mamba": {"depth": 2}})
    assert len(config.points(["linear", "mamba"])) == 1


# --- defect 7: npz files that are damaged, hold objects, empty images or labels past any class count ------------

def _npz_file(tmp_path: Path, case: str) -> Path:
    import io
    import zipfile

    import numpy as np

    x = np.zeros((4, 8, 8, 3), np.uint8)
    y = np.array([0, 1, 0, 1])
    arrays = {"x_train": x, "y_train": y, "x_test": x, "y_test": y}
    if case == "object":
        arrays["x_train"] = np.array([x[0], "a"], dtype=object)
    elif case == "empty_images":
        arrays["x_train"] = arrays["x_test"] = np.zeros((4, 0, 0, 3), np.uint8)
    elif case == "huge_label":
        arrays["y_train"] = np.array([0, 1, 0, 50_000_000])
    elif case == "uint64_wraps":
        arrays["y_train"] = np.array([0, 1, 0, 2**64 - 1], dtype=np.uint64)
    path = tmp_path / f"{case}.npz"
    np.savez(path, **arrays)
    if case == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif case == "truncated_member":  # the zip is whole, one array inside it is cut short
        with zipfile.ZipFile(path, "w") as archive:
            for name, value in arrays.items():
                buffer = io.BytesIO()
                np.save(buffer, value)
                archive.writestr(f"{name}.npy", buffer.getvalue()[:100] if name == "x_train" else buffer.getvalue())
    return path


@pytest.mark.parametrize("case,message", [
    ("object", "x_train is an object array; it is not loaded"),
    ("truncated", "is not a readable .npz file"),
    ("truncated_member", "cannot read the array x_train"),
    ("empty_images", "x_train holds 0x0 images"),
    ("huge_label", "y_train has a label of 50,000,000; labels are class indices 0 .. 99,999"),
    ("uint64_wraps", "y_train has a label of 18,446,744,073,709,551,615"),
])
def test_bad_npz_files_are_one_line(tmp_path: Path, capsys, case: str, message: str) -> None:
    from experiments.sweep.__main__ import main

    config = tmp_path / "c.toml"
    config.write_text(BASE)
    out = tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-plan", "--epochs", "1",
                 "--dataset", "npz", "--data-path", str(_npz_file(tmp_path, case))]) == 2
    one_line_error(capsys, message)
    assert not out.exists()


# --- defect 7: the report's --claims and --readme ---------------------------------------------------------------

CLAIM = ('[[claims]]\ntext = "t"\nmetric = "latency_ms"\nmixer = "mamba"\nreferences = ["attention"]\n'
         'img_size = 32\nfactor = 2.0\n')


@pytest.fixture()
def sweep_dir(tmp_path: Path) -> Path:
    """A sweep folder with a runs.csv and no report yet."""
    for img in (16, 32, 64):
        append_row(tmp_path / "sweep" / "runs.csv", _cost_row("linear", img, 8, "{}", "ok"))
    return tmp_path / "sweep"


@pytest.mark.parametrize("text,message", [
    (CLAIM.replace('"latency_ms"', '"accuracy"'), "metric must be one of latency_ms"),
    (CLAIM.replace('["attention"]', '"attention"'), "references must be a list of mixer names"),
    (CLAIM.replace("img_size = 32", 'img_size = "32"'), "img_size must be a positive integer"),
    (CLAIM.replace("factor = 2.0", 'factor = "2.8x"'), "factor must be a number > 0"),
    (CLAIM.replace("factor = 2.0", "factor = true"), "factor must be a number > 0"),
    (CLAIM.replace("factor = 2.0", "saving = 1.5"), "saving must be a number < 1"),
    (CLAIM + "verdict = 'holds'\n", "unknown field(s) verdict"),
    ("claims = [1]\n", "claims[0] must be a [[claims]] table"),
    ("source = 5\n" + CLAIM, "source is not text"),
])
def test_odd_claims_fields_are_one_line_before_the_report_is_written(sweep_dir: Path, capsys, text: str,
                                                                      message: str) -> None:
    from experiments.report.__main__ import main as report_main

    claims = sweep_dir.parent / "claims.toml"
    claims.write_text(text)
    assert report_main([str(sweep_dir), "--claims", str(claims)]) == 2
    one_line_error(capsys, message)
    assert not (sweep_dir / "summary.md").exists()


@pytest.fixture()
def claimed_sweep(tmp_path: Path) -> tuple[Path, Path]:
    """A sweep folder whose rows CLAIM matches (mamba and attention at 32 px), and that claims file."""
    for mixer in ("mamba", "attention"):
        for img in (16, 32, 64):
            append_row(tmp_path / "sweep" / "runs.csv", _cost_row(mixer, img, 8, "{}", "ok"))
    claims = tmp_path / "claims.toml"
    claims.write_text(CLAIM)
    return tmp_path / "sweep", claims


def _claims_reported(sweep: Path) -> bool:
    summary = (sweep / "summary.md").read_text()
    return (sweep / "tables" / "claims.csv").is_file() and "## Published claims" in summary


def test_a_plain_rebuild_checks_the_claims_the_previous_report_checked(claimed_sweep: tuple[Path, Path],
                                                                       capsys) -> None:
    from experiments.report.__main__ import main as report_main

    sweep, claims = claimed_sweep
    assert report_main([str(sweep), "--claims", str(claims)]) == 0 and _claims_reported(sweep)
    assert report_main([str(sweep)]) == 0 and _claims_reported(sweep)
    assert f"checking the claims of {claims} again" in capsys.readouterr().out
    assert report_main([str(sweep), "--no-claims"]) == 0  # dropped on request: tables, section and record
    assert not (sweep / "tables" / "claims.csv").exists() and "## Published claims" not in (
        sweep / "summary.md").read_text()
    assert report_main([str(sweep)]) == 0 and not (sweep / "tables" / "claims.csv").exists()


def test_claims_the_report_cannot_name_again_are_one_line(claimed_sweep: tuple[Path, Path], capsys) -> None:
    from experiments.report.__main__ import main as report_main
    from experiments.report.claims import ClaimsError
    from experiments.report.manifest import read_manifest, recorded_claims, write_manifest

    sweep, claims = claimed_sweep
    assert report_main([str(sweep), "--claims", str(claims)]) == 0
    summary = (sweep / "summary.md").read_text()
    claims.unlink()  # the recorded claims file is gone
    assert report_main([str(sweep)]) == 2
    one_line_error(capsys, "--no-claims drops them")
    with pytest.raises(ClaimsError, match="--no-claims drops them"):  # a sweep's end-of-run report says so too
        build_report(sweep)
    write_manifest(sweep, read_manifest(sweep))  # a manifest from before the claims were recorded
    assert recorded_claims(sweep) is None
    assert report_main([str(sweep)]) == 2
    one_line_error(capsys, "--claims NAME|PATH to keep them")
    assert (sweep / "summary.md").read_text() == summary and (sweep / "tables" / "claims.csv").is_file()


def test_readme_outside_the_sweeps_parent_is_refused_before_the_report(sweep_dir: Path, capsys) -> None:
    from experiments.report.__main__ import main as report_main

    readme = sweep_dir.parent / "elsewhere" / "README.md"
    readme.parent.mkdir()
    readme.write_text("a\n<!-- headline:start -->\nold\n<!-- headline:end -->\nb\n")
    assert report_main([str(sweep_dir), "--readme", str(readme)]) == 2
    one_line_error(capsys, "is not under the README's folder")
    assert readme.read_text() == "a\n<!-- headline:start -->\nold\n<!-- headline:end -->\nb\n"
    assert not (sweep_dir / "summary.md").exists()


@pytest.mark.parametrize("text,message", [
    ("a\n<!-- headline:end -->\nold\n<!-- headline:start -->\nb\n", "has <!-- headline:end --> before"),
    ("<!-- headline:start -->\n<!-- headline:end -->\n<!-- headline:start -->\n<!-- headline:end -->\n",
     "more than once"),
])
def test_reversed_or_repeated_headline_markers_leave_the_readme_untouched(sweep_dir: Path, capsys, text: str,
                                                                          message: str) -> None:
    from experiments.report.__main__ import main as report_main

    readme = sweep_dir.parent / "README.md"
    readme.write_text(text)
    assert report_main([str(sweep_dir), "--readme", str(readme)]) == 2
    one_line_error(capsys, message)
    assert readme.read_text() == text
    assert not (sweep_dir / "summary.md").exists()


def test_readme_above_the_sweep_gets_its_headline(sweep_dir: Path) -> None:
    from experiments.report.__main__ import main as report_main

    readme = sweep_dir.parent / "README.md"
    readme.write_text("a\n<!-- headline:start -->\nold\n<!-- headline:end -->\nb\n")
    assert report_main([str(sweep_dir), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old" not in text and "](sweep/figures/wall" in text and text.endswith("<!-- headline:end -->\nb\n")


# --- defect 7: the benchmark command lines -----------------------------------------------------------------------

@pytest.mark.parametrize("module,argv,message", [
    ("scan", ["--length", "0"], "argument --lengths/--length: must be in 1 .."),
    ("scan", ["--lengths", "0"], "argument --lengths/--length: must be in 1 .."),
    ("scan", ["--batch", "-1"], "argument --batch: must be in 1 .."),
    ("scan", ["--channels", "x"], "argument --channels: expected an integer"),
    ("scan", ["--block-seconds", "nan"], "argument --block-seconds: must be a finite number > 0"),
    ("scan", ["--device", "cuda", "--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    ("mixers", ["--grid", "0", "4"], "argument --grid: must be in 1 .."),
    ("mixers", ["--threads", "0"], "argument --threads: must be in 1 .."),
    ("mixers", ["--mixers", "mambaa"], "unknown mixer(s) mambaa; registered:"),
    ("mixers", ["--dim", "10", "--heads", "3", "--mixers", "attention"], "--dim 10 --heads 3: dim=10 is not"),
])
def test_bench_cli_bad_arguments_are_one_line(capsys, module: str, argv: list[str], message: str) -> None:
    import importlib

    main = importlib.import_module(f"experiments.bench.{module}").main
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    one_line_error(capsys, message)
