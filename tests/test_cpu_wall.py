"""The CPU reference wall's config plans what its header says, and a rerun at another thread count is refused
(the thread count is no key column: each count gets its own results folder)."""
from __future__ import annotations

from pathlib import Path

import pytest

from experiments.runs_csv import read_rows
from experiments.sweep.__main__ import main
from experiments.sweep.config import CONFIG_DIR, config_from_dict, load_config
from experiments.sweep.machine import usable_cpus
from mixers import list_mixers
from tiny_sweep import tiny_config, write_config


def test_the_wall_covers_every_mixer_from_196_to_4096_tokens_at_patch_16_and_8() -> None:
    config = config_from_dict(*load_config("cpu_wall"))
    assert not config.mixers  # every registered mixer, so a new one joins the wall
    points = config.points(list_mixers())
    assert {p.mixer for p in points} == set(list_mixers())
    assert {p.preset for p in points} == {"tiny"} and {p.dtype for p in points} == {"float32"}
    for patch in (16, 8):
        tokens = {p.tokens for p in points if p.patch_size == patch}
        assert min(tokens) == 196 and max(tokens) >= 4096
    assert {p.compile for p in points} == {"", "default"}
    assert {p.batch_size for p in points} >= {1} and len({p.batch_size for p in points}) == 2
    assert "python -m experiments.bench.anchor" in (CONFIG_DIR / "cpu_wall.toml").read_text()


@pytest.mark.skipif(usable_cpus() < 2, reason="needs 2 CPUs to ask for a second thread count")
def test_a_rerun_at_another_thread_count_is_refused(tmp_path: Path, capsys) -> None:
    config, out = write_config(tmp_path, tiny_config(["attention"], [16])), tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--num-threads", "1"]) == 0
    before = (out / "runs.csv").read_bytes()
    assert read_rows(out / "runs.csv")[0]["cpu_threads"] == "1"
    capsys.readouterr()
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--num-threads", "2"]) == 2
    message = capsys.readouterr().err
    assert "num_threads 2" in message and "on 1 threads" in message and "its own --out" in message
    assert (out / "runs.csv").read_bytes() == before  # nothing written
    # the same count resumes (nothing to run); a point left at 0 threads is the sweep's choice and never refused
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--num-threads", "1"]) == 0
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--dry-run", "--no-plan"]) == 0
