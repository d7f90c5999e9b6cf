"""Benchmark: forward and forward+backward of each mixer alone, on one grid (not a test: prints a table).

    python -m experiments.bench.mixers                      # dim 192, 64 x 64 grid (4096 tokens), batch 1
    python -m experiments.bench.mixers --grid 32 32 --mixers attention mamba --threads 2

Timing follows the sweep's protocol (warm-up, repeats until a count and a time are reached, median and IQR).
"""
from __future__ import annotations

import torch

from mixers import create_mixer, list_mixers

from ..measure.provenance import provenance
from .cli import Parser, int_at_least, positive_float
from ..measure.timing import TimingProtocol, time_call


def seeded_mixer(name: str, dim: int, heads: int, **options) -> torch.nn.Module:
    """The mixer with the weights seed 0 gives, whatever was built before it."""
    torch.manual_seed(0)
    return create_mixer(name, dim, heads, layer_idx=1, **options)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="python -m experiments.bench.mixers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mixers", nargs="+", default=None, help="default: all registered")
    parser.add_argument("--dim", type=int_at_least(1), default=192)
    parser.add_argument("--heads", type=int_at_least(1), default=3)
    parser.add_argument("--grid", type=int_at_least(1), nargs=2, default=(64, 64), metavar=("H", "W"))
    parser.add_argument("--batch", type=int_at_least(1), default=1)
    parser.add_argument("--threads", type=int_at_least(1, 4096), default=torch.get_num_threads())
    parser.add_argument("--min-time-s", type=positive_float, default=2.0)
    args = parser.parse_args(argv)
    unknown = [m for m in args.mixers or () if m not in list_mixers()]
    if unknown:
        parser.error(f"unknown mixer(s) {', '.join(unknown)}; registered: {', '.join(list_mixers())}")
    try:  # a shape a mixer refuses (dim not divisible by heads, say) is a bad argument, not a crash
        built = {name: seeded_mixer(name, args.dim, args.heads) for name in args.mixers or list_mixers()}
    except (TypeError, ValueError) as error:
        parser.error(f"--dim {args.dim} --heads {args.heads}: {error}")
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    protocol = TimingProtocol(warmup=1, min_repeats=3, min_time_s=args.min_time_s)
    grid = tuple(args.grid)
    n = grid[0] * grid[1]
    info = provenance(device)
    print(f"dim {args.dim}, heads {args.heads}, grid {grid} ({n} tokens), batch {args.batch}, fp32, "
          f"{args.threads} threads, {info['device_name']}, torch {info['torch_version']}, commit {info['commit'][:10]}")
    print(f"| mixer | impl | GMACs (fwd) | forward ms (IQR) | forward+backward ms (IQR) |\n|---|---|---|---|---|")
    for name, mixer in built.items():
        x = torch.randn(args.batch, n, args.dim, requires_grad=True)

        def forward() -> None:
            with torch.no_grad():
                mixer(x, grid)

        def forward_backward() -> None:
            mixer(x, grid).sum().backward()

        fwd = time_call(forward, device, protocol)
        fwd_bwd = time_call(forward_backward, device, protocol)
        print(f"| {name} | {mixer.impl} | {mixer.macs(grid) * args.batch / 1e9:.2f} | {fwd.median_ms:.1f} "
              f"({fwd.iqr_ms:.1f}) | {fwd_bwd.median_ms:.1f} ({fwd_bwd.iqr_ms:.1f}) |")


if __name__ == "__main__":
    main()
