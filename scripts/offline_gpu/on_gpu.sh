#!/usr/bin/env bash
# On an offline CUDA machine, in the root of a copy of the checkout that carries .gpu/ (scripts/offline_gpu/pack.sh):
# sets up, then runs the steps named in order; what each writes for the way back goes to $OUT (at most 8 files).
#
#   bash scripts/offline_gpu/on_gpu.sh smoke scan profile
#   bash scripts/offline_gpu/on_gpu.sh sweep gpu_reference gpu_reference_h100 8
#
# Setup (every call): the wheels of .gpu/whl into /tmp/site; git moved to .gpu/head.bundle's HEAD with the working
# tree kept, so that a tree equal to that commit reads clean; mamba-ssm's selective scan compiled for this GPU from
# .gpu/mamba_ssm-*.tar.gz into /tmp/mamba_scan (once per machine: a call that finds it warm reuses the build);
# ../shared/data/cifar10-subset.npz from .gpu/.
# Steps:
#   smoke                          python -m experiments.gpu_smoke: pytest -m gpu, one point per mixer eager and
#                                  graphed at batch 1 and max, a device-trainer epoch -> $OUT/gpu_smoke.txt
#   tests                          python -m pytest -m gpu                         -> $OUT/pytest_gpu.txt
#   scan                           the scans alone, L = 1K..64K, bf16              -> $OUT/bench_scan.{txt,csv}
#   profile                        the mamba mixer by kernel at 4K, 16K, 64K tokens, through mamba-ssm's scan and
#                                  the Triton scan                                 -> $OUT/profile_mamba_*.{txt,csv}
#   sweep CONFIG FOLDER MINUTES    resumes the committed results/FOLDER/runs.csv with --config CONFIG, no report,
#        [SWEEP FLAGS... --]       until MINUTES after this call started (its budget is what setup and earlier
#                                  steps left of them); a step after it needs the "--"
#                                                                                  -> $OUT/FOLDER.runs.csv (+ .erf.tar)
# A sweep step is refused where the tree differs from the commit git names (rows would say dirty=True):
# ALLOW_DIRTY=1 runs it anyway.
set -uo pipefail
export PYTHONUNBUFFERED=1
py=python3
started=$(date +%s)

setup() {
  if compgen -G ".gpu/whl/*.whl" > /dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
      && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  fi
  if [ -f .gpu/head.bundle ]; then
    git fetch -q .gpu/head.bundle HEAD && git reset -q FETCH_HEAD \
      || echo "on_gpu.sh: WARNING: the git bundle did not apply; rows will say dirty=True" >&2
  fi
  changed=$(git status --porcelain --untracked-files=no -- . ':(exclude)results' | wc -l)
  echo "on_gpu.sh: at $(git rev-parse --short HEAD), tracked files changed: $changed"
  if [ "$changed" -gt 0 ] && [ "$sweeps" -gt 0 ] && [ "${ALLOW_DIRTY:-0}" != 1 ]; then
    echo "on_gpu.sh: the tree differs from $(git rev-parse --short HEAD), so sweep rows would say dirty=True;" \
      "commit, rerun pack.sh and carry .gpu again (or set ALLOW_DIRTY=1)" >&2
    exit 2
  fi
  local sdist
  sdist=$(compgen -G ".gpu/mamba_ssm-*.tar.gz" | head -n 1)
  if [ ! -f /tmp/mamba_scan/selective_scan_cuda.so ] && [ -n "$sdist" ]; then
    MAX_JOBS=$(nproc) $py -m scripts.offline_gpu.build_mamba_scan "$sdist" /tmp/mamba_scan \
      || echo "on_gpu.sh: WARNING: mamba-ssm's scan did not build; mamba runs the Triton scan" >&2
  fi
  if [ -f /tmp/mamba_scan/selective_scan_cuda.so ]; then export PYTHONPATH=/tmp/mamba_scan:${PYTHONPATH:-}; fi
  if [ -f .gpu/cifar10-subset.npz ] && [ ! -f ../shared/data/cifar10-subset.npz ]; then
    mkdir -p ../shared/data && cp .gpu/cifar10-subset.npz ../shared/data/
  fi
  $py -c "import torch; print('on_gpu.sh: torch', torch.__version__, torch.cuda.get_device_name(0))"
}

