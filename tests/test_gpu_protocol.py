"""The GPU measurement protocol, exercised on the CPU: back-to-back timing, the graphed regime's refusal off CUDA,
batch size max under a simulated out-of-memory, the measured peak and MFU in the row, committed references
refused from a dirty tree, and the report's handling of rows a reader must not cite blindly."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments.measure import throughput
from experiments.measure.point import Point
from experiments.measure.rates import add_rates
from experiments.measure.run import measure_point
from experiments.measure.timing import HostClock, TimingProtocol, time_back_to_back
from experiments.report.build import build_report, load_runs
from experiments.report.claims import NO_VERDICT, claims_table, load_claims
from experiments.report.tables import cost_tables
from experiments.runs_csv import read_rows
from experiments.schema import COLUMNS
from experiments.sweep import references
from experiments.sweep.__main__ import main
from experiments.sweep.config import config_from_dict, load_config
from mixers import list_mixers

import tiny_sweep

REPO = Path(__file__).resolve().parents[1]
QUICK = TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.0)
TINY = dict(mixer="attention", preset="micro", img_size=16, patch_size=8, overrides='{"depth":1}')


# --- timing regimes ----------------------------------------------------------------------------------------

def test_back_to_back_samples_hold_k_calls_without_a_sync_inside() -> None:
    """The GPU's path with a host clock: k is chosen so a sample lasts min_sample_ms; latency is sample / k."""
    calls, syncs = [], []

    class CountingClock(HostClock):
        def start(self) -> None:
            syncs.append(len(calls))
            super().start()

    protocol = TimingProtocol(warmup=2, min_repeats=3, min_time_s=0.0, min_sample_ms=2.0, max_calls_per_sample=50)
    timing = time_back_to_back(lambda: calls.append(1), CountingClock(torch.device("cpu")), protocol)
    assert 1 < timing.calls_per_sample <= 50  # a no-op is far shorter than 2 ms
    assert timing.repeats == 3
    assert len(calls) == 2 + 1 + 3 * timing.calls_per_sample  # warm-up, the call that sizes k, the samples
    # the clock is read only around samples: never between the calls of one sample
    assert syncs[-3:] == [3 + i * timing.calls_per_sample for i in range(3)]


def test_graphed_timing_on_a_cpu_is_an_error_row_with_one_clear_line() -> None:
    row = measure_point(Point(**TINY, batch_size=1, timing=QUICK, timing_mode="graphed"))
    assert row["status"] == "error"
    assert "graphed timing needs CUDA" in row["error"] and "\n" not in row["error"]
    assert row["gmacs"] > 0  # the point's cost is still known, so its curve continues


# --- batch size max ----------------------------------------------------------------------------------------

def _simulate_oom_above(monkeypatch: pytest.MonkeyPatch, largest: int) -> None:
    """The model runs out of (simulated CUDA) memory for any batch above `largest`."""
    from experiments.measure import run

    build = run.build_model

    def build_with_a_small_memory(*args, **kwargs):
        model = build(*args, **kwargs)
        forward = model.forward

        def forward_or_oom(x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] > largest:
                raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (simulated, batch {x.shape[0]})")
            return forward(x)

        model.forward = forward_or_oom
        return model

    monkeypatch.setattr(run, "build_model", build_with_a_small_memory)


def test_max_batch_backs_off_on_oom_and_records_its_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    _simulate_oom_above(monkeypatch, 8)
    protocol = TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.0, max_batch=64)
    row = measure_point(Point(**TINY, batch_size=0, timing=protocol, device_peak_tflops=1.0))
    assert row["status"] == "ok", row["error"]
    assert row["batch_used"] == 8 and row["train_batch_used"] == 8
    assert row["throughput_img_s"] == pytest.approx(8 / (row["latency_ms"] / 1e3))


def test_measurement_that_runs_out_of_memory_halves_the_batch() -> None:
    """A probe call fits at 8, the full measurement does not: it backs off to 4, as timm's benchmark does."""
    freed = []

    def measure(batch: int) -> str:
        if batch > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return f"measured at {batch}"

    def probe(batch: int) -> None:
        if batch > 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    assert throughput.at_max_batch(measure, probe, 1024, lambda: freed.append(1)) == (4, "measured at 4")
    assert throughput.at_max_batch(measure, probe, 2, lambda: None) == (2, "measured at 2")  # the limit holds
    with pytest.raises(ValueError):  # anything but an out-of-memory is not a batch question
        throughput.at_max_batch(measure, lambda b: (_ for _ in ()).throw(ValueError("bug")), 8, lambda: None)


# --- rates ------------------------------------------------------------------------------------------------

