"""results/README.md's table of CUDA-only paths names, for each path, a test that only a GPU can pass: each one
named must exist and be `gpu`-marked, so `pytest -m gpu --collect-only` lists a test for every row."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _table_rows() -> list[str]:
    text = (REPO / "results" / "README.md").read_text()
    section = text.split("### CUDA-only paths and what tests them", 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| CUDA-only")]


def _gpu_tests(path: Path) -> set[str]:
    """The test functions of a module whose `pytestmark` includes `pytest.mark.gpu`."""
    tree = ast.parse(path.read_text())
    marked = any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
                 and "pytest.mark.gpu" in ast.unparse(node.value) for node in tree.body)
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and node.name.startswith("test_")} if marked else set()


def test_every_cuda_path_in_the_table_names_an_existing_gpu_test() -> None:
    rows = _table_rows()
    assert len(rows) >= 10
    for row in rows:
        gpu_cell = row.rstrip(" |").rsplit(" | ", 1)[1]
        names = re.findall(r"`(?:(test_\w+\.py))?(?:::(test_\w+))?`", gpu_cell)
        module, tests = None, []
        for file, test in names:
            module = file or module
            if test:
                tests.append((module, test))
        assert tests, f"no GPU test named for: {row[:60]}"
        for module, test in tests:
            assert test in _gpu_tests(REPO / "tests" / module), f"{module}::{test} is not a gpu-marked test"
