#!/usr/bin/env bash
# Packs into .gpu/ (git-ignored) what an offline CUDA machine needs beside a copy of this checkout, for
# scripts/offline_gpu/on_gpu.sh there (README.md beside this file):
#   .gpu/whl/           pure-Python wheels of fvcore and of its needs that a CUDA image tends to lack
#   .gpu/mamba_ssm-*.tar.gz   mamba-ssm's sdist (on_gpu.sh compiles its selective scan for that GPU alone)
#   .gpu/cifar10-subset.npz   the CIFAR-10 subset the accuracy sweeps read (from ../shared/data, where present)
#   .gpu/head.bundle    the commits since the copy's own base (git bundle), so that rows there name HEAD, clean
# Run it in the checkout, in a venv where the project is installed (pip resolves mamba-ssm's sdist with torch).
#   WITH_CIFAR=0                  leaves the CIFAR subset out (most of the pack's size)
#   BASE=<commit the copy knows>  default: where this clone's HEAD started (its first reflog entry); a full bundle
#                                 where that is unknown
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "pack.sh: the checkout has uncommitted changes; commit them first, so that rows name the code that ran" >&2
  exit 2
fi
if ! python -c "import fvcore, torch" 2>/dev/null; then
  echo "pack.sh: run it in the project's venv (. .venv/bin/activate): it packs the fvcore this venv tests with" >&2
  exit 2
fi
# .gpu/ is in .gitignore: it never lands in a commit, and a run carries it by name. Built aside and moved into
# place at the end, so a failed download leaves an earlier pack whole.
next=$(mktemp -d .gpu.next.XXXX)
trap 'rm -rf "$next"' EXIT
mkdir -p "$next/whl"
# The versions this venv runs (the tests passed with them). fvcore and iopath ship only sdists; all four are pure
# Python, so one wheel serves any Python 3.
pins=$(python -c "from importlib.metadata import version as v
print(' '.join(f'{n}=={v(n)}' for n in ('fvcore', 'iopath', 'yacs', 'termcolor')))")
# shellcheck disable=SC2086
pip wheel -q --no-deps -w "$next/whl" $pins
# the sdist alone, its CUDA build skipped (as experiments/bench/scan.py's --mamba-src help says)
MAMBA_SKIP_CUDA_BUILD=TRUE pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$next" \
  "mamba-ssm==${MAMBA_SSM_VERSION:-2.3.2.post1}"
if [ "${WITH_CIFAR:-1}" = 0 ]; then
  :  # steps that train on no CIFAR (smoke, tests, scan, profile, gpu_reference): a smaller carry
elif [ -f ../shared/data/cifar10-subset.npz ]; then
  cp ../shared/data/cifar10-subset.npz "$next/"
else
  echo "pack.sh: WARNING: no ../shared/data/cifar10-subset.npz here; accuracy_gpu's CIFAR runs will fail there" >&2
fi
base=${BASE:-$(git reflog show --format=%H HEAD 2>/dev/null | tail -n 1)}
if [ "$base" = "$(git rev-parse HEAD)" ]; then
  :  # the copy's own .git already has HEAD
elif [ -n "$base" ] && git merge-base --is-ancestor "$base" HEAD; then
  git bundle create -q "$next/head.bundle" "$base..HEAD"
else
  git bundle create -q "$next/head.bundle" HEAD
fi
rm -rf .gpu && mv "$next" .gpu
du -ah --max-depth=1 .gpu | sed "s/^/pack.sh: /"
echo "pack.sh: name .gpu in the run's carry; on the GPU machine: bash scripts/offline_gpu/on_gpu.sh STEP ..."
