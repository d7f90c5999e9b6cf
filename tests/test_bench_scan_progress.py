"""bench.scan prints and saves each length as soon as it is measured, so a long run that is stopped (its 16K case
with the float64 reference runs for tens of minutes on 2 cores) keeps the lengths it finished."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

import experiments.bench.scan as bench


def test_a_run_stopped_at_its_second_length_keeps_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    make_inputs = bench.make_inputs

    def stopped_at_16(batch: int, channels: int, length: int, d_state: int, seed: int) -> dict:
        if length == 16:
            raise KeyboardInterrupt  # Ctrl-C, or a timeout's signal, while the second length runs
        return make_inputs(batch, channels, length, d_state, seed)

    monkeypatch.setattr(bench, "make_inputs", stopped_at_16)
    out = tmp_path / "scan.csv"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--lengths", "8", "16", "--channels", "4", "--d-state", "2", "--repeats", "1",
                    "--block-seconds", "0.01", "--num-threads", "1", "--csv", str(out)])
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {r["length"] for r in rows} == {"8"}
    assert {r["pass"] for r in rows} == {"fwd", "fwd+bwd"}
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|      8 |")]
    assert len(printed) == len(rows)  # the finished length's table lines were printed before the stop


def test_no_gate_times_the_scan_without_z(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vmamba's scan has no z: --no-gate times that case, against the float64 reference without z too."""
    out = tmp_path / "scan.csv"
    bench.main(["--lengths", "8", "--channels", "4", "--d-state", "1", "--repeats", "1", "--block-seconds", "0.01",
                "--num-threads", "1", "--no-gate", "--csv", str(out)])
    assert "with D, no z," in capsys.readouterr().out
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {r["z_gate"] for r in rows} == {"False"}
    assert all(float(r["max_rel_err_vs_float64"]) < 1e-4 for r in rows)
    with pytest.raises(SystemExit) as stop:
        bench.main(["--device", "cuda", "--no-gate"])
    assert stop.value.code == 2 and "--no-gate" in capsys.readouterr().err
