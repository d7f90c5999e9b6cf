"""Tests of the report: tables, figures, exponents, crossovers and input checks on a synthetic runs.csv.

The fixture's costs come from power laws, so the right exponents and crossovers are known exactly.
"""
from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.report import plots as report_plots
from experiments.report import plots_cost
from experiments.report.build import ReportError, build_report, load_runs
from experiments.report.manifest import content_hash, read_manifest, write_manifest
from experiments.report.crossover import (
    COST_KEYS, RECIPE_KEYS, REPLICATE_KEYS, cost_points, crossover_table, curve_keys, curve_points, exponent_table,
    find_crossover, first_failures, fit_exponent,
)
from experiments.report.plots import json_differences, mixer_style
from experiments.report.plots_accuracy import pareto_front
from experiments.report.tables import cost_tables, exponent_tables, fmt_spread, to_latex
from experiments.schema import COLUMNS, KEY_COLUMNS

REPO = Path(__file__).resolve().parents[1]

# cost = coefficient * N^exponent, per mixer: (latency ms, peak memory MiB, GMACs).
POWER_LAWS: dict[str, tuple[tuple[float, float], tuple[float, float], tuple[float, float]]] = {
    "attention": ((1e-4, 2), (0.02, 1), (1e-6, 2)),
    "attention_naive": ((2e-4, 2), (1e-4, 2), (1e-6, 2)),
    "swin": ((0.02, 1), (0.03, 1), (2e-3, 1)),
    "linear": ((0.05, 1), (0.01, 1), (1e-3, 1)),
    "mamba": ((0.08, 1), (0.015, 1), (3e-3, 1)),
}
IMG_SIZES = (64, 128, 256, 512)
PATCH_SIZES = (8, 16)
# Points that did not run: the largest sizes of attention_naive, and one skipped mamba point.
NOT_OK: dict[tuple[str, int, int], str] = {
    ("attention_naive", 512, 8): "oom",
    ("attention_naive", 512, 16): "timeout",
    ("attention_naive", 256, 8): "oom",
    ("mamba", 512, 8): "skipped",
}


