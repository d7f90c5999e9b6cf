"""The selective scan of Mamba (S6) as Triton kernels (`triton`): forward, and a backward that recomputes states.

Same semantics and shapes as `mixers.selective_scan` (mamba-ssm's `selective_scan_fn` with one group of variable
B and C). Each program owns one sequence and a block of `BLOCK_D` channels, holds their `(BLOCK_D, N)` state in
float32 registers and walks time step by step, so the scan is sequential in L and parallel over B x D / BLOCK_D:

- forward: per step it loads u, delta, z for the block and the B_t, C_t vectors, applies delta_bias, softplus,
  the D skip and the silu(z) gate in the kernel, writes y in `u.dtype`, and stores the state before every chunk
  of `CHUNK` steps in a small `(B, D, L / CHUNK, N)` float32 buffer.
- backward: walks the chunks in reverse. For each chunk it re-runs the forward from the stored chunk-start state
  into a chunk-local scratch `(B, D, CHUNK + 1, N)` (running the recurrence backwards through 1 / exp(delta A)
  is unstable), then steps back through the chunk with g_t = dL/dh_t = C_t dy_t + exp(delta_{t+1} A) g_{t+1}.
  Per-channel gradients (u, delta, z) are written directly; dA, dD, d delta_bias are accumulated in registers
  over time and written per sequence; dB, dC are summed over the block's channels and written per channel
  block; the batch and channel-block partials are summed afterwards in torch, so results are deterministic.

Triton is imported guarded: where it is missing (CPU-only torch builds), `import mixers` still works and the
`triton` implementation reports that it is unavailable. On CPU tensors the kernels run only under Triton's
interpreter (`TRITON_INTERPRET=1` set before triton is first imported), which is how the tests check them.
Only long-standing `tl` APIs are used (tested on Triton 3.8; written for 3.6 as well).
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch builds ship without triton
    triton = None
    tl = None

# Triton decides at decoration time whether a kernel is compiled or interpreted; record what it decided.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")
DEFAULT_CHUNK = 64
DEFAULT_BLOCK_D = 16
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def triton_available() -> bool:
    """Whether triton imported in this process."""
    return triton is not None


def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Triton scan cannot run on tensors of `device` and `dtype`, or None when it can."""
    if triton is None:
        return "triton does not import here (CPU-only torch builds ship without it)"
    if dtype not in SUPPORTED_DTYPES:
        return f"the Triton scan takes float32/float16/bfloat16 inputs, got {dtype}"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and INTERPRET:
        return None
    if device.type == "cpu":
        return ("CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 in the environment before the "
                "process imports torch or triton")
    return f"the Triton scan runs on CUDA tensors (or CPU under TRITON_INTERPRET=1), got {device}"


