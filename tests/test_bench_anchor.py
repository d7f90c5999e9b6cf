"""experiments.bench.anchor: our attention ViT and timm's DeiT-Ti timed side by side, rows with provenance."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.bench.anchor import anchor_models, main

from messages import one_line_error


def test_the_anchor_pair_has_deit_tinys_shape() -> None:
    ours, theirs = anchor_models(32).values()
    # DeiT-Ti's class token and its one extra position are the only parameters ours lacks: 2 x 192.
    assert sum(p.numel() for p in theirs.parameters()) - sum(p.numel() for p in ours.parameters()) == 2 * 192


def test_a_run_writes_one_row_per_model_and_batch(tmp_path: Path, capsys) -> None:
    main(["--img-size", "32", "--batches", "1", "2", "--rounds", "1", "--min-time-s", "0.01", "--threads", "1",
          "--csv", str(tmp_path / "anchor.csv")])
    rows = pd.read_csv(tmp_path / "anchor.csv")
    assert len(rows) == 4 and set(rows["batch_size"]) == {1, 2}
    assert {"commit", "torch_version", "device_name"} <= set(rows.columns)
    assert (rows["latency_ms"] > 0).all()
    assert "ours / timm's per round" in capsys.readouterr().out


@pytest.mark.parametrize("argv,fragment", [
    (["--img-size", "100"], "not a multiple of the patch size 16"),
    (["--batches", "0"], "--batches"),
    (["--rounds", "-1"], "--rounds"),
])
def test_bad_arguments_are_refused_in_one_line(argv: list[str], fragment: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    one_line_error(capsys, fragment)


def test_a_csv_path_that_is_a_folder_is_refused_before_timing(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--csv", str(tmp_path)])
    one_line_error(capsys, "is a folder")
