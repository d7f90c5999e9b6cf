"""Benchmark: the CPU selective scans (the compiled `cpp_loop`, the stepped `torch_stream` op, the autograd
`torch_loop`, and mamba-ssm's own `selective_scan_ref` where its source is given) against each other and against
the float64 reference.

Times forward (no grad) and forward+backward at a Vim-tiny-like problem (default B=1, D=384, N=16, fp32) over
L = 256, 1,024 and 4,096 (`--long` adds 16,384; it takes minutes) with `torch.utils.benchmark.Timer` and an
explicit thread count, and prints per L and implementation the median, IQR, speed-up over `torch_stream`, and the
largest relative error of the output and of every input's gradient against the float64 reference loop.

`selective_scan_ref` is read from mamba-ssm's source archive (the package installs only with CUDA). Get it with

    MAMBA_SKIP_CUDA_BUILD=TRUE pip download --no-deps --no-binary :all: --no-build-isolation \
        mamba-ssm==2.3.2.post1 -d /tmp/mamba_src
    tar xzf /tmp/mamba_src/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba_src

(pip prepares the sdist's metadata, which imports torch: hence no build isolation, in an environment with torch)
and pass `--mamba-src /tmp/mamba_src/mamba_ssm-2.3.2.post1`. Without it only our scans are timed.

With `--device cuda` it instead times the GPU implementations (`triton`, `torch_stream`, and
`mamba_ssm_cuda` where mamba-ssm imports) forward, forward+backward, and Vision Mamba's bidirectional pair
(`bidir fwd+bwd`: a forward and a reverse scan) over L = 1K..64K at a Vim-tiny-like B=1, D=384 (expand 2 x
dim 192), N=16, in bf16 or fp32 (`--dtype`), and prints one table; see `bench_cuda`.

Usage:
    python -m experiments.bench.scan --device cpu --num-threads 1
    python -m experiments.bench.scan --device cpu --long --d-state 1 --no-gate   # vmamba's scan, to 16K
    python -m experiments.bench.scan --mamba-src /tmp/mamba_src/mamba_ssm-2.3.2.post1 --lengths 1024
    python -m experiments.bench.scan --device cuda --dtype bf16
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mixers.ops.selective_scan import resolve_scan_impl, selective_scan, selective_scan_loop, selective_scan_reference
from mixers.ops.selective_scan.cpp_scan import cpp_unavailable_reason

from .record import provenance_columns, provenance_line, write_rows
from .cli import Parser, int_at_least, positive_float

# torch.utils.benchmark is imported where it times: on a CUDA build without a CUDA runtime its import logs a
# warning, and a bad argument must stop in one line before that.
if TYPE_CHECKING:
    from torch.utils.benchmark import Measurement


GET_SOURCE = (
    "MAMBA_SKIP_CUDA_BUILD=TRUE pip download --no-deps --no-binary :all: --no-build-isolation "
    "mamba-ssm==2.3.2.post1 -d /tmp/mamba_src && tar xzf /tmp/mamba_src/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba_src"
)
INPUT_NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
DEFAULT_LENGTHS = (256, 1024, 4096)
LONG_LENGTHS = (16384,)
# The longest L each slow CPU scan is timed at: the stepped op pays Python per step, the autograd loop keeps every
# state (O(B D L N) memory) and mamba-ssm's reference indexes per step.
STEPPED_MAX_LENGTH = {"torch_stream (op)": 16384, "torch_loop (autograd)": 4096, "mamba-ssm selective_scan_ref": 1024}


def load_selective_scan_ref(src: Path) -> Callable[..., torch.Tensor]:
    """mamba-ssm's `selective_scan_ref` from an unpacked source tree, importable without CUDA.

    `selective_scan_interface.py` imports the compiled `selective_scan_cuda` and a Triton layer norm at module
    level; both are stubbed, and the package's `__init__` (which imports every model) is bypassed. The stubs are
    removed from `sys.modules` afterwards so that nothing else in the process mistakes them for mamba-ssm.
    """
    package_dir = src / "mamba_ssm"
    if not (package_dir / "ops" / "selective_scan_interface.py").is_file():
        raise FileNotFoundError(f"{src} holds no mamba_ssm/ops/selective_scan_interface.py")
    before = set(sys.modules)
    package = types.ModuleType("mamba_ssm")
    package.__path__ = [str(package_dir)]
    layer_norm = types.ModuleType("mamba_ssm.ops.triton.layer_norm")
    layer_norm._layer_norm_fwd = None
    stubs = {
        "mamba_ssm": package,
        "mamba_ssm.ops.triton.layer_norm": layer_norm,
        "selective_scan_cuda": types.ModuleType("selective_scan_cuda"),
    }
    sys.modules.update(stubs)
    try:
        module = importlib.import_module("mamba_ssm.ops.selective_scan_interface")
    finally:
        for name in set(sys.modules) - before:
            if name == "mamba_ssm" or name.startswith("mamba_ssm.") or name == "selective_scan_cuda":
                del sys.modules[name]
    return module.selective_scan_ref


def make_inputs(batch: int, channels: int, length: int, d_state: int, seed: int) -> dict[str, torch.Tensor | bool]:
    """Inputs as a Mamba layer at initialisation sees them: S4D-real A, dt in [1e-3, 1e-1] through softplus."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.exp(torch.rand(channels, generator=g) * (torch.log(torch.tensor(0.1)) - torch.log(torch.tensor(1e-3)))
                   + torch.log(torch.tensor(1e-3)))
    return dict(
        u=torch.randn(batch, channels, length, generator=g),
        delta=torch.randn(batch, channels, length, generator=g) * 0.5,
        A=-torch.arange(1, d_state + 1, dtype=torch.float32).repeat(channels, 1),
        B=torch.randn(batch, d_state, length, generator=g),
        C=torch.randn(batch, d_state, length, generator=g),
        D=torch.ones(channels),
        z=torch.randn(batch, channels, length, generator=g),
        delta_bias=dt + torch.log(-torch.expm1(-dt)),
        delta_softplus=True,
    )


