"""The Triton selective scans on CPU through Triton's interpreter, against the float64 reference.

`TRITON_INTERPRET=1` only takes effect if it is set before triton is imported, and importing torch imports triton,
so the kernels run in one subprocess (this file run as a script) that measures every case and prints JSON; the
tests below read it. The pytest process itself is left as it is: a global `TRITON_INTERPRET` would also send the
GPU tests' kernels through the interpreter. The interpreter runs `tl.associative_scan` element by element in
Python, so sizes are tiny, but odd: L not a multiple of the chunk, D not a multiple of the channel block, N not a
power of two. The op-level cases shrink the default chunk (`DEFAULT_CHUNK`) in the subprocess for the same reason.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_selective_scan import make_inputs

REPO = Path(__file__).resolve().parents[1]
GRAD_NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
OPTION_NAMES = ("with_D", "with_z", "with_bias", "softplus")
FP32_RTOL = 1e-4
# mamba-ssm's bf16 tolerances, element-wise as torch.testing.assert_close, the same as tests/test_gpu.py's.
BF16_RTOL, BF16_ATOL = 3e-2, 5e-2


def _option_cases() -> dict[str, tuple]:
    """Every combination of (D, z, delta_bias, softplus), each in one direction chosen so that every option value
    meets both directions (the direction is the parity of the options on), and all options in both directions.

    Each case: (batch, channels, length, d_state, chunk, block_d, splits, reverse, dtype, options). Chunk 4 and
    block 2 give 3 chunks (the last of 3 steps) and 2 channel blocks (the last of 1 channel).
    """
    cases = {}
    for options in itertools.product([False, True], repeat=4):
        reverse = sum(options) % 2 == 1
        name = "_".join(n for n, on in zip(("D", "z", "bias", "softplus"), options) if on) or "no_options"
        cases[f"{name}_{'reverse' if reverse else 'forward'}"] = (1, 3, 11, 3, 4, 2, 1, reverse, "float32", options)
    cases["D_z_bias_softplus_reverse"] = (1, 3, 11, 3, 4, 2, 1, True, "float32", (True,) * 4)
    return cases


KERNEL_CASES = {
    **_option_cases(),
    # L split into 3 groups of 2 chunks (the last group of 1): the carry pass joins them, forward and backward.
    "split_forward": (2, 3, 19, 3, 4, 2, 3, False, "float32", (True,) * 4),
    "split_reverse": (2, 3, 19, 3, 4, 2, 3, True, "float32", (True,) * 4),
    # vmamba's default d_state = 1: a state block one wide (issue 34 item 7).
    "d_state_1_forward": (2, 3, 19, 1, 4, 2, 3, False, "float32", (True,) * 4),
    "d_state_1_reverse": (1, 5, 11, 1, 4, 2, 1, True, "float32", (True,) * 4),
}
# Low precision in, float32 inside: against the reference on the same rounded values, at mamba-ssm's bf16
# tolerances element-wise (fp16 rounds finer than bf16, so the same bound holds).
HALF_CASES = {
    "float16_reverse": (1, 3, 11, 3, 4, 2, 1, True, "float16", (True,) * 4),
    "bfloat16_forward": (1, 3, 11, 3, 4, 2, 2, False, "bfloat16", (True,) * 4),
}
# Through `selective_scan(impl=...)` (the custom op and its autograd) with the default tiling at a shrunken chunk.
OP_CHUNK = 16
OP_CASES = {
    "triton_float32_forward": ("triton", torch.float32, False, (1, 10, 37, 5)),
    "triton_float32_reverse": ("triton", torch.float32, True, (1, 10, 37, 5)),
    "triton_bfloat16_reverse": ("triton", torch.bfloat16, True, (1, 9, 70, 4)),
    "triton_float32_d_state_1": ("triton", torch.float32, True, (1, 10, 37, 1)),
}


def elementwise_excess(a: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> float:
    """max |a - ref| / (atol + rtol |ref|): at most 1 where torch.testing.assert_close(a, ref, rtol, atol) passes."""
    a, ref = a.double(), ref.double()
    return ((a - ref).abs() / (atol + rtol * ref.abs())).max().item()


def rel_norm_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref||, in float64."""
    return ((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _reference_grads(inputs: dict, dy: torch.Tensor, reverse: bool = False) -> dict[str, torch.Tensor]:
    """y and gradients of <y, dy> from the float64 reference, keyed as in GRAD_NAMES."""
    from mixers.ops.selective_scan import selective_scan_reference

    leaves = {k: inputs[k].double().requires_grad_() for k in GRAD_NAMES if inputs[k] is not None}
    y = selective_scan_reference(**{**inputs, **leaves}, reverse=reverse)
    grads = torch.autograd.grad(y, list(leaves.values()), dy.double())
    return {"y": y.detach(), **dict(zip(leaves, grads))}


def _errors(result: dict[str, torch.Tensor | None], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    assert set(k for k, v in result.items() if v is not None) == set(ref), "gradients present differ"
    return {k: rel_norm_err(result[k], ref[k]) for k in ref}


def _excess(result: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """Element-wise excess over mamba-ssm's bf16 tolerances; a gradient's atol scales with its largest entry."""
    return {k: elementwise_excess(result[k], r, BF16_RTOL,
                                  BF16_ATOL * (1.0 if k == "y" else max(1.0, r.abs().max().item() / 10)))
            for k, r in ref.items()}


def _kernel_case(case: tuple) -> dict:
    from mixers.ops.selective_scan.triton_scan import scan_bwd, scan_fwd

    b, d, length, n, chunk, block_d, splits, reverse, dtype, options = case
    inputs = make_inputs(b, d, length, n, dtype=getattr(torch, dtype), **dict(zip(OPTION_NAMES, options)))
    dy = torch.randn(b, d, length, generator=torch.Generator().manual_seed(1)).to(inputs["u"].dtype)
    tiling = dict(chunk_size=chunk, block_d=block_d, splits=splits)
    y, ckpt = scan_fwd(**inputs, reverse=reverse, **tiling)
    grads = scan_bwd(dy, ckpt, **inputs, reverse=reverse, **tiling)
    result = {"y": y, **dict(zip(GRAD_NAMES, grads))}
    ref = _reference_grads(inputs, dy, reverse)
    return {"errors": _errors(result, ref), "excess": _excess(result, ref),
            "dtypes": sorted({str(t.dtype) for t in result.values() if t is not None})}


def _op_case(impl: str, dtype: torch.dtype, reverse: bool, shape: tuple) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from mixers.ops.selective_scan import selective_scan, selective_scan_flops

    b, d, length, n = shape
    inputs = make_inputs(b, d, length, n, dtype=dtype)
    leaves = {k: inputs[k].clone().requires_grad_() for k in GRAD_NAMES}
    # Like with like: the reference gets the same dtype-rounded inputs and dy, upcast.
    dy = torch.randn(b, d, length, generator=torch.Generator().manual_seed(1)).to(dtype)
    with FlopCounterMode(display=False) as counter:
        y, ran = selective_scan(**{**inputs, **leaves}, impl=impl, reverse=reverse)
    grads = torch.autograd.grad(y, list(leaves.values()), dy)
    result = {"y": y, **dict(zip(leaves, grads))}
    ref = _reference_grads(inputs, dy, reverse)
    return {
        "impl": ran,
        "dtypes": [str(t.dtype) for t in (y, *grads)],
        "flops": counter.get_total_flops(),
        "expected_flops": selective_scan_flops(b, d, length, n),
        "errors": _errors(result, ref),
        "excess": _excess(result, ref),
    }


def _mixer_results() -> dict:
    """The mamba mixer's native reverse (`triton`) against Vim's flip formulation: one backward direction alone,
    and the whole mixer against `torch_stream` (which flips); outputs and gradients."""
    from mixers import create_mixer

    pair = {impl: create_mixer("mamba", 16, 2, d_state=3, scan_impl=impl) for impl in ("triton", "torch_stream")}
    pair["triton"].load_state_dict(pair["torch_stream"].state_dict())
    mixer = pair["triton"]
    out: dict = {}

    # One direction: _direction(reverse=True) on x, z against _direction on flipped x, z, flipped back.
    g = torch.Generator().manual_seed(3)
    x, z = torch.randn(2, 2, 13, mixer.d_inner, generator=g).unbind(0)  # (B, L, d_inner) each, time-major
    backward = (mixer.conv1d_b, mixer.x_proj_b, mixer.dt_proj_b, mixer.A_b_log, mixer.D_b)
    results = []
    for native in (True, False):
        x_leaf, z_leaf = x.clone().requires_grad_(), z.clone().requires_grad_()
        if native:
            y = mixer._direction(x_leaf, z_leaf, *backward, reverse=True)
        else:
            y = mixer._direction(x_leaf.flip(1), z_leaf.flip(1), *backward).flip(-1)  # y is (B, d_inner, L)
        params = [x_leaf, z_leaf, mixer.conv1d_b.weight, mixer.A_b_log, mixer.dt_proj_b.bias]
        results.append((y, *torch.autograd.grad(y.square().sum(), params)))
    names = ("y", "dx", "dz", "dconv_b", "dA_b_log", "ddt_bias_b")
    out["direction"] = {k: rel_norm_err(a, b) for k, a, b in zip(names, *results)}

    # The whole mixer; it also hands the scan non-contiguous delta, B and C (transposed projections).
    tokens = torch.randn(2, 3 * 5, 16, generator=torch.Generator().manual_seed(2))
    outputs = {}
    for impl, m in pair.items():
        x_leaf = tokens.clone().requires_grad_()
        y = m(x_leaf, (3, 5))
        outputs[impl] = (y, *torch.autograd.grad(y.square().sum(), [x_leaf, m.A_log, m.dt_proj_b.bias]))
    out["impl"] = mixer.impl
    out["mixer"] = {k: rel_norm_err(a, b) for k, a, b in zip(("y", "dx", "dA_log", "ddt_bias_b"), *outputs.values())}
    return out


def _vmamba_results() -> dict:
    """vmamba at its default d_state = 1 with scan_impl='triton' against 'torch_stream' (same weights): output and
    the input's and A's gradients, on a grid whose four scans have 15 steps."""
    from mixers import create_mixer

    pair = {impl: create_mixer("vmamba", 16, 2, scan_impl=impl) for impl in ("triton", "torch_stream")}
    pair["triton"].load_state_dict(pair["torch_stream"].state_dict())
    tokens = torch.randn(2, 3 * 5, 16, generator=torch.Generator().manual_seed(4))
    outputs = {}
    for impl, m in pair.items():
        x_leaf = tokens.clone().requires_grad_()
        y = m(x_leaf, (3, 5))
        outputs[impl] = (y, *torch.autograd.grad(y.square().sum(), [x_leaf, m.A_logs, m.dt_projs_bias]))
    return {"impl": pair["triton"].impl, "d_state": pair["triton"].d_state,
            "errors": {k: rel_norm_err(a, b) for k, a, b in zip(("y", "dx", "dA_logs", "ddt_bias"),
                                                                  *outputs.values())}}


def interpreter_results() -> dict:
    """Runs every case under the interpreter (TRITON_INTERPRET=1 must be set already) and returns the errors."""
    from mixers.ops.selective_scan import triton_scan

    assert triton_scan.INTERPRET, "run with TRITON_INTERPRET=1 in the environment"
    out: dict = {
        "kernel": {name: _kernel_case(case) for name, case in {**KERNEL_CASES, **HALF_CASES}.items()},
    }
    triton_scan.DEFAULT_CHUNK = OP_CHUNK  # the fake reads the same constant, so they stay in step
    out["op"] = {name: _op_case(*case) for name, case in OP_CASES.items()}
    out.update(_mixer_results())
    out["vmamba"] = _vmamba_results()

    inputs = make_inputs(1, 3, 5, 3)
    args = tuple(inputs.values())
    grad_args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)
    for sample in (grad_args, (*args[:5], None, None, None, False)):
        torch.library.opcheck(torch.ops.mixerbench.selective_scan_triton.default, sample)
    torch.library.opcheck(torch.ops.mixerbench.selective_scan_triton.default, (*grad_args, True))
    out["opcheck"] = "passed"
    return out


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """The errors measured by `interpreter_results` in a subprocess with TRITON_INTERPRET=1."""
    pytest.importorskip("triton", reason="triton does not import here")
    # The subprocess imports `mixers` from this checkout, as the pytest process does.
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": python_path}
    result = subprocess.run([sys.executable, __file__], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_kernels_match_reference_float32(interpreted: dict, case: str) -> None:
    """Forward and every gradient within 1e-4 norm-wise relative error, over chunk, channel-block and split edges,
    for every option combination and both directions."""
    errors = interpreted["kernel"][case]["errors"]
    present = {"y", "u", "delta", "A", "B", "C"} | {
        name for name, on in zip(("D", "z", "delta_bias"), KERNEL_CASES[case][-1][:3]) if on}
    assert set(errors) == present
    assert max(errors.values()) <= FP32_RTOL, errors
    assert interpreted["kernel"][case]["dtypes"] == ["torch.float32"]


@pytest.mark.parametrize("case", list(HALF_CASES))
def test_kernels_take_half_precision_inputs(interpreted: dict, case: str) -> None:
    """fp16/bf16 in and out (every gradient in its input's dtype), float32 inside: within mamba-ssm's bf16
    tolerances element-wise and 1e-2 norm-wise of the reference on the same rounded values."""
    result = interpreted["kernel"][case]
    assert result["dtypes"] == [f"torch.{HALF_CASES[case][-2]}"]
    assert max(result["errors"].values()) <= 1e-2, result["errors"]
    assert max(result["excess"].values()) <= 1.0, result["excess"]


@pytest.mark.parametrize("case", [c for c in OP_CASES if OP_CASES[c][1] == torch.float32])
def test_op_float32_matches_reference_and_counts_flops(interpreted: dict, case: str) -> None:
    """Through `selective_scan` (the custom op and its autograd)."""
    result = interpreted["op"][case]
    assert result["impl"] == OP_CASES[case][0]
    assert set(result["errors"]) == {"y", *GRAD_NAMES}
    assert max(result["errors"].values()) <= FP32_RTOL, result["errors"]
    assert result["dtypes"] == ["torch.float32"] * 9
    assert result["flops"] == result["expected_flops"]


def test_op_bfloat16_accumulates_in_float32(interpreted: dict) -> None:
    """bf16 in and out (A, D, delta_bias too, as given), reversed, against the reference on the same bf16 values:
    within 1e-2 norm-wise and mamba-ssm's rtol 3e-2 / atol 5e-2 element-wise (tests/test_gpu.py's criterion)."""
    result = interpreted["op"]["triton_bfloat16_reverse"]
    assert result["dtypes"] == ["torch.bfloat16"] * 9
    assert max(result["errors"].values()) <= 1e-2, result["errors"]
    assert max(result["excess"].values()) <= 1.0, result["excess"]
    assert result["flops"] == result["expected_flops"]


def test_native_reverse_equals_vim_flip_formulation(interpreted: dict) -> None:
    """The mixer's backward direction read backwards by the kernel (anti-causal conv, reverse scan) equals Vim's
    flip, scan, flip back: output and the gradients of x, z, the conv, A and the dt bias within 1e-4."""
    errors = interpreted["direction"]
    assert max(errors.values()) <= FP32_RTOL, errors


def test_vim_mixer_runs_the_triton_scan(interpreted: dict) -> None:
    """The mamba mixer with scan_impl='triton' (native reverse) against torch_stream (flips): within 1e-4."""
    assert interpreted["impl"] == "triton"
    errors = interpreted["mixer"]
    assert max(errors.values()) <= FP32_RTOL, errors


def test_vmamba_default_d_state_1_runs_the_triton_scan(interpreted: dict) -> None:
    """vmamba's default d_state = 1 through the Triton scan (a one-wide state block) matches torch_stream within
    1e-4, output and gradients (issue 34 item 7)."""
    result = interpreted["vmamba"]
    assert result["impl"] == "triton" and result["d_state"] == 1
    assert max(result["errors"].values()) <= FP32_RTOL, result["errors"]


def test_opcheck(interpreted: dict) -> None:
    assert interpreted["opcheck"] == "passed"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="this process interprets triton")
def test_cpu_tensors_need_the_interpreter() -> None:
    impl = "triton"
    from mixers.ops.selective_scan import resolve_scan_impl, selective_scan

    assert resolve_scan_impl("auto", torch.device("cpu")) in ("cpp_loop", "torch_stream")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        selective_scan(**make_inputs(length=3), impl=impl)
    with pytest.raises(RuntimeError, match="float32/float16/bfloat16"):
        resolve_scan_impl(impl, torch.device("cuda"), torch.float64)


def test_tiling_rejects_non_powers_of_two() -> None:
    pytest.importorskip("triton", reason="triton does not import here")
    from mixers.ops.selective_scan.triton_scan import Tiling

    with pytest.raises(ValueError, match="chunk_size must be a power of two"):
        Tiling(1, 8, 100, chunk_size=48)
    tiling = Tiling(1, 384, 65536)  # B x D / BLOCK_D programs alone are too few: L is split too
    assert tiling.splits > 1 and tiling.splits * tiling.chunks_per_split >= tiling.n_chunks


BF16_ARGS = ("u", "delta", "B", "C", "z", "y", "dout", "du", "ddelta", "dz")


@pytest.mark.slow
@pytest.mark.parametrize("local,carry,reverse", [(False, False, False), (False, True, True), (True, False, True)])
def test_kernels_compile_for_sm90(local: bool, carry: bool, reverse: bool) -> None:
    """The kernels compile to an sm_90 cubin with Triton's bundled toolchain, no GPU needed: the interpreter runs
    kernels that the compiler may still reject (types, loops, layouts)."""
    triton = pytest.importorskip("triton", reason="triton does not import here")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mixers.ops.selective_scan import triton_scan as kernels

    options = dict(HAS_D=True, HAS_Z=True, HAS_BIAS=True, SOFTPLUS=True, BLOCK_N=16, CHUNK=kernels.DEFAULT_CHUNK,
                   LOCAL=local, HAS_CARRY=carry, REVERSE=reverse)
    passes = ((kernels._scan_fwd_kernel, kernels.FWD_BLOCK_D, kernels.FWD_NUM_WARPS),
              (kernels._scan_bwd_kernel, kernels.BWD_BLOCK_D, kernels.BWD_NUM_WARPS))
    for fn, block_d, num_warps in passes:
        constexprs = {**options, "BLOCK_D": block_d}
        # bf16 activations and their gradients, float32 parameters and buffers, as a bf16 Mamba layer passes them.
        signature = {name: "constexpr" if name in constexprs else "i32" if not name.endswith("_ptr")
                     else "*bf16" if name[:-4] in BF16_ARGS else "*fp32" for name in fn.arg_names}
        compiled = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": num_warps})
        assert compiled.asm["cubin"], fn.__name__


if __name__ == "__main__":
    print(json.dumps(interpreter_results()))
