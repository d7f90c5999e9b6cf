"""Where a number came from: code version, software, hardware. Stamped on every row."""
from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def git_state() -> tuple[str, bool | None]:
    """(commit hash, dirty) of the checkout the code runs from; ("unknown", None) where git cannot say (no git on
    PATH, not a checkout): an unknown tree is not a clean one, and a row records its `dirty` as empty."""
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        # results/ is excluded: a sweep writing its own rows must not mark the code it measures as dirty.
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"))
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return commit, dirty


def device_name(device: torch.device) -> str:
    """A human name for the device: the GPU model; for the CPU its model name from /proc/cpuinfo, with its family
    and model numbers where it gives them and the vector instructions torch dispatches to, e.g.
    "AMD EPYC (family 26 model 2, AVX512)".

    A VM's CPU often reports a bare model name ("AMD EPYC") for machines generations apart: this project's sessions
    drew a Zen 3 (AVX2) and a Zen 5 (AVX-512) under that one name, far apart on the same training step. The numbers
    and the instruction set tell them apart (`experiments/sweep/same_machine.py` compares these names).
    """
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    fields: dict[str, str] = {}
    try:
        with Path("/proc/cpuinfo").open() as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break  # the first processor's block holds every field read here; a large host lists hundreds
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    details = [torch.backends.cpu.get_cpu_capability()]
    if "cpu family" in fields and "model" in fields:
        details.insert(0, f"family {fields['cpu family']} model {fields['model']}")
    return f"{name} ({', '.join(details)})"


def nvidia_smi(device: torch.device) -> dict[str, str]:
    """The SM clock (MHz) and driver version that nvidia-smi reports for `device`; empty where it does not answer."""
    if device.type != "cuda":
        return {"gpu_clock_mhz": "", "driver_version": ""}
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=clocks.sm,driver_version",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        clock, driver = (field.strip() for field in out.splitlines()[0].split(","))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {"gpu_clock_mhz": "", "driver_version": ""}
    return {"gpu_clock_mhz": clock, "driver_version": driver}


def math_settings(device: torch.device) -> dict[str, object]:
    """The global switches that change what a matmul or convolution computes or how it is chosen."""
    return {
        "tf32": torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else "",
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def package_version(name: str) -> str:
    """The installed version of a distribution (e.g. "triton", "mamba-ssm"); "" where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return ""


def provenance(device: torch.device) -> dict[str, object]:
    """The provenance columns of a row (see experiments/schema.py)."""
    commit, dirty = git_state()
    return {
        "commit": commit,
        "dirty": "" if dirty is None else dirty,
        "torch_version": torch.__version__,
        "triton_version": package_version("triton"),
        "mamba_ssm_version": package_version("mamba-ssm"),
        "cuda_version": torch.version.cuda or "",
        "device_name": device_name(device),
        "cpu_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or "default",
        "python_version": platform.python_version(),
        **math_settings(device),
        **nvidia_smi(device),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
