"""The first Triton selective scan (`triton_v1`), kept selectable to be timed against `triton` on a GPU (issue 23).

It steps through time with a `(BLOCK_D, N)` state per program, loading `BLOCK_D` channels per step strided by L;
`selective_scan_triton` (now `triton`) loads coalesced tiles along L instead. It has no `reverse` of its own:
`selective_scan` flips around it.

Same semantics and shapes as `mixers.selective_scan` (mamba-ssm's `selective_scan_fn` with one group of variable
B and C). A program holds the `(BLOCK_D, N)` float32 state of one sequence and `BLOCK_D` channels in registers and
steps through time; the sequence is cut into chunks of `CHUNK` steps that run in parallel, so the grid is
B x D / BLOCK_D x L / CHUNK (`pick_chunk` sizes chunks for >= 1024 programs) rather than B x D / BLOCK_D:

- forward: pass 1 scans every chunk from a zero state and stores its end state and sum of delta (its total decay
  is exp(A sum delta)); pass 2, sequential over chunks but one multiply-add each, combines them into each chunk's
  true start state h_start[c] = exp(A dsum[c-1]) h_start[c-1] + end[c-1]; pass 3 re-runs each chunk from its
  start state, applies delta_bias, softplus, the D skip and the silu(z) gate and writes y in `u.dtype`. The
  start states `(B, D, L / CHUNK, N)` are the backward's checkpoints.
- backward: the same three passes in reverse. Pass 1 runs each chunk's adjoint g_t = C_t dy_t +
  exp(delta_{t+1} A) g_{t+1} back from zero (no states needed), pass 2 combines the carries entering each chunk
  from the one after, and pass 3 (persistent: a fixed grid whose programs each own a scratch slot) re-runs
  each chunk forward from its checkpoint into the slot (running back through 1 / exp(delta A) is unstable) and
  steps back from the true carry. Per-channel gradients (u, delta, z) are written directly; dA, dD,
  d delta_bias per (sequence, chunk) and dB, dC per channel block are partials summed afterwards in torch, so
  results are deterministic (no atomics).

Offsets over sequences and channels are int64, so (B, D, L) tensors past 2^31 elements index correctly.

The triton import, its interpreter switch and availability checks are `selective_scan_triton`'s. Only
long-standing `tl` APIs are used (tested on Triton 3.8; written for 3.6 as well).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .selective_scan_triton import triton, triton_unavailable_reason

if triton is not None:
    import triton.language as tl

    from .selective_scan_triton import _softplus

DEFAULT_BLOCK_D = 16
# Chunks are sized so that sequence x channel block x chunk gives at least this many programs (~8 per SM on 132).
TARGET_PROGRAMS = 1024
BWD_PROGRAMS_PER_SM = 8


if triton is not None:

    @triton.jit
    def _step_delta(dt_ptrs, t, s_dt_l, mask_d, bias, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
        """(delta_t after bias and softplus, delta_t + bias before softplus), float32, for the block's channels."""
        dt_pre = tl.load(dt_ptrs + t * s_dt_l, mask=mask_d, other=0.0).to(tl.float32)
        if HAS_BIAS:
            dt_pre = dt_pre + bias
        if SOFTPLUS:
            dt = _softplus(dt_pre)
        else:
            dt = dt_pre
        return dt, dt_pre

    @triton.jit
    def _chunk_local_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, z_ptr, bias_ptr, dout_ptr, loc_ptr, dsum_ptr,
        dim, length, dstate,
        s_u_b, s_u_d, s_u_l,
        s_dt_b, s_dt_d, s_dt_l,
        s_A_d, s_A_n,
        s_B_b, s_B_n, s_B_l,
        s_C_b, s_C_n, s_C_l,
        s_z_b, s_z_d, s_z_l,
        s_do_b, s_do_d, s_do_l,
        s_loc_b, s_loc_d, s_loc_c, s_loc_n,
        s_ds_b, s_ds_d, s_ds_c,
        BACKWARD: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
    ):
        """Pass 1, one program per (sequence, channel block, chunk), every chunk at once, from a zero state.

        Forward: the chunk's end state sum_t (prod_{s > t} exp(delta_s A)) delta_t B_t u_t. Backward: the adjoint
        carried out of the chunk's front, exp(delta_s A) g_s at its first step s, with g = 0 after its end. Both
        store sum_t delta_t over the chunk: its total decay is exp(A sum_t delta_t).
        """
        pid_b = tl.program_id(0).to(tl.int64)
        pid_d = tl.program_id(1)
        c = tl.program_id(2)
        offs_d = (pid_d * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
        offs_n = tl.arange(0, BLOCK_N)
        mask_d = offs_d < dim
        mask_n = offs_n < dstate
        mask_dn = mask_d[:, None] & mask_n[None, :]

        A = tl.load(A_ptr + offs_d[:, None] * s_A_d + offs_n[None, :] * s_A_n, mask=mask_dn, other=0.0).to(tl.float32)
        bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        u_ptrs = u_ptr + pid_b * s_u_b + offs_d * s_u_d
        dt_ptrs = delta_ptr + pid_b * s_dt_b + offs_d * s_dt_d
        z_ptrs = z_ptr + pid_b * s_z_b + offs_d * s_z_d
        do_ptrs = dout_ptr + pid_b * s_do_b + offs_d * s_do_d
        B_ptrs = B_ptr + pid_b * s_B_b + offs_n * s_B_n
        C_ptrs = C_ptr + pid_b * s_C_b + offs_n * s_C_n

        start = c * CHUNK
        steps = tl.minimum(CHUNK, length - start)
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        dsum = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for j in range(0, steps):
            if BACKWARD:
                t = start + steps - 1 - j
            else:
                t = start + j
            dt, dt_pre = _step_delta(dt_ptrs, t, s_dt_l, mask_d, bias, HAS_BIAS, SOFTPLUS)
            dsum += dt
            decay = tl.exp(dt[:, None] * A)
            if BACKWARD:
                dy = tl.load(do_ptrs + t * s_do_l, mask=mask_d, other=0.0).to(tl.float32)
                if HAS_Z:
                    z = tl.load(z_ptrs + t * s_z_l, mask=mask_d, other=0.0).to(tl.float32)
                    dy = dy * z * tl.sigmoid(z)
                Ct = tl.load(C_ptrs + t * s_C_l, mask=mask_n, other=0.0).to(tl.float32)
                h = (dy[:, None] * Ct[None, :] + h) * decay
            else:
                u = tl.load(u_ptrs + t * s_u_l, mask=mask_d, other=0.0).to(tl.float32)
                Bt = tl.load(B_ptrs + t * s_B_l, mask=mask_n, other=0.0).to(tl.float32)
                h = decay * h + (dt * u)[:, None] * Bt[None, :]
        tl.store(loc_ptr + pid_b * s_loc_b + offs_d[:, None] * s_loc_d + c * s_loc_c + offs_n[None, :] * s_loc_n,
                 h, mask=mask_dn)
        tl.store(dsum_ptr + pid_b * s_ds_b + offs_d * s_ds_d + c * s_ds_c, dsum, mask=mask_d)

    @triton.jit
    def _chunk_combine_kernel(
        A_ptr, loc_ptr, dsum_ptr, out_ptr,
        dim, dstate, n_chunks,
        s_A_d, s_A_n,
        s_loc_b, s_loc_d, s_loc_c, s_loc_n,
        s_ds_b, s_ds_d, s_ds_c,
        REVERSE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """Pass 2, sequential over chunks (one cheap step each): out[c] = the carry entering chunk c.

        Forward: out[0] = 0, out[c] = exp(A dsum[c-1]) out[c-1] + loc[c-1] (the state before chunk c). Backward
        (REVERSE): out[last] = 0, out[c] = exp(A dsum[c+1]) out[c+1] + loc[c+1] (exp(delta A) g entering chunk c
        from the one after it). `out` has `loc`'s strides.
        """
        pid_b = tl.program_id(0).to(tl.int64)
        pid_d = tl.program_id(1)
        offs_d = (pid_d * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
        offs_n = tl.arange(0, BLOCK_N)
        mask_d = offs_d < dim
        mask_dn = mask_d[:, None] & (offs_n < dstate)[None, :]
        A = tl.load(A_ptr + offs_d[:, None] * s_A_d + offs_n[None, :] * s_A_n, mask=mask_dn, other=0.0).to(tl.float32)
        tile = pid_b * s_loc_b + offs_d[:, None] * s_loc_d + offs_n[None, :] * s_loc_n
        ds_ptrs = dsum_ptr + pid_b * s_ds_b + offs_d * s_ds_d
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        for k in range(0, n_chunks):
            if REVERSE:
                c = n_chunks - 1 - k
            else:
                c = k
            tl.store(out_ptr + tile + c * s_loc_c, h, mask=mask_dn)
            loc = tl.load(loc_ptr + tile + c * s_loc_c, mask=mask_dn, other=0.0)
            dsum = tl.load(ds_ptrs + c * s_ds_c, mask=mask_d, other=0.0)
            h = tl.exp(dsum[:, None] * A) * h + loc

    @triton.jit
    def _chunk_fwd_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, y_ptr, ckpt_ptr,
        dim, length, dstate,
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
        """Pass 3 of the forward, one program per (sequence, channel block, chunk): the chunk from its true start
        state (pass 2's), writing y = (C_t h_t + D u_t) silu(z_t) in y's dtype."""
        pid_b = tl.program_id(0).to(tl.int64)
        pid_d = tl.program_id(1)
        c = tl.program_id(2)
        offs_d = (pid_d * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
        offs_n = tl.arange(0, BLOCK_N)
        mask_d = offs_d < dim
        mask_n = offs_n < dstate
        mask_dn = mask_d[:, None] & mask_n[None, :]

        A = tl.load(A_ptr + offs_d[:, None] * s_A_d + offs_n[None, :] * s_A_n, mask=mask_dn, other=0.0).to(tl.float32)
        if HAS_D:
            Dv = tl.load(D_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        u_ptrs = u_ptr + pid_b * s_u_b + offs_d * s_u_d
        dt_ptrs = delta_ptr + pid_b * s_dt_b + offs_d * s_dt_d
        z_ptrs = z_ptr + pid_b * s_z_b + offs_d * s_z_d
        y_ptrs = y_ptr + pid_b * s_y_b + offs_d * s_y_d
        B_ptrs = B_ptr + pid_b * s_B_b + offs_n * s_B_n
        C_ptrs = C_ptr + pid_b * s_C_b + offs_n * s_C_n

        h = tl.load(ckpt_ptr + pid_b * s_ck_b + offs_d[:, None] * s_ck_d + c * s_ck_c + offs_n[None, :] * s_ck_n,
                    mask=mask_dn, other=0.0)
        start = c * CHUNK
        steps = tl.minimum(CHUNK, length - start)
        for i in range(0, steps):
            t = start + i
            u = tl.load(u_ptrs + t * s_u_l, mask=mask_d, other=0.0).to(tl.float32)
            dt, dt_pre = _step_delta(dt_ptrs, t, s_dt_l, mask_d, bias, HAS_BIAS, SOFTPLUS)
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
    def _chunk_bwd_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, dout_ptr, ckpt_ptr, carry_ptr, scratch_ptr,
        du_ptr, ddelta_ptr, dz_ptr, dA_ptr, dD_ptr, dbias_ptr, dB_ptr, dC_ptr,
        dim, length, dstate, n_chunks, n_blocks, n_tiles,
        s_u_b, s_u_d, s_u_l,
        s_dt_b, s_dt_d, s_dt_l,
        s_A_d, s_A_n,
        s_B_b, s_B_n, s_B_l,
        s_C_b, s_C_n, s_C_l,
        s_z_b, s_z_d, s_z_l,
        s_do_b, s_do_d, s_do_l,
        s_ck_b, s_ck_d, s_ck_c, s_ck_n,
        s_sc_p, s_sc_t, s_sc_d, s_sc_n,
        s_g_b, s_g_d, s_g_l,
        s_dA_b, s_dA_d, s_dA_c, s_dA_n,
        s_dv_b, s_dv_d, s_dv_c,
        s_dBC_b, s_dBC_k, s_dBC_l, s_dBC_n,
        HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
    ):
        """Pass 3 of the backward. Persistent: program p takes tiles p, p + P, ... of (sequence, block, chunk) and
        owns scratch slot p, so the scratch is bounded by the grid, not by L. Per tile: re-run the chunk forward
        from its stored start state into the slot (running back through 1 / exp(delta A) is unstable), then step
        back from the true incoming adjoint carry (pass 2's) with g_t = C_t dy_t + exp(delta_{t+1} A) g_{t+1}.
        Per-step gradients are written directly; dA, dD, d delta_bias per (sequence, chunk) and dB, dC per
        channel block are partials that torch sums afterwards (deterministic, no atomics)."""
        pid = tl.program_id(0)
        n_prog = tl.num_programs(0)
        offs_n = tl.arange(0, BLOCK_N)
        mask_n = offs_n < dstate
        sc_ptrs = scratch_ptr + pid.to(tl.int64) * s_sc_p + tl.arange(0, BLOCK_D)[:, None] * s_sc_d \
            + offs_n[None, :] * s_sc_n
        for tile in range(pid, n_tiles, n_prog):
            c = tile % n_chunks
            pid_d = (tile // n_chunks) % n_blocks
            pid_b = (tile // (n_chunks * n_blocks)).to(tl.int64)
            offs_d = (pid_d * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
            mask_d = offs_d < dim
            mask_dn = mask_d[:, None] & mask_n[None, :]

            A = tl.load(A_ptr + offs_d[:, None] * s_A_d + offs_n[None, :] * s_A_n, mask=mask_dn,
                        other=0.0).to(tl.float32)
            if HAS_D:
                Dv = tl.load(D_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
            bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
            if HAS_BIAS:
                bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
            u_ptrs = u_ptr + pid_b * s_u_b + offs_d * s_u_d
            dt_ptrs = delta_ptr + pid_b * s_dt_b + offs_d * s_dt_d
            z_ptrs = z_ptr + pid_b * s_z_b + offs_d * s_z_d
            do_ptrs = dout_ptr + pid_b * s_do_b + offs_d * s_do_d
            B_ptrs = B_ptr + pid_b * s_B_b + offs_n * s_B_n
            C_ptrs = C_ptr + pid_b * s_C_b + offs_n * s_C_n
            # du, ddelta, dz share one stride set: they are allocated contiguous (B, D, L) alike.
            g_off = pid_b * s_g_b + offs_d * s_g_d
            dBC_off = pid_b * s_dBC_b + pid_d * s_dBC_k + offs_n * s_dBC_n
            ck_off = pid_b * s_ck_b + offs_d[:, None] * s_ck_d + c * s_ck_c + offs_n[None, :] * s_ck_n

            start = c * CHUNK
            steps = tl.minimum(CHUNK, length - start)
            # Re-run the chunk forward from its start state; scratch row j holds h_{start + j - 1}.
            h = tl.load(ckpt_ptr + ck_off, mask=mask_dn, other=0.0)
            tl.store(sc_ptrs, h, mask=mask_dn)
            for i in range(0, steps):
                t = start + i
                u = tl.load(u_ptrs + t * s_u_l, mask=mask_d, other=0.0).to(tl.float32)
                dt, dt_pre = _step_delta(dt_ptrs, t, s_dt_l, mask_d, bias, HAS_BIAS, SOFTPLUS)
                Bt = tl.load(B_ptrs + t * s_B_l, mask=mask_n, other=0.0).to(tl.float32)
                h = tl.exp(dt[:, None] * A) * h + (dt * u)[:, None] * Bt[None, :]
                tl.store(sc_ptrs + (i + 1) * s_sc_t, h, mask=mask_dn)
            tl.debug_barrier()

            dA_acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
            dD_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
            dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
            carry = tl.load(carry_ptr + ck_off, mask=mask_dn, other=0.0)  # exp(delta_{t+1} A) g_{t+1}
            # h is h_t on entry to each reverse step.
            for j in range(0, steps):
                i = steps - 1 - j
                t = start + i
                h_prev = tl.load(sc_ptrs + i * s_sc_t, mask=mask_dn, other=0.0)
                u = tl.load(u_ptrs + t * s_u_l, mask=mask_d, other=0.0).to(tl.float32)
                dt, dt_pre = _step_delta(dt_ptrs, t, s_dt_l, mask_d, bias, HAS_BIAS, SOFTPLUS)
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
            tl.store(dA_ptr + pid_b * s_dA_b + offs_d[:, None] * s_dA_d + c * s_dA_c + offs_n[None, :] * s_dA_n,
                     dA_acc, mask=mask_dn)
            dv_off = pid_b * s_dv_b + offs_d * s_dv_d + c * s_dv_c
            if HAS_D:
                tl.store(dD_ptr + dv_off, dD_acc, mask=mask_d)
            if HAS_BIAS:
                tl.store(dbias_ptr + dv_off, dbias_acc, mask=mask_d)
            tl.debug_barrier()  # the next tile's recompute overwrites the slot


def _check_runs(u: Tensor) -> None:
    reason = triton_unavailable_reason(u.device, u.dtype)
    if reason is not None:
        raise RuntimeError(f"scan impl 'triton_v1' cannot run: {reason}")


def _block_d(dim: int, block_d: int | None) -> int:
    """Channels per program: a power of two, DEFAULT_BLOCK_D or fewer for narrow inputs."""
    return block_d or min(DEFAULT_BLOCK_D, 1 << max(0, dim - 1).bit_length())


def pick_chunk(batch: int, dim: int, length: int, block_d: int | None = None) -> int:
    """Time steps per chunk: the longest of 256, 128, 64 that still gives `TARGET_PROGRAMS` programs
    (sequence x channel block x chunk), else 32. A function of the shapes alone, so the op's fake agrees."""
    rows = batch * -(-dim // _block_d(dim, block_d))
    for chunk in (256, 128, 64):
        if rows * -(-length // chunk) >= TARGET_PROGRAMS:
            return chunk
    return 32


def _meta(batch: int, dim: int, length: int, dstate: int, chunk_size: int | None,
          block_d: int | None) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_N, CHUNK): powers of two for the register tiles, CHUNK steps per chunk."""
    return (_block_d(dim, block_d), triton.next_power_of_2(dstate),
            chunk_size or pick_chunk(batch, dim, length, block_d))


def _num_chunks(length: int, chunk: int) -> int:
    return max(1, -(-length // chunk))


def _chunk_carries(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, z: Tensor | None, delta_bias: Tensor | None,
    delta_softplus: bool, dout: Tensor | None, n_chunks: int, BLOCK_D: int, BLOCK_N: int, CHUNK: int,
) -> Tensor:
    """Passes 1 and 2: the carry entering every chunk, (B, D, n_chunks, N) float32. Forward (dout None): the state
    before the chunk. Backward: exp(delta A) g from the step after the chunk's end."""
    batch, dim, length = u.shape
    dstate = A.shape[1]
    loc = torch.empty(batch, dim, n_chunks, dstate, device=u.device, dtype=torch.float32)  # (B, D, nc, N)
    dsum = torch.empty(batch, dim, n_chunks, device=u.device, dtype=torch.float32)  # (B, D, nc)
    z_ = z if z is not None else u
    dout_ = dout if dout is not None else u
    blocks = triton.cdiv(dim, BLOCK_D)
    _chunk_local_kernel[(batch, blocks, n_chunks)](
        u, delta, A, B, C, z_, delta_bias if delta_bias is not None else u, dout_, loc, dsum,
        dim, length, dstate,
        *u.stride(), *delta.stride(), *A.stride(), *B.stride(), *C.stride(), *z_.stride(), *dout_.stride(),
        *loc.stride(), *dsum.stride(),
        BACKWARD=dout is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
        SOFTPLUS=bool(delta_softplus), BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, CHUNK=CHUNK,
    )
    carry = torch.empty_like(loc)  # (B, D, nc, N)
    _chunk_combine_kernel[(batch, blocks)](
        A, loc, dsum, carry, dim, dstate, n_chunks, *A.stride(), *loc.stride(), *dsum.stride(),
        REVERSE=dout is not None, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
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
    *,
    chunk_size: int | None = None,
    block_d: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Runs the forward's three passes. Arguments as `selective_scan_reference`.

    Args:
        chunk_size: time steps per chunk (default `pick_chunk`).
        block_d: channels per program, a power of two (default up to 16).

    Returns:
        y (B, D, L) in `u.dtype`, and the float32 state before each chunk, (B, D, ceil(L / chunk), N).
    """
    _check_runs(u)
    batch, dim, length = u.shape
    dstate = A.shape[1]
    BLOCK_D, BLOCK_N, CHUNK = _meta(batch, dim, length, dstate, chunk_size, block_d)
    n_chunks = _num_chunks(length, CHUNK)
    ckpt = _chunk_carries(u, delta, A, B, C, z, delta_bias, delta_softplus, None, n_chunks, BLOCK_D, BLOCK_N, CHUNK)
    y = torch.empty(batch, dim, length, device=u.device, dtype=u.dtype)  # (B, D, L)
    z_ = z if z is not None else u
    _chunk_fwd_kernel[(batch, triton.cdiv(dim, BLOCK_D), n_chunks)](
        u, delta, A, B, C, D if D is not None else u, z_, delta_bias if delta_bias is not None else u, y, ckpt,
        dim, length, dstate,
        *u.stride(), *delta.stride(), *A.stride(), *B.stride(), *C.stride(), *z_.stride(), *y.stride(),
        *ckpt.stride(),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus),
        BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, CHUNK=CHUNK,
    )
    return y, ckpt


def _bwd_programs(n_tiles: int, device: torch.device) -> int:
    """Grid of the persistent backward pass: enough programs to fill the GPU, each with its own scratch slot."""
    if device.type == "cuda":
        return min(n_tiles, BWD_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count)
    return min(n_tiles, 4)  # the interpreter runs programs one after another


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
    """Runs the backward's three passes and sums their partials; `ckpt` is `scan_fwd`'s second output, made
    with the same `chunk_size` and `block_d`.

    Returns:
        (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) in the dtypes of their inputs, None where the input was None.
    """
    _check_runs(u)
    batch, dim, length = u.shape
    dstate = A.shape[1]
    BLOCK_D, BLOCK_N, CHUNK = _meta(batch, dim, length, dstate, chunk_size, block_d)
    n_chunks = _num_chunks(length, CHUNK)
    if ckpt.shape != (batch, dim, n_chunks, dstate):
        raise ValueError(f"ckpt has shape {tuple(ckpt.shape)}, expected {(batch, dim, n_chunks, dstate)}: "
                         "scan_fwd and scan_bwd need the same chunk_size and block_d")
    ckpt = ckpt.contiguous()
    carry = _chunk_carries(u, delta, A, B, C, z, delta_bias, delta_softplus, dout, n_chunks, BLOCK_D, BLOCK_N, CHUNK)
    blocks = triton.cdiv(dim, BLOCK_D)
    n_tiles = batch * blocks * n_chunks
    programs = _bwd_programs(n_tiles, u.device)
    dev, f32 = u.device, torch.float32
    du = torch.empty(batch, dim, length, device=dev, dtype=u.dtype)  # (B, D, L)
    ddelta = torch.empty(batch, dim, length, device=dev, dtype=delta.dtype)  # (B, D, L)
    dz = torch.empty(batch, dim, length, device=dev, dtype=z.dtype) if z is not None else du  # (B, D, L)
    scratch = torch.empty(programs, CHUNK + 1, BLOCK_D, BLOCK_N, device=dev, dtype=f32)  # (P, T + 1, BD, BN)
    dA_part = torch.empty(batch, dim, n_chunks, dstate, device=dev, dtype=f32)  # (B, D, nc, N)
    dvec_part = torch.empty(2, batch, dim, n_chunks, device=dev, dtype=f32)  # dD and d delta_bias, (2, B, D, nc)
    dBC_part = torch.empty(2, batch, blocks, length, dstate, device=dev, dtype=f32)  # (2, B, blocks, L, N)
    z_ = z if z is not None else u
    _chunk_bwd_kernel[(programs,)](
        u, delta, A, B, C, D if D is not None else u, z_, delta_bias if delta_bias is not None else u, dout, ckpt,
        carry, scratch, du, ddelta, dz, dA_part, dvec_part[0], dvec_part[1], dBC_part[0], dBC_part[1],
        dim, length, dstate, n_chunks, blocks, n_tiles,
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
        dA_part.sum((0, 2)).to(A.dtype),
        dB.to(B.dtype),
        dC.to(C.dtype),
        dvec_part[0].sum((0, 2)).to(D.dtype) if D is not None else None,
        dz if z is not None else None,
        dvec_part[1].sum((0, 2)).to(delta_bias.dtype) if delta_bias is not None else None,
    )


@torch.library.custom_op("mixerbench::selective_scan_triton_v1", mutates_args=())
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
    ckpt = u.new_empty(batch, dim, _num_chunks(length, pick_chunk(batch, dim, length)), A.shape[1],
                       dtype=torch.float32)
    return u.new_empty(u.shape), ckpt


@torch.library.custom_op("mixerbench::selective_scan_triton_v1_bwd", mutates_args=())
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
    du, ddelta, dA, dB, dC, dD, dz, dbias = torch.ops.mixerbench.selective_scan_triton_v1_bwd(
        dy, ckpt, u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus
    )
    has_D, has_z, has_bias = ctx.present
    return (du, ddelta, dA, dB, dC, dD if has_D else None, dz if has_z else None, dbias if has_bias else None, None)


_selective_scan_triton_op.register_autograd(_backward, setup_context=_setup_context)
