"""Published claims beside measured rows: the verdict rule, the table, and one-line errors for bad files."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.report.claims import ClaimsError, claims_table, load_claims, verdict


def _rows(latency: dict[str, float], memory: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame([
        {"mixer": m, "img_size": 1248, "batch_size": 16, "status": "ok", "latency_ms": latency[m],
         "peak_mem_total_mb": memory[m]}
        for m in latency
    ])


@pytest.mark.parametrize("measured,claimed,expected", [
    (3.0, 2.8, "holds"), (1.5, 2.8, "same direction, smaller"), (0.5, 2.8, "does not hold"),
    (0.9, 0.868, "holds"), (0.2, 0.868, "same direction, smaller"), (-1.0, 0.868, "does not hold"),
])
def test_verdict(measured: float, claimed: float, expected: str) -> None:
    assert verdict(measured, claimed) == expected


def test_named_claims_compare_factor_and_saving() -> None:
    source, claims = load_claims("vim_1248")
    assert "Vision Mamba" in source
    runs = _rows({"mamba": 10.0, "attention": 30.0, "attention_naive": 5.0},
                 {"mamba": 10.0, "attention": 20.0, "attention_naive": 100.0})
    table = claims_table(runs, claims).set_index(["metric", "reference"])
    assert table.loc[("latency_ms", "attention"), "measured"] == pytest.approx(3.0)
    assert table.loc[("latency_ms", "attention_naive"), "verdict"] == "does not hold"
    # memory as a user's GPU sees it (weights and input included), never the peak above the baseline
    assert table.loc[("peak_mem_total_mb", "attention_naive"), "measured"] == pytest.approx(0.9)
    assert table.loc[("peak_mem_total_mb", "attention"), "verdict"] == "same direction, smaller"


def test_failed_rows_are_not_compared() -> None:
    _, claims = load_claims("vim_1248")
    runs = _rows({"mamba": 10.0, "attention": 30.0}, {"mamba": 1.0, "attention": 2.0})
    runs.loc[runs["mixer"] == "attention", "status"] = "oom"
    assert claims_table(runs, claims).empty


@pytest.mark.parametrize("text,fragment", [
    ("source = 'x'\n", "needs one or more [[claims]]"),
    ("[[claims]]\ntext = 'a'\nmetric = 'latency_ms'\nmixer = 'm'\nreferences = ['r']\nimg_size = 1\n",
     "exactly one of factor or saving"),
    ("[[claims]\n", "not valid UTF-8 TOML"),
])
def test_bad_claims_files_name_the_fix(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "claims.toml"
    path.write_text(text)
    with pytest.raises(ClaimsError, match=fragment.replace("[", r"\[")):
        load_claims(str(path))


def test_unknown_claims_name_lists_the_known_ones() -> None:
    with pytest.raises(ClaimsError, match="vim_1248"):
        load_claims("no_such_claims")


def test_named_headline_section_leaves_the_default_one(tmp_path: Path) -> None:
    import shutil

    from experiments.report.build import ReportError, write_headline

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    shutil.copy(Path(__file__).parents[1] / "results" / "vim_1248_h100" / "runs.csv", sweep / "runs.csv")
    readme = tmp_path / "README.md"
    readme.write_text("<!-- headline:start -->cpu<!-- headline:end -->\n"
                      "<!-- headline:gpu:start -->old<!-- headline:gpu:end -->\n")
    write_headline(readme, sweep, "gpu")
    text = readme.read_text()
    assert "<!-- headline:start -->cpu<!-- headline:end -->" in text
    assert "old" not in text and "--headline gpu" in text and "NVIDIA" in text
    with pytest.raises(ReportError, match="headline:tpu:start"):
        write_headline(readme, sweep, "tpu")
