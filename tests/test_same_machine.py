"""A results folder holds one machine's rows: a resume on another CPU model is refused with one line (the machine is
no key column, so the points left would join another machine's rows in one table), and allowed when asked."""
from __future__ import annotations

import csv
from pathlib import Path

from experiments.runs_csv import read_rows
from experiments.sweep.__main__ import main
from tiny_sweep import tiny_config, write_config


def _write_rows(runs: Path, rows: list[dict[str, str]]) -> None:
    with runs.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _rename_machine(runs: Path, name: str, **fields: str) -> None:
    """Says another machine measured every row of `runs` (with `fields` set in each row too)."""
    with runs.open(newline="") as f:
        rows = list(csv.DictReader(f))
    _write_rows(runs, [{**row, "device_name": name, **fields} for row in rows])


def test_a_resume_on_another_cpu_model_is_refused_unless_allowed(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    one = write_config(tmp_path, tiny_config(["attention"], [16]))
    assert main(["--config", str(one), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 0
    _rename_machine(out / "runs.csv", "Another CPU")
    before = (out / "runs.csv").read_bytes()
    capsys.readouterr()

    two = tmp_path / "two.toml"
    two.write_text(tiny_config(["attention"], [16, 32]))  # one point left to run
    assert main(["--config", str(two), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1
    assert "measured on Another CPU" in message and "1 point left" in message
    assert "its own --out" in message and "--allow-mixed-machines" in message
    assert (out / "runs.csv").read_bytes() == before  # nothing written

    # nothing left to run is no mix (the report may be rebuilt anywhere); the flag lets the resume go on
    assert main(["--config", str(one), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 0
    assert main(["--config", str(two), "--out", str(out), "--quiet", "--no-report", "--no-plan",
                 "--allow-mixed-machines"]) == 0
    names = [row["device_name"] for row in read_rows(out / "runs.csv")]
    assert names[0] == "Another CPU" and len(names) == 2 and names[1] != "Another CPU"


def test_the_seed_stage_of_a_learning_rate_grid_is_checked_too(tmp_path: Path, capsys) -> None:
    """A grid whose rows are all there leaves only the seeds at the chosen rate, which are known after the check
    of the grid's points: they are refused on another machine as well."""
    text = tiny_config(["attention"], [16]).replace("patch_sizes = [8]", "patch_sizes = [4]")
    head, timing = text.split("[timing]")
    train = "\n[train]\ntrain_samples = 40\nbatch_size = 20\nval_fraction = 0.25\n"
    grid = head + 'epochs = 1\ndataset = "reach"\nlr_grid = [1e-3, 3e-3]\nseeds = [0]\n'
    out, config = tmp_path / "out", tmp_path / "grid.toml"
    config.write_text(grid + "[timing]" + timing + train)
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 0
    _rename_machine(out / "runs.csv", "Another CPU")
    before = (out / "runs.csv").read_bytes()
    capsys.readouterr()

    config.write_text(grid.replace("seeds = [0]", "seeds = [0, 1]") + "[timing]" + timing + train)
    # the dry run says it at once, as the real run does once the grid's check has passed
    assert main(["--config", str(config), "--out", str(out), "--dry-run", "--no-plan"]) == 2
    assert "measured on Another CPU" in capsys.readouterr().err
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1 and "measured on Another CPU" in message
    assert (out / "runs.csv").read_bytes() == before


def test_rows_that_say_nothing_of_the_machine_do_not_refuse(tmp_path: Path, capsys) -> None:
    """Another machine's error rows hold no timing, and a failed row that --retry-failed re-runs is replaced: a
    folder of those is resumed here. A refusal names every machine in the folder, this one too where it is there."""
    out = tmp_path / "out"
    one = write_config(tmp_path, tiny_config(["attention"], [16]))
    assert main(["--config", str(one), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 0
    _rename_machine(out / "runs.csv", "Another CPU", status="error", error="failed there")
    two = tmp_path / "two.toml"
    two.write_text(tiny_config(["attention"], [16, 32]))
    assert main(["--config", str(two), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 0
    assert main(["--config", str(two), "--out", str(out), "--quiet", "--no-report", "--no-plan",
                 "--retry-failed"]) == 0
    rows = read_rows(out / "runs.csv")
    here = rows[-1]["device_name"]
    assert here != "Another CPU" and all(row["status"] == "ok" for row in rows[-2:])

    _rename_machine(out / "runs.csv", "Another CPU")  # now a folder of its timings ...
    rows = read_rows(out / "runs.csv")
    _write_rows(out / "runs.csv", rows[:-1] + [{**rows[-1], "device_name": here}])  # ... and one of this machine's
    capsys.readouterr()
    three = tmp_path / "three.toml"
    three.write_text(tiny_config(["attention"], [16, 32, 48]))
    assert main(["--config", str(three), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 2
    message = capsys.readouterr().err
    assert f"measured on {' and '.join(sorted(['Another CPU', here]))}" in message


def test_a_cpu_is_named_with_its_family_model_and_vector_instructions(tmp_path: Path, capsys) -> None:
    """A VM's bare "AMD EPYC" named CPUs generations apart: the name carries what tells them apart, and rows that
    name the model alone (written before) are another machine's, since which one measured them cannot be told."""
    import torch

    from experiments.measure.provenance import device_name

    here = device_name(torch.device("cpu"))
    bare, _, details = here.partition(" (")
    assert details.endswith(f"{torch.backends.cpu.get_cpu_capability()})")
    if "cpu family" in Path("/proc/cpuinfo").read_text():
        assert details.startswith("family ")
    out = tmp_path / "out"
    one = write_config(tmp_path, tiny_config(["attention"], [16]))
    assert main(["--config", str(one), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 0
    _rename_machine(out / "runs.csv", bare)
    two = tmp_path / "two.toml"
    two.write_text(tiny_config(["attention"], [16, 32]))
    capsys.readouterr()
    assert main(["--config", str(two), "--out", str(out), "--quiet", "--no-report", "--no-plan"]) == 2
    assert f"measured on {bare}, and this machine is {here}" in capsys.readouterr().err
