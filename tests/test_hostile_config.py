"""Nonsense in a sweep config is refused when the config is read, in one line naming the field, exit 2, before
any point runs (issue 35): a TOML `true` is not a window of 1, a state size of 0 or -1 builds no model worth a row,
options this CPU cannot run fail every point, and learning rates and seeds have ranges."""
from __future__ import annotations

from pathlib import Path

import pytest

from experiments.sweep.__main__ import main
from mixers import create_mixer

import tiny_sweep
from tiny_sweep import tiny_config

# (mixer, TOML of its mixer_options, what the one line must name)
BAD_OPTIONS = [
    ("swin", "window_size = true", "window_size"),
    ("neighborhood", "kernel_size = true", "kernel_size"),
    ("mamba", "d_conv = true", "d_conv"),
    ("vmamba", "d_state = 0", "d_state"),
    ("vmamba", "d_state = -1", "d_state"),
    ("vmamba", "expand = -1", "expand"),
    ("gla", "gate_logit_normalizer = 0", "gate_logit_normalizer"),
    ("gla", "chunk_size = true", "chunk_size"),
    ("neighborhood", 'impl = "flex"', "impl"),  # FlexAttention has no CPU backward
    ("mamba", 'scan_impl = "triton"', "scan_impl"),  # Triton on a CPU needs its interpreter
]


def sweep(tmp_path: Path, capsys, text: str) -> tuple[int, str]:
    config = tiny_sweep.write_config(tmp_path, text)
    code = main(["--config", str(config), "--out", str(tmp_path / "out"), "--quiet", "--no-plan"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("mixer,options,field", BAD_OPTIONS, ids=[f"{m}-{o}" for m, o, _ in BAD_OPTIONS])
def test_bad_mixer_option_is_one_line_before_any_point(mixer: str, options: str, field: str, tmp_path: Path,
                                                       capsys) -> None:
    text = tiny_config([mixer], [16]).replace("measure_train_step = false", "measure_train_step = true")
    text = text.replace('overrides = {"*" = {depth = 1}}',
                        f'overrides = {{"*" = {{depth = 1}}, {mixer} = {{mixer_options = {{{options}}}}}}}')
    code, err = sweep(tmp_path, capsys, text)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and field in err and "Traceback" not in err
    assert not (tmp_path / "out" / "runs.csv").exists()  # refused before any point ran


@pytest.mark.parametrize("fields,field", [("lr_grid = [1e300]", "lr_grid"), ("lr_grid_seeds = [-1]", "lr_grid_seeds")])
def test_learning_rate_grid_ranges(fields: str, field: str, tmp_path: Path, capsys) -> None:
    grid = "lr_grid = [1e-3]\n" if field != "lr_grid" else ""
    text = ("epochs = 1\ndataset = \"pathfinder\"\n" + grid + fields + "\n" + tiny_config(["linear"], [16])
            + "\n[train]\nval_fraction = 0.1\n")
    code, err = sweep(tmp_path, capsys, text)
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("mixer,option,value", [
    ("swin", "window_size", True), ("neighborhood", "kernel_size", True), ("mamba", "d_conv", True),
    ("mamba", "dt_rank", True), ("vmamba", "d_state", 0), ("vmamba", "d_state", -1), ("vmamba", "expand", -1),
    ("gla", "gate_logit_normalizer", 0), ("gla", "chunk_size", True), ("linear", "eps", -1.0),
    ("attention", "qkv_bias", "yes"),
])
def test_each_mixer_checks_its_options(mixer: str, option: str, value: object) -> None:
    with pytest.raises((TypeError, ValueError), match=option):
        create_mixer(mixer, 32, 2, **{option: value})
