"""`python -m experiments.gpu_smoke`: the first command to run on a GPU, before any sweep (meant to take about two
minutes).

It runs the GPU test suite (`pytest -m gpu`), then one small point per registered mixer in each timing regime
(eager and graphed) at batch 1 and batch `max`, each with its training step and fvcore count, then one short
training on the device trainer (the generated `reach` task, one epoch). It prints one line per point and ends
with exit status 0 when everything passed, 1 when something failed (the lines say what), and 2 on a machine
without CUDA, which it refuses in one line.
"""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from mixers import list_mixers

from .bench.cli import Parser, int_at_least
from .measure.point import Point, canonical_json
from .measure.timing import TimingProtocol
from .schema import MAX_BATCH

REPO = Path(__file__).resolve().parents[1]
SMOKE_SIZE = dict(preset="micro", img_size=32, patch_size=4)  # 64 tokens: every path, none of the cost
SMOKE_DTYPE = "bfloat16"  # the dtype of the GPU references
TIMING_MODES = ("eager", "graphed")
# One epoch of reach on the device trainer: enough steps for the divergence check, the checkpoint and the RNG state.
TRAINER_RECIPE = {"train_samples": 512, "batch_size": 64, "eval_batch_size": 256,
                  "warmup_epochs": 0.0, "val_fraction": 0.1}


def smoke_points(mixers: Iterable[str], max_batch: int = 16) -> list[Point]:
    """One point per mixer, timing regime and batch (1 and `max`, searched up to `max_batch`), on CUDA."""
    timing = TimingProtocol(warmup=1, min_repeats=3, min_time_s=0.0, max_batch=max_batch)
    return [Point(mixer=mixer, batch_size=batch, device="cuda", dtype=SMOKE_DTYPE, timing_mode=mode, timing=timing,
                  **SMOKE_SIZE)
            for mixer in mixers for mode in TIMING_MODES for batch in (1, MAX_BATCH)]


def trainer_point(checkpoint_dir: str = "") -> Point:
    """A one-epoch training of attention on reach through the device trainer (fused AdamW, device data)."""
    return Point(mixer="attention", batch_size=1, device="cuda", dtype=SMOKE_DTYPE, dataset="reach", epochs=1,
                 train=canonical_json(TRAINER_RECIPE), checkpoint_dir=checkpoint_dir, measure_train_step=False,
                 timing=TimingProtocol(warmup=1, min_repeats=1, min_time_s=0.0), **SMOKE_SIZE)


def row_line(point: Point, row: dict) -> str:
    """One line per point: what ran and how it ended."""
    batch = "max" if point.batch_size == MAX_BATCH else str(point.batch_size)
    cells = [f"{point.mixer:<16}", f"{point.timing_mode:<7}", f"b{batch:<4}", f"{row.get('status', '?'):<6}",
             f"impl={row.get('impl') or '-'}"]
    if row.get("latency_ms") is not None:
        cells.append(f"{row['latency_ms']:.3f} ms at batch {row.get('batch_used')}")
    if row.get("accuracy") is not None:
        cells.append(f"accuracy {row['accuracy']:.3f}")
    if row.get("error"):
        cells.append(f"| {row['error']}")
    return "  ".join(cells)


def run_points(points: list[Point]) -> int:
    """Measures each point in its own child process, as a sweep does, and prints its line; returns how many did not
    end ok (a training step or fvcore note inside an ok row counts as a failure too: the smoke expects every path
    to run).

    In one process, a failed CUDA graph capture left torch's CUDA generator in capture state, and every later
    point failed at its first random number ("Offset increment outside graph capture", seen on an H200): a child
    per point keeps each failure to its own line.
    """
    from .measure.run import measure_point
    from .sweep.isolation import run_isolated

    failed = 0
    for point in points:
        row = run_isolated(measure_point, point, point.timeout_s)
        print(row_line(point, row), flush=True)
        failed += row.get("status") != "ok" or bool(row.get("error"))
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m experiments.gpu_smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mixers", nargs="+", default=None, metavar="MIXER",
                        help="only these registered mixers (default: all)")
    parser.add_argument("--max-batch", type=int_at_least(1, 4096), default=16,
                        help="batch max searches powers of two up to this")
    parser.add_argument("--skip-pytest", action="store_true", help="skip `pytest -m gpu`")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.mixers or ()) - set(list_mixers()))
    if unknown:
        parser.error(f"unknown mixer(s) {', '.join(unknown)}; registered: {', '.join(list_mixers())}")
    if not torch.cuda.is_available():
        print(f"{parser.prog}: needs a CUDA device and torch sees none (torch {torch.__version__}); run it on the "
              "GPU machine", file=sys.stderr)
        return 2
    started = time.perf_counter()
    print(f"GPU smoke on {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    failures = []
    if not args.skip_pytest:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"],
                               cwd=REPO)
        if tests.returncode != 0:
            failures.append(f"pytest -m gpu exited {tests.returncode}")
    failed = run_points(smoke_points(args.mixers or list_mixers(), args.max_batch))
    if failed:
        failures.append(f"{failed} measured point(s) did not end ok")
    import tempfile

    with tempfile.TemporaryDirectory() as checkpoints:
        if run_points([trainer_point(checkpoints)]):
            failures.append("the device-trainer run did not end ok")
    print(f"{time.perf_counter() - started:.0f} s; " + ("; ".join(failures) if failures else "all passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