if triton is not None:

    @triton.jit
    def _softplus(x):
        """log(1 + exp(x)) without losing exp(x) << 1 to rounding (no log1p in long-standing tl)."""
        e = tl.exp(tl.minimum(x, 20.0))
        one_plus = 1.0 + e
        # log1p(e) = log(1 + e) * e / ((1 + e) - 1): exact in the rounding of 1 + e (Goldberg's trick).
        denom = tl.where(one_plus == 1.0, 1.0, one_plus - 1.0)
        log1p = tl.where(one_plus == 1.0, e, tl.log(one_plus) * (e / denom))
        return tl.where(x <= 20.0, log1p, x)

    @triton.jit
    def _scan_fwd_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, y_ptr, ckpt_ptr,
        dim, length, dstate, n_chunks,
        s_u_b, s_u_d, s_u_l,
        s_dt_b, s_dt_d, s_dt_l,
        s_A_d, s_A_n,
        s_B_b, s_B_n, s_B_l,
        s_C_b, s_C_n, s_C_l,
        s_z_b, s_z_d, s_z_l,
        s_y_b, s_y_d, s_y_l,
        s_ck_b, s_ck_d, s_ck_c, s_ck_n,
        HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
    ):
        pid_b = tl.program_id(0)
        pid_d = tl.program_id(1)
        offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        mask_d = offs_d < dim
        mask_n = offs_n < dstate
        mask_dn = mask_d[:, None] & mask_n[None, :]

        A = tl.load(A_ptr + offs_d[:, None] * s_A_d + offs_n[None, :] * s_A_n, mask=mask_dn, other=0.0).to(tl.float32)
        if HAS_D:
            Dv = tl.load(D_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)

        u_ptrs = u_ptr + pid_b * s_u_b + offs_d * s_u_d
        dt_ptrs = delta_ptr + pid_b * s_dt_b + offs_d * s_dt_d
        z_ptrs = z_ptr + pid_b * s_z_b + offs_d * s_z_d
        y_ptrs = y_ptr + pid_b * s_y_b + offs_d * s_y_d
        B_ptrs = B_ptr + pid_b * s_B_b + offs_n * s_B_n
        C_ptrs = C_ptr + pid_b * s_C_b + offs_n * s_C_n
        ck_ptrs = ckpt_ptr + pid_b * s_ck_b + offs_d[:, None] * s_ck_d + offs_n[None, :] * s_ck_n

        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        for c in range(0, n_chunks):
            tl.store(ck_ptrs + c * s_ck_c, h, mask=mask_dn)
            start = c * CHUNK
            steps = tl.minimum(CHUNK, length - start)
            for i in range(0, steps):
                t = start + i
                u = tl.load(u_ptrs + t * s_u_l, mask=mask_d, other=0.0).to(tl.float32)
                dt = tl.load(dt_ptrs + t * s_dt_l, mask=mask_d, other=0.0).to(tl.float32)
                if HAS_BIAS:
                    dt = dt + bias
                if SOFTPLUS:
                    dt = _softplus(dt)
                Bt = tl.load(B_ptrs + t * s_B_l, mask=mask_n, other=0.0).to(tl.float32)
                Ct = tl.load(C_ptrs + t * s_C_l, mask=mask_n, other=0.0).to(tl.float32)
                h = tl.exp(dt[:, None] * A) * h + (dt * u)[:, None] * Bt[None, :]
                y = tl.sum(h * Ct[None, :], axis=1)
                if HAS_D:
                    y = y + Dv * u
                if HAS_Z:
                    z = tl.load(z_ptrs + t * s_z_l, mask=mask_d, other=0.0).to(tl.float32)
                    y = y * (z * tl.sigmoid(z))
                tl.store(y_ptrs + t * s_y_l, y.to(y_ptr.dtype.element_ty), mask=mask_d)

    @triton.jit
    def _scan_bwd_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, dout_ptr, ckpt_ptr, scratch_ptr,
        du_ptr, ddelta_ptr, dz_ptr, dA_ptr, dD_ptr, dbias_ptr, dB_ptr, dC_ptr,
        dim, length, dstate, n_chunks,
        s_u_b, s_u_d, s_u_l,
        s_dt_b, s_dt_d, s_dt_l,
        s_A_d, s_A_n,
        s_B_b, s_B_n, s_B_l,
        s_C_b, s_C_n, s_C_l,
        s_z_b, s_z_d, s_z_l,
        s_do_b, s_do_d, s_do_l,
        s_ck_b, s_ck_d, s_ck_c, s_ck_n,
        s_sc_b, s_sc_d, s_sc_t, s_sc_n,
        s_g_b, s_g_d, s_g_l,
        s_dA_b, s_dA_d, s_dA_n,
        s_dv_b, s_dv_d,
        s_dBC_b, s_dBC_k, s_dBC_l, s_dBC_n,
        HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
    ):
        pid_b = tl.program_id(0)
        pid_d = tl.program_id(1)
        offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        mask_d = offs_d < dim
        mask_n = offs_n < dstate
        mask_dn = mask_d[:, None] & mask_n[None, :]

        A = tl.load(A_ptr + offs_d[:, None] * s_A_d + offs_n[None, :] * s_A_n, mask=mask_dn, other=0.0).to(tl.float32)
        if HAS_D:
            Dv = tl.load(D_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)

        u_ptrs = u_ptr + pid_b * s_u_b + offs_d * s_u_d
        dt_ptrs = delta_ptr + pid_b * s_dt_b + offs_d * s_dt_d
        z_ptrs = z_ptr + pid_b * s_z_b + offs_d * s_z_d
        do_ptrs = dout_ptr + pid_b * s_do_b + offs_d * s_do_d
        B_ptrs = B_ptr + pid_b * s_B_b + offs_n * s_B_n
        C_ptrs = C_ptr + pid_b * s_C_b + offs_n * s_C_n
        ck_ptrs = ckpt_ptr + pid_b * s_ck_b + offs_d[:, None] * s_ck_d + offs_n[None, :] * s_ck_n
        sc_ptrs = scratch_ptr + pid_b * s_sc_b + offs_d[:, None] * s_sc_d + offs_n[None, :] * s_sc_n
        # du, ddelta, dz share one stride set: they are allocated contiguous (B, D, L) alike.
        g_off = pid_b * s_g_b + offs_d * s_g_d
        dBC_off = pid_b * s_dBC_b + pid_d * s_dBC_k + offs_n * s_dBC_n

        dA_acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        dD_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
        dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
        carry = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)  # exp(delta_{t+1} A) g_{t+1}
        for k in range(0, n_chunks):
            c = n_chunks - 1 - k
            start = c * CHUNK
            steps = tl.minimum(CHUNK, length - start)
            # Re-run the chunk forward from its stored start state; scratch slot j holds h_{start + j - 1}.
            h = tl.load(ck_ptrs + c * s_ck_c, mask=mask_dn, other=0.0)
            tl.store(sc_ptrs, h, mask=mask_dn)
            for i in range(0, steps):
                t = start + i
                u = tl.load(u_ptrs + t * s_u_l, mask=mask_d, other=0.0).to(tl.float32)
                dt = tl.load(dt_ptrs + t * s_dt_l, mask=mask_d, other=0.0).to(tl.float32)
                if HAS_BIAS:
                    dt = dt + bias
                if SOFTPLUS:
                    dt = _softplus(dt)
                Bt = tl.load(B_ptrs + t * s_B_l, mask=mask_n, other=0.0).to(tl.float32)
                h = tl.exp(dt[:, None] * A) * h + (dt * u)[:, None] * Bt[None, :]
                tl.store(sc_ptrs + (i + 1) * s_sc_t, h, mask=mask_dn)
            tl.debug_barrier()
            # h is h_t on entry to each reverse step.
            for j in range(0, steps):
                i = steps - 1 - j
                t = start + i
                h_prev = tl.load(sc_ptrs + i * s_sc_t, mask=mask_dn, other=0.0)
                u = tl.load(u_ptrs + t * s_u_l, mask=mask_d, other=0.0).to(tl.float32)
                dt_pre = tl.load(dt_ptrs + t * s_dt_l, mask=mask_d, other=0.0).to(tl.float32)
                if HAS_BIAS:
                    dt_pre = dt_pre + bias
                if SOFTPLUS:
                    dt = _softplus(dt_pre)
                else:
                    dt = dt_pre
                Bt = tl.load(B_ptrs + t * s_B_l, mask=mask_n, other=0.0).to(tl.float32)
                Ct = tl.load(C_ptrs + t * s_C_l, mask=mask_n, other=0.0).to(tl.float32)
                dy = tl.load(do_ptrs + t * s_do_l, mask=mask_d, other=0.0).to(tl.float32)
                if HAS_Z:
                    z = tl.load(z_ptrs + t * s_z_l, mask=mask_d, other=0.0).to(tl.float32)
                    sig = tl.sigmoid(z)
                    y_pre = tl.sum(h * Ct[None, :], axis=1)
                    if HAS_D:
                        y_pre = y_pre + Dv * u
                    dz = dy * y_pre * sig * (1.0 + z * (1.0 - sig))
                    tl.store(dz_ptr + g_off + t * s_g_l, dz.to(dz_ptr.dtype.element_ty), mask=mask_d)
                    dy = dy * z * sig
                # dC_t[n] = sum_d dy_t[d] h_t[d, n] over this block's channels
                dC_part = tl.sum(dy[:, None] * h, axis=0)
                tl.store(dC_ptr + dBC_off + t * s_dBC_l, dC_part, mask=mask_n)
                g = dy[:, None] * Ct[None, :] + carry
                dB_part = tl.sum(g * (dt * u)[:, None], axis=0)
                tl.store(dB_ptr + dBC_off + t * s_dBC_l, dB_part, mask=mask_n)
                gB = tl.sum(g * Bt[None, :], axis=1)
                du = gB * dt
                if HAS_D:
                    du = du + Dv * dy
                    dD_acc += dy * u
                tl.store(du_ptr + g_off + t * s_g_l, du.to(du_ptr.dtype.element_ty), mask=mask_d)
                decay = tl.exp(dt[:, None] * A)
                w = g * h_prev * decay  # d loss / d (delta_t A)
                ddt = gB * u + tl.sum(w * A, axis=1)
                dA_acc += w * dt[:, None]
                if SOFTPLUS:
                    ddt = ddt * tl.sigmoid(dt_pre)
                dbias_acc += ddt
                tl.store(ddelta_ptr + g_off + t * s_g_l, ddt.to(ddelta_ptr.dtype.element_ty), mask=mask_d)
                carry = g * decay
                h = h_prev
            tl.debug_barrier()  # the next chunk's recompute overwrites the scratch

        tl.store(dA_ptr + pid_b * s_dA_b + offs_d[:, None] * s_dA_d + offs_n[None, :] * s_dA_n, dA_acc, mask=mask_dn)
        if HAS_D:
            tl.store(dD_ptr + pid_b * s_dv_b + offs_d * s_dv_d, dD_acc, mask=mask_d)
        if HAS_BIAS:
            tl.store(dbias_ptr + pid_b * s_dv_b + offs_d * s_dv_d, dbias_acc, mask=mask_d)


