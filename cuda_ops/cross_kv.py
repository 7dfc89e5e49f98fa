"""Cross-attention K/V written straight into an FP8 cache, quantised in the projection's epilogue.

Each window's cross K/V (`cross_kv(audio_features)`, [B, 1500, 2 x d_model]) is computed once and
read on every decode step. Quantising it with torch ops (amax, divide, clamp, cast: `quantize_kv`)
cost several extra passes over the largest tensor of an admission, which made mixed_fp8's admission
slower than fp16's (docs/benchmarks.md, issue 15). Here one Triton GEMM computes a
[SCALE_TILE positions x BLOCK_N] tile of the projection, and its epilogue takes each head's amax over
the tile (SCALE_TILE x head_dim values, all in the program's registers: no cross-program reduction),
writes the tile as e4m3 into the cache layout [slots, heads, positions, head_dim] and its scale into
[slots, heads, positions / SCALE_TILE]. The fp16 projection never reaches memory.

The same kernel without the GEMM (`GEMM=False`) quantises an already computed projection in one
read and one write (for an FP8 `cross_kv` linear, or to A/B against cuBLAS's GEMM).

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

# Launch (BLOCK_M is SCALE_TILE: a program's rows are one scale tile of one window). Defaults are
# the Triton matmul tutorial's Hopper shape for fp16 at this tile height; to be swept on the H200
# (`benchmarks/bench_fp8.py --cross-kv`).
BLOCK_N = 128  # two heads of 64; must be a multiple of head_dim dividing d_model (else head_dim)
BLOCK_K = 64
NUM_WARPS = 8
NUM_STAGES = 3
QUANT_BLOCK_N = 64  # quantise-only launch: one head per program, 4 warps
QUANT_WARPS = 4


def cross_kv_fp8_reference(x: Tensor, weight: Tensor | None, bias: Tensor | None, n_head: int):
    """(k_fp8, v_fp8 [B, H, T, Dh], k_scale, v_scale [B, H, ceil(T / SCALE_TILE)]) in fp32 math.

    With `weight`, x [B, T, K] is projected first (fp32, no intermediate rounding); without, x is
    the projection [B, T, 2 x d_model] itself.
    """
    y = x.float() if weight is None else x.float() @ weight.float().t()
    if weight is not None and bias is not None:
        y = y + bias.float()
    B, T, N = y.shape
    kv = y.view(B, T, 2, n_head, N // (2 * n_head)).permute(2, 0, 3, 1, 4)  # [2, B, H, T, Dh]
    (k, ks), (v, vs) = quantize_kv_tiles(kv[0]), quantize_kv_tiles(kv[1])
    return k, v, ks, vs


def write_cross_kv_fp8(x: Tensor, weight: Tensor | None, bias: Tensor | None, k_out: Tensor, v_out: Tensor,
                       k_scale_out: Tensor, v_scale_out: Tensor) -> None:
    """Write the FP8 cross K/V of x into (k_out, v_out [B, H, T, Dh] e4m3; scales [B, H, n_tiles]):
    the kernel on CUDA, the reference elsewhere. `weight=None`: x is the projection already."""
    if x.is_cuda and triton_usable(x.device):
        write_cross_kv_fp8_triton(x, weight, bias, k_out, v_out, k_scale_out, v_scale_out)
        return
    k, v, ks, vs = cross_kv_fp8_reference(x, weight, bias, k_out.shape[1])
    k_out.copy_(k), v_out.copy_(v), k_scale_out.copy_(ks), v_scale_out.copy_(vs)


def write_cross_kv_fp8_triton(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, k_out: Tensor, v_out: Tensor,
    k_scale_out: Tensor, v_scale_out: Tensor, *,
    block_n: int | None = None, block_k: int = BLOCK_K, num_warps: int | None = None, num_stages: int = NUM_STAGES,
) -> None:
    """The kernel on x's device (CUDA, or the CPU under TRITON_INTERPRET=1); launch overrides for
    benchmarks and tests."""
    B, T, K = x.shape
    _, H, Tc, Dh = k_out.shape
    d_model = H * Dh
    gemm = weight is not None
    if k_out.shape != (B, H, T, Dh) or v_out.shape != k_out.shape or k_out.stride() != v_out.stride():
        raise ValueError(f"k_out/v_out must be [{B}, H, {T}, Dh] with equal strides, got {tuple(k_out.shape)}")
    if k_out.dtype != FP8_DTYPE or v_out.dtype != FP8_DTYPE:
        raise ValueError("k_out and v_out must be float8_e4m3fn")
    tiles = -(-T // SCALE_TILE)
    for s in (k_scale_out, v_scale_out):
        if s.shape != (B, H, tiles) or s.dtype != torch.float32 or s.stride(2) != 1 or s.stride() != k_scale_out.stride():
            raise ValueError(f"scales must be float32 [{B}, {H}, {tiles}], contiguous along tiles, equal strides")
    if gemm and (weight.shape != (2 * d_model, K) or K % block_k):
        raise ValueError(f"weight must be [{2 * d_model}, K] with K % {block_k} == 0, got {tuple(weight.shape)}")
    if not gemm and K != 2 * d_model:
        raise ValueError(f"the projection must have 2 x d_model = {2 * d_model} columns, got {K}")
    if Dh not in (16, 32, 64, 128, 256):
        raise ValueError(f"head dim must be a power of two in [16, 256], got {Dh}")
    block_n = block_n or (BLOCK_N if gemm else QUANT_BLOCK_N)
    if block_n % Dh or d_model % block_n:
        block_n = Dh  # a block never straddles K and V, and covers whole heads
    if num_warps is None:
        num_warps = NUM_WARPS if gemm else QUANT_WARPS
    w = weight if gemm else x  # placeholder, never read without the GEMM
    _cross_kv_kernel[(2 * d_model // block_n, B * tiles)](
        x, w, bias if (gemm and bias is not None) else x, k_out, v_out, k_scale_out, v_scale_out,
        T, K, d_model, tiles,
        x.stride(0), x.stride(1), x.stride(2), w.stride(0), w.stride(1),
        k_out.stride(0), k_out.stride(1), k_out.stride(2), k_out.stride(3),
        k_scale_out.stride(0), k_scale_out.stride(1),
        GEMM=gemm, HAS_BIAS=gemm and bias is not None, SOFT_ROUND=not x.is_cuda,
        BLOCK_M=SCALE_TILE, BLOCK_N=block_n, BLOCK_K=block_k, HEAD_DIM=Dh,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip


@jit
def _cross_kv_kernel(
    x_ptr, w_ptr, bias_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr,
    T, K, D_MODEL, n_tiles,
    stride_xb, stride_xt, stride_xk, stride_wn, stride_wk,
    stride_cs, stride_ch, stride_ct, stride_cd,  # the K and V caches (equal strides)
    stride_ss, stride_sh,  # the scales [B, H, n_tiles], tiles contiguous
    GEMM: tl.constexpr, HAS_BIAS: tl.constexpr, SOFT_ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    # Axis 0 walks the output columns, so programs launched together share one x tile (L2); the
    # weight (2 x d_model x K, 6.5 MB at large-v3) stays in L2 for the whole launch.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = (pid_m // n_tiles).to(tl.int64)
    tile = pid_m % n_tiles
    offs_t = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_t = offs_t < T
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)  # column of the projection, [0, 2 x d_model)
    x_rows = x_ptr + b * stride_xb + offs_t[:, None] * stride_xt
    if GEMM:
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(x_rows + (k0 + offs_k)[None, :] * stride_xk, mask=mask_t[:, None], other=0.0)
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k0 + offs_k)[None, :] * stride_wk)
            acc = tl.dot(a, tl.trans(w), acc)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n).to(tl.float32)[None, :]
    else:
        acc = tl.load(x_rows + offs_n[None, :] * stride_xk, mask=mask_t[:, None], other=0.0).to(tl.float32)

    # Per-head amax over the tile's valid rows (padding rows hold the bias: kept out). A block holds
    # BLOCK_N / HEAD_DIM heads: column maxima, then one masked max per head.
    col_max = tl.max(tl.where(mask_t[:, None], tl.abs(acc), 0.0), axis=0)  # [BLOCK_N]
    local = tl.arange(0, BLOCK_N) // HEAD_DIM
    head_max = col_max
    for j in tl.static_range(BLOCK_N // HEAD_DIM):
        m_j = tl.max(tl.where(local == j, col_max, 0.0), axis=0)
        head_max = tl.where(local == j, m_j, head_max)
    scale, inv = _fp8_scales(head_max)  # per column, equal within a head
    q = acc * inv[None, :]
    q = tl.where(q > 448.0, 448.0, tl.where(q < -448.0, -448.0, q))  # compare+select keeps NaN
    if SOFT_ROUND:
        q = _round_to_e4m3(q)
    q = q.to(tl.float8e4nv)

    head = (offs_n % D_MODEL) // HEAD_DIM
    d = offs_n % HEAD_DIM
    c_off = b * stride_cs + head[None, :] * stride_ch + offs_t[:, None] * stride_ct + d[None, :] * stride_cd
    s_off = b * stride_ss + head * stride_sh + tile
    first = d == 0  # one scale store per head
    if n0 < D_MODEL:
        tl.store(k_ptr + c_off, q, mask=mask_t[:, None])
        tl.store(ks_ptr + s_off, scale, mask=first)
    else:
        tl.store(v_ptr + c_off, q, mask=mask_t[:, None])
        tl.store(vs_ptr + s_off, scale, mask=first)