def time_it(fn: Callable[[], object], num_threads: int, repeats: int, block_seconds: float) -> Measurement:
    """`repeats` timed blocks of `fn` with `Timer`, each block about `block_seconds` long, after a warm-up call."""
    from torch.utils.benchmark import Measurement, Timer

    timer = Timer("fn()", globals={"fn": fn}, num_threads=num_threads)
    once = timer.timeit(number=1).median
    number = max(1, round(block_seconds / max(once, 1e-9)))
    return Measurement.merge([timer.timeit(number=number) for _ in range(repeats)])[0]


def forward_and_grads(scan: Callable[..., torch.Tensor], inputs: dict, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    """y and the gradient of <y, dy> w.r.t. every tensor input, in float64 for comparison."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    y = scan(**{**inputs, **leaves})
    grads = torch.autograd.grad(y, list(leaves.values()), dy.to(y.dtype))
    return {"y": y.detach().double(), **{f"d{k}": g.double() for k, g in zip(leaves, grads)}}


CUDA_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def bench_cuda(
    lengths: tuple[int, ...] = CUDA_LENGTHS,
    *,
    batch: int = 1,
    channels: int = 384,
    d_state: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 5,
    block_seconds: float = 0.2,
    stream_max_length: int = 8192,
    seed: int = 0,
) -> list[tuple[int, str, str, float, float]]:
    """Times the selective scan's GPU implementations and prints a table of medians.

    u, delta, B, C, z are in `dtype`; A, D, delta_bias stay float32 as in a Mamba layer. `torch_stream` steps in
    Python and takes seconds at long L, so it is timed only up to `stream_max_length`.

    Returns:
        rows (L, implementation, pass, median ms, IQR ms).
    """
    impls = ["triton", "torch_stream"]
    if resolve_scan_impl("auto", torch.device("cuda"), dtype) == "mamba_ssm_cuda":
        impls.insert(0, "mamba_ssm_cuda")
    print(f"selective scan on {torch.cuda.get_device_name()}, B={batch} D={channels} N={d_state}, {dtype} inputs, "
          f"with D, z, delta_bias, softplus; torch {torch.__version__}; implementations: {', '.join(impls)}")
    print(provenance_line(provenance_columns(torch.device("cuda"), repeats)) + "\n")
    rows = []
    for length in lengths:
        cpu_inputs = make_inputs(batch, channels, length, d_state, seed)
        inputs = {k: (v.cuda().to(dtype) if k in ("u", "delta", "B", "C", "z") else v.cuda())
                  if isinstance(v, torch.Tensor) else v for k, v in cpu_inputs.items()}
        dy = torch.randn(batch, channels, length, device="cuda", dtype=dtype)
        for impl in impls:
            if impl == "torch_stream" and length > stream_max_length:
                continue
            leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if isinstance(v, torch.Tensor)}

            def forward(impl=impl) -> None:
                with torch.no_grad():
                    selective_scan(**inputs, impl=impl)

            def forward_backward(impl=impl, leaves=leaves) -> None:
                y, _ = selective_scan(**{**inputs, **leaves}, impl=impl)
                torch.autograd.grad(y, list(leaves.values()), dy)

            # Vision Mamba's bidirectional pair: one scan forward, one backward in time (`reverse`: read backwards
            # by `triton`, flipped around the others as Vim does).
            def pair_forward_backward(impl=impl, leaves=leaves) -> None:
                ys = [selective_scan(**{**inputs, **leaves}, impl=impl, reverse=r)[0] for r in (False, True)]
                torch.autograd.grad(ys, list(leaves.values()), [dy, dy])

            for pass_name, fn in (("fwd", forward), ("fwd+bwd", forward_backward),
                                  ("bidir fwd+bwd", pair_forward_backward)):
                m = time_it(fn, 1, repeats, block_seconds)
                rows.append((length, impl, pass_name, m.median * 1e3, m.iqr * 1e3))
        torch.cuda.empty_cache()

    print(f"| {'L':>6} | {'implementation':<15} | {'pass':<7} | {'median ms':>9} | {'IQR ms':>7} |")
    print(f"|{'-' * 8}|{'-' * 17}|{'-' * 9}|{'-' * 11}|{'-' * 9}|")
    for length, impl, pass_name, ms, iqr in rows:
        print(f"| {length:>6} | {impl:<15} | {pass_name:<7} | {ms:9.3f} | {iqr:7.3f} |")
    return rows


_TABLE_HEAD = (f"| {'L':>6} | {'implementation':<30} | {'pass':<7} | {'median ms':>9} | {'IQR ms':>7} | "
               f"{'vs torch_stream':>15} | {'max rel err vs float64':>22} |\n"
               f"|{'-' * 8}|{'-' * 32}|{'-' * 9}|{'-' * 11}|{'-' * 9}|{'-' * 17}|{'-' * 24}|")


def _table_lines(rows: list[dict[str, object]], skip_float64: bool) -> list[str]:
    """One length's rows as lines of the printed table, each with its speed-up over torch_stream at that length."""
    stepped = {r["pass"]: r["median_ms"] for r in rows if r["implementation"] == "torch_stream (op)"}
    lines = []
    for r in rows:
        base = stepped.get(r["pass"])
        speedup = f"{base / r['median_ms']:.1f}x" if base else "n/a"
        err = "skipped" if skip_float64 else f"{r['max_rel_err_vs_float64']:.1e}"
        lines.append(f"| {r['length']:>6} | {r['implementation']:<30} | {r['pass']:<7} | {r['median_ms']:9.1f} | "
                     f"{r['iqr_ms']:7.1f} | {speedup:>15} | {err:>22} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = Parser(
        prog="python -m experiments.bench.scan",
        description="Time the CPU selective scans (cpp_loop, torch_stream, torch_loop, and mamba-ssm's "
        "selective_scan_ref with --mamba-src) over L, fp32: forward and forward+backward medians and IQRs, the "
        "speed-up over torch_stream, and the largest error of outputs and gradients against a float64 reference.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--mamba-src", type=Path, default=None,
                        help=f"unpacked mamba-ssm source folder (holds mamba_ssm/); get it with: {GET_SOURCE}")
    parser.add_argument("--num-threads", type=int_at_least(1, 4096), default=torch.get_num_threads(),
                        help="intra-op threads for every timing (Timer's own default would be one)")
    parser.add_argument("--batch", type=int_at_least(1), default=1)
    parser.add_argument("--channels", type=int_at_least(1), default=384,
                        help="scanned channels D (384: Vim-tiny's expand 2 x dim 192)")
    parser.add_argument("--lengths", "--length", type=int_at_least(1), nargs="+", default=list(DEFAULT_LENGTHS),
                        help="time steps L to time")
    parser.add_argument("--long", action="store_true",
                        help=f"also time L = {', '.join(map(str, LONG_LENGTHS))} (minutes: the stepped scans and "
                             "the float64 reference loop are slow there)")
    parser.add_argument("--d-state", type=int_at_least(1), default=16, help="state size N")
    parser.add_argument("--repeats", type=int_at_least(1), default=5,
                        help="timed blocks per case (median and IQR over these)")
    parser.add_argument("--block-seconds", type=positive_float, default=0.2, help="target length of one timed block")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--skip-float64", action="store_true", help="skip the float64 reference (slow at large L)")
    parser.add_argument("--no-gate", action="store_true",
                        help="scan without the z gate, as vmamba does (with --d-state 1 its problem); CPU only")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: time the GPU implementations over L = 1K..64K instead (see bench_cuda)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="input dtype with --device cuda")
    parser.add_argument("--csv", type=Path, default=None, metavar="FILE",
                        help="where the rows go, with provenance columns (default: "
                             "results/local/bench/scan_<device>_<dtype>.csv)")
    args = parser.parse_args(argv)
    if args.no_gate and args.device == "cuda":
        parser.error("--no-gate times the CPU scans; the CUDA bench runs Vim's gated scan (drop --no-gate)")
    dtype_name = args.dtype if args.device == "cuda" else "fp32"
    csv_path = args.csv or Path("results/local/bench") / f"scan_{args.device}_{dtype_name}.csv"
    if args.device == "cuda":
        repeats = 5
        cuda_rows = bench_cuda(dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32, seed=args.seed,
                               repeats=repeats)
        prov = provenance_columns(torch.device("cuda"), repeats)
        table = [{"length": length, "implementation": impl, "pass": pass_name, "median_ms": ms, "iqr_ms": iqr,
                  "dtype": dtype_name, **prov} for length, impl, pass_name, ms, iqr in cuda_rows]
        print(f"rows: {write_rows(csv_path, table)}")
        return

    torch.set_num_threads(args.num_threads)
    lengths = sorted(set(args.lengths) | (set(LONG_LENGTHS) if args.long else set()))
    scans: dict[str, Callable[..., torch.Tensor]] = {}
    cpp_problem = cpp_unavailable_reason(torch.device("cpu"), torch.float32)
    if cpp_problem is None:
        scans["cpp_loop (compiled)"] = lambda **kw: selective_scan(**kw, impl="cpp_loop")[0]
    else:
        print(f"cpp_loop not timed: {cpp_problem}\n")
    scans["torch_stream (op)"] = lambda **kw: selective_scan(**kw, impl="torch_stream")[0]
    scans["torch_loop (autograd)"] = selective_scan_loop
    ref_name = "mamba-ssm selective_scan_ref"
    if args.mamba_src is None:
        print(f"--mamba-src not given: timing our scans only. To compare, get the source with:\n  {GET_SOURCE}\n"
              "and pass --mamba-src /tmp/mamba_src/mamba_ssm-2.3.2.post1\n")
    else:
        try:
            scans[ref_name] = load_selective_scan_ref(args.mamba_src)
        except (FileNotFoundError, ImportError) as err:
            print(f"could not load selective_scan_ref from {args.mamba_src} ({err}); timing our scans only. "
                  f"Get the source with:\n  {GET_SOURCE}\n")

    prov = provenance_columns(torch.device("cpu"), args.repeats)
    print(f"selective scan, B={args.batch} D={args.channels} N={args.d_state}, L = {', '.join(map(str, lengths))}, "
          f"fp32, with D, {'no z' if args.no_gate else 'z'}, delta_bias, softplus; torch {torch.__version__}, "
          f"{args.num_threads} thread(s)")
    print(provenance_line(prov) + "\n")
    print(_TABLE_HEAD, flush=True)
    rows = []
    for length in lengths:
        first = len(rows)
        inputs = make_inputs(args.batch, args.channels, length, args.d_state, args.seed)
        if args.no_gate:
            del inputs["z"]
        dy = torch.randn(args.batch, args.channels, length, generator=torch.Generator().manual_seed(args.seed + 1))
        exact = None
        if not args.skip_float64:
            exact = forward_and_grads(selective_scan_reference, {k: v.double() if isinstance(v, torch.Tensor) else v
                                                                 for k, v in inputs.items()}, dy.double())
        for name, scan in scans.items():
            if name != "cpp_loop (compiled)" and length > STEPPED_MAX_LENGTH.get(name, length):
                continue  # the stepped and autograd loops take minutes (or gigabytes) there

            def forward(scan=scan) -> None:
                with torch.no_grad():
                    scan(**inputs)

            leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if isinstance(v, torch.Tensor)}

            def forward_backward(scan=scan, leaves=leaves) -> None:
                y = scan(**{**inputs, **leaves})
                torch.autograd.grad(y, list(leaves.values()), dy)

            times = {}
            for pass_name, fn in (("fwd", forward), ("fwd+bwd", forward_backward)):
                m = time_it(fn, args.num_threads, args.repeats, args.block_seconds)
                times[pass_name] = (m.median * 1e3, m.iqr * 1e3)
            error = float("nan")
            if exact is not None:
                res = forward_and_grads(scan, inputs, dy)
                error = max((res[k] - exact[k]).abs().max().item() / max(exact[k].abs().max().item(), 1e-30)
                            for k in exact)
            for pass_name, (ms, iqr) in times.items():
                rows.append({"length": length, "implementation": name, "pass": pass_name, "median_ms": ms,
                             "iqr_ms": iqr, "max_rel_err_vs_float64": error})
        # Each length is printed and saved as soon as it is done: --long's 16K with the float64 reference ran past
        # 20 minutes on 2 cores, and a run stopped there had shown and kept nothing.
        write_rows(csv_path, [{**row, "dtype": "fp32", "num_threads": args.num_threads, "channels": args.channels,
                               "d_state": args.d_state, "batch": args.batch, "z_gate": not args.no_gate, **prov}
                              for row in rows])
        for line in _table_lines(rows[first:], args.skip_float64):
            print(line, flush=True)

    print("\nmax rel err: the largest of max |a - ref| / max |ref| over y and the gradient of every input, against "
          "the float64 reference loop")
    print(f"median of per-case IQR/median: {statistics.median(r['iqr_ms'] / r['median_ms'] for r in rows):.2f} "
          "(CPU timings on shared machines are noisy; compare ratios within one run)")
    print(f"rows: {csv_path}")


if __name__ == "__main__":
    main()