def _check_runs(u: Tensor) -> None:
    reason = triton_unavailable_reason(u.device, u.dtype)
    if reason is not None:
        raise RuntimeError(f"scan impl 'triton' cannot run: {reason}")


def _meta(dim: int, dstate: int, chunk_size: int | None, block_d: int | None) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_N, CHUNK): powers of two for the register tiles, CHUNK steps between stored states."""
    block_d = block_d or min(DEFAULT_BLOCK_D, triton.next_power_of_2(dim))
    return block_d, triton.next_power_of_2(dstate), chunk_size or DEFAULT_CHUNK


def _num_chunks(length: int, chunk_size: int | None) -> int:
    return max(1, -(-length // (chunk_size or DEFAULT_CHUNK)))


def scan_fwd(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    *,
    chunk_size: int | None = None,
    block_d: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Launches the forward kernel. Arguments as `selective_scan_reference`.

    Args:
        chunk_size: steps between stored states (default 64).
        block_d: channels per program, a power of two (default up to 16).

    Returns:
        y (B, D, L) in `u.dtype`, and the float32 state before each chunk, (B, D, ceil(L / chunk), N).
    """
    _check_runs(u)
    batch, dim, length = u.shape
    dstate = A.shape[1]
    BLOCK_D, BLOCK_N, CHUNK = _meta(dim, dstate, chunk_size, block_d)
    y = torch.empty(batch, dim, length, device=u.device, dtype=u.dtype)  # (B, D, L)
    ckpt = torch.empty(batch, dim, _num_chunks(length, CHUNK), dstate, device=u.device, dtype=torch.float32)
    z_ = z if z is not None else u
    grid = (batch, triton.cdiv(dim, BLOCK_D))
    _scan_fwd_kernel[grid](
        u, delta, A, B, C, D if D is not None else u, z_, delta_bias if delta_bias is not None else u, y, ckpt,
        dim, length, dstate, ckpt.shape[2],
        *u.stride(), *delta.stride(), *A.stride(), *B.stride(), *C.stride(), *z_.stride(), *y.stride(),
        *ckpt.stride(),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus),
        BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, CHUNK=CHUNK,
    )
    return y, ckpt


