"""The README's promises: its example mixer works as written, and CI runs exactly its test command."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()

# Runs in a fresh interpreter so the example's registration does not leak into the other tests.
CHECK_EXAMPLE = r'''
import importlib.util, sys, torch
import mixers
from torch.utils.flop_counter import FlopCounterMode
spec = importlib.util.spec_from_loader("mixers.pool", loader=None)
module = importlib.util.module_from_spec(spec)
module.__package__ = "mixers"
sys.modules["mixers.pool"] = module
exec(sys.stdin.read(), module.__dict__)
assert "pool" in mixers.list_mixers()
from models import create_vit
model = create_vit("micro", mixer="pool", img_size=(20, 28), patch_size=4, num_classes=3)
with FlopCounterMode(display=False) as counter:
    loss = model(torch.randn(2, 3, 20, 28)).sum()
loss.backward()
assert model.macs() == counter.get_total_flops() // 2 // 2
print("ok", model.impl)
'''


def test_example_mixer_runs_in_the_backbone() -> None:
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    assert '@register_mixer("pool")' in code
    result = subprocess.run([sys.executable, "-c", CHECK_EXAMPLE], input=code, cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok avg_pool2d")


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"^(python3 -m venv .*)$", README, re.M)
    test_command = next(c for c in commands if "pytest" in c)
    install_and_test = test_command.split(". .venv/bin/activate && ", 1)[1]
    assert install_and_test in (REPO / ".ci" / "run").read_text()


def test_results_readme_documents_every_column() -> None:
    from experiments.schema import COLUMNS

    documented = (REPO / "results" / "README.md").read_text()
    missing = [c for c in COLUMNS if f"`{c}`" not in documented]
    assert not missing
