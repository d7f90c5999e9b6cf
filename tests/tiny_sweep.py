"""The tiny sweep the sweep, fault and planner tests run: micro preset, one block, patch 8, one untimed call."""
from __future__ import annotations

import json
from pathlib import Path


def tiny_config(mixers: list[str], img_sizes: list[int]) -> str:
    """A sweep config's TOML text for `mixers` at `img_sizes`; tests edit it with `str.replace`."""
    return f"""
name = "tiny"
mixers = {json.dumps(mixers)}
presets = ["micro"]
img_sizes = {json.dumps(img_sizes)}
patch_sizes = [8]
measure_train_step = false
timeout_s = 120
overrides = {{"*" = {{depth = 1}}}}

[timing]
warmup = 0
min_repeats = 1
min_time_s = 0.0
"""


def write_config(tmp_path: Path, text: str) -> Path:
    """Write `text` as `tmp_path/tiny.toml` and return its path."""
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path
