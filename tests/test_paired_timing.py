"""Paired timing: a point timed beside a reference mixer, call for call, so its ratio survives a drifting machine;
the row's columns, the config's checks and the ratio table that prefers the paired ratio."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import experiments.measure.run as run
from experiments.measure.point import Point, reference_point
from experiments.measure.run import measure_point
from experiments.measure.timing import MIN_ROUNDS, TimingProtocol, time_paired
from experiments.report.ratios import ratio_notes, ratio_table
from experiments.sweep.__main__ import main
from experiments.sweep.plan import paired_seconds
from experiments.sweep.config import ConfigError, SweepConfig
from mixers import list_mixers
from test_report import synthetic_runs

QUICK = TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.0)


class DriftingMachine:
    """A fake clock and two calls: the subject costs twice the reference, and every call runs a little slower than
    the one before (a machine drifting linearly), so calls timed apart disagree while neighbours do not."""

    def __init__(self, drift: float = 0.01) -> None:
        self.now = 0.0
        self.speed = 1.0
        self.drift = drift
        self.calls = []

    def _run(self, cost: float, name: str) -> None:
        self.now += cost * self.speed
        self.speed += self.drift
        self.calls.append(name)

    def subject(self) -> None:
        self._run(2.0, "subject")

    def reference(self) -> None:
        self._run(1.0, "reference")

    def start(self) -> None:
        self._started = self.now

    def stop_ms(self) -> float:
        return self.now - self._started


def test_paired_ratio_cancels_a_linear_drift() -> None:
    machine = DriftingMachine()
    timing = time_paired(machine.subject, machine.reference, torch.device("cpu"), QUICK, clock=machine)
    assert timing.ratio == pytest.approx(2.0, rel=1e-12) and timing.ratio_iqr == pytest.approx(0.0, abs=1e-12)
    assert timing.rounds == MIN_ROUNDS
    # reference, then per round subject and reference: each block one untimed call and three timed ones
    assert machine.calls[:4] == ["reference"] * 4 and machine.calls[4:8] == ["subject"] * 4
    assert machine.calls[-4:] == ["reference"] * 4 and len(machine.calls) == 4 * (2 * MIN_ROUNDS + 1)


def test_paired_rounds_follow_the_protocol() -> None:
    machine = DriftingMachine()
    protocol = TimingProtocol(warmup=1, min_repeats=5, min_time_s=0.0)
    assert time_paired(machine.subject, machine.reference, torch.device("cpu"), protocol, clock=machine).rounds == 5
    assert machine.calls[:2] == ["reference", "subject"]  # the protocol's warm-up, once each
    machine = DriftingMachine()
    long = TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.2, max_repeats=50)  # 200 "ms" of timed calls
    rounds = time_paired(machine.subject, machine.reference, torch.device("cpu"), long, clock=machine).rounds
    assert MIN_ROUNDS < rounds < 50


@pytest.mark.parametrize("protocol", [QUICK, TimingProtocol(warmup=2, min_repeats=4, min_time_s=0.05)])
def test_the_planner_predicts_what_pairing_spends(protocol) -> None:
    machine = DriftingMachine(drift=0.0)  # calls of 2 and 1 "ms"
    time_paired(machine.subject, machine.reference, torch.device("cpu"), protocol, clock=machine)
    assert paired_seconds(2.0, 1.0, protocol) * 1e3 == pytest.approx(machine.now)


def tiny_point(**kwargs) -> Point:
    defaults = dict(mixer="linear", preset="micro", img_size=16, patch_size=4, batch_size=2, timing=QUICK,
                    overrides='{"depth":1}', paired_reference="attention")
    return Point(**{**defaults, **kwargs})


def test_a_paired_row_holds_both_ratios_and_the_reference_row_none() -> None:
    row = measure_point(tiny_point())
    assert row["status"] == "ok" and row["error"] == "" and row["paired_reference"] == "attention"
    for column in ("latency_vs_ref", "train_step_vs_ref"):
        assert math.isfinite(row[column]) and row[column] > 0 and row[f"{column}_iqr"] >= 0
    reference = measure_point(tiny_point(mixer="attention"))
    assert reference["status"] == "ok" and "paired_reference" not in reference and "latency_vs_ref" not in reference


def test_the_reference_runs_at_its_defaults_with_the_points_model_overrides() -> None:
    point = tiny_point(mixer="mamba", overrides='{"depth":1,"mixer_options":{"d_state":8,"expand":1}}')
    reference = reference_point(point)
    assert reference.mixer == "attention" and reference.overrides == '{"depth":1}'
    assert reference.img_size == point.img_size and reference.batch_size == point.batch_size


def test_without_a_training_step_only_the_forward_is_paired() -> None:
    row = measure_point(tiny_point(measure_train_step=False))
    assert row["latency_vs_ref"] > 0 and "train_step_vs_ref" not in row


def test_a_failed_pairing_keeps_the_points_own_timings(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("reference would not build\nsecond line")

    monkeypatch.setattr(run, "measure_paired", broken)
    row = measure_point(tiny_point())
    assert row["status"] == "ok" and row["latency_ms"] > 0 and row["train_step_ms"] > 0
    assert row["error"] == "paired timing beside attention: RuntimeError: reference would not build"
    assert "paired_reference" not in row


def test_config_checks_the_reference() -> None:
    with pytest.raises(ConfigError, match="paired_reference: unknown mixer 'atention'"):
        SweepConfig(paired_reference="atention").points(list_mixers())
    with pytest.raises(ConfigError, match="paired_reference times eager and compiled calls"):
        SweepConfig(paired_reference="attention", timing_modes=("eager", "graphed"), device="cuda")
    points = SweepConfig(mixers=("linear",), paired_reference="attention").points(list_mixers())
    assert {p.paired_reference for p in points} == {"attention"}


def test_cli_flag_with_an_unknown_reference_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    assert main(["--mixers", "linear", "--paired-reference", "nope", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown mixer 'nope'" in err
    assert not (tmp_path / "out" / "runs.csv").exists()


def _paired(runs: pd.DataFrame, reference: str) -> pd.DataFrame:
    """`runs` with every non-attention row timed beside `reference` at a ratio of 7."""
    runs = runs.copy()
    others = runs["mixer"] != "attention"
    runs.loc[others, "paired_reference"] = reference
    for column in ("latency_vs_ref", "train_step_vs_ref"):
        runs[column] = others.map({True: 7.0, False: math.nan})
    return runs


def test_ratio_table_uses_the_paired_ratio_and_keeps_the_rows_ratio_beside_it() -> None:
    runs = synthetic_runs()
    apart = ratio_table(runs)
    table = ratio_table(_paired(runs, "attention"))
    assert (table["latency_ms_ratio"] == 7.0).all() and (table["train_step_ms_ratio"] == 7.0).all()
    assert table["paired"].all() and not apart["paired"].any()
    assert table["latency_ms_ratio_apart"].tolist() == pytest.approx(apart["latency_ms_ratio"].tolist())
    assert ratio_notes(table)[-1].startswith("All of the") and "timed beside attention" in ratio_notes(table)[-1]
    assert "timed apart" in ratio_notes(apart)[-1]


def test_ratio_table_ignores_a_pairing_with_another_mixer() -> None:
    runs = synthetic_runs()
    table = ratio_table(_paired(runs, "attention_naive"))
    assert not table["paired"].any()
    assert table["latency_ms_ratio"].tolist() == pytest.approx(ratio_table(runs)["latency_ms_ratio"].tolist())


def test_a_row_with_one_ratio_paired_and_one_apart_is_not_called_paired() -> None:
    runs = _paired(synthetic_runs(), "attention")
    runs["train_step_vs_ref"] = math.nan  # the training step was not paired (it ran out of memory, say)
    table = ratio_table(runs)
    assert (table["latency_ms_ratio"] == 7.0).all() and not table["paired"].any()
    assert table["train_step_ms_ratio"].tolist() == pytest.approx(table["train_step_ms_ratio_apart"].tolist())