def scan_bwd(
    dout: Tensor,
    ckpt: Tensor,
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    *,
    chunk_size: int | None = None,
    block_d: int | None = None,
) -> tuple[Tensor | None, ...]:
    """Launches the backward kernel and sums its partials; `ckpt` is `scan_fwd`'s second output, made with the
    same `chunk_size`.

    Returns:
        (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) in the dtypes of their inputs, None where the input was None.
    """
    _check_runs(u)
    batch, dim, length = u.shape
    dstate = A.shape[1]
    BLOCK_D, BLOCK_N, CHUNK = _meta(dim, dstate, chunk_size, block_d)
    blocks = triton.cdiv(dim, BLOCK_D)
    dev, f32 = u.device, torch.float32
    du = torch.empty(batch, dim, length, device=dev, dtype=u.dtype)  # (B, D, L)
    ddelta = torch.empty(batch, dim, length, device=dev, dtype=delta.dtype)  # (B, D, L)
    dz = torch.empty(batch, dim, length, device=dev, dtype=z.dtype) if z is not None else du  # (B, D, L)
    scratch = torch.empty(batch, dim, CHUNK + 1, dstate, device=dev, dtype=f32)  # (B, D, T + 1, N)
    dA_part = torch.empty(batch, dim, dstate, device=dev, dtype=f32)  # (B, D, N)
    dvec_part = torch.empty(2, batch, dim, device=dev, dtype=f32)  # dD and d delta_bias per sequence, (2, B, D)
    dBC_part = torch.empty(2, batch, blocks, length, dstate, device=dev, dtype=f32)  # (2, B, blocks, L, N)
    z_ = z if z is not None else u
    grid = (batch, blocks)
    _scan_bwd_kernel[grid](
        u, delta, A, B, C, D if D is not None else u, z_, delta_bias if delta_bias is not None else u, dout, ckpt,
        scratch, du, ddelta, dz, dA_part, dvec_part[0], dvec_part[1], dBC_part[0], dBC_part[1],
        dim, length, dstate, ckpt.shape[2],
        *u.stride(), *delta.stride(), *A.stride(), *B.stride(), *C.stride(), *z_.stride(), *dout.stride(),
        *ckpt.stride(), *scratch.stride(), *du.stride(), *dA_part.stride(), *dvec_part[0].stride(),
        *dBC_part[0].stride(),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus),
        BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, CHUNK=CHUNK,
    )
    # Summed apart so that dB and dC are separate tensors (an op's outputs must not alias each other).
    dB, dC = (part.sum(1).transpose(-1, -2).contiguous() for part in dBC_part)  # (B, N, L) each
    return (
        du,
        ddelta,
        dA_part.sum(0).to(A.dtype),
        dB.to(B.dtype),
        dC.to(C.dtype),
        dvec_part[0].sum(0).to(D.dtype) if D is not None else None,
        dz if z is not None else None,
        dvec_part[1].sum(0).to(delta_bias.dtype) if delta_bias is not None else None,
    )


