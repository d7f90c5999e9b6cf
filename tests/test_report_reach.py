"""The report's accuracy spread, reach curves and receptive field maps, from a synthetic sweep folder."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.report.build import build_report, load_runs
from experiments.report.erf import mass_radius
from experiments.report.plots import percent_error_bars
from experiments.report.reach import bucket_rows, reach_summary, separations
from experiments.report.stats import above_chance, seed_stats, t975
from experiments.schema import COLUMNS, KEY_COLUMNS
from experiments.sweep.config import _digest
from experiments.train.erf import save_erf

MIXERS = {"attention": 0.95, "swin": 0.6, "mamba": 0.52}  # accuracy at the longest distance
DISTANCES = (1, 3, 7)


def reach_runs() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for mixer, far in MIXERS.items():
        for seed in range(3):
            by_bucket = {}
            for direction in ("horizontal", "vertical", "diagonal"):
                for d in DISTANCES:
                    base = 0.97 if d == 1 else far
                    by_bucket[f"{direction}:{d}"] = round(float(base + rng.normal(0, 0.005)), 4)
            row = {c: "" for c in COLUMNS}
            row.update(mixer=mixer, preset="micro", overrides="{}" if mixer != "mamba" else '{"mixer_options":{"expand":1}}',
                       img_size=32, patch_size=4, batch_size=1, device="cpu", dtype="float32", dataset="reach",
                       epochs=4, seed=seed, train='{"batch_size":64}', tokens=64, status="ok", params=2e5,
                       gmacs=0.015, latency_ms=1.0, peak_mem_mb=1.0, accuracy=np.mean(list(by_bucket.values())),
                       accuracy_by_bucket=json.dumps(by_bucket), train_time_s=10.0)
            rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    runs = reach_runs()
    runs.to_csv(tmp_path / "runs.csv", index=False)
    grid = np.zeros((32, 32))
    for _, row in runs.iterrows():
        key = {c: row[c] for c in KEY_COLUMNS}
        wide = {"attention": 12, "swin": 3, "mamba": 8}[row["mixer"]]
        init = np.zeros((32, 32))
        init[16 - wide // 2 : 16 + wide // 2 + 2, 16 - wide // 2 : 16 + wide // 2 + 2] = 1
        save_erf(tmp_path / "erf" / f"{_digest(tuple(str(key[c]) for c in KEY_COLUMNS))}.npz",
                 {"init": init, "trained": init + grid}, key, 4)
    save_erf(tmp_path / "erf" / "stale.npz", {"init": np.ones((32, 32))}, {"mixer": "gone"}, 4)
    return tmp_path


def test_t_interval() -> None:
    assert t975(2) == pytest.approx(4.303, abs=1e-3)  # scipy's quantile; printed tables round it
    assert t975(60) == pytest.approx(2.000, abs=2e-3)
    stats = seed_stats([50.0, 52.0, 54.0])
    assert stats["mean"] == 52 and stats["sd"] == pytest.approx(2.0) and stats["n"] == 3
    assert stats["ci_high"] - stats["mean"] == pytest.approx(t975(2) * 2 / math.sqrt(3))
    one = seed_stats([51.0])
    assert one["n"] == 1 and math.isnan(one["ci_low"])
    assert not above_chance(one["ci_low"], 1, 50) and not above_chance(stats["ci_low"], 3, 50)
    assert above_chance(51.0, 3, 50)


def test_reach_summary_and_separations() -> None:
    runs = load_runs_frame(reach_runs())
    summary = reach_summary(runs)
    assert len(summary) == len(MIXERS) * 3 * len(DISTANCES) and (summary["seeds"] == 3).all()
    pairs = separations(bucket_rows(runs))
    assert (pairs["p_value"] < 0.05).all()  # Welch's t-test from scipy decides, not non-overlapping intervals
    far = pairs[pairs["distance"] == 7]
    assert {("attention", "swin"), ("attention", "mamba"), ("swin", "mamba")} <= set(zip(far["better"], far["worse"]))
    assert pairs[pairs["distance"] == 1].empty  # all at 97% there


def test_two_poolings_of_one_mixer_are_two_settings_not_its_seeds() -> None:
    """reach_pool trains each mixer under mean and max pooling: the control averaged the two (75% for a mixer at
    100% under one and 50% under the other) and called every mixer under-trained."""
    from experiments.report.reach import reach_controls, reach_tables

    runs = reach_runs()
    runs = runs[runs["mixer"] == "mamba"]
    learnt = runs.assign(overrides='{"mixer_options":{"expand":1},"pool":"max"}')
    at_chance = runs.assign(accuracy_by_bucket=runs["accuracy_by_bucket"].map(
        lambda text: json.dumps({bucket: 0.5 for bucket in json.loads(text)})))
    frame = load_runs_frame(pd.concat([learnt, at_chance]))
    verdicts = reach_controls(frame)
    assert dict(zip(verdicts["backbone"], verdicts["verdict"])) == {'{"pool":"max"}': "passes", "{}": "under-trained"}
    # The reach table once kept the first setting's cells and dropped the other's: a block of rows for each.
    _, wide = reach_tables(frame)
    assert sorted(wide["Shared overrides"].unique()) == ['{"pool":"max"}', "{}"]
    assert len(wide) == 2 * 3 * len(DISTANCES)


def test_two_option_sets_of_one_mixer_are_two_mixers_each_with_its_control() -> None:
    """reach_long trains swin with 2 x 2 windows and with one window over the grid: the reach table showed one of
    them under the name swin, and the control averaged both (75%) and called the one that learnt under-trained."""
    from experiments.report.reach import reach_controls, reach_tables

    runs = reach_runs()
    swin = runs[runs["mixer"] == "swin"]
    windows = swin.assign(overrides='{"mixer_options":{"window_size":2}}', accuracy_by_bucket=swin[
        "accuracy_by_bucket"].map(lambda text: json.dumps({bucket: 0.5 for bucket in json.loads(text)})))
    one_window = swin.assign(overrides='{"mixer_options":{"window_size":4}}')  # 97% at distance 1
    frame = load_runs_frame(pd.concat([runs[runs["mixer"] != "swin"], windows, one_window]))
    verdicts = reach_controls(frame)
    assert dict(zip(verdicts["mixer"], verdicts["verdict"])) == {
        "attention": "passes", "swin (window_size 2)": "under-trained", "swin (window_size 4)": "passes",
        "mamba": "passes"}  # mamba has one set of options: its plain name
    _, wide = reach_tables(frame)
    assert {"swin (window_size 2) (under-trained)", "swin (window_size 4)"} <= set(wide.columns)


def _with_identity(level: float, lr_of_identity: str = '{"batch_size":64}') -> pd.DataFrame:
    """reach_runs plus the negative control, identity, at `level` on every bucket (its own rate if given)."""
    runs = reach_runs()
    identity = runs[runs["mixer"] == "attention"].assign(
        mixer="identity", train=lr_of_identity,
        accuracy_by_bucket=lambda f: f["accuracy_by_bucket"].map(
            lambda text: json.dumps({bucket: level for bucket in json.loads(text)})))
    return load_runs_frame(pd.concat([runs, identity]))


def test_negative_control_at_chance_leaves_the_findings_standing() -> None:
    from experiments.report.reach import reach_controls, reach_tables

    runs = _with_identity(0.5)
    verdicts = reach_controls(runs).set_index("mixer")
    assert verdicts.loc["identity", "verdict"] == "at chance"
    assert verdicts.loc["attention", "verdict"] == "passes"
    pairs = separations(bucket_rows(runs))
    assert not pairs["note"].str.contains("solvable").any()
    numeric, _ = reach_tables(runs)
    assert not numeric["solvable_without_mixing"].any()


def test_negative_control_above_chance_makes_every_reading_of_its_task_no_finding() -> None:
    """A model that mixes nothing at 100% (reach under a max over the tokens): no mixer's reach there is a finding,
    though identity trained at a rate of its own (another `train`, the same task)."""
    from experiments.report.reach import reach_controls, reach_notes, reach_summary_lines, reach_tables

    runs = _with_identity(1.0, lr_of_identity='{"batch_size":64,"lr":0.002}')
    verdicts = reach_controls(runs).set_index("mixer")
    assert verdicts.loc["identity", "verdict"] == "solvable without mixing"
    pairs = separations(bucket_rows(runs))
    assert len(pairs) and pairs["note"].str.contains("not a finding: solvable without mixing").all()
    numeric, display = reach_tables(runs)
    assert numeric["solvable_without_mixing"].all()
    shown = display["attention"][display["attention"] != "–"]
    assert len(shown) and shown.str.endswith("§").all()
    assert any(note.startswith("§ solvable without mixing") for note in reach_notes(numeric))
    assert any("identity: **solvable without mixing**" in line for line in reach_summary_lines(runs))


def load_runs_frame(frame: pd.DataFrame, tmp: Path | None = None) -> pd.DataFrame:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "runs.csv"
        frame.to_csv(path, index=False)
        return load_runs(path)


def test_report_draws_reach_erf_and_spread(sweep: Path) -> None:
    written = {p.relative_to(sweep).as_posix() for p in build_report(sweep)}
    for stem in ("reach", "erf", "accuracy_cost_reach"):
        assert {f"figures/{stem}.png", f"figures/{stem}.pdf"} <= written, stem
    for stem in ("accuracy", "reach", "reach_separations", "erf"):
        assert f"tables/{stem}.md" in written, stem
    accuracy = (sweep / "tables" / "accuracy.md").read_text()
    assert "95% CI (%)" in accuracy and "Params (M)" in accuracy and "GMACs / img" in accuracy
    erf = pd.read_csv(sweep / "tables" / "erf.csv")
    assert set(erf["mixer"]) == set(MIXERS) and (erf["seeds"] == 3).all()  # the stale file is ignored
    radii = erf[erf["stage"] == "init"].set_index("mixer")["r90_patches"]
    assert radii["swin"] < radii["mamba"] < radii["attention"]
    summary = (sweep / "summary.md").read_text()
    assert "## Reach: does any distance" in summary and "attention" in summary and "figures/erf.png" in summary


def test_maps_of_an_earlier_method_are_left_out_with_a_reason(sweep: Path) -> None:
    runs = reach_runs()
    swin = [f for f in (sweep / "erf").glob("*.npz") if json.loads(str(np.load(f)["key"]))["mixer"] == "swin"]
    for path in swin:  # as an earlier save_erf wrote them: no method field
        with np.load(path) as f:
            fields = {name: f[name] for name in f.files if name != "method"}
        np.savez(path, **fields)
    build_report(sweep)
    erf = pd.read_csv(sweep / "tables" / "erf.csv")
    assert set(erf["mixer"]) == set(MIXERS) - {"swin"}
    summary = (sweep / "summary.md").read_text()
    assert f"{len(swin)} map file(s) in erf/ were computed by an earlier method" in summary
    assert len(swin) == (runs["mixer"] == "swin").sum()


def test_headline_carries_accuracy_with_spread_params_and_cost(sweep: Path) -> None:
    from experiments.report.build import write_headline

    build_report(sweep)
    readme = sweep.parent / "README.md"
    readme.write_text("before\n<!-- headline:start -->old<!-- headline:end -->\nafter\n")
    write_headline(readme, sweep)
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    for column in ("Top-1 acc. (%, mean ± s.d.)", "95% CI (%)", "| n |", "Params (M)", "GMACs / img"):
        assert column in text, column
    assert all(f"| {mixer} |" in text for mixer in MIXERS)
    assert "figures/accuracy_cost_reach.png)" in text


def test_mass_radius() -> None:
    grad = np.zeros((8, 8))
    grad[3:5, 3:5] = 1  # the centre token of a 4 x 4 grid of 2 px patches is the patch at rows/cols 4-5
    assert mass_radius(grad, 2, 0.5) < 1.5
    uniform = np.ones((8, 8))
    assert mass_radius(uniform, 2, 0.9) > mass_radius(uniform, 2, 0.5) > 0


def test_error_bars_stop_at_0_and_100_percent_and_vanish_without_an_interval() -> None:
    mean = pd.Series([80.0, 50.0, 70.0])
    low = pd.Series([10.0, 45.0, math.nan])  # 3 seeds 97, 95, 50: the t interval passes 100%
    high = pd.Series([150.0, 55.0, math.nan])
    below, above = percent_error_bars(mean, low, high)
    assert below.tolist() == [70.0, 5.0, 0.0]
    assert above.tolist() == [20.0, 5.0, 0.0]
