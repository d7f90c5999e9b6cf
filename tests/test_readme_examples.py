"""Every sweep command of the README's "Running sweeps" block plans what its comment says: run with --dry-run
--no-plan (nothing measured), each plans the number of points its comment names."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from experiments.sweep.__main__ import main

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
BLOCK = re.search(r"## Running sweeps\n\n```bash\n(.*?)```", README, re.S).group(1)
COMMANDS = [line.split("  # ", 1) for line in BLOCK.splitlines() if line.startswith("python -m experiments.sweep")]


def test_the_block_has_sweep_commands_with_comments() -> None:
    assert len(COMMANDS) >= 5 and all(len(parts) == 2 for parts in COMMANDS)


@pytest.mark.parametrize("command,comment", [c for c in COMMANDS if "--help" not in c[0]],
                         ids=lambda value: value.strip()[:60])
def test_example_plans_the_points_its_comment_says(command: str, comment: str, tmp_path: Path, monkeypatch,
                                                   capsys) -> None:
    said = re.search(r"(\d[\d,]*) (?:cost )?points", comment)
    assert said, f"the comment of `{command.strip()}` does not say how many points it plans"
    monkeypatch.chdir(tmp_path)  # its --out (results/mine) is resolved here, never in the repository
    argv = shlex.split(command)[3:]
    assert main([*argv, "--dry-run", "--no-plan"]) == 0
    planned = re.search(r"^(\d+) points in all", capsys.readouterr().out, re.M)
    assert int(planned.group(1)) == int(said.group(1).replace(",", ""))
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