check_steps() {  # before setup, so that a typo costs nothing
  while [ $# -gt 0 ]; do
    case $1 in
      smoke|tests|scan|profile) shift ;;
      sweep)
        if [ $# -lt 4 ]; then echo "on_gpu.sh: sweep needs CONFIG FOLDER MINUTES" >&2; exit 2; fi
        if [[ ! $4 =~ ^[0-9]+([.][0-9]+)?$ ]]; then
          echo "on_gpu.sh: sweep $2 $3: MINUTES must be a number of minutes, got '$4'" >&2; exit 2
        fi
        if [[ ! $3 =~ ^[A-Za-z0-9._-]+$ ]]; then
          echo "on_gpu.sh: sweep $2: FOLDER must be a folder name under results/ (letters, digits, . _ -), got '$3'" >&2
          exit 2
        fi
        sweeps=$((sweeps + 1))
        shift 4
        while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
        if [ $# -gt 0 ]; then shift; fi ;;
      *) echo "on_gpu.sh: unknown step '$1'; steps: smoke, tests, scan, profile, sweep CONFIG FOLDER MINUTES" >&2; exit 2 ;;
    esac
  done
}

if [ $# -eq 0 ]; then echo "on_gpu.sh: name the steps to run: smoke, tests, scan, profile, sweep CONFIG FOLDER MINUTES" >&2; exit 2; fi
sweeps=0
check_steps "$@"
if [ -z "${OUT:-}" ]; then echo "on_gpu.sh: set OUT to the folder whose files should come back" >&2; exit 2; fi
out=$OUT
mkdir -p "$out"
setup
status=0
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    smoke)
      $py -m experiments.gpu_smoke 2>&1 | tee "$out/gpu_smoke.txt" || status=1 ;;
    tests)
      $py -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/pytest_gpu.txt" || status=1 ;;
    scan)
      $py -m experiments.bench.scan --device cuda --dtype bf16 --csv "$out/bench_scan.csv" 2>&1 \
        | tee "$out/bench_scan.txt" || status=1 ;;
    profile)
      for impl in auto triton; do
        $py -m experiments.bench.profile --device cuda --tokens 4096 16384 65536 --options "scan_impl=$impl" \
          --csv "$out/profile_mamba_$impl.csv" 2>&1 | tee "$out/profile_mamba_$impl.txt" || status=1
      done ;;
    sweep)
      config=$1 folder=$2 minutes=$3; shift 3
      flags=()
      while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
      if [ $# -gt 0 ]; then shift; fi  # the "--" that ends the sweep's flags
      # what this call has left of MINUTES after setup and earlier steps
      budget=$(awk -v m="$minutes" -v s="$(( $(date +%s) - started ))" 'BEGIN { printf "%.1f", m - s / 60 }')
      if awk -v b="$budget" 'BEGIN { exit !(b < 1) }'; then
        echo "on_gpu.sh: sweep $folder skipped: $budget of its $minutes minutes left after setup" >&2; status=1; continue
      fi
      work=/tmp/sweeps/$folder  # the committed rows, afresh: a warm machine's earlier copy may be stale
      rm -rf "$work" && mkdir -p "$work"
      if [ -f "results/$folder/runs.csv" ]; then cp "results/$folder/runs.csv" "$work/"; fi
      if [ -d "results/$folder/erf" ]; then cp -r "results/$folder/erf" "$work/"; fi
      echo "on_gpu.sh: sweep $config into $folder for $budget minutes"
      $py -m experiments.sweep --config "$config" --out "$work" --budget-minutes "$budget" --no-report --quiet \
        "${flags[@]}" || status=1
      cp "$work/runs.csv" "$out/$folder.runs.csv" || status=1
      if [ -d "$work/erf" ]; then tar cf "$out/$folder.erf.tar" -C "$work" erf || status=1; fi ;;
  esac
done
exit $status