def synthetic_runs() -> pd.DataFrame:
    """A runs.csv frame with every schema column, costs from `POWER_LAWS`, accuracy for the small images."""
    rows = []
    for mixer, ((lat_a, lat_e), (mem_a, mem_e), (mac_a, mac_e)) in POWER_LAWS.items():
        for patch in PATCH_SIZES:
            for img in IMG_SIZES:
                tokens = (img // patch) ** 2
                row = {c: "" for c in COLUMNS}
                row.update(mixer=mixer, preset="micro", overrides="{}", img_size=img, patch_size=patch,
                           batch_size=8, device="cpu", dtype="float32", dataset="synthetic", epochs=1, seed=0,
                           train='{"lr":0.001}', train_status="ok",
                           tokens=tokens, grid_h=img // patch, grid_w=img // patch, dim=64, depth=2,
                           num_heads=2, mlp_ratio=4, impl="sdpa-math" if mixer == "attention" else "reference",
                           commit="abc1234", dirty=False, torch_version="2.5.0", device_name="Synthetic CPU",
                           cpu_threads=2, python_version="3.11.9", memory_method="cpu_profiler",
                           timestamp=f"2024-01-01T00:00:{len(rows) % 60:02d}Z")
                status = NOT_OK.get((mixer, img, patch), "ok")
                row["status"] = status
                if status != "ok":
                    row["error"] = f"synthetic {status}"
                    row["train_status"] = ""
                    rows.append(row)
                    continue
                latency = lat_a * tokens**lat_e
                row.update(params=1e5 * (1 + len(mixer)), gmacs=mac_a * tokens**mac_e,
                           latency_ms=latency, latency_iqr_ms=0.05 * latency, latency_repeats=10,
                           throughput_img_s=8 / latency * 1e3, peak_mem_mb=mem_a * tokens**mem_e,
                           train_step_ms=3 * latency, train_step_iqr_ms=0.1 * latency,
                           train_peak_mem_mb=3 * mem_a * tokens**mem_e)
                row["macs"] = row["gmacs"] * 1e9
                row["gflops"] = 2 * row["gmacs"]
                if img <= 128:
                    row["accuracy"] = 0.3 + 0.05 * math.log2(tokens) + 0.01 * len(mixer) / 10
                rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    """A sweep folder holding the synthetic runs.csv."""
    synthetic_runs().to_csv(tmp_path / "runs.csv", index=False)
    return tmp_path


@pytest.fixture()
def small_sweep(tmp_path: Path) -> Path:
    """A sweep folder with two mixers at one patch size: quick to report on."""
    runs = synthetic_runs()
    runs[runs["mixer"].isin(["attention", "linear"]) & (runs["patch_size"] == 16)].to_csv(
        tmp_path / "runs.csv", index=False)
    return tmp_path


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The synthetic runs as `load_runs` returns them, so tests see exactly what the report sees."""
    path = tmp_path_factory.mktemp("loaded") / "runs.csv"
    synthetic_runs().to_csv(path, index=False)
    return load_runs(path)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """The report of the synthetic sweep, built once for the module: (sweep folder, files written)."""
    folder = tmp_path_factory.mktemp("sweep")
    synthetic_runs().to_csv(folder / "runs.csv", index=False)
    return folder, build_report(folder)


# --- outputs -----------------------------------------------------------------------------------------------

def test_every_table_and_figure_is_written(report: tuple[Path, list[Path]]) -> None:
    folder, written = report
    names = {p.relative_to(folder).as_posix() for p in written}
    for table in ("costs", "exponents", "crossovers", "ratios"):
        assert {f"tables/{table}.{ext}" for ext in ("csv", "md", "tex")} <= names
    figures = {"wall_patch-8", "wall_patch-16", "wall_train_patch-8", "wall_train_patch-16", "patch_resolution",
               "accuracy_cost_synthetic", "accuracy_tokens"}  # trained at several N: accuracy against N
    # Named by what differs between figures only: nothing says "dataset", "epochs" or "none".
    assert {n.removeprefix("figures/").rsplit(".", 1)[0] for n in names if n.startswith("figures/")} == figures
    assert "summary.md" in names
    for path in written:
        assert path.is_file() and path.stat().st_size > 0, path


def test_cost_table_keeps_every_status_and_reads_well(report: tuple[Path, list[Path]]) -> None:
    folder, _ = report
    costs = pd.read_csv(folder / "tables" / "costs.csv")
    assert len(costs) == len(synthetic_runs())
    assert set(costs["Status"]) == {"ok", "oom", "timeout", "skipped"}
    assert {"Latency (ms)", "Peak mem. inference (MiB)", "GMACs / img"} <= set(costs.columns)
    accuracy = pd.read_csv(folder / "tables" / "accuracy.csv")
    assert {"Dataset", "Epochs", "Top-1 acc. (%)", "GMACs / img"} <= set(accuracy.columns)
    assert len(accuracy) == synthetic_runs()["accuracy"].ne("").sum()
    markdown = (folder / "tables" / "costs.md").read_text()
    assert "Latency (ms, median ± IQR)" in markdown
    latex = (folder / "tables" / "costs.tex").read_text()
    assert "\\toprule" in latex and "\\bottomrule" in latex and "$\\pm$" in latex


def test_summary_states_convention_and_provenance(report: tuple[Path, list[Path]]) -> None:
    folder, _ = report
    summary = (folder / "summary.md").read_text()
    for phrase in ("GFLOPs = 2 x GMACs", "9 x L x D x N FLOPs per direction", "abc1234", "2.5.0",
                   "Synthetic CPU", "float32", "cpu_threads: 2", "tables/crossovers.md", "figures/wall_patch-8.png",
                   "## Crossovers", "## Scaling exponents"):
        assert phrase in summary, phrase


def test_rebuild_removes_stale_outputs(small_sweep: Path) -> None:
    build_report(small_sweep)
    stale = small_sweep / "figures" / "wall_old-setting.png"
    stale.write_bytes(b"old")
    # A previous report drew it (its manifest says so); a file it did not list is never removed (test_out_dir_safety).
    write_manifest(small_sweep, {**read_manifest(small_sweep), "figures/wall_old-setting.png": content_hash(stale)})
    build_report(small_sweep)
    assert not stale.exists()


# --- exponents and crossovers ------------------------------------------------------------------------------

def test_exponents_recover_the_power_laws(loaded: pd.DataFrame) -> None:
    exponents = exponent_table(loaded)
    for mixer, laws in POWER_LAWS.items():
        for metric, (_, exponent) in zip(("latency_ms", "peak_mem_mb", "gmacs"), laws):
            fitted = exponents[(exponents["mixer"] == mixer) & (exponents["metric"] == metric)]["exponent"]
            assert np.allclose(fitted, exponent, atol=1e-6), (mixer, metric)


def test_exponent_is_fitted_over_the_largest_sizes_only() -> None:
    tokens = np.array([1, 4, 16, 64, 256, 1024])
    cost = np.where(tokens <= 16, tokens, tokens**2 / 16.0)  # linear, then quadratic
    exponent, used = fit_exponent(tokens, cost, n_points=3)
    assert exponent == pytest.approx(2.0)
    assert list(used) == [64, 256, 1024]
    assert math.isnan(fit_exponent([8], [1.0])[0])


def test_crossover_of_power_laws_is_found_within_one_percent() -> None:
    tokens = np.array([10.0, 30.0, 70.0, 300.0, 1000.0])
    crossover = find_crossover(tokens, cost=100 * tokens, ref_cost=tokens**2)
    assert crossover.kind == "crosses"
    assert crossover.tokens == pytest.approx(100, rel=0.01)


@pytest.mark.parametrize(("cost", "kind"), [(0.5, "always"), (2.0, "never")])
def test_crossover_always_and_never(cost: float, kind: str) -> None:
    tokens = np.array([16.0, 64.0, 256.0])
    crossover = find_crossover(tokens, cost * tokens**2, tokens**2)
    assert crossover.kind == kind and crossover.tokens is None
    assert crossover.describe() in ("always cheaper", "never in range")


def test_crossover_cheaper_only_below_and_no_data() -> None:
    tokens = np.array([10.0, 100.0, 1000.0])
    crossover = find_crossover(tokens, cost=tokens**2, ref_cost=100 * tokens)
    assert crossover.kind == "only_below" and crossover.tokens == pytest.approx(100, rel=0.01)
    assert find_crossover([], [], []).kind == "no_data"


def test_one_common_point_is_no_range() -> None:
    """A budgeted sweep's first rows hold one size per curve: "never in range" would claim a range not measured."""
    crossover = find_crossover([196.0], [2.0], [1.0])
    assert crossover.kind == "one_point" and crossover.tokens is None
    assert crossover.describe() == "one common point"


def test_crossover_table_finds_the_known_answer(loaded: pd.DataFrame) -> None:
    crossovers = crossover_table(loaded)
    # linear: 0.05 N against attention: 1e-4 N^2 cross at N = 500, inside the patch-8 range (64 to 4096).
    row = crossovers[(crossovers["mixer"] == "linear") & (crossovers["reference"] == "attention")
                     & (crossovers["metric"] == "latency_ms") & (crossovers["patch_size"] == 8)].iloc[0]
    assert row["kind"] == "crosses"
    assert row["tokens"] == pytest.approx(500, rel=0.01)
    assert row["img_px_p8"] == pytest.approx(math.sqrt(500) * 8, rel=0.01)
    # attention's memory is linear like linear's, with a higher coefficient: linear is always cheaper.
    memory = crossovers[(crossovers["mixer"] == "linear") & (crossovers["reference"] == "attention")
                        & (crossovers["metric"] == "peak_mem_mb")]
    assert set(memory["kind"]) == {"always"}
    # Comparisons with attention_naive stop where it ran out of memory, and the note says so.
    naive = crossovers[(crossovers["reference"] == "attention_naive") & (crossovers["patch_size"] == 8)]
    assert naive["note"].str.contains("attention_naive oom from N = 1,024").all()


# --- cost points, facets and training-step failures ----------------------------------------------------------

def cost_only_and_training_rows() -> pd.DataFrame:
    """The synthetic sweep as cost-only rows (epochs 0, no data set), plus two training rows (two seeds) at one
    point (linear, 64 px, patch 8) whose latencies differ: 3 latencies at that point in all."""
    runs = synthetic_runs().assign(dataset="", epochs=0, train="{}", accuracy="")
    point = runs[(runs["mixer"] == "linear") & (runs["img_size"] == 64) & (runs["patch_size"] == 8)]
    trained = pd.concat([point, point]).assign(dataset="pathfinder", epochs=4, train='{"batch_size":64}',
                                               seed=[0, 1], accuracy=[0.6, 0.7], train_status="",
                                               train_step_ms="")
    trained["latency_ms"] = point["latency_ms"].iloc[0] * np.array([2.0, 4.0])
    return pd.concat([runs, trained], ignore_index=True)


@pytest.fixture()
def mixed(tmp_path: Path) -> Path:
    """A sweep folder whose runs.csv mixes cost-only and training rows (`cost_only_and_training_rows`)."""
    cost_only_and_training_rows().to_csv(tmp_path / "runs.csv", index=False)
    return tmp_path


def test_every_key_column_is_a_cost_recipe_or_replicate_key() -> None:
    assert sorted(COST_KEYS + RECIPE_KEYS + REPLICATE_KEYS) == sorted(KEY_COLUMNS)


def test_text_columns_stay_text(mixed: Path) -> None:
    runs = load_runs(mixed / "runs.csv")
    assert set(runs["train"]) == {"{}", '{"batch_size":64}'}
    assert set(runs["train_status"]) == {"ok", ""}
    summary_free = synthetic_runs().drop(columns=["train"])  # an older runs.csv, before the train column
    summary_free.to_csv(mixed / "runs.csv", index=False)
    assert set(load_runs(mixed / "runs.csv")["train"]) == {"{}"}


def test_duplicate_cost_rows_are_one_point_at_their_median(mixed: Path) -> None:
    runs = load_runs(mixed / "runs.csv")
    base = POWER_LAWS["linear"][0][0] * 64  # linear at 64 px, patch 8: N = 64
    points = cost_points(runs, ["latency_ms"])
    assert len(points) == len(synthetic_runs())
    at = points[(points["mixer"] == "linear") & (points["img_size"] == 64) & (points["patch_size"] == 8)]
    assert at["latency_ms"].item() == pytest.approx(2 * base)  # median of base, 2 base and 4 base
    curve = curve_points(runs, "latency_ms", curve_keys(runs))
    at = curve[(curve["mixer"] == "linear") & (curve["patch_size"] == 8) & (curve["tokens"] == 64)]
    assert at["latency_ms"].item() == pytest.approx(2 * base)
    costs = cost_tables(runs)[0]
    assert len(costs) == len(synthetic_runs()) and "Dataset" not in costs and "Epochs" not in costs


def test_training_rows_do_not_split_cost_curves(mixed: Path) -> None:
    runs = load_runs(mixed / "runs.csv")
    assert curve_keys(runs) == ["patch_size"]
    for table in (exponent_table(runs), crossover_table(runs)):
        assert not {"dataset", "epochs", "train", "seed"} & set(table.columns)
    written = build_report(mixed)
    figures = {p.stem for p in written if p.suffix == ".png"}
    assert figures == {"wall_patch-8", "wall_patch-16", "wall_train_patch-8", "wall_train_patch-16",
                       "patch_resolution", "accuracy_cost_pathfinder"}
    summary = (mixed / "summary.md").read_text()
    assert not re.search(r"\bnan\b", summary) and "Training: pathfinder, 4 epochs" in summary


def test_tables_have_no_empty_facet_rows(mixed: Path) -> None:
    runs = load_runs(mixed / "runs.csv")
    runs = runs[~((runs["mixer"] == "mamba") & (runs["patch_size"] == 16))]  # a curve that does not exist
    keys = curve_keys(runs)
    display = exponent_tables(exponent_table(runs), keys)[1]
    assert len(display) == 9  # 5 mixers at patch 8, 4 at patch 16: no product of the key values
    exponent_columns = [c for c in display.columns if c.endswith("exp.")]
    assert not (display[exponent_columns] == "–").all(axis=1).any()


def test_exponent_rows_without_any_fit_are_dropped() -> None:
    exponents = pd.DataFrame({"patch_size": [8, 8, 16], "mixer": ["linear", "swin", "linear"],
                              "metric": ["latency_ms"] * 3, "exponent": [1.0, 1.1, math.nan],
                              "points": [3, 3, 1], "tokens_min": [16, 16, 64], "tokens_max": [64, 64, 64]})
    display = exponent_tables(exponents, ["patch_size"])[1]
    assert list(display["Mixer"]) == ["swin", "linear"] and set(display["Patch (px)"]) == {"8"}


def with_train_step_failures() -> pd.DataFrame:
    """The synthetic sweep where linear's training step ran out of memory at 256 px and was skipped at 512 px
    (patch 8), while its inference ran."""
    runs = synthetic_runs()
    linear8 = (runs["mixer"] == "linear") & (runs["patch_size"] == 8)
    for img, status in ((256, "oom"), (512, "skipped")):
        row = linear8 & (runs["img_size"] == img)
        train_costs = ["train_step_ms", "train_step_iqr_ms", "train_peak_mem_mb"]
        runs.loc[row, ["train_status", *train_costs]] = [status, "", "", ""]
    return runs


def test_train_step_failure_ends_the_training_curve_only(tmp_path: Path) -> None:
    with_train_step_failures().to_csv(tmp_path / "runs.csv", index=False)
    runs = load_runs(tmp_path / "runs.csv")
    train = first_failures(runs, "train_step_ms")
    linear = train[(train["mixer"] == "linear") & (train["patch_size"] == 8)]
    assert linear[["tokens", "status"]].values.tolist() == [[1024, "oom"]]
    inference = first_failures(runs, "latency_ms")
    assert inference[inference["mixer"] == "linear"].empty


def test_train_step_failure_is_marked_in_the_training_panels(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    with_train_step_failures().to_csv(tmp_path / "runs.csv", index=False)
    drawn = {}
    monkeypatch.setattr(plots_cost, "_save", lambda fig, stem: drawn.setdefault(stem.name, fig) and [])
    build_report(tmp_path)

    def x_markers(name: str) -> list[float]:
        axes = [ax for ax in drawn[name].axes if ax.get_ylabel()]
        return [x for ax in axes for line in ax.lines if line.get_marker() == "x" for x in line.get_xdata()]

    # At patch 8, attention_naive's inference ran out of memory at N = 1,024 (so did its training step), and
    # linear's training step alone did.
    expected = {(1024, mixer_style("attention_naive").color), (1024, mixer_style("linear").color)}
    train_axes = [ax for ax in drawn["wall_train_patch-8"].axes if ax.get_ylabel()]
    assert len(train_axes) == 2
    for ax in train_axes:
        marks = [line for line in ax.lines if line.get_marker() == "x"]
        assert {(m.get_xdata()[0], m.get_color()) for m in marks} == expected
    assert x_markers("wall_patch-8") == [1024] * 3  # attention_naive's only, once per panel
    assert x_markers("wall_train_patch-16") == []


def test_facet_names_say_only_what_differs() -> None:
    assert json_differences(['{"lr": 0.01, "bs": 64}', '{"bs": 64}']) == [{"lr": "0.01"}, {"lr": "default"}]
    rows = pd.DataFrame({"dataset": ["cifar", "cifar"], "train": ['{"lr":0.1,"bs":8}', '{"lr":0.2,"bs":8}'],
                         "epochs": [3, 3]})
    facets = report_plots.facets(rows, ["train"], always=("dataset",), context=("epochs",))
    assert [f.suffix for f in facets] == ["_cifar_lr-0.1", "_cifar_lr-0.2"]
    assert facets[0].title == "cifar · recipe lr=0.1 · 3 epochs"


# --- styles and helpers ------------------------------------------------------------------------------------

def test_mixer_styles_are_fixed_distinct_and_stable() -> None:
    builtins = ["attention", "attention_naive", "swin", "linear", "mamba"]
    colors = {mixer_style(m).color for m in builtins}
    assert len(colors) == len(builtins)
    added = mixer_style("my_new_mixer")
    assert added == mixer_style("my_new_mixer")
    assert added.color not in colors


def test_pareto_front_keeps_only_undominated_points() -> None:
    cost = np.array([1.0, 2.0, 3.0, 4.0, 2.0])
    accuracy = np.array([0.5, 0.7, 0.6, 0.8, 0.4])
    assert list(pareto_front(cost, accuracy)) == [0, 1, 3]


def test_formatting_helpers() -> None:
    assert fmt_spread(12.345, 0.4321) == "12.3 ± 0.4"
    assert "\\_" in to_latex(pd.DataFrame({"Mixer": ["attention_naive"]}), "c", "tab:x")


def test_rerun_keeps_the_last_ok_row(sweep: Path) -> None:
    runs = synthetic_runs()
    retry = runs[runs["status"] == "ok"].iloc[[0]].assign(status="error", latency_ms="")
    pd.concat([runs, retry]).to_csv(sweep / "runs.csv", index=False)
    loaded = load_runs(sweep / "runs.csv")
    assert len(loaded) == len(runs)
    assert loaded.loc[0, "status"] == "ok"


# --- input checks ------------------------------------------------------------------------------------------

def test_missing_runs_csv(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no runs.csv"):
        build_report(tmp_path)


def test_empty_runs_csv(tmp_path: Path) -> None:
    (tmp_path / "runs.csv").write_text("")
    with pytest.raises(ReportError, match="is empty"):
        build_report(tmp_path)


def test_header_only_runs_csv(tmp_path: Path) -> None:
    (tmp_path / "runs.csv").write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(ReportError, match="no rows"):
        build_report(tmp_path)


HEADER = ",".join(COLUMNS).encode()


@pytest.mark.parametrize("content", [
    HEADER + b"\n" + b"x," * len(COLUMNS) + b"\n" + b"x," * (2 * len(COLUMNS)) + b"\n",  # a row too long
    HEADER + b'\n"an unterminated quote,1\n',
    bytes(range(128, 256)) * 4,  # not text
])
def test_corrupt_runs_csv(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "runs.csv").write_bytes(content)
    with pytest.raises(ReportError, match="cannot parse"):
        build_report(tmp_path)


def test_missing_columns_are_named(sweep: Path) -> None:
    synthetic_runs().drop(columns=["latency_ms", "tokens"]).to_csv(sweep / "runs.csv", index=False)
    with pytest.raises(ReportError, match="missing required column\\(s\\): tokens, .*latency_ms"):
        build_report(sweep)


def test_non_numeric_key_names_the_line(sweep: Path) -> None:
    runs = synthetic_runs().astype({"img_size": object})
    runs.loc[3, "img_size"] = "big"
    runs.to_csv(sweep / "runs.csv", index=False)
    with pytest.raises(ReportError, match="'img_size' is empty or not a number on line\\(s\\) 5"):
        build_report(sweep)


def test_cli_exits_2_with_one_line_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "experiments.report", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("error: no runs.csv")
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_report_does_not_import_torch_or_models(small_sweep: Path) -> None:
    code = (
        "import sys\n"
        "from experiments.report.__main__ import main\n"
        f"assert main([{str(small_sweep)!r}]) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mixers', 'models')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
