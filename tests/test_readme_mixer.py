"""The README's add-a-mixer example, written exactly as the README shows it into a copy of the tree, passes the
tests, so the README cannot drift from the mixer contract again.

The default run writes the example into a copy and runs the tests parametrised over the registry, filtered to the
new mixer (`python -m pytest -k pool`, as the README's reader would): that is what a new mixer meets, in seconds.
The whole suite on that copy would double CI's time, so it runs behind `slow`.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
SECTION = re.search(r"## Adding a mixer: one file\n(.*?)\n## ", README, re.S).group(1)
# What a newcomer needs to run the registry's tests; the whole suite also reads results/, scripts/ and .ci/.
FOR_THE_MIXER_TESTS = ["mixers", "models", "experiments", "tests", "pyproject.toml", "README.md"]
FOR_THE_WHOLE_SUITE = [*FOR_THE_MIXER_TESTS, "results", "scripts", "docs", ".ci", "CITATION.cff"]


def tree_with_the_example(dest: Path, entries: list[str]) -> str:
    """Copies `entries` of the repository to `dest` and writes the README's example as the README says.

    Returns:
        the registry key the example registers.
    """
    for entry in entries:
        source = REPO / entry
        if source.is_dir():
            shutil.copytree(source, dest / entry, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif source.exists():
            shutil.copy2(source, dest / entry)
    file_name = re.search(r"Write `(mixers/\w+\.py)`", SECTION).group(1)
    import_line = re.search(r"add `(from \. import \w+)` to `mixers/__init__\.py`", SECTION).group(1)
    code = re.search(r"```python\n(.*?)```", SECTION, re.S).group(1)
    (dest / file_name).write_text(code)
    init = dest / "mixers" / "__init__.py"
    init.write_text(init.read_text() + import_line + "\n")
    return re.search(r'@register_mixer\("(\w+)"\)', code).group(1)


def pytest_in(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1"}
    # This file is left out in the copy: it would copy the tree again from inside the copy.
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           f"--ignore=tests/{Path(__file__).name}", *args],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=1800)


def test_the_example_passes_the_registry_tests(tmp_path: Path) -> None:
    name = tree_with_the_example(tmp_path, FOR_THE_MIXER_TESTS)
    result = pytest_in(tmp_path, "-k", name)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"(\d+) passed", result.stdout), result.stdout[-2000:]


@pytest.mark.slow
def test_the_example_passes_the_whole_suite(tmp_path: Path) -> None:
    tree_with_the_example(tmp_path, FOR_THE_WHOLE_SUITE)
    result = pytest_in(tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
