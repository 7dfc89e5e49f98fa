"""Cross-attention K/V written into an FP8 cache: cuBLAS's projection + one quantise pass (default),
or a Triton GEMM that quantises in its epilogue (A/B).

Each window's cross K/V (`cross_kv(audio_features)`, [B, 1500, 2 x d_model]) is computed once and
read on every decode step. The cache holds it as e4m3 [slots, heads, positions, head_dim] with one
fp32 scale per (slot, head, SCALE_TILE positions) [slots, heads, n_tiles].

Two kernels, one epilogue (`_quantize_store`):
- `_quant_tiles_kernel` (the path after cuBLAS, `weight=None`): a program takes one 128-position
  tile of HEADS heads of one window ([128, HEADS, head_dim] values, one 3-D load with the head dim
  contiguous), takes each head's amax in registers, scales, casts and stores the codes (each head's
  128 x head_dim codes are contiguous in the cache) and the HEADS scales. One read of the fp16
  projection, one write of the codes: no separate amax pass, no cross-program reduction.
- `_cross_kv_gemm_kernel`: a [128 positions x BLOCK_N] tile of the projection by tl.dot, then the same
  epilogue on the accumulator (BLOCK_N = NH whole heads). Slower than cuBLAS + the pass on the H200 as
  first written (157 against 584 TFLOP/s for the GEMM alone); kept behind
  `PrecisionConfig.cross_kv_epilogue` for A/B (docs/kernels-fp8.md).

What the first version got wrong on the GPU (docs/kernels-fp8.md, "Cross-attention K/V"): its store
offsets took the head from `(column % d_model) // head_dim` with d_model a runtime value, so Triton
could not prove the codes contiguous and stored every byte with its own instruction (64 one-byte
stores per thread, 253 GB/s for the quantise pass); here the head is a loop/program index and only the
head-dim offset varies along the contiguous axis. Per-element offsets are int32 within a tile, the
tile bases int64 (no int32 overflow however many slots).

Scale convention: `x ~= x_fp8 * scale`, scale = amax / 448 per (slot, head, tile), amax floored at
1e-12 (`attention.quantize_kv_tiles` is the reference; `attention.decode_attention` reads it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from cuda_ops._triton import HAVE_TRITON, jit, tl, triton, triton_usable
from cuda_ops.attention import FP8_DTYPE, SCALE_TILE, quantize_kv_tiles

if HAVE_TRITON:
    from cuda_ops.fp8 import _fp8_scales, _round_to_e4m3

# Quantise pass: heads per program (the largest of these dividing H) and warps. 2 heads x 128
# positions x 64 = 16k values a program, 64 per thread at 8 warps. To be swept on the H200
# (`benchmarks/bench_cross_kv.py`).
QUANT_HEADS = (2, 1)
QUANT_WARPS = 8
# GEMM with the epilogue (A/B only): the Triton tutorial's Hopper fp16 shapes at BLOCK_M = 128.
BLOCK_N = 128  # whole heads (2 of 64); must divide d_model, else one head per program
BLOCK_K = 64
NUM_WARPS = 8
NUM_STAGES = 3


def cross_kv_fp8_reference(x: Tensor, weight: Tensor | None, bias: Tensor | None, n_head: int):
    """(k_fp8, v_fp8 [B, H, T, Dh], k_scale, v_scale [B, H, ceil(T / SCALE_TILE)]) in fp32 math.

    With `weight`, x [B, T, K] is projected first (fp32, no intermediate rounding); without, x is
    the projection [B, T, 2 x d_model] itself.
    """
    y = x.float() if weight is None else x.float() @ weight.float().t()
    if weight is not None and bias is not None:
        y = y + bias.float()
    B, T, N = y.shape
    kv = y.reshape(B, T, 2, n_head, N // (2 * n_head)).permute(2, 0, 3, 1, 4)  # [2, B, H, T, Dh]
    (k, ks), (v, vs) = quantize_kv_tiles(kv[0]), quantize_kv_tiles(kv[1])
    return k, v, ks, vs


def write_cross_kv_fp8(x: Tensor, weight: Tensor | None, bias: Tensor | None, k_out: Tensor, v_out: Tensor,
                       k_scale_out: Tensor, v_scale_out: Tensor) -> None:
    """Write the FP8 cross K/V of x into (k_out, v_out [B, H, T, Dh] e4m3; scales [B, H, n_tiles]):
    the kernels on CUDA, the reference elsewhere. `weight=None`: x is the projection already."""
    if x.is_cuda and triton_usable(x.device):
        write_cross_kv_fp8_triton(x, weight, bias, k_out, v_out, k_scale_out, v_scale_out)
        return
    k, v, ks, vs = cross_kv_fp8_reference(x, weight, bias, k_out.shape[1])
    k_out.copy_(k), v_out.copy_(v), k_scale_out.copy_(ks), v_scale_out.copy_(vs)


def _check_outputs(B: int, T: int, k_out: Tensor, v_out: Tensor, k_scale_out: Tensor, v_scale_out: Tensor) -> None:
    _, H, _, Dh = k_out.shape
    if k_out.shape != (B, H, T, Dh) or v_out.shape != k_out.shape or k_out.stride() != v_out.stride():
        raise ValueError(f"k_out/v_out must be [{B}, H, {T}, Dh] with equal strides, got {tuple(k_out.shape)}")
    if k_out.dtype != FP8_DTYPE or v_out.dtype != FP8_DTYPE:
        raise ValueError("k_out and v_out must be float8_e4m3fn")
    if k_out.stride(3) != 1:
        raise ValueError("k_out/v_out must be contiguous along the head dim")
    tiles = -(-T // SCALE_TILE)
    for s in (k_scale_out, v_scale_out):
        if s.shape != (B, H, tiles) or s.dtype != torch.float32 or s.stride() != k_scale_out.stride():
            raise ValueError(f"scales must be float32 [{B}, {H}, {tiles}] with equal strides")
    if Dh not in (16, 32, 64, 128, 256):
        raise ValueError(f"head dim must be a power of two in [16, 256], got {Dh}")
    # int32 offsets inside a tile: SCALE_TILE rows of any of the tensors must stay below 2^31
    for t in (k_out, v_out):
        if SCALE_TILE * t.stride(2) + H * t.stride(1) >= 2**31:
            raise ValueError("cache strides too large for int32 offsets within a tile")


def write_cross_kv_fp8_triton(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, k_out: Tensor, v_out: Tensor,
    k_scale_out: Tensor, v_scale_out: Tensor, *,
    heads: int | None = None, block_n: int | None = None, block_k: int = BLOCK_K,
    num_warps: int | None = None, num_stages: int = NUM_STAGES,
) -> None:
    """The kernels on x's device (CUDA, or the CPU under TRITON_INTERPRET=1); launch overrides for
    benchmarks and tests (`heads`: heads per program of the quantise pass; `block_n`, `block_k`,
    `num_stages`: the GEMM's; `num_warps`: either's)."""
    B, T, K = x.shape
    _, H, _, Dh = k_out.shape
    d_model = H * Dh
    _check_outputs(B, T, k_out, v_out, k_scale_out, v_scale_out)
    tiles = -(-T // SCALE_TILE)
    if SCALE_TILE * abs(x.stride(1)) + K * abs(x.stride(2)) >= 2**31:
        raise ValueError("x strides too large for int32 offsets within a tile")
    soft = not x.is_cuda  # the interpreter's fp8 cast needs rounding first (fp8._round_to_e4m3)
    if weight is None:
        if K != 2 * d_model:
            raise ValueError(f"the projection must have 2 x d_model = {2 * d_model} columns, got {K}")
        if heads is None:
            heads = next(n for n in QUANT_HEADS if H % n == 0)
        if H % heads or heads & (heads - 1):
            raise ValueError(f"heads per program must be a power of two dividing H={H}, got {heads}")
        _quant_tiles_kernel[(2 * H // heads, B * tiles)](
            x, k_out, v_out, k_scale_out, v_scale_out, T, tiles, H,
            x.stride(0), x.stride(1), x.stride(2),
            k_out.stride(0), k_out.stride(1), k_out.stride(2),
            k_scale_out.stride(0), k_scale_out.stride(1), k_scale_out.stride(2),
            SOFT_ROUND=soft, BLOCK_M=SCALE_TILE, HEADS=heads, HEAD_DIM=Dh,
            num_warps=num_warps or QUANT_WARPS,
        )  # fmt: skip
        return
    if weight.shape != (2 * d_model, K) or K % block_k:
        raise ValueError(f"weight must be [{2 * d_model}, K] with K % {block_k} == 0, got {tuple(weight.shape)}")
    block_n = block_n or BLOCK_N
    if block_n % Dh or d_model % block_n:
        block_n = Dh  # a block never straddles K and V, and covers whole heads
    _cross_kv_gemm_kernel[(2 * d_model // block_n, B * tiles)](
        x, weight, bias if bias is not None else x, k_out, v_out, k_scale_out, v_scale_out,
        T, K, H, tiles,
        x.stride(0), x.stride(1), x.stride(2), weight.stride(0), weight.stride(1),
        k_out.stride(0), k_out.stride(1), k_out.stride(2),
        k_scale_out.stride(0), k_scale_out.stride(1), k_scale_out.stride(2),
        HAS_BIAS=bias is not None, SOFT_ROUND=soft,
        BLOCK_M=SCALE_TILE, BLOCK_N=block_n, BLOCK_K=block_k, HEAD_DIM=Dh,
        num_warps=num_warps or NUM_WARPS, num_stages=num_stages,
    )  # fmt: skip


@jit
def _quantize_store(x, row_ok, head0, b, tile, t0, is_v, k_ptr, v_ptr, ks_ptr, vs_ptr,
                    stride_cs, stride_ch, stride_ct, stride_ss, stride_sh, stride_st,
                    SOFT_ROUND: tl.constexpr, BLOCK_M: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """x [BLOCK_M, HEADS, HEAD_DIM] fp32 (positions t0.., heads head0.., of K or V) -> e4m3 codes and
    one scale per head into the cache of window (slot) b; rows past T (row_ok False) are left out of
    the amax and not stored."""
    x = tl.where(row_ok[:, None, None], x, 0.0)  # the GEMM's padding rows hold the bias
    amax = tl.max(tl.max(tl.abs(x), axis=2), axis=0)  # [HEADS]
    scale, inv = _fp8_scales(amax)
    q = x * inv[None, :, None]
    q = tl.where(q > 448.0, 448.0, tl.where(q < -448.0, -448.0, q))  # compare+select keeps NaN
    if SOFT_ROUND:
        q = _round_to_e4m3(q)
    q = q.to(tl.float8e4nv)
    rows = tl.arange(0, BLOCK_M)
    hh = tl.arange(0, HEADS)
    d = tl.arange(0, HEAD_DIM)
    # int64 base of the tile, int32 offsets inside it; the head dim is the contiguous axis
    base = b.to(tl.int64) * stride_cs + head0.to(tl.int64) * stride_ch + t0.to(tl.int64) * stride_ct
    off = rows[:, None, None] * stride_ct + hh[None, :, None] * stride_ch + d[None, None, :]
    s_off = b.to(tl.int64) * stride_ss + (head0 + hh) * stride_sh + tile * stride_st
    mask = row_ok[:, None, None]
    if is_v:
        tl.store(v_ptr + base + off, q, mask=mask)
        tl.store(vs_ptr + s_off, scale)
    else:
        tl.store(k_ptr + base + off, q, mask=mask)
        tl.store(ks_ptr + s_off, scale)


@jit
def _quant_tiles_kernel(
    y_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, T, n_tiles, H,
    stride_yb, stride_yt, stride_yn,
    stride_cs, stride_ch, stride_ct,  # the K and V caches (equal strides, head dim contiguous)
    stride_ss, stride_sh, stride_st,  # the scales [B, H, n_tiles]
    SOFT_ROUND: tl.constexpr, BLOCK_M: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    # Axis 0 walks the heads of one tile (K's, then V's), so programs launched together read
    # neighbouring columns of the same rows.
    g = tl.program_id(0) * HEADS  # first of this program's heads among the 2H of the projection
    pid_m = tl.program_id(1)
    b = pid_m // n_tiles
    tile = pid_m % n_tiles
    t0 = tile * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    row_ok = t0 + rows < T
    cols = tl.arange(0, HEADS)[None, :, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, None, :]
    src = y_ptr + b.to(tl.int64) * stride_yb + t0.to(tl.int64) * stride_yt + g.to(tl.int64) * HEAD_DIM * stride_yn
    x = tl.load(src + rows[:, None, None] * stride_yt + cols * stride_yn, mask=row_ok[:, None, None], other=0.0)
    is_v = g >= H
    head0 = tl.where(is_v, g - H, g)
    _quantize_store(x.to(tl.float32), row_ok, head0, b, tile, t0, is_v, k_ptr, v_ptr, ks_ptr, vs_ptr,
                    stride_cs, stride_ch, stride_ct, stride_ss, stride_sh, stride_st,
                    SOFT_ROUND, BLOCK_M, HEADS, HEAD_DIM)  # fmt: skip


@jit
def _cross_kv_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr,
    T, K, H, n_tiles,
    stride_xb, stride_xt, stride_xk, stride_wn, stride_wk,
    stride_cs, stride_ch, stride_ct,
    stride_ss, stride_sh, stride_st,
    HAS_BIAS: tl.constexpr, SOFT_ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    # Axis 0 walks the output columns, so programs launched together share one x tile (L2); the
    # weight (2 x d_model x K, 6.5 MB at large-v3) stays in L2 for the whole launch.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = pid_m // n_tiles
    tile = pid_m % n_tiles
    t0 = tile * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    row_ok = t0 + rows < T
    n0 = pid_n * BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + b.to(tl.int64) * stride_xb + t0.to(tl.int64) * stride_xt + rows[:, None] * stride_xt
    w_ptrs = w_ptr + n0.to(tl.int64) * stride_wn + offs_n[:, None] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs + (k0 + offs_k)[None, :] * stride_xk, mask=row_ok[:, None], other=0.0)
        w = tl.load(w_ptrs + (k0 + offs_k)[None, :] * stride_wk)
        acc = tl.dot(a, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n0 + offs_n).to(tl.float32)[None, :]
    NH: tl.constexpr = BLOCK_N // HEAD_DIM
    g = n0 // HEAD_DIM  # first head of the block among the 2H
    is_v = g >= H
    head0 = tl.where(is_v, g - H, g)
    _quantize_store(tl.reshape(acc, (BLOCK_M, NH, HEAD_DIM)), row_ok, head0, b, tile, t0, is_v,
                    k_ptr, v_ptr, ks_ptr, vs_ptr, stride_cs, stride_ch, stride_ct, stride_ss, stride_sh, stride_st,
                    SOFT_ROUND, BLOCK_M, NH, HEAD_DIM)  # fmt: skip