@torch.library.custom_op("mixerbench::selective_scan_triton", mutates_args=())
def _selective_scan_triton_op(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
) -> tuple[Tensor, Tensor]:
    """y and the chunk-start states (kept for the backward), from the Triton forward kernel."""
    return scan_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus)


@_selective_scan_triton_op.register_fake
def _selective_scan_triton_fake(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
) -> tuple[Tensor, Tensor]:
    batch, dim, length = u.shape
    ckpt = u.new_empty(batch, dim, _num_chunks(length, None), A.shape[1], dtype=torch.float32)
    return u.new_empty(u.shape), ckpt


@torch.library.custom_op("mixerbench::selective_scan_triton_bwd", mutates_args=())
def _selective_scan_triton_bwd_op(
    dout: Tensor,
    ckpt: Tensor,
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
) -> list[Tensor]:
    """The Triton backward as an op of its own, so that tracing the backward sees one op and its fake."""
    grads = scan_bwd(dout, ckpt, u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    # An op cannot return None: absent inputs get empty placeholders, dropped again in `_backward`.
    return [g if g is not None else u.new_empty(0) for g in grads]


@_selective_scan_triton_bwd_op.register_fake
def _selective_scan_triton_bwd_fake(
    dout: Tensor,
    ckpt: Tensor,
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
) -> list[Tensor]:
    optional = [t.new_empty(t.shape) if t is not None else u.new_empty(0) for t in (D, z, delta_bias)]
    return [
        u.new_empty(u.shape),
        delta.new_empty(delta.shape),
        A.new_empty(A.shape),
        B.new_empty(B.shape),
        C.new_empty(C.shape),
        *optional,
    ]


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    u, delta, A, B, C, D, z, delta_bias, delta_softplus = inputs
    ctx.save_for_backward(output[1], u, delta, A, B, C, D, z, delta_bias)
    ctx.delta_softplus = delta_softplus
    ctx.present = (D is not None, z is not None, delta_bias is not None)


def _backward(ctx, dy: Tensor, dckpt: Tensor | None) -> tuple[Tensor | None, ...]:
    ckpt, u, delta, A, B, C, D, z, delta_bias = ctx.saved_tensors
    du, ddelta, dA, dB, dC, dD, dz, dbias = torch.ops.mixerbench.selective_scan_triton_bwd(
        dy, ckpt, u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus
    )
    has_D, has_z, has_bias = ctx.present
    return (du, ddelta, dA, dB, dC, dD if has_D else None, dz if has_z else None, dbias if has_bias else None, None)


_selective_scan_triton_op.register_autograd(_backward, setup_context=_setup_context)
