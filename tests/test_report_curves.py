"""The report's learning curves, convergence marks, the two numbers per training and the reach positive control,
from a synthetic sweep folder (runs.csv and curves/*.csv written here; nothing trains)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.report.build import build_report, load_runs
from experiments.report.control import CONTROLS, UNDER_TRAINED, control_of, control_verdicts
from experiments.report.curves import load_curves
from experiments.report.plots_curves import _curve_figure, curve_rows
from experiments.report.reach import reach_summary
from experiments.report.stats import ACCURACY_BOUNDS, seed_stats
from experiments.report.tables import accuracy_tables
from experiments.report.tables_convergence import convergence_tables
from experiments.schema import COLUMNS, CURVE_COLUMNS, CURVES_DIR, KEY_COLUMNS

SEEDS = (0, 1, 2)
EVALS = 21  # evaluation 0 (before the first step) and 20 more, evenly spaced in samples seen
SAMPLES = 4000  # samples seen at the last evaluation
FLOPS_PER_SAMPLE = 1e7
TARGET = 0.9
# Per mixer: the accuracy its curve climbs to (all buckets alike but the control), its control bucket's, and
# whether it converged. swin misses its control (under-trained); "mymixer" is a user's mixer with no known control.
MIXERS = {"attention": (0.95, 0.97, True), "swin": (0.6, 0.55, False), "mymixer": (0.8, 0.95, True)}
BUCKETS = ("horizontal:1", "horizontal:3", "vertical:1", "vertical:3")


def _curve(final: float, control: float, seed: int) -> list[dict]:
    """A curve rising from chance to `final` (the control bucket to `control`), distinct per seed."""
    points = []
    for i in range(EVALS):
        share = 1 - math.exp(-4 * i / (EVALS - 1))
        wobble = 0.004 * (seed - 1)  # seeds differ, so the band has a width
        acc = 0.5 + (final - 0.5) * share + wobble
        buckets = {b: round(0.5 + ((control if b == "horizontal:1" else final) - 0.5) * share + wobble, 4)
                   for b in BUCKETS}
        samples = SAMPLES * i / (EVALS - 1)
        points.append({"eval_index": i, "epoch": i / 5, "optimizer_steps": i * 10, "samples_seen": samples,
                       "train_flops": samples * FLOPS_PER_SAMPLE, "wall_s": i * 0.5, "lr": 1e-3,
                       "train_loss": "" if i == 0 else 0.7 - 0.01 * i, "val_loss": 0.69 - 0.01 * i,
                       "val_accuracy": round(acc, 4), "val_accuracy_by_bucket": json.dumps(buckets)})
    return points


def _first(points: list[dict], target: float) -> dict | None:
    return next((p for p in points if p["val_accuracy"] >= target), None)


def curve_sweep(folder: Path, convergence: bool = True) -> Path:
    """runs.csv of 3 mixers x 3 seeds on reach, with curve files, one truncated and one foreign."""
    rows, curves = [], []
    for mixer, (final, control, converged) in MIXERS.items():
        for seed in SEEDS:
            points = _curve(final, control, seed)
            last = points[-1]
            reached = _first(points, TARGET)
            by_bucket = {b: v for b, v in json.loads(last["val_accuracy_by_bucket"]).items()}
            row = {c: "" for c in COLUMNS}
            row.update(mixer=mixer, preset="micro", overrides="{}", img_size=32, patch_size=4, batch_size=1,
                       device="cpu", dtype="float32", dataset="reach", epochs=10, seed=seed,
                       train='{"batch_size":32}', tokens=64, status="ok", params=2e5, gmacs=0.015, latency_ms=1.0,
                       peak_mem_mb=1.0, accuracy=last["val_accuracy"], val_accuracy=last["val_accuracy"],
                       accuracy_by_bucket=json.dumps(by_bucket), train_time_s=10.0)
            if convergence:
                row.update(converged=str(converged), stop_reason="plateau" if converged else "max_budget",
                           converged_samples=SAMPLES * 0.8, target_accuracy=TARGET, curve_points=EVALS,
                           samples_to_target=reached["samples_seen"] if reached else "",
                           flops_to_target=reached["train_flops"] if reached else "")
            rows.append(row)
            curves.append(({c: row[c] for c in KEY_COLUMNS}, points))
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(folder / "runs.csv", index=False)
    if not convergence:
        return folder
    (folder / CURVES_DIR).mkdir()
    for i, (key, points) in enumerate(curves):
        with (folder / CURVES_DIR / f"{i:02d}.csv").open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=[*KEY_COLUMNS, *CURVE_COLUMNS])
            writer.writeheader()
            writer.writerows({**key, **p} for p in points)
    truncated = folder / CURVES_DIR / "08.csv"  # mymixer, seed 2: killed inside a write
    truncated.write_bytes(truncated.read_bytes()[:-40])
    short = folder / CURVES_DIR / "05.csv"  # swin, seed 2: cut at a line's end, fewer evaluations than its row's
    short.write_text("".join(short.read_text(encoding="utf-8").splitlines(keepends=True)[:11]), encoding="utf-8")
    (folder / CURVES_DIR / "foreign.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    return folder


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    return curve_sweep(tmp_path)


def test_curves_join_by_key_and_skip_a_truncated_or_foreign_file(sweep: Path) -> None:
    runs = load_runs(sweep / "runs.csv")
    curves = load_curves(sweep, runs)
    assert curves.points["row"].nunique() == len(runs) - 2  # every row but the two truncated ones
    assert len(curves.points) == (len(runs) - 2) * EVALS
    notes = " ".join(curves.notes)
    assert "08.csv" in notes and "05.csv: truncated (holds 10 of the 21" in notes and "foreign.csv" in notes


def test_curves_are_drawn_per_mixer_with_seeds_banded(sweep: Path) -> None:
    runs = load_runs(sweep / "runs.csv")
    rows = curve_rows(runs, load_curves(sweep, runs).points)
    fig = _curve_figure(rows, "")
    flops_axis, samples_axis = fig.axes[:2]
    assert flops_axis.get_xscale() == "log"  # 200 to 4,000 samples' FLOPs: more than a decade
    # One band (a filled polygon) per mixer, each of its seeds inside it.
    assert len(samples_axis.collections) == len(MIXERS)
    for band, mixer in zip(samples_axis.collections, ["attention", "swin", "mymixer"]):
        ys = band.get_paths()[0].vertices[:, 1]
        last = rows[(rows["mixer"] == mixer) & (rows["eval_index"] == EVALS - 1)]["val_accuracy"]
        assert ys.max() == pytest.approx(last.max()) or ys.max() >= last.max()
        assert ys.min() <= last.min()


def test_a_seed_that_stopped_early_holds_its_last_accuracy_in_the_mean() -> None:
    """The seed that learnt and stopped on a plateau must not leave the mean, which would fall back to chance."""
    from experiments.report.plots_curves import _mean_band

    learnt = [(0, 0, 50.0), (0, 1, 100.0)]  # (row, eval_index, accuracy): stopped after two evaluations
    still = [(1, i, 50.0) for i in range(4)]
    curve = pd.DataFrame([dict(row=r, seed=r, eval_index=i, samples_seen=100 * i, val_accuracy=a)
                          for r, i, a in learnt + still])
    line = _mean_band(curve, "samples_seen")
    assert list(line["x"]) == [0, 100, 200, 300]
    assert list(line["mean"]) == [50.0, 75.0, 75.0, 75.0]
    assert (list(line["low"]), list(line["high"])) == ([50.0] * 4, [50.0, 100.0, 100.0, 100.0])
    assert list(line["seeds"]) == [2, 2, 2, 2]


def test_two_numbers_never_and_the_unconverged_mark(sweep: Path) -> None:
    runs = load_runs(sweep / "runs.csv")
    numeric, display = convergence_tables(runs)
    by_mixer = display.set_index("Mixer")
    assert by_mixer.at["swin", "Samples to target"] == "never"  # its curve tops out near 60%
    assert by_mixer.at["swin", "Train FLOPs to target"] == "never"
    assert by_mixer.at["attention", "Samples to target"] not in ("never", "–")
    assert by_mixer.at["swin", "Converged"].startswith("no") and "†" in by_mixer.at["swin", "Converged"]
    assert "†" in by_mixer.at["swin", "Converged acc. (%, test, mean ± s.d.)"]
    assert by_mixer.at["attention", "Converged"] == "yes"
    accuracy = accuracy_tables(runs)[1].set_index("Mixer")
    assert "†" in accuracy.at["swin", "Top-1 acc. (%, mean ± s.d.)"]
    assert "†" not in accuracy.at["attention", "Top-1 acc. (%, mean ± s.d.)"]


def test_positive_control_flags_an_under_trained_row(sweep: Path) -> None:
    runs = load_runs(sweep / "runs.csv")
    verdicts = control_verdicts(reach_summary(runs), []).set_index("mixer")
    assert verdicts.at["swin", "verdict"] == UNDER_TRAINED
    assert verdicts.at["attention", "verdict"] == "passes"
    assert verdicts.at["mymixer", "verdict"] == "no control"  # a user's mixer: the report does not guess
    assert control_of("swin", '{"mixer_options":{"window_size":1}}')[0] is None  # a 1 x 1 window covers nothing
    assert {"attention", "swin", "linear", "mamba", "mamba2", "vmamba", "gla", "neighborhood"} <= set(CONTROLS)


def test_no_interval_leaves_the_unit_range() -> None:
    one_learnt = seed_stats([31.0, 99.0, 99.5], ACCURACY_BOUNDS)  # a t interval of [-5, 158]% before clipping
    assert one_learnt["ci_low"] >= 0 and one_learnt["ci_high"] <= 100


def test_report_writes_curves_tables_and_marks(sweep: Path) -> None:
    written = build_report(sweep)
    names = {p.relative_to(sweep).as_posix() for p in written}
    # Figures are named by their facet; accuracy figures always by the data set.
    assert {"figures/curves_reach.png", "figures/curves_reach.pdf", "figures/curves_buckets_reach.png",
            "figures/curves_buckets_reach.pdf", "tables/convergence.md",
            "tables/reach_control.md", "tables/reach_to_target.md"} <= names
    manifest = json.loads((sweep / ".report-manifest.json").read_text())["files"]
    assert "figures/curves_reach.png" in manifest  # removed and rebuilt like every other figure
    summary = (sweep / "summary.md").read_text()
    assert "figures/curves_reach.png" in summary and "tables/convergence.md" in summary
    assert "08.csv" in summary and "under-trained" in summary and "provisional" in summary
    reach = (sweep / "tables" / "reach.md").read_text()
    assert "swin (under-trained)" in reach and "‡" in reach and "†" in reach
    for table in ("accuracy", "reach"):
        frame = pd.read_csv(sweep / "tables" / f"{table}.csv")
        low = [c for c in frame.columns if "CI low" in c or c == "ci_low_pct"]
        high = [c for c in frame.columns if "CI high" in c or c == "ci_high_pct"]
        values = frame[low + high].to_numpy(dtype=float)
        assert np.nanmin(values) >= 0 and np.nanmax(values) <= 100


def test_a_sweep_from_before_curves_says_so(tmp_path: Path) -> None:
    build_report(curve_sweep(tmp_path, convergence=False))
    summary = (tmp_path / "summary.md").read_text()
    assert "No learning curves recorded" in summary
    assert not (tmp_path / "tables" / "convergence.md").exists()
    assert not list((tmp_path / "figures").glob("curves*"))


def test_a_stop_reason_without_its_flag_reads_as_the_rule_decided() -> None:
    from experiments.report.convergence import converged_flags

    rows = pd.DataFrame({"converged": ["", "", "", "", "True"],
                         "stop_reason": ["plateau", "ceiling", "max_budget", "", "ceiling"]})
    assert converged_flags(rows).tolist() == [True, True, False, None, True]