def test_mfu_divides_achieved_flops_by_the_measured_peak() -> None:
    row = measure_point(Point(**TINY, batch_size=2, timing=QUICK, device_peak_tflops=0.5))
    achieved = 2 * row["macs_analytic"] * 2 / (row["latency_ms"] / 1e3) / 1e12
    assert row["device_peak_tflops"] == 0.5
    assert row["achieved_tflops"] == pytest.approx(achieved)
    assert row["mfu"] == pytest.approx(achieved / 0.5)
    assert row["train_flops_counted"] > 2 * row["flops_counted"]  # backward counted, not guessed
    assert row["train_mfu"] == pytest.approx(row["train_flops_counted"] * 2 / (row["train_step_ms"] / 1e3) / 1e12 / 0.5)
    assert add_rates({"macs_analytic": 10, "batch_used": 1, "latency_ms": 1.0}, 0.0)["mfu"] is None  # no peak


def test_sweep_records_the_calibration_both_regimes_and_max_batch(tmp_path: Path) -> None:
    text = tiny_sweep.tiny_config(["attention"], [16])
    text = text.replace("patch_sizes = [8]",
                        'patch_sizes = [8]\nbatch_sizes = [1, "max"]\ntiming_modes = ["eager", "graphed"]')
    text = text.replace("min_time_s = 0.0", "min_time_s = 0.0\nmax_batch = 4")
    config, out = tiny_sweep.write_config(tmp_path, text), tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report"]) == 0
    rows = {(r["batch_size"], r["timing_mode"]): r for r in read_rows(out / "runs.csv")}
    assert set(rows) == {("1", "eager"), ("1", "graphed"), ("0", "eager"), ("0", "graphed")}
    eager = rows[("1", "eager")]
    assert float(eager["device_peak_tflops"]) > 0 and float(eager["mfu"]) > 0
    assert rows[("0", "eager")]["batch_used"] == "4"
    assert rows[("1", "graphed")]["status"] == "error" and "needs CUDA" in rows[("1", "graphed")]["error"]


def test_gpu_reference_plans_eager_graphed_and_max_batch_points() -> None:
    values, source = load_config("gpu_reference")
    labels = [p.label() for p in config_from_dict({**values, "device": "cuda"}, source).points(list_mixers())]
    assert any(" graphed " in label for label in labels)
    assert any(" bmax " in label for label in labels)
    assert any(" b1 " in label and "graphed" not in label for label in labels)


# --- committed references ----------------------------------------------------------------------------------

