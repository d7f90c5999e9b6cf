"""Where a mixer's time goes: torch.profiler over forward and backward of one mixer, time by kernel (CUDA) or
operator (CPU) name, each name put in a class (scan, matmul, conv, copy/layout, reduction, elementwise/other).

    python -m experiments.bench.profile --device cuda --tokens 4096 16384 65536   # mamba, dim 192, bf16
    python -m experiments.bench.profile --mixers mamba linear --tokens 1024 --device cpu --csv prof.csv

Self times are summed, so nothing is counted twice and the shares of one case add up to 100%: on CUDA the
device time of every kernel, copy and memset; on the CPU the host time of every operator (there the scan of
`torch_stream` is a chain of ordinary operators and has no name of its own). Shares, not absolute times, are the
point: the profiler adds its own overhead to each call. The time itself is `experiments.bench.mixers`'s job.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from mixers import list_mixers

from ..measure.memory import stderr_silenced
from .cli import Parser, int_at_least
from .mixers import seeded_mixer
from .record import check_output_path, provenance_columns, provenance_line, write_rows

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_TOKENS = 1 << 24  # a 4096 x 4096 grid; 2**30 tokens asked for a 768 GiB input: a typo, refused up front

# First match wins. The scan: mamba-ssm's kernels, the Triton scan's (mixers/ops/selective_scan/triton_scan.py),
# and the compiled CPU loops of gla's and mamba2's recurrences (mixers/ops/gla, mixers/ops/ssd), their ops and
# autograd nodes: else the largest share of those two mixers read as "elementwise/other"
CLASSES = (
    ("scan", re.compile(r"selective_scan|_scan_(fwd|bwd|combine_splits)_kernel|gla_recurrent|ssd_(recurrent|hydra)")),
    ("matmul", re.compile(r"gemm|gemv|xmma|cutlass|nvjet|cublas|matmul|aten::(mm|bmm|addmm|baddbmm|linear)\b")),
    ("conv", re.compile(r"convolution|aten::conv\dd|causal_conv|conv\w*_kernel|depthwise_conv_tokens")),
    # anchored: CUDA's `unrolled_elementwise_kernel` (any non-contiguous or casting elementwise op) is no roll
    ("copy/layout", re.compile(r"copy|contiguous|clone|flip|aten::cat\b|catarraybatched|transpose|permute|memcpy"
                               r"|memset|fill|aten::index|index_select|gather|scatter|aten::roll\b|roll_cuda"
                               r"|constant_pad|aten::pad\b")),
    ("reduction", re.compile(r"reduce|aten::(sum|mean|norm|softmax)|softmax|layer_norm")),
)


def kernel_class(name: str) -> str:
    """The class of a kernel or operator name (`CLASSES`), "elementwise/other" when none matches."""
    lowered = name.lower()
    return next((label for label, pattern in CLASSES if pattern.search(lowered)), "elementwise/other")


def _self_time_us(event, device: torch.device) -> float:
    if device.type == "cuda":
        if event.device_type != torch.autograd.DeviceType.CUDA:
            return 0.0
        return float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0))
    return float(event.self_cpu_time_total)


def profile_case(mixer: torch.nn.Module, x: torch.Tensor, grid: tuple[int, int], device: torch.device,
                 repeats: int, backward: bool = True) -> list[dict[str, object]]:
    """One row per kernel (or operator) name: time and calls per iteration, share, class; largest first."""
    from torch.profiler import ProfilerActivity, profile

    def step() -> None:
        if backward:  # gradients set to None first, as a training step's zero_grad does: none is accumulated
            mixer.zero_grad(set_to_none=True)
            x.grad = None
            mixer(x, grid).float().sum().backward()
        else:
            with torch.no_grad():
                mixer(x, grid)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):  # warm-up: Triton compiles, cuBLAS picks its kernels, the allocator fills its cache
        step()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with stderr_silenced(), profile(activities=activities) as prof:
        for _ in range(repeats):
            step()
        sync()
    times: dict[str, list[float]] = {}
    for event in prof.key_averages():
        us = _self_time_us(event, device)
        if us > 0:
            entry = times.setdefault(event.key, [0.0, 0.0])
            entry[0] += us
            entry[1] += event.count
    total = sum(us for us, _ in times.values())
    if not total:
        raise RuntimeError(f"the profiler recorded no {'device' if device.type == 'cuda' else 'operator'} time "
                           "(on CUDA it needs CUPTI, which ships with torch's CUDA wheels)")
    rows = [{"name": name, "class": kernel_class(name), "ms_per_iter": us / 1e3 / repeats,
             "calls_per_iter": calls / repeats, "share": us / total}
            for name, (us, calls) in times.items()]
    return sorted(rows, key=lambda r: -r["ms_per_iter"])


def class_shares(rows: list[dict[str, object]]) -> dict[str, float]:
    """Share of the case's time per class, largest first."""
    shares: dict[str, float] = {}
    for row in rows:
        shares[row["class"]] = shares.get(row["class"], 0.0) + row["share"]
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def _grid(tokens: int) -> tuple[int, int]:
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ValueError(f"{tokens} tokens is not a square grid; give a square number (64, 4096, 16384, ...)")
    return side, side


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="python -m experiments.bench.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mixers", nargs="+", default=["mamba"], help="default: mamba")
    parser.add_argument("--tokens", type=int_at_least(1, MAX_TOKENS), nargs="+", default=[4096],
                        help="token counts N, each a square grid (default: 4096)")
    parser.add_argument("--dim", type=int_at_least(1), default=192, help="channels (default: 192, DeiT-Ti)")
    parser.add_argument("--heads", type=int_at_least(1), default=3)
    parser.add_argument("--batch", type=int_at_least(1), default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--forward-only", action="store_true", help="profile the forward alone (no_grad)")
    parser.add_argument("--repeats", type=int_at_least(1), default=10, help="profiled iterations (default: 10)")
    parser.add_argument("--top", type=int_at_least(1), default=12, help="names listed per case (default: 12)")
    parser.add_argument("--options", default=None, metavar="KEY=VALUE,...",
                        help="mixer options, e.g. scan_impl=triton (values as Python literals where they parse)")
    parser.add_argument("--csv", type=Path, default=None, help="also write every row, with provenance, as CSV")
    args = parser.parse_args(argv)
    unknown = [m for m in args.mixers if m not in list_mixers()]
    if unknown:
        parser.error(f"unknown mixer(s) {', '.join(unknown)}; registered: {', '.join(list_mixers())}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; use --device cpu")
    try:
        grids = {n: _grid(n) for n in args.tokens}
        options = _options(args.options)
        if args.csv is not None:
            check_output_path(args.csv)  # before profiling: a folder there lost every result after the run
    except ValueError as error:
        parser.error(str(error))
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    prov = provenance_columns(device, args.repeats)
    print(f"{'forward' if args.forward_only else 'forward+backward'} of one mixer, dim {args.dim}, batch "
          f"{args.batch}, {dtype}; {provenance_line(prov, 'profiled iterations per case, after 3 warm-up ones')}")
    written = []
    for name in args.mixers:
        try:
            mixer = seeded_mixer(name, args.dim, args.heads, **options).to(device, dtype)
        except (TypeError, ValueError) as error:
            parser.error(f"{name} with --dim {args.dim} --heads {args.heads} --options {args.options}: {error}")
        for tokens, grid in grids.items():
            try:
                x = torch.randn(args.batch, tokens, args.dim, device=device, dtype=dtype,
                                requires_grad=not args.forward_only)
                rows = profile_case(mixer, x, grid, device, args.repeats, backward=not args.forward_only)
            except (RuntimeError, NotImplementedError, MemoryError) as error:  # flex's CPU backward, triton on a
                # CPU, an input past memory: one line, and the cases already profiled are kept
                if args.csv and written:
                    write_rows(args.csv, written)
                first = (str(error).strip().splitlines() or [""])[0][:200]
                parser.error(f"{name} (--options {args.options}) at N = {tokens:,} cannot run "
                             f"{'forward' if args.forward_only else 'forward+backward'} on {device.type} "
                             f"({type(error).__name__}: {first})")
            total = sum(r["ms_per_iter"] for r in rows)
            split = ", ".join(f"{label} {100 * share:.0f}%" for label, share in class_shares(rows).items())
            print(f"\n{name} ({getattr(mixer, 'impl', '')}), N = {tokens:,}: {total:.3f} ms per iteration "
                  f"(profiled); {split}\n")
            print("| kernel / operator | class | ms / iter | calls / iter | share |\n|---|---|---:|---:|---:|")
            for row in rows[:args.top]:
                print(f"| {row['name'][:90]} | {row['class']} | {row['ms_per_iter']:.4f} | "
                      f"{row['calls_per_iter']:g} | {100 * row['share']:.1f}% |")
            written += [{**prov, "mixer": name, "impl": getattr(mixer, "impl", ""), "tokens": tokens,
                         "dim": args.dim, "batch": args.batch, "dtype": str(dtype).removeprefix("torch."),
                         "passes": "fwd" if args.forward_only else "fwd+bwd", **row} for row in rows]
    if args.csv:
        print(f"\nwrote {write_rows(args.csv, written)}")


def _options(text: str | None) -> dict[str, object]:
    """`key=value,key=value` as keyword options; a value is a Python literal where it parses (8, 1.5, True)."""
    import ast

    options: dict[str, object] = {}
    for item in filter(None, (text or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--options: expected key=value, got {item!r}")
        try:
            options[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[key.strip()] = value.strip()
    return options


if __name__ == "__main__":
    main()
