"""Builds mamba-ssm's selective-scan extension from its sdist for the GPU architectures asked for, nothing else.

`pip install mamba-ssm` first tries to download a prebuilt wheel (a wait on a machine without internet), then
compiles every kernel of the package for each of the nine architectures its setup.py lists. The suite calls
only `selective_scan_fn` (mixers/ops/selective_scan/, impl `mamba_ssm_cuda`), whose kernels are the ten files of
csrc/selective_scan. This compiles those, for one architecture by default (the GPU's own), with the flags of
mamba-ssm's setup.py, through torch's extension builder (ninja, MAX_JOBS jobs at a time):

    python -m scripts.offline_gpu.build_mamba_scan mamba_ssm-2.3.2.post1.tar.gz /tmp/mamba [--arch 90]
    export PYTHONPATH=/tmp/mamba:$PYTHONPATH   # then `import mamba_ssm` finds the package and the extension

The folder then holds the sdist's Python package `mamba_ssm` (with its metadata, so its version is found) and
`selective_scan_cuda*.so`. The extension is built against the torch that runs this script; another torch release
needs its own build.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

from experiments.bench.cli import Parser

SOURCES = ("selective_scan.cpp",
           *(f"selective_scan_fwd_{t}.cu" for t in ("fp32", "fp16", "bf16")),
           *(f"selective_scan_bwd_{t}_{k}.cu" for t in ("fp32", "fp16", "bf16") for k in ("real", "complex")))

# mamba-ssm's own nvcc flags (its setup.py), less the architecture list, which --arch replaces, and less its
# -std=c++17: torch's builder sets the standard its own headers need (C++20 from torch 2.14 at least)
NVCC_FLAGS = ["-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
              "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
              "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math", "-lineinfo",
              "--threads", "4"]


def _local_arch() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def _dotted(arch: str) -> str:
    """A compute capability as torch writes it: 90 -> 9.0, 90a -> 9.0a, 100 -> 10.0."""
    digits = arch.rstrip("abcdefghijklmnopqrstuvwxyz")
    return f"{digits[:-1]}.{digits[-1]}{arch[len(digits):]}"


def _unpack(sdist: Path, dest: Path) -> Path:
    """The sdist's top folder, unpacked under dest/src; its `mamba_ssm` package copied to dest."""
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+, 3.11.4+: refuse links and paths out of dest
            tar.extractall(dest / "src", filter="data")
        else:
            tar.extractall(dest / "src")
    root = dest / "src" / top
    shutil.rmtree(dest / "mamba_ssm", ignore_errors=True)
    shutil.copytree(root / "mamba_ssm", dest / "mamba_ssm")
    # the sdist's PKG-INFO as the package's metadata, so that its version is found (rows record `mamba_ssm_version`)
    info = (root / "PKG-INFO").read_text(encoding="utf-8")
    version = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("Version:"))
    for old in dest.glob("mamba_ssm-*.dist-info"):
        shutil.rmtree(old)
    (dest / f"mamba_ssm-{version}.dist-info").mkdir()
    (dest / f"mamba_ssm-{version}.dist-info" / "METADATA").write_text(info, encoding="utf-8")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m scripts.offline_gpu.build_mamba_scan", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sdist", type=Path, help="mamba-ssm's source archive (mamba_ssm-X.tar.gz)")
    parser.add_argument("dest", type=Path, help="folder for the package and the extension (put it on PYTHONPATH)")
    parser.add_argument("--arch", nargs="+", default=None,
                        help="compute capabilities without the dot, e.g. 90 for an H100/H200 (default: this GPU's)")
    args = parser.parse_args(argv)
    if not args.sdist.is_file():
        parser.error(f"{args.sdist}: no such file; download it with `pip download --no-deps --no-build-isolation "
                     "mamba-ssm`")
    arches = args.arch or [a for a in [_local_arch()] if a]
    if not arches:
        parser.error("no GPU here to take the architecture from: name it, e.g. --arch 90")

    from torch.utils.cpp_extension import load

    args.dest.mkdir(parents=True, exist_ok=True)
    root = _unpack(args.sdist, args.dest)
    csrc = root / "csrc" / "selective_scan"
    gencode = [flag for a in arches for flag in ("-gencode", f"arch=compute_{a},code=sm_{a}")]
    build = args.dest / "build"
    build.mkdir(exist_ok=True)
    started = time.perf_counter()
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    # no CUDA device here (a build machine): keep torch from guessing architectures of its own
    os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(_dotted(a) for a in arches)
    load(name="selective_scan_cuda", sources=[str(csrc / s) for s in SOURCES], extra_include_paths=[str(csrc)],
         extra_cflags=["-O3"], extra_cuda_cflags=NVCC_FLAGS + gencode, build_directory=str(build),
         is_python_module=False, verbose=False)
    built = next(build.glob("selective_scan_cuda*.so"))
    shutil.copy2(built, args.dest / built.name)
    print(f"built {args.dest / built.name} for sm_{', sm_'.join(arches)} in {time.perf_counter() - started:.0f} s; "
          f"export PYTHONPATH={args.dest}:$PYTHONPATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
