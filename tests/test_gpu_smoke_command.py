"""The GPU smoke command's own logic on a CPU: its refusal without CUDA (one line, exit 2), the points it covers,
and its per-point loop on CPU stand-ins (the command itself runs on a GPU: scripts/offline_gpu's first step)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from experiments import gpu_smoke
from experiments.measure.timing import TimingProtocol
from experiments.schema import MAX_BATCH
from mixers import list_mixers


def test_refuses_without_cuda_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_smoke.main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "CUDA" in captured.err


def test_unknown_mixer_is_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        gpu_smoke.main(["--mixers", "nonesuch"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nonesuch" in err and "attention" in err


def test_every_registered_mixer_in_both_regimes_at_batch_1_and_max() -> None:
    points = gpu_smoke.smoke_points(list_mixers())
    covered = {(p.mixer, p.timing_mode, p.batch_size) for p in points}
    assert covered == {(m, mode, b) for m in list_mixers() for mode in ("eager", "graphed") for b in (1, MAX_BATCH)}
    assert all(p.device == "cuda" and p.measure_train_step for p in points)
    trainer = gpu_smoke.trainer_point()
    assert trainer.epochs == 1 and trainer.dataset == "reach"


def test_the_loop_reports_a_line_per_point_and_counts_failures(capsys: pytest.CaptureFixture) -> None:
    """Run on the CPU: eager rows end ok, graphed ones with the refusal off CUDA, which the smoke counts."""
    quick = TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.0, max_batch=2)
    points = [dataclasses.replace(p, device="cpu", dtype="float32", timing=quick, overrides='{"depth":1}')
              for p in gpu_smoke.smoke_points(["attention"])]
    assert gpu_smoke.run_points(points) == 2  # the two graphed points
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and sum("graphed timing needs CUDA" in line for line in lines) == 2
    assert all("impl=" in line for line in lines)


def test_the_trainer_point_trains_on_a_cpu_stand_in(capsys: pytest.CaptureFixture, tmp_path) -> None:
    """The device-trainer point as the smoke builds it, on the CPU: its recipe must be one TrainRecipe takes (a key
    the recipe had dropped failed only on the GPU before)."""
    point = dataclasses.replace(gpu_smoke.trainer_point(str(tmp_path)), device="cpu", dtype="float32")
    assert gpu_smoke.run_points([point]) == 0, capsys.readouterr().out