def test_dirty_tree_is_refused_for_committed_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(references, "git_state", lambda: ("abc", True))
    config = tiny_sweep.write_config(tmp_path, tiny_sweep.tiny_config(["attention"], [16]))
    out = REPO / "results" / "no_such_reference_folder"
    assert main(["--config", str(config), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "uncommitted changes" in err and "--allow-dirty" in err and len(err.splitlines()) == 1
    assert not out.exists()
    references.check_clean_tree(out, allow_dirty=True)  # the flag lets it through
    references.check_clean_tree(REPO / "results" / "local" / "x", allow_dirty=False)  # local runs are yours
    references.check_clean_tree(tmp_path / "elsewhere", allow_dirty=False)


# --- the report ---------------------------------------------------------------------------------------------

def _row(**cells: object) -> dict[str, object]:
    row = {c: "" for c in COLUMNS}
    row.update(mixer="mamba", preset="tiny", overrides="{}", img_size=224, patch_size=16, batch_size=1,
               device="cuda", dtype="bfloat16", dataset="", epochs=0, seed=0, train="{}", compile="",
               tokens=196, status="ok", params=7e6, gmacs=1.5, latency_ms=10.0, latency_iqr_ms=0.1,
               peak_mem_mb=2.0, dirty="False", commit="abc")
    row.update(cells)
    return row


def test_a_key_measured_with_two_impls_is_kept_apart(tmp_path: Path) -> None:
    rows = [_row(impl="torch_stream", latency_ms=78.0), _row(impl="mamba_ssm_cuda", latency_ms=10.7),
            _row(img_size=384, tokens=576, impl="mamba_ssm_cuda", latency_ms=12.9),
            _row(mixer="attention", impl="sdpa_cudnn", latency_ms=3.3)]
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(tmp_path / "runs.csv", index=False)
    runs = load_runs(tmp_path / "runs.csv")
    assert sorted(runs["mixer"]) == ["attention", "mamba (mamba_ssm_cuda)", "mamba (mamba_ssm_cuda)",
                                     "mamba (torch_stream)"]
    costs = cost_tables(runs)[0].set_index(["Mixer", "Tokens N"])
    assert costs.loc[("mamba (torch_stream)", 196), "Latency (ms)"] == 78.0  # no median over two kernels
    assert costs.loc[("mamba (mamba_ssm_cuda)", 196), "Latency (ms)"] == 10.7
    build_report(tmp_path)
    assert "kept apart as mamba (mamba_ssm_cuda), mamba (torch_stream)" in (tmp_path / "summary.md").read_text()


def test_committed_fvcore_oom_row_reads_as_ok_with_its_note(tmp_path: Path) -> None:
    """results/gpu_h100: attention_naive at 65,536 tokens was written as oom though its 625.8 ms was measured."""
    shutil.copy(REPO / "results" / "gpu_h100" / "runs.csv", tmp_path / "runs.csv")
    runs = load_runs(tmp_path / "runs.csv")
    row = runs[(runs["mixer"] == "attention_naive") & (runs["tokens"] == 65536)].iloc[0]
    assert row["status"] == "ok" and row["latency_ms"] > 0
    assert "fvcore count: out of memory" in row["error"] and "read as ok" in row["error"]
    costs = cost_tables(runs)[1]
    cell = costs[(costs["Mixer"] == "attention_naive") & (costs["Tokens N"] == "65536")].iloc[0]
    assert cell["Status"] == "ok" and "oom read as ok" in cell["Flags"] and "dirty tree" in cell["Flags"]


def test_flags_mark_dirty_noisy_and_backwards_rows(tmp_path: Path) -> None:
    rows = [_row(mixer="attention", impl="sdpa", img_size=224, tokens=196, latency_ms=6.0, latency_iqr_ms=1.0),
            _row(mixer="attention", impl="sdpa", img_size=384, tokens=576, latency_ms=3.3, latency_iqr_ms=0.1,
                 dirty="True"),
            _row(mixer="attention", impl="sdpa", img_size=512, tokens=1024, latency_ms=5.0, latency_iqr_ms=0.1)]
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(tmp_path / "runs.csv", index=False)
    build_report(tmp_path)
    costs = pd.read_csv(tmp_path / "tables" / "costs.csv").set_index("Tokens N")["Flags"].fillna("")
    assert costs[196] == "IQR over 10%"
    assert costs[576] == "dirty tree; runs backwards"
    assert costs[1024] == ""
    summary = (tmp_path / "summary.md").read_text()
    assert "6 ms at N = 196 to 3.3 ms at N = 576" in summary and "1 of 3 rows were measured from a working" in summary


def test_claims_give_no_verdict_at_launch_bound_batches() -> None:
    _, claims = load_claims("vim_1248")
    runs = pd.DataFrame([{"mixer": m, "img_size": 1248, "batch_size": b, "status": "ok", "latency_ms": lat,
                          "peak_mem_total_mb": mem, "peak_mem_reserved_mb": mem, "dirty": "True"}
                         for b in (1, 16) for m, lat, mem in (("mamba", 10.0, 10.0), ("attention", 30.0, 100.0))])
    table = claims_table(runs, claims, verdict_min_batch=16, differences=("x",))
    assert set(table.loc[table["batch_size"] == 1, "verdict"]) == {NO_VERDICT}
    assert NO_VERDICT not in set(table.loc[table["batch_size"] == 16, "verdict"])
    assert set(table["metric"]) == {"latency_ms", "peak_mem_total_mb", "peak_mem_reserved_mb"}
    assert set(table["flags"]) == {"dirty tree"} and set(table["differences"]) == {"x"}
    vig = [c for c in claims if c["mixer"] == "linear"]
    assert vig and all("2405.18425" in c["source"] and c["img_size"] == 1024 for c in vig)


def test_bench_scan_writes_its_provenance(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from experiments.bench.scan import main as scan_main

    path = tmp_path / "scan.csv"
    scan_main(["--length", "16", "--channels", "4", "--repeats", "2", "--block-seconds", "0.001", "--skip-float64",
               "--num-threads", "1", "--csv", str(path)])
    rows = pd.read_csv(path, keep_default_na=False)
    assert {"commit", "dirty", "torch_version", "triton_version", "mamba_ssm_version", "device_name",
            "repeats"} <= set(rows.columns)
    assert set(rows["repeats"]) == {2} and all(rows["commit"])
    out = capsys.readouterr().out
    assert "commit " in out and "timed blocks per case" in out and "mamba-ssm" in out


def test_unknown_tree_is_not_recorded_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture) -> None:
    """No git on PATH: the commit is unknown, so is the tree's state. A row says dirty "" (never False), and a
    sweep into a committed reference folder is refused in one line (issue 35)."""
    from experiments.measure import provenance

    provenance.git_state.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))  # no git here
    try:
        assert provenance.git_state() == ("unknown", None)
        assert provenance.provenance(torch.device("cpu"))["dirty"] == ""
        config = tiny_sweep.write_config(tmp_path, tiny_sweep.tiny_config(["attention"], [16]))
        out = REPO / "results" / "no_such_reference_folder"
        assert main(["--config", str(config), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert "git cannot say" in err and len(err.splitlines()) == 1
        assert not out.exists()
    finally:
        provenance.git_state.cache_clear()
