"""scripts/offline_gpu: the GPU-machine runner and the mamba-ssm scan builder refuse bad input in one line, before
any setup or compilation (the parts that need a GPU run on one: scripts/offline_gpu/README.md)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts" / "offline_gpu"


def _one_line(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args,env,message", [
    ([], {"OUT": "x"}, "name the steps to run"),
    (["tests", "scna"], {"OUT": "x"}, "unknown step 'scna'"),
    (["sweep", "gpu_reference", "gpu_reference_h100"], {"OUT": "x"}, "sweep needs CONFIG FOLDER MINUTES"),
    (["sweep", "gpu_reference", "gpu_reference_h100", "eight"], {"OUT": "x"}, "MINUTES must be a number of minutes"),
    (["sweep", "gpu_reference", "../h100", "8"], {"OUT": "x"}, "FOLDER must be a folder name under results/"),
    (["tests", "sweep", "gpu_reference", "h100", "8", "--presets", "small", "--", "scna"], {"OUT": "x"},
     "unknown step 'scna'"),
    (["tests"], {}, "set OUT to the folder"),
])
def test_the_runner_refuses_before_setup(tmp_path: Path, args: list[str], env: dict[str, str], message: str) -> None:
    environment = {"PATH": "/usr/bin:/bin", **{k: str(tmp_path / v) for k, v in env.items()}}
    result = subprocess.run(["bash", str(SCRIPTS / "on_gpu.sh"), *args], cwd=tmp_path, env=environment,
                            capture_output=True, text=True)
    _one_line(result, message)
    assert not (tmp_path / "x").exists()  # nothing written, nothing set up


def test_the_scripts_parse() -> None:
    for script in ("on_gpu.sh", "pack.sh"):
        assert subprocess.run(["bash", "-n", str(SCRIPTS / script)]).returncode == 0


def test_the_scan_builder_refuses_a_missing_sdist(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "scripts.offline_gpu.build_mamba_scan",
                             str(tmp_path / "absent.tar.gz"), str(tmp_path / "dest"), "--arch", "90"],
                            cwd=REPO, capture_output=True, text=True)
    _one_line(result, "absent.tar.gz: no such file; download it with")
    assert not (tmp_path / "dest").exists()


def test_the_scan_builder_needs_an_architecture_without_a_gpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: its architecture is the default")
    sdist = tmp_path / "mamba_ssm-0.tar.gz"
    sdist.write_bytes(b"")
    result = subprocess.run([sys.executable, "-m", "scripts.offline_gpu.build_mamba_scan", str(sdist),
                             str(tmp_path / "dest")], cwd=REPO, capture_output=True, text=True)
    _one_line(result, "no GPU here to take the architecture from: name it, e.g. --arch 90")
