"""New self-attention K and V written into the slot cache, both in one kernel.

Each decoder layer of a step writes its tokens' K and V at (row, position) of its slots' cache. As
two PyTorch index assignments (`cache[rows, :, positions] = k.transpose(1, 2)`) that is two launches
of the generic index kernel per layer, which read the strided head-split views one element at a time:
0.124 s of a 2.6-s run of 256 large-v3 windows on the H200 (64 launches a step, ~17 µs each for
0.66 MB: ~40 GB/s; `profile_engine.py`, session 13). Here one program per token reads its K and V
rows (all heads, contiguous in the QKV projection's output) and stores each head's Dh values
contiguously at its cache position: one launch per layer, vector loads and stores.

`write_kv` dispatches: the kernel on CUDA, the index assignment (the reference) elsewhere;
`write_kv_triton` runs the kernel on any device (the CPU under TRITON_INTERPRET=1, for the tests).
"""

from __future__ import annotations

import torch
from torch import Tensor

from cuda_ops._triton import jit, tl, triton, triton_usable


def write_kv_reference(k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, rows: Tensor, positions: Tensor) -> None:
    """k, v [B, T, H, Dh] (any strides) into cache_k/v [S, H, Tctx, Dh] at (rows[b, t], :, positions[b, t])."""
    cache_k[rows, :, positions] = k
    cache_v[rows, :, positions] = v


def write_kv(k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, rows: Tensor, positions: Tensor) -> None:
    """The kernel on CUDA, the reference elsewhere (same arguments as `write_kv_reference`)."""
    if k.is_cuda and triton_usable(k.device):
        write_kv_triton(k, v, cache_k, cache_v, rows, positions)
    else:
        write_kv_reference(k, v, cache_k, cache_v, rows, positions)


def write_kv_triton(k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, rows: Tensor, positions: Tensor) -> None:
    B, T, H, Dh = k.shape
    if v.shape != k.shape or cache_k.shape != cache_v.shape or cache_k.shape[1] != H or cache_k.shape[3] != Dh:
        raise ValueError(f"k, v [B, T, H, Dh] and caches [S, H, Tctx, Dh] disagree: {tuple(k.shape)}, {tuple(cache_k.shape)}")
    if k.stride(3) != 1 or v.stride(3) != 1 or cache_k.stride(3) != 1 or cache_v.stride(3) != 1:
        raise ValueError("k, v and the caches must be contiguous along the head dim")
    if rows.shape != (B, T) or positions.shape != (B, T):
        raise ValueError(f"rows and positions must be [{B}, {T}], got {tuple(rows.shape)}, {tuple(positions.shape)}")
    _write_kv_kernel[(B * T,)](
        k, v, cache_k, cache_v, rows, positions, T,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        rows.stride(0), rows.stride(1), positions.stride(0), positions.stride(1),
        H=H, BLOCK_H=triton.next_power_of_2(H), HEAD_DIM=Dh, num_warps=4,
    )  # fmt: skip


@jit
def _write_kv_kernel(
    k_ptr, v_ptr, ck_ptr, cv_ptr, rows_ptr, pos_ptr, T,
    s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
    s_cks, s_ckh, s_ckt, s_cvs, s_cvh, s_cvt,
    s_rb, s_rt, s_pb, s_pt,
    H: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)  # b * T + t
    b = pid // T
    t = pid % T
    row = tl.load(rows_ptr + b * s_rb + t * s_rt).to(tl.int64)
    pos = tl.load(pos_ptr + b * s_pb + t * s_pt).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, HEAD_DIM)[None, :]
    mask = h < H
    kv = tl.load(k_ptr + b.to(tl.int64) * s_kb + t * s_kt + h * s_kh + d, mask=mask)
    tl.store(ck_ptr + row * s_cks + pos * s_ckt + h * s_ckh + d, kv, mask=mask)
    vv = tl.load(v_ptr + b.to(tl.int64) * s_vb + t * s_vt + h * s_vh + d, mask=mask)
    tl.store(cv_ptr + row * s_cvs + pos * s_cvt + h * s_cvh + d, vv, mask=mask)
