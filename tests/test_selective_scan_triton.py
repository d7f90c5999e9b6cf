"""The Triton selective scan on CPU through Triton's interpreter, against the float64 reference.

`TRITON_INTERPRET=1` only takes effect if it is set before triton is imported, and importing torch imports triton,
so the kernels run in one subprocess (this file run as a script) that measures every case and prints JSON; the
tests below read it. The pytest process itself is left as it is: a global `TRITON_INTERPRET` would also send the
GPU tests' kernels through the interpreter. Sizes are tiny (the interpreter takes milliseconds per time step and
program) but odd: L not a multiple of the chunk, D not a multiple of the channel block, N not a power of two.
"""
from __future__ import annotations

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
FP32_RTOL = 1e-4
# (batch, channels, length, d_state, chunk, block_d, with_D, with_z, with_bias, softplus); chunk 16 and block 8
# give 3 chunks (the last of 13 steps) and 2 channel blocks (the last of 2 channels).
KERNEL_CASES = {
    "all_options": (2, 10, 45, 5, 16, 8, True, True, True, True),
    "no_options": (2, 10, 45, 5, 16, 8, False, False, False, False),
    "D_bias_no_softplus": (1, 10, 45, 5, 16, 8, True, False, True, False),
    "z_softplus_no_bias": (1, 10, 45, 5, 16, 8, False, True, False, True),
    # 6 chunks of 8 (the last of 5) x 2 blocks x 2 sequences = 24 tiles: the persistent backward's 4 programs
    # take 6 tiles each, and the carries cross 5 chunk edges.
    "many_chunks": (2, 10, 45, 5, 8, 8, True, True, True, True),
}
# Through `selective_scan(impl="triton")` (the custom op and its autograd) with the default chunk and block; the
# bf16 case is long enough (L = 300, 7200 outputs) for an element-wise check to see a bad tail.
OP_SHAPES = {torch.float32: (1, 20, 70, 5), torch.bfloat16: (1, 24, 300, 16)}
# mamba-ssm's bf16 tolerances, element-wise as torch.testing.assert_close, the same as tests/test_gpu.py's.
BF16_RTOL, BF16_ATOL = 3e-2, 5e-2


