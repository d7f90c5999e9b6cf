"""The selective scan of Mamba (S6) as Triton kernels on mamba-ssm's CUDA design (`triton`).

Same semantics and shapes as `mixers.ops.selective_scan` (mamba-ssm's `selective_scan_fn` with one group of variable
B and C), plus `reverse`: scan the sequence from its last step to its first and write y in the original order,
which is what the backward direction of Vision Mamba needs without flipping anything.

Design (mamba-ssm's `csrc/selective_scan`, in Triton):
- A program owns one sequence and `BLOCK_D` channels and walks its steps in chunks of `CHUNK` contiguous steps.
  u, delta, z, dout and y are (B, D, L) with L contiguous, so a chunk is a coalesced `(BLOCK_D, CHUNK)` tile; B_n
  and C_n of one state are contiguous `(CHUNK,)` rows. In reverse the tile's addresses simply run downwards.
- For each state n the chunk is scanned in registers with `tl.associative_scan` over (decay, input) pairs,
  `(a1, b1) o (a2, b2) = (a1 a2, b1 a2 + b2)`, and the state before the chunk enters as `h = b + a_cum h_0`. The
  state carried from chunk to chunk lives in registers as a `(BLOCK_D, N)` tile; h is never written to HBM. Only
  the state before each chunk is saved, `(B, D, n_chunks, N)` float32, as the backward's checkpoints.
- The backward walks the chunks backwards: it recomputes the chunk's states from its checkpoint (the same forward
  scan) and runs the adjoint g_s = C_s dy_s + exp(delta_{s+1} A) g_{s+1} as a reverse scan (`reverse=True`, the
  same combine), the adjoint entering from the later chunk carried in registers like the state.
- When sequences x channel blocks alone give fewer than `TARGET_PROGRAMS` programs, L is also split into
  `splits` groups of chunks that run in parallel: a first pass scans each group from a zero state (forward) or a
  zero adjoint (backward) and stores its end value and its sum of delta (its total decay is exp(A sum delta)), a
  one-step-per-group pass combines them into each group's true incoming carry, and the main pass starts from it.

Float32 state and accumulation for float32/float16/bfloat16 inputs. Results are deterministic: no atomics. The
gradients of A, D and delta_bias are written per (sequence, split) and those of B and C per channel block, as
partials that torch sums afterwards in a fixed order. Offsets along sequences and channels are int64.

Only APIs that Triton 3.6 (the GPU image) and 3.9 (here) share are used; `tl.associative_scan` takes tuples and
`reverse` in both, and Triton's own tests check its reverse scan with this non-commutative combine against
flip-scan-flip. Triton is imported guarded: where it is missing (CPU-only torch builds), `import mixers` still
works and the `triton` implementation reports that it is unavailable. On CPU tensors the kernels run only under
Triton's interpreter (`TRITON_INTERPRET=1` set before triton is first imported), which is how the tests check them.
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
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Tiles of one program, (BLOCK_D, CHUNK), and warps: untimed (issue 23 leaves the tuning to a GPU), picked so that
# ptxas (Triton 3.9, sm_90) spills no registers. The chunk is shared (the checkpoints are per chunk); the backward
# takes wider channel blocks because its dB/dC partials, (B, D / BLOCK_D, N, L) each, grow as D / BLOCK_D.
DEFAULT_CHUNK = 64
FWD_BLOCK_D, FWD_NUM_WARPS = 8, 4
BWD_BLOCK_D, BWD_NUM_WARPS = 16, 8
# Below this many (sequence, channel block) programs, L is split too (~4 per SM on an H100's 132).
TARGET_PROGRAMS = 512


def triton_available() -> bool:
    """Whether triton imported in this process."""
    return triton is not None


def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Triton scans cannot run on tensors of `device` and `dtype`, or None when they can."""
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
    def _linear_combine(a1, b1, a2, b2):
        """Composes x -> a1 x + b1, then x -> a2 x + b2 (the earlier step on the left); associative, not commutative."""
        return a1 * a2, b1 * a2 + b2

    @triton.jit
    def _load_delta(delta_ptrs, t, s_dt_l, mask, bias, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
        """(delta after bias and softplus, delta + bias), float32 (BLOCK_D, CHUNK); delta is 0 where masked out,
        so those steps decay by exp(0) = 1 and add nothing."""
        dt_pre = tl.load(delta_ptrs + t[None, :] * s_dt_l, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            dt_pre = dt_pre + bias[:, None]
        if SOFTPLUS:
            dt = _softplus(dt_pre)
        else:
            dt = dt_pre
        return tl.where(mask, dt, 0.0), dt_pre

    @triton.jit
    def _scan_fwd_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, y_ptr, ckpt_ptr, carry_ptr, dsum_ptr,
        dim, length, dstate, n_chunks, chunks_per_split,
        s_u_b, s_u_d, s_u_l,
        s_dt_b, s_dt_d, s_dt_l,
        s_A_d, s_A_n,
        s_B_b, s_B_n, s_B_l,
        s_C_b, s_C_n, s_C_l,
        s_z_b, s_z_d, s_z_l,
        s_y_b, s_y_d, s_y_l,
        s_ck_b, s_ck_d, s_ck_c, s_ck_n,
        s_cr_b, s_cr_d, s_cr_s, s_cr_n,
        s_ds_b, s_ds_d, s_ds_s,
        LOCAL: tl.constexpr, HAS_CARRY: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
        HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, REVERSE: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
    ):
        """One program per (sequence, channel block, split of L), walking its chunks in scan order.

        Main pass (not LOCAL): starts from the split's incoming state (`carry`, when HAS_CARRY) or zero, saves the
        state before every chunk into `ckpt`, writes y = (C_t h_t + D u_t) silu(z_t) in y's dtype. LOCAL (first
        pass of a split L): starts from zero and stores only the split's end state in `carry` and its sum of delta
        in `dsum`.
        """
        pid_b = tl.program_id(0).to(tl.int64)
        pid_d = tl.program_id(1)
        pid_s = tl.program_id(2)
        offs_d = (pid_d * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
        offs_n = tl.arange(0, BLOCK_N)
        offs_c = tl.arange(0, CHUNK)
        mask_d = offs_d < dim
        mask_dn = mask_d[:, None] & (offs_n < dstate)[None, :]

        bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        if HAS_D:
            Dv = tl.load(D_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        u_ptrs = u_ptr + pid_b * s_u_b + offs_d[:, None] * s_u_d
        dt_ptrs = delta_ptr + pid_b * s_dt_b + offs_d[:, None] * s_dt_d
        z_ptrs = z_ptr + pid_b * s_z_b + offs_d[:, None] * s_z_d
        y_ptrs = y_ptr + pid_b * s_y_b + offs_d[:, None] * s_y_d
        A_ptrs = A_ptr + offs_d * s_A_d
        B_row = B_ptr + pid_b * s_B_b
        C_row = C_ptr + pid_b * s_C_b
        carry_tile = pid_b * s_cr_b + offs_d[:, None] * s_cr_d + pid_s * s_cr_s + offs_n[None, :] * s_cr_n
        ck_tile = pid_b * s_ck_b + offs_d[:, None] * s_ck_d + offs_n[None, :] * s_ck_n

        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)  # the state before the chunk, every n
        last = offs_c[None, :] == CHUNK - 1
        if HAS_CARRY:
            h = tl.load(carry_ptr + carry_tile, mask=mask_dn, other=0.0).to(tl.float32)
        dsum = tl.zeros((BLOCK_D,), dtype=tl.float32)
        c_begin = pid_s * chunks_per_split
        c_end = tl.minimum(c_begin + chunks_per_split, n_chunks)
        for c in range(c_begin, c_end):
            if not LOCAL:
                tl.store(ckpt_ptr + ck_tile + c * s_ck_c, h, mask=mask_dn)
            s = c * CHUNK + offs_c
            mask_l = s < length
            t = length - 1 - s if REVERSE else s  # the time step at each scan position
            mask = mask_d[:, None] & mask_l[None, :]
            u = tl.load(u_ptrs + t[None, :] * s_u_l, mask=mask, other=0.0).to(tl.float32)
            dt, dt_pre = _load_delta(dt_ptrs, t, s_dt_l, mask, bias, HAS_BIAS, SOFTPLUS)
            du = dt * u
            if LOCAL:
                dsum += tl.sum(dt, axis=1)
            y = tl.zeros((BLOCK_D, CHUNK), dtype=tl.float32)
            for n in range(0, dstate):
                A_n = tl.load(A_ptrs + n * s_A_n, mask=mask_d, other=0.0).to(tl.float32)
                B_n = tl.load(B_row + n * s_B_n + t * s_B_l, mask=mask_l, other=0.0).to(tl.float32)
                decay = tl.exp(dt * A_n[:, None])
                a_cum, h_local = tl.associative_scan((decay, du * B_n[None, :]), 1, _linear_combine)
                # Column n of the register tile h (tl has no dynamic indexing): the state before the chunk.
                is_n = offs_n[None, :] == n
                h_n = h_local + a_cum * tl.sum(tl.where(is_n, h, 0.0), axis=1)[:, None]  # (BLOCK_D, CHUNK)
                if not LOCAL:
                    C_n = tl.load(C_row + n * s_C_n + t * s_C_l, mask=mask_l, other=0.0).to(tl.float32)
                    y += h_n * C_n[None, :]
                # Steps past L decay by 1 and add 0, so the last column is the state after the chunk.
                h = tl.where(is_n, tl.sum(tl.where(last, h_n, 0.0), axis=1)[:, None], h)
            if not LOCAL:
                if HAS_D:
                    y += Dv[:, None] * u
                if HAS_Z:
                    z = tl.load(z_ptrs + t[None, :] * s_z_l, mask=mask, other=0.0).to(tl.float32)
                    y = y * (z * tl.sigmoid(z))
                tl.store(y_ptrs + t[None, :] * s_y_l, y.to(y_ptr.dtype.element_ty), mask=mask)
        if LOCAL:
            tl.store(carry_ptr + carry_tile, h, mask=mask_dn)
            tl.store(dsum_ptr + pid_b * s_ds_b + offs_d * s_ds_d + pid_s * s_ds_s, dsum, mask=mask_d)

    @triton.jit
    def _scan_combine_splits_kernel(
        A_ptr, carry_ptr, dsum_ptr,
        dim, dstate, splits,
        s_A_d, s_A_n,
        s_cr_b, s_cr_d, s_cr_s, s_cr_n,
        s_ds_b, s_ds_d, s_ds_s,
        BACKWARD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """In place, one step per split: `carry` holds each split's local end value on entry and its true incoming
        carry on exit. Forward: in[0] = 0, in[k] = exp(A dsum[k-1]) in[k-1] + end[k-1]. BACKWARD: the same from
        the last split down (the adjoint enters a split from the one after it)."""
        pid_b = tl.program_id(0).to(tl.int64)
        pid_d = tl.program_id(1)
        offs_d = (pid_d * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
        offs_n = tl.arange(0, BLOCK_N)
        mask_d = offs_d < dim
        mask_dn = mask_d[:, None] & (offs_n < dstate)[None, :]
        A = tl.load(A_ptr + offs_d[:, None] * s_A_d + offs_n[None, :] * s_A_n, mask=mask_dn, other=0.0).to(tl.float32)
        tile = carry_ptr + pid_b * s_cr_b + offs_d[:, None] * s_cr_d + offs_n[None, :] * s_cr_n
        ds_ptrs = dsum_ptr + pid_b * s_ds_b + offs_d * s_ds_d
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        for j in range(0, splits):
            if BACKWARD:
                k = splits - 1 - j
            else:
                k = j
            end = tl.load(tile + k * s_cr_s, mask=mask_dn, other=0.0)
            dsum = tl.load(ds_ptrs + k * s_ds_s, mask=mask_d, other=0.0)
            tl.store(tile + k * s_cr_s, h, mask=mask_dn)
            h = tl.exp(dsum[:, None] * A) * h + end

    @triton.jit
    def _scan_bwd_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, dout_ptr, ckpt_ptr, carry_ptr, dsum_ptr,
        du_ptr, ddelta_ptr, dz_ptr, dA_ptr, dD_ptr, dbias_ptr, dB_ptr, dC_ptr,
        dim, length, dstate, n_chunks, chunks_per_split,
        s_u_b, s_u_d, s_u_l,
        s_dt_b, s_dt_d, s_dt_l,
        s_A_d, s_A_n,
        s_B_b, s_B_n, s_B_l,
        s_C_b, s_C_n, s_C_l,
        s_z_b, s_z_d, s_z_l,
        s_do_b, s_do_d, s_do_l,
        s_ck_b, s_ck_d, s_ck_c, s_ck_n,
        s_cr_b, s_cr_d, s_cr_s, s_cr_n,
        s_ds_b, s_ds_d, s_ds_s,
        s_g_b, s_g_d, s_g_l,
        s_dA_b, s_dA_s, s_dA_d, s_dA_n,
        s_dv_b, s_dv_s, s_dv_d,
        s_dBC_b, s_dBC_k, s_dBC_n, s_dBC_l,
        LOCAL: tl.constexpr, HAS_CARRY: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
        HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, REVERSE: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
    ):
        """One program per (sequence, channel block, split of L), walking its chunks backwards in scan order.

        The carry q (BLOCK_D, N) is exp(delta_e A) g_e at the first step e after the chunk: the adjoint that
        enters the chunk's last step. Main pass: per chunk and state n, recompute h from the chunk's checkpoint
        (forward scan), run g_s = C_s dy_s + exp(delta_{s+1} A) g_{s+1} as a reverse scan, and accumulate every
        gradient; per-step ones (u, delta, z) are written, the others stored as partials (see the module
        docstring). LOCAL (first pass of a split L): from a zero carry, only the carry out of the split's front
        into `carry` and the split's sum of delta into `dsum`.
        """
        pid_b = tl.program_id(0).to(tl.int64)
        pid_d = tl.program_id(1)
        pid_s = tl.program_id(2)
        offs_d = (pid_d * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
        offs_n = tl.arange(0, BLOCK_N)
        offs_c = tl.arange(0, CHUNK)
        mask_d = offs_d < dim
        mask_dn = mask_d[:, None] & (offs_n < dstate)[None, :]

        bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        if HAS_D:
            Dv = tl.load(D_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        u_ptrs = u_ptr + pid_b * s_u_b + offs_d[:, None] * s_u_d
        dt_ptrs = delta_ptr + pid_b * s_dt_b + offs_d[:, None] * s_dt_d
        z_ptrs = z_ptr + pid_b * s_z_b + offs_d[:, None] * s_z_d
        do_ptrs = dout_ptr + pid_b * s_do_b + offs_d[:, None] * s_do_d
        # du, ddelta and dz share one stride set: they are allocated contiguous (B, D, L) alike.
        g_ptrs = pid_b * s_g_b + offs_d[:, None] * s_g_d
        A_ptrs = A_ptr + offs_d * s_A_d
        B_row = B_ptr + pid_b * s_B_b
        C_row = C_ptr + pid_b * s_C_b
        dBC_row = pid_b * s_dBC_b + pid_d.to(tl.int64) * s_dBC_k  # blocks x N x L can pass 2^31
        carry_tile = pid_b * s_cr_b + offs_d[:, None] * s_cr_d + pid_s * s_cr_s + offs_n[None, :] * s_cr_n
        ck_col = ckpt_ptr + pid_b * s_ck_b + offs_d * s_ck_d

        q = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        if HAS_CARRY:
            q = tl.load(carry_ptr + carry_tile, mask=mask_dn, other=0.0).to(tl.float32)
        dsum = tl.zeros((BLOCK_D,), dtype=tl.float32)
        dA_acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        dD_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
        dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
        first = offs_c[None, :] == 0
        last = offs_c[None, :] == CHUNK - 1
        c_begin = pid_s * chunks_per_split
        c_end = tl.minimum(c_begin + chunks_per_split, n_chunks)
        for j in range(0, c_end - c_begin):
            c = c_end - 1 - j
            s = c * CHUNK + offs_c
            mask_l = s < length
            t = length - 1 - s if REVERSE else s  # the time step at each scan position
            mask = mask_d[:, None] & mask_l[None, :]
            dt, dt_pre = _load_delta(dt_ptrs, t, s_dt_l, mask, bias, HAS_BIAS, SOFTPLUS)
            dy = tl.load(do_ptrs + t[None, :] * s_do_l, mask=mask, other=0.0).to(tl.float32)
            if HAS_Z:
                z = tl.load(z_ptrs + t[None, :] * s_z_l, mask=mask, other=0.0).to(tl.float32)
                sig = tl.sigmoid(z)
                dy_core = dy * z * sig  # d loss / d (C h + D u)
            else:
                dy_core = dy
            if LOCAL:
                dsum += tl.sum(dt, axis=1)
                for n in range(0, dstate):
                    A_n = tl.load(A_ptrs + n * s_A_n, mask=mask_d, other=0.0).to(tl.float32)
                    C_n = tl.load(C_row + n * s_C_n + t * s_C_l, mask=mask_l, other=0.0).to(tl.float32)
                    decay = tl.exp(dt * A_n[:, None])
                    is_n = offs_n[None, :] == n
                    b = dy_core * C_n[None, :] + tl.where(last, tl.sum(tl.where(is_n, q, 0.0), axis=1)[:, None], 0.0)
                    # w_s = exp(delta_s A) g_s = decay_s (b_s + w_{s+1}): no shifted decay needed for the front.
                    _, w = tl.associative_scan((decay, decay * b), 1, _linear_combine, reverse=True)
                    q = tl.where(is_n, tl.sum(tl.where(first, w, 0.0), axis=1)[:, None], q)
            else:
                u = tl.load(u_ptrs + t[None, :] * s_u_l, mask=mask, other=0.0).to(tl.float32)
                # delta at the next scan position: g_s takes exp(delta_{s+1} A) g_{s+1} from inside the chunk.
                s_next = s + 1
                t_next = length - 1 - s_next if REVERSE else s_next
                mask_next = mask_d[:, None] & (s_next < length)[None, :]
                dt_next, _ = _load_delta(dt_ptrs, t_next, s_dt_l, mask_next, bias, HAS_BIAS, SOFTPLUS)
                du = dt * u
                gB = tl.zeros((BLOCK_D, CHUNK), dtype=tl.float32)  # sum_n g B_n
                ddt = tl.zeros((BLOCK_D, CHUNK), dtype=tl.float32)  # sum_n A_n exp(delta A_n) h_{s-1} g
                y_core = tl.zeros((BLOCK_D, CHUNK), dtype=tl.float32)
                for n in range(0, dstate):
                    A_n = tl.load(A_ptrs + n * s_A_n, mask=mask_d, other=0.0).to(tl.float32)
                    B_n = tl.load(B_row + n * s_B_n + t * s_B_l, mask=mask_l, other=0.0).to(tl.float32)
                    C_n = tl.load(C_row + n * s_C_n + t * s_C_l, mask=mask_l, other=0.0).to(tl.float32)
                    h0 = tl.load(ck_col + c * s_ck_c + n * s_ck_n, mask=mask_d, other=0.0).to(tl.float32)
                    decay = tl.exp(dt * A_n[:, None])
                    drive = du * B_n[None, :]
                    a_cum, h_local = tl.associative_scan((decay, drive), 1, _linear_combine)
                    h_n = h_local + a_cum * h0[:, None]
                    # The carry (column n of q) enters at the chunk's last step.
                    is_n = offs_n[None, :] == n
                    b = dy_core * C_n[None, :] + tl.where(last, tl.sum(tl.where(is_n, q, 0.0), axis=1)[:, None], 0.0)
                    # Reverse scan: g_s = b_s + exp(delta_{s+1} A) g_{s+1}; the chunk's last step has the carry in b.
                    _, g = tl.associative_scan((tl.exp(dt_next * A_n[:, None]), b), 1, _linear_combine,
                                               reverse=True)
                    q = tl.where(is_n, tl.sum(tl.where(first, decay * g, 0.0), axis=1)[:, None], q)
                    # exp(delta_s A) h_{s-1} g_s = (h_s - drive_s) g_s: d loss / d (delta_s A_n)
                    w = (h_n - drive) * g
                    ddt += w * A_n[:, None]
                    dA_acc = tl.where(is_n, dA_acc + tl.sum(w * dt, axis=1)[:, None], dA_acc)
                    gB += g * B_n[None, :]
                    tl.store(dB_ptr + dBC_row + n * s_dBC_n + t * s_dBC_l, tl.sum(g * du, axis=0), mask=mask_l)
                    tl.store(dC_ptr + dBC_row + n * s_dBC_n + t * s_dBC_l, tl.sum(dy_core * h_n, axis=0),
                             mask=mask_l)
                    if HAS_Z:
                        y_core += h_n * C_n[None, :]
                du_out = gB * dt
                if HAS_D:
                    du_out += Dv[:, None] * dy_core
                    dD_acc += tl.sum(dy_core * u, axis=1)
                ddt += gB * u
                if SOFTPLUS:
                    ddt = ddt * tl.sigmoid(dt_pre)
                ddt = tl.where(mask, ddt, 0.0)
                dbias_acc += tl.sum(ddt, axis=1)
                if HAS_Z:
                    if HAS_D:
                        y_core += Dv[:, None] * u
                    dz = dy * y_core * sig * (1.0 + z * (1.0 - sig))
                    tl.store(dz_ptr + g_ptrs + t[None, :] * s_g_l, dz.to(dz_ptr.dtype.element_ty), mask=mask)
                tl.store(du_ptr + g_ptrs + t[None, :] * s_g_l, du_out.to(du_ptr.dtype.element_ty), mask=mask)
                tl.store(ddelta_ptr + g_ptrs + t[None, :] * s_g_l, ddt.to(ddelta_ptr.dtype.element_ty), mask=mask)
        if LOCAL:
            tl.store(carry_ptr + carry_tile, q, mask=mask_dn)
            tl.store(dsum_ptr + pid_b * s_ds_b + offs_d * s_ds_d + pid_s * s_ds_s, dsum, mask=mask_d)
        else:
            tl.store(dA_ptr + pid_b * s_dA_b + pid_s * s_dA_s + offs_d[:, None] * s_dA_d + offs_n[None, :] * s_dA_n,
                     dA_acc, mask=mask_dn)
            dv_off = pid_b * s_dv_b + pid_s * s_dv_s + offs_d * s_dv_d
            if HAS_D:
                tl.store(dD_ptr + dv_off, dD_acc, mask=mask_d)
            if HAS_BIAS:
                tl.store(dbias_ptr + dv_off, dbias_acc, mask=mask_d)


def _check_runs(u: Tensor) -> None:
    reason = triton_unavailable_reason(u.device, u.dtype)
    if reason is not None:
        raise RuntimeError(f"scan impl 'triton' cannot run: {reason}")


def _next_power_of_2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


class Tiling:
    """How a (B, D, L) scan is cut: `block_d` channels x `chunk` steps per tile, `splits` groups of
    `chunks_per_split` chunks along L. A function of the shapes alone, so the op's fake agrees with the kernel.

    Args:
        batch, dim, length: the shape of u.
        chunk_size: steps per chunk, a power of two (default `DEFAULT_CHUNK`, less for short sequences).
        block_d: channels per program, a power of two (default `default_block_d`, less for narrow inputs).
        splits: groups along L (default: enough for `TARGET_PROGRAMS` programs, at most one per chunk).
        default_block_d: the pass's default channels per program (`FWD_BLOCK_D` or `BWD_BLOCK_D`).
    """

    def __init__(self, batch: int, dim: int, length: int, chunk_size: int | None = None,
                 block_d: int | None = None, splits: int | None = None, *,
                 default_block_d: int = FWD_BLOCK_D) -> None:
        self.block_d = block_d or min(default_block_d, _next_power_of_2(dim))
        self.chunk = chunk_size or min(DEFAULT_CHUNK, max(16, _next_power_of_2(length)))
        for name, value in (("block_d", self.block_d), ("chunk_size", self.chunk)):
            if value & (value - 1):
                raise ValueError(f"Triton scan: {name} must be a power of two, got {value}")
        self.blocks = -(-dim // self.block_d)
        self.n_chunks = max(1, -(-length // self.chunk))
        wanted = splits or -(-TARGET_PROGRAMS // (batch * self.blocks))
        self.chunks_per_split = -(-self.n_chunks // max(1, min(wanted, self.n_chunks)))
        self.splits = -(-self.n_chunks // self.chunks_per_split)


def _carries(
    kernel, args: tuple, strides: tuple, flags: dict, A: Tensor, batch: int, dim: int, dstate: int,
    tiling: Tiling, block_n: int, backward: bool, num_warps: int,
) -> Tensor | None:
    """First pass (LOCAL) and combine pass of a split L: each split's incoming carry, (B, D, splits, N) float32;
    None when L is not split."""
    if tiling.splits == 1:
        return None
    device = A.device
    carry = torch.empty(batch, dim, tiling.splits, dstate, device=device, dtype=torch.float32)  # (B, D, S, N)
    dsum = torch.empty(batch, dim, tiling.splits, device=device, dtype=torch.float32)  # (B, D, S)
    kernel[(batch, tiling.blocks, tiling.splits)](
        *args(carry, dsum), dim, *strides(carry, dsum), LOCAL=True, HAS_CARRY=False, **flags,
        BLOCK_D=tiling.block_d, BLOCK_N=block_n, CHUNK=tiling.chunk, num_warps=num_warps,
    )
    _scan_combine_splits_kernel[(batch, tiling.blocks)](
        A, carry, dsum, dim, dstate, tiling.splits, *A.stride(), *carry.stride(), *dsum.stride(),
        BACKWARD=backward, BLOCK_D=tiling.block_d, BLOCK_N=block_n,
    )
    return carry


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
    reverse: bool = False,
    *,
    chunk_size: int | None = None,
    block_d: int | None = None,
    splits: int | None = None,
    num_warps: int = FWD_NUM_WARPS,
) -> tuple[Tensor, Tensor]:
    """The forward: y and the checkpoints. Arguments as `selective_scan_reference`, and `Tiling`'s.

    Args:
        reverse: scan from the last step to the first; y is in the original order.
        num_warps: warps per program.

    Returns:
        y (B, D, L) in `u.dtype`, and the float32 state before each chunk in scan order, (B, D, n_chunks, N).
    """
    _check_runs(u)
    batch, dim, length = u.shape
    dstate = A.shape[1]
    tiling = Tiling(batch, dim, length, chunk_size, block_d, splits, default_block_d=FWD_BLOCK_D)
    block_n = _next_power_of_2(dstate)
    dev = u.device
    y = torch.empty(batch, dim, length, device=dev, dtype=u.dtype)  # (B, D, L)
    ckpt = torch.empty(batch, dim, tiling.n_chunks, dstate, device=dev, dtype=torch.float32)  # (B, D, nc, N)
    z_ = z if z is not None else u
    D_ = D if D is not None else u
    bias_ = delta_bias if delta_bias is not None else u
    flags = dict(HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
                 SOFTPLUS=bool(delta_softplus), REVERSE=bool(reverse))

    def args(carry: Tensor, dsum: Tensor) -> tuple:
        return (u, delta, A, B, C, D_, z_, bias_, y, ckpt, carry, dsum)

    def strides(carry: Tensor, dsum: Tensor) -> tuple:
        return (length, dstate, tiling.n_chunks, tiling.chunks_per_split,
                *u.stride(), *delta.stride(), *A.stride(), *B.stride(), *C.stride(), *z_.stride(), *y.stride(),
                *ckpt.stride(), *carry.stride(), *dsum.stride())

    carry = _carries(_scan_fwd_kernel, args, strides, flags, A, batch, dim, dstate, tiling, block_n, False, num_warps)
    has_carry = carry is not None
    if carry is None:
        carry = ckpt  # not read: HAS_CARRY is off
    _scan_fwd_kernel[(batch, tiling.blocks, tiling.splits)](
        *args(carry, ckpt), dim, *strides(carry, ckpt[..., 0]), LOCAL=False, HAS_CARRY=has_carry, **flags,
        BLOCK_D=tiling.block_d, BLOCK_N=block_n, CHUNK=tiling.chunk, num_warps=num_warps,
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
    reverse: bool = False,
    *,
    chunk_size: int | None = None,
    block_d: int | None = None,
    splits: int | None = None,
    num_warps: int = BWD_NUM_WARPS,
) -> tuple[Tensor | None, ...]:
    """The backward, from `scan_fwd`'s checkpoints (made with the same `chunk_size`; `block_d` and `splits` may
    differ, the checkpoints are per channel and chunk). Arguments as `scan_fwd`.

    Returns:
        (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) in the dtypes of their inputs, None where the input was None.
    """
    _check_runs(u)
    batch, dim, length = u.shape
    dstate = A.shape[1]
    tiling = Tiling(batch, dim, length, chunk_size, block_d, splits, default_block_d=BWD_BLOCK_D)
    if ckpt.shape != (batch, dim, tiling.n_chunks, dstate):
        raise ValueError(f"ckpt has shape {tuple(ckpt.shape)}, expected {(batch, dim, tiling.n_chunks, dstate)}: "
                         "scan_fwd and scan_bwd need the same chunk_size")
    block_n = _next_power_of_2(dstate)
    dev, f32 = u.device, torch.float32
    du = torch.empty(batch, dim, length, device=dev, dtype=u.dtype)  # (B, D, L)
    ddelta = torch.empty(batch, dim, length, device=dev, dtype=delta.dtype)  # (B, D, L)
    dz = torch.empty(batch, dim, length, device=dev, dtype=z.dtype) if z is not None else du  # (B, D, L)
    dA_part = torch.empty(batch, tiling.splits, dim, dstate, device=dev, dtype=f32)  # (B, S, D, N)
    dvec_part = torch.empty(2, batch, tiling.splits, dim, device=dev, dtype=f32)  # dD, d delta_bias: (2, B, S, D)
    dBC_part = torch.empty(2, batch, tiling.blocks, dstate, length, device=dev, dtype=f32)  # (2, B, blocks, N, L)
    z_ = z if z is not None else u
    D_ = D if D is not None else u
    bias_ = delta_bias if delta_bias is not None else u
    flags = dict(HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
                 SOFTPLUS=bool(delta_softplus), REVERSE=bool(reverse))

    def args(carry: Tensor, dsum: Tensor) -> tuple:
        return (u, delta, A, B, C, D_, z_, bias_, dout, ckpt, carry, dsum,
                du, ddelta, dz, dA_part, dvec_part[0], dvec_part[1], dBC_part[0], dBC_part[1])

    def strides(carry: Tensor, dsum: Tensor) -> tuple:
        return (length, dstate, tiling.n_chunks, tiling.chunks_per_split,
                *u.stride(), *delta.stride(), *A.stride(), *B.stride(), *C.stride(), *z_.stride(),
                *dout.stride(), *ckpt.stride(), *carry.stride(), *dsum.stride(), *du.stride(), *dA_part.stride(),
                *dvec_part[0].stride(), *dBC_part[0].stride())

    carry = _carries(_scan_bwd_kernel, args, strides, flags, A, batch, dim, dstate, tiling, block_n, True, num_warps)
    has_carry = carry is not None
    if carry is None:
        carry = ckpt  # not read: HAS_CARRY is off
    _scan_bwd_kernel[(batch, tiling.blocks, tiling.splits)](
        *args(carry, ckpt[..., 0]), dim, *strides(carry, ckpt[..., 0]), LOCAL=False, HAS_CARRY=has_carry,
        **flags, BLOCK_D=tiling.block_d, BLOCK_N=block_n, CHUNK=tiling.chunk, num_warps=num_warps,
    )
    # Summed apart so that dB and dC are separate tensors (an op's outputs must not alias each other).
    dB, dC = (part.sum(1) for part in dBC_part)  # (B, N, L) each
    return (
        du,
        ddelta,
        dA_part.sum((0, 1)).to(A.dtype),
        dB.to(B.dtype),
        dC.to(C.dtype),
        dvec_part[0].sum((0, 1)).to(D.dtype) if D is not None else None,
        dz if z is not None else None,
        dvec_part[1].sum((0, 1)).to(delta_bias.dtype) if delta_bias is not None else None,
    )


def num_checkpoints(batch: int, dim: int, length: int) -> int:
    """Chunks of the default tiling: the checkpoint count of `scan_fwd`'s second output."""
    return Tiling(batch, dim, length).n_chunks


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
    reverse: bool = False,
) -> tuple[Tensor, Tensor]:
    """y and the chunk checkpoints (kept for the backward), from the Triton forward kernel."""
    return scan_fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse)


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
    reverse: bool = False,
) -> tuple[Tensor, Tensor]:
    batch, dim, length = u.shape
    ckpt = u.new_empty(batch, dim, num_checkpoints(batch, dim, length), A.shape[1], dtype=torch.float32)
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
    reverse: bool = False,
) -> list[Tensor]:
    """The Triton backward as an op of its own, so that tracing the backward sees one op and its fake."""
    grads = scan_bwd(dout, ckpt, u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse)
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
    reverse: bool = False,
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
    u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse = inputs
    ctx.save_for_backward(output[1], u, delta, A, B, C, D, z, delta_bias)
    ctx.delta_softplus = delta_softplus
    ctx.reverse = reverse
    ctx.present = (D is not None, z is not None, delta_bias is not None)


def _backward(ctx, dy: Tensor, dckpt: Tensor | None) -> tuple[Tensor | None, ...]:
    ckpt, u, delta, A, B, C, D, z, delta_bias = ctx.saved_tensors
    du, ddelta, dA, dB, dC, dD, dz, dbias = torch.ops.mixerbench.selective_scan_triton_bwd(
        dy, ckpt, u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus, ctx.reverse
    )
    has_D, has_z, has_bias = ctx.present
    return (du, ddelta, dA, dB, dC, dD if has_D else None, dz if has_z else None, dbias if has_bias else None,
            None, None)


_selective_scan_triton_op.register_autograd(_backward, setup_context=_setup_context)
