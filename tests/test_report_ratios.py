"""The ratio table: each mixer's cost over attention's at the same point, options in the row, compile matched."""
from __future__ import annotations

import pandas as pd
import pytest

from experiments.report.ratios import mixer_options, model_overrides, ratio_notes, ratio_table, ratio_tables
from test_report import POWER_LAWS, synthetic_runs


def _ok(runs: pd.DataFrame, mixer: str, patch: int = 16) -> pd.DataFrame:
    return runs[(runs["mixer"] == mixer) & (runs["status"] == "ok") & (runs["patch_size"] == patch)]


def _mamba_over_attention(law: int, tokens: pd.Series) -> list[float]:
    """mamba's cost over attention's at each N from the synthetic rows' power laws (law 0: latency, 2: GMACs)."""
    (coef_m, exp_m), (coef_a, exp_a) = POWER_LAWS["mamba"][law], POWER_LAWS["attention"][law]
    return [coef_m * n**exp_m / (coef_a * n**exp_a) for n in tokens]


def test_ratio_is_the_mixer_over_attention_at_each_point() -> None:
    table = ratio_table(synthetic_runs())
    rows = table[(table["mixer"] == "mamba") & (table["patch_size"] == 16)]
    expected = _mamba_over_attention(0, rows["tokens"])
    assert rows["latency_ms_ratio"].tolist() == pytest.approx(expected)
    assert rows["train_step_ms_ratio"].tolist() == pytest.approx(expected)  # both steps are 3x the latency
    assert "attention" not in set(table["mixer"])


def test_macs_ratio_is_counted_beside_the_timed_ones_and_shown_first() -> None:
    table = ratio_table(synthetic_runs())
    rows = table[(table["mixer"] == "mamba") & (table["patch_size"] == 16)]
    assert rows["gmacs_ratio"].tolist() == pytest.approx(_mamba_over_attention(2, rows["tokens"]))
    assert "gmacs_ratio_apart" not in table.columns  # counted, not timed: nothing to pair
    notes = ratio_notes(table)
    assert notes[0].startswith("MACs ×") and "timed apart" in notes[-1]
    display = ratio_tables(synthetic_runs())[1]
    macs = [c for c in display.columns if c.startswith("MACs ×, N=")]
    assert macs and display.columns.get_loc(macs[-1]) < display.columns.get_loc(
        next(c for c in display.columns if c.startswith("latency ×")))


def test_mixer_options_make_a_row_of_their_own_against_attention_at_its_defaults() -> None:
    runs = synthetic_runs()
    matched = _ok(runs, "mamba").assign(overrides='{"mixer_options":{"expand":1}}',
                                        latency_ms=lambda f: f["latency_ms"] / 2)
    table = ratio_table(pd.concat([runs, matched], ignore_index=True))
    mamba = table[(table["mixer"] == "mamba") & (table["patch_size"] == 16)]
    default = mamba[mamba["options"] == ""].set_index("tokens")["latency_ms_ratio"]
    half = mamba[mamba["options"] == '{"expand":1}'].set_index("tokens")["latency_ms_ratio"]
    assert (half * 2).to_dict() == pytest.approx(default.to_dict())


def test_compiled_rows_are_compared_with_compiled_attention_and_model_overrides_must_match() -> None:
    runs = synthetic_runs()
    compiled = pd.concat([_ok(runs, "attention"), _ok(runs, "linear")]).assign(compile="default")
    compiled.loc[compiled["mixer"] == "attention", "latency_ms"] *= 4  # compiled attention slower
    deeper = _ok(runs, "linear").assign(overrides='{"depth":4}')  # no attention at depth 4: no ratio
    table = ratio_table(pd.concat([runs, compiled, deeper], ignore_index=True))
    linear = table[(table["mixer"] == "linear") & (table["patch_size"] == 16)]
    eager = linear[linear["compile"].isin(["", "nan"]) | linear["compile"].isna()].set_index("tokens")
    fast = linear[linear["compile"] == "default"].set_index("tokens")
    assert (fast["latency_ms_ratio"] * 4).to_dict() == pytest.approx(eager["latency_ms_ratio"].to_dict())
    assert len(linear) == len(eager) + len(fast)  # the depth-4 rows found no reference and are left out


def test_overrides_split_into_the_model_and_the_mixer() -> None:
    both = '{"mixer_options":{"d_state":8,"expand":1},"depth":2}'
    assert model_overrides(both) == '{"depth":2}' and mixer_options(both) == '{"d_state":8,"expand":1}'
    assert model_overrides("{}") == "{}" and mixer_options("{}") == ""


def test_display_reads_one_row_per_mixer_and_setting() -> None:
    runs = synthetic_runs()
    numeric, display = ratio_tables(runs[runs["patch_size"] == 16])
    assert "Patch size" not in display.columns  # one patch size: N alone places a point
    assert list(display["Mixer"]) == [m for m in POWER_LAWS if m != "attention"]
    assert set(display["Options"]) == {"defaults"}
    assert any(c.startswith("latency ×, N=") for c in display.columns)


def test_no_attention_no_table() -> None:
    runs = synthetic_runs()
    assert ratio_table(runs[runs["mixer"] != "attention"]).empty