def elementwise_excess(a: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> float:
    """max |a - ref| / (atol + rtol |ref|): at most 1 where torch.testing.assert_close(a, ref, rtol, atol) passes."""
    a, ref = a.double(), ref.double()
    return ((a - ref).abs() / (atol + rtol * ref.abs())).max().item()


def rel_norm_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref||, in float64."""
    return ((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _reference_grads(inputs: dict, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    """y and gradients of <y, dy> from the float64 reference, keyed as in GRAD_NAMES."""
    from mixers.selective_scan import selective_scan_reference

    leaves = {k: inputs[k].double().requires_grad_() for k in GRAD_NAMES if inputs[k] is not None}
    y = selective_scan_reference(**{**inputs, **leaves})
    grads = torch.autograd.grad(y, list(leaves.values()), dy.double())
    return {"y": y.detach(), **dict(zip(leaves, grads))}


def _errors(result: dict[str, torch.Tensor | None], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    assert set(k for k, v in result.items() if v is not None) == set(ref), "gradients present differ"
    return {k: rel_norm_err(result[k], ref[k]) for k in ref}


def interpreter_results() -> dict:
    """Runs every case under the interpreter (TRITON_INTERPRET=1 must be set already) and returns the errors."""
    from torch.utils.flop_counter import FlopCounterMode

    from mixers.selective_scan import selective_scan, selective_scan_flops
    from mixers.selective_scan_triton import INTERPRET, scan_bwd, scan_fwd

    assert INTERPRET, "run with TRITON_INTERPRET=1 in the environment"
    out: dict = {"kernel": {}}
    for name, (b, d, length, n, chunk, block_d, *options) in KERNEL_CASES.items():
        inputs = make_inputs(b, d, length, n, **dict(zip(("with_D", "with_z", "with_bias", "softplus"), options)))
        dy = torch.randn(b, d, length, generator=torch.Generator().manual_seed(1))
        y, ckpt = scan_fwd(**inputs, chunk_size=chunk, block_d=block_d)
        grads = scan_bwd(dy, ckpt, **inputs, chunk_size=chunk, block_d=block_d)
        out["kernel"][name] = _errors({"y": y, **dict(zip(GRAD_NAMES, grads))}, _reference_grads(inputs, dy))

    for dtype, (b, d, length, n) in OP_SHAPES.items():
        inputs = make_inputs(b, d, length, n, dtype=dtype)
        leaves = {k: inputs[k].clone().requires_grad_() for k in GRAD_NAMES}
        # Like with like: the reference gets the same dtype-rounded inputs and dy, upcast.
        dy = torch.randn(b, d, length, generator=torch.Generator().manual_seed(1)).to(dtype)
        with FlopCounterMode(display=False) as counter:
            y, impl = selective_scan(**{**inputs, **leaves}, impl="triton")
        grads = torch.autograd.grad(y, list(leaves.values()), dy)
        result = {"y": y, **dict(zip(leaves, grads))}
        ref = _reference_grads(inputs, dy)
        out[f"op_{str(dtype).split('.')[-1]}"] = {
            "impl": impl,
            "dtypes": [str(t.dtype) for t in (y, *grads)],
            "flops": counter.get_total_flops(),
            "expected_flops": selective_scan_flops(b, d, length, n),
            "errors": _errors(result, ref),
            "elementwise_excess": {
                k: elementwise_excess(result[k], r, BF16_RTOL,
                                      BF16_ATOL * (1.0 if k == "y" else max(1.0, r.abs().max().item() / 10)))
                for k, r in ref.items()
            },
        }

    # The Vim mixer hands the scan non-contiguous delta, B and C (transposed projections).
    from mixers import create_mixer

    pair = {impl: create_mixer("mamba", 16, 2, scan_impl=impl) for impl in ("triton", "torch_stream")}
    pair["triton"].load_state_dict(pair["torch_stream"].state_dict())
    x = torch.randn(2, 3 * 5, 16, generator=torch.Generator().manual_seed(2))
    outputs = {}
    for impl, mixer in pair.items():
        x_leaf = x.clone().requires_grad_()
        y = mixer(x_leaf, (3, 5))
        outputs[impl] = (y, *torch.autograd.grad(y.square().sum(), [x_leaf, mixer.A_log, mixer.dt_proj_b.bias]))
    out["mixer"] = {
        "impl": pair["triton"].impl,
        "errors": {k: rel_norm_err(a, b) for k, a, b in zip(("y", "dx", "dA_log", "ddt_bias_b"), *outputs.values())},
    }

    inputs = make_inputs(1, 3, 5, 3)
    args = tuple(inputs.values())
    grad_args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)
    for sample in (grad_args, (*args[:5], None, None, None, False)):
        torch.library.opcheck(torch.ops.mixerbench.selective_scan_triton.default, sample)
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
                            timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_kernels_match_reference_float32(interpreted: dict, case: str) -> None:
    """Forward and every gradient within 1e-4 norm-wise relative error, over chunk and channel-block edges."""
    errors = interpreted["kernel"][case]
    assert errors and max(errors.values()) <= FP32_RTOL, errors


def test_op_float32_matches_reference_and_counts_flops(interpreted: dict) -> None:
    result = interpreted["op_float32"]
    assert result["impl"] == "triton"
    assert set(result["errors"]) == {"y", *GRAD_NAMES}
    assert max(result["errors"].values()) <= FP32_RTOL, result["errors"]
    assert result["dtypes"] == ["torch.float32"] * 9
    assert result["flops"] == result["expected_flops"]


def test_op_bfloat16_accumulates_in_float32(interpreted: dict) -> None:
    """bf16 in and out (A, D, delta_bias too, as given) against the reference on the same bf16 values: errors are
    those of rounding the outputs, within 1e-2 norm-wise and mamba-ssm's rtol 3e-2 / atol 5e-2 element-wise (the
    criterion of tests/test_gpu.py), at L = 300."""
    result = interpreted["op_bfloat16"]
    assert result["dtypes"] == ["torch.bfloat16"] * 9
    assert max(result["errors"].values()) <= 1e-2, result["errors"]
    assert max(result["elementwise_excess"].values()) <= 1.0, result["elementwise_excess"]
    assert result["flops"] == result["expected_flops"]


def test_vim_mixer_runs_the_triton_scan(interpreted: dict) -> None:
    """The mamba mixer with scan_impl='triton' against torch_stream: output and gradients within 1e-4."""
    result = interpreted["mixer"]
    assert result["impl"] == "triton"
    assert max(result["errors"].values()) <= FP32_RTOL, result["errors"]


def test_opcheck(interpreted: dict) -> None:
    assert interpreted["opcheck"] == "passed"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="this process interprets triton")
def test_cpu_tensors_need_the_interpreter() -> None:
    from mixers.selective_scan import resolve_scan_impl, selective_scan

    assert resolve_scan_impl("auto", torch.device("cpu")) == "torch_stream"
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        selective_scan(**make_inputs(length=3), impl="triton")
    with pytest.raises(RuntimeError, match="float32/float16/bfloat16"):
        resolve_scan_impl("triton", torch.device("cuda"), torch.float64)


if __name__ == "__main__":
    print(json.dumps(interpreter_results()))
