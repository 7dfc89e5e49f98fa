"""Cross-attention K/V in 4 bits: the cache format, its writer and the decode attention over it.

A decode step at many windows is bound by reading every window's cross K/V (large-v3, 256 windows,
FP8: 7.4 ms of a 9.0-ms step floor on an H200, the attention kernel at 94 % of copy bandwidth). Four
bits halve that read again. The format follows what KV-cache quantisation work found for keys and
values (keys have outlier channels, values outlier tokens):

- K: a symmetric 4-bit code per value with one scale per (slot, head, SCALE_TILE positions, channel):
  per channel, so an outlier channel does not flatten the others; per 128 positions, so the kernel
  folds the tile's scales into q once per tile, not per position.
- V: a symmetric 4-bit code per value with one scale per (slot, head, position): the kernel folds it
  into the softmax weight p of that position.
- Codes are q + 8 in [1, 15] (q in [-7, 7]); byte j of a row holds channel j in its low nibble and
  channel j + D/2 in its high nibble, so the kernel unpacks each half of the head dim with one mask
  or shift and never interleaves (q . k is the sum of the two halves' products).
- Scales are fp16 (a third of the bytes of fp32 at V's one scale per 64 values), floored at 2^-14
  (fp16's smallest normal): a channel or token below 7 x 2^-14 in magnitude codes as zeros.

Bytes per head and position, K and V: 64 codes + 2 (K scales over 128 positions) + 2 (V scale) = 68
against 128 + 0.06 for FP8 (0.53x). WER with tiny.en and base, the cache quantised this way
(CPU, `fast` long-form on five English and two messy es/fr recordings; H200, 41 clips): as FP8's.

Status: the cache of the mixed_fp8 preset since session 15, read by the v2 kernel. The v1 kernel below
is bound by instructions, not bytes: 0.54-0.71x the FP8 tile kernel's speed at B >= 32 on the H200
(docs/benchmarks.md, session 13). A position costs ~1,000 thread-instructions here against FP8's 736,
and both issue ~21 T/s; to pay, under ~350 (packed fp16x2 unpacking into tensor-core products).
Issue 15's v2 kernel (below: `decode_attention_int4_v2_triton`, STREAMER_INT4_ATTN_KERNEL=v2) does the
arithmetic on fp16x2 pairs in the codes' own bits: 304 thread-instructions a position in its loop
compiled for sm_90 here (+20 for its per-tile prologue; on the H200 1.18 / 1.31 / 1.48x FP8 v7's speed at
B = 32 / 128 / 256, 1.00x at 8), against v1's 948 and FP8 v7's 736 counted the same way (benchmarks/int4_sass.py; docs/notes/int4_15.md;
timings: docs/benchmarks.md, session 15).

Each kernel has a pure-PyTorch reference; the dispatchers use the kernels on CUDA and the references
elsewhere. Under TRITON_INTERPRET=1 the `*_triton` launchers run on the CPU (the tests).
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from cuda_ops._triton import interpreter_active, jit, num_sms, tl, triton, triton_usable
from cuda_ops.attention import SCALE_TILE, WAVES_FP8, _decode_reduce_kernel, auto_fp8_tile_splits

QMAX = 7  # symmetric codes in [-7, 7]
OFFSET = 8  # stored as q + 8 in a nibble
SCALE_FLOOR = 2.0**-14  # fp16's smallest normal
# The decode kernel's launch: positions per loop step (divides SCALE_TILE), warps, cp.async stages of
# the loop (as attention.py's v7). STREAMER_INT4_ATTN_LAUNCH="64x4x3" overrides (the sweep:
# benchmarks/sweep_int4_attention.py).
BLOCK_T, NUM_WARPS, STAGES = (int(x) for x in os.environ.get("STREAMER_INT4_ATTN_LAUNCH", "64x4x3").split("x"))
WRITE_WARPS = 4


# ---- the format (references) ------------------------------------------------------------------

def _pack(q: Tensor) -> Tensor:
    """Integer codes [..., D] in [-7, 7] -> uint8 [..., D/2] (channel j low nibble, j + D/2 high)."""
    half = q.shape[-1] // 2
    lo, hi = (q[..., :half] + OFFSET).to(torch.uint8), (q[..., half:] + OFFSET).to(torch.uint8)
    return lo | (hi << 4)


def _unpack(codes: Tensor) -> Tensor:
    """uint8 [..., D/2] -> float32 codes [..., D] in [-7, 7]."""
    lo = (codes & 15).float() - OFFSET
    hi = (codes >> 4).float() - OFFSET
    return torch.cat([lo, hi], dim=-1)


def _scale(amax: Tensor) -> Tensor:
    """fp16 scale of a group whose largest magnitude is amax (float32): a true divide, as the
    kernel's div_rn (PyTorch divides by a Python scalar through its reciprocal)."""
    return (amax / torch.full_like(amax, QMAX)).clamp_min(SCALE_FLOOR).to(torch.float16)


def _codes(x: Tensor, scale: Tensor) -> Tensor:
    """round-half-up(x / scale) clamped to [-7, 7], scale broadcast to x (as the kernel does)."""
    return torch.floor(x / scale.float() + 0.5).clamp(-QMAX, QMAX)


def quantize_k(k: Tensor) -> tuple[Tensor, Tensor]:
    """K [B, H, T, D] -> (codes uint8 [B, H, T, D/2], scale fp16 [B, H, ceil(T / SCALE_TILE), D])."""
    B, H, T, D = k.shape
    nt = -(-T // SCALE_TILE)
    kf = torch.nn.functional.pad(k.float(), (0, 0, 0, nt * SCALE_TILE - T)).view(B, H, nt, SCALE_TILE, D)
    scale = _scale(kf.abs().amax(dim=3))  # [B, H, nt, D]; zero padding does not move the amax
    q = _codes(kf, scale[:, :, :, None, :]).view(B, H, nt * SCALE_TILE, D)[:, :, :T]
    return _pack(q.to(torch.int32)).contiguous(), scale


def quantize_v(v: Tensor) -> tuple[Tensor, Tensor]:
    """V [B, H, T, D] -> (codes uint8 [B, H, T, D/2], scale fp16 [B, H, T])."""
    vf = v.float()
    scale = _scale(vf.abs().amax(dim=-1))
    return _pack(_codes(vf, scale[..., None]).to(torch.int32)).contiguous(), scale


def dequantize_k(codes: Tensor, scale: Tensor) -> Tensor:
    """Inverse of quantize_k, float32 [S, H, T, D]."""
    T = codes.shape[2]
    return _unpack(codes) * scale.float().repeat_interleave(SCALE_TILE, dim=2)[:, :, :T]


def dequantize_v(codes: Tensor, scale: Tensor) -> Tensor:
    """Inverse of quantize_v, float32 [S, H, T, D]."""
    return _unpack(codes) * scale.float()[..., None]


def cross_kv_int4_reference(y: Tensor, n_head: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The projection y [B, T, 2 x d_model] (K columns, then V) -> (k codes, v codes, k scale, v scale)."""
    B, T, N = y.shape
    kv = y.float().reshape(B, T, 2, n_head, N // (2 * n_head)).permute(2, 0, 3, 1, 4)  # [2, B, H, T, Dh]
    (kc, ks), (vc, vs) = quantize_k(kv[0]), quantize_v(kv[1])
    return kc, vc, ks, vs


def decode_attention_int4_reference(q: Tensor, k_codes: Tensor, v_codes: Tensor, k_scale: Tensor, v_scale: Tensor,
                                    slot_ids: Tensor | None = None, sm_scale: float | None = None) -> Tensor:
    """fp32 attention of q [B, H, D] over every position of its slot's 4-bit cross K/V -> [B, H, D]."""
    _check(q, k_codes, v_codes, k_scale, v_scale, slot_ids)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    k, v = dequantize_k(k_codes, k_scale), dequantize_v(v_codes, v_scale)
    if slot_ids is not None:
        k, v = k[slot_ids.long()], v[slot_ids.long()]
    probs = torch.softmax(torch.einsum("bhd,bhtd->bht", q.float(), k) * sm_scale, dim=-1)
    return torch.einsum("bht,bhtd->bhd", probs, v).to(q.dtype)


def _check(q: Tensor, kc: Tensor, vc: Tensor, ks: Tensor, vs: Tensor, slot_ids: Tensor | None) -> None:
    """Fail loudly on shapes and dtypes that the kernels would misread."""
    B, H, D = q.shape
    S, Hk, T, half = kc.shape
    if (Hk, 2 * half) != (H, D) or vc.shape != kc.shape or kc.dtype != torch.uint8 or vc.dtype != torch.uint8:
        raise ValueError(f"need uint8 codes [S, {H}, T, {D // 2}] for q {tuple(q.shape)}, got {tuple(kc.shape)}")
    if ks.shape != (S, H, -(-T // SCALE_TILE), D) or vs.shape != (S, H, T) or ks.dtype != torch.float16 \
            or vs.dtype != torch.float16:
        raise ValueError(f"need fp16 scales K [S, H, tiles, D] and V [S, H, T], got {tuple(ks.shape)}, {tuple(vs.shape)}")
    if slot_ids is None and S != B:
        raise ValueError(f"without slot_ids the cache must have B={B} rows, got {S}")
    if slot_ids is not None and (slot_ids.shape != (B,) or slot_ids.dtype != torch.int32):
        raise ValueError(f"slot_ids must be int32 [{B}], got {slot_ids.dtype} {tuple(slot_ids.shape)}")
    for t in (kc, vc, ks, vs):
        if t.stride(-1) != 1:
            raise ValueError("codes and scales must be contiguous along their last dim")


# ---- writing the cache ------------------------------------------------------------------------

def write_cross_kv_int4(y: Tensor, k_out: Tensor, v_out: Tensor, k_scale_out: Tensor, v_scale_out: Tensor) -> None:
    """Quantise the projection y [B, T, 2 x d_model] into a 4-bit cross cache's slots (codes
    [B, H, T, D/2], scales [B, H, tiles, D] and [B, H, T]): the kernel on CUDA, else the reference."""
    if y.is_cuda and triton_usable(y.device):
        write_cross_kv_int4_triton(y, k_out, v_out, k_scale_out, v_scale_out)
        return
    kc, vc, ks, vs = cross_kv_int4_reference(y, k_out.shape[1])
    k_out.copy_(kc), v_out.copy_(vc), k_scale_out.copy_(ks), v_scale_out.copy_(vs)


def write_cross_kv_int4_triton(y: Tensor, k_out: Tensor, v_out: Tensor, k_scale_out: Tensor, v_scale_out: Tensor,
                               num_warps: int = WRITE_WARPS) -> None:
    """The writer kernel on y's device: one program per (head of K or V, window, 128-position tile)
    reads the tile once and writes its codes and scales."""
    B, T, N = y.shape
    _, H, _, half = k_out.shape
    D = 2 * half
    if N != 2 * H * D or y.stride(2) != 1:
        raise ValueError(f"y must be [B, T, {2 * H * D}] with contiguous columns, got {tuple(y.shape)}")
    if k_out.stride() != v_out.stride() or k_out.stride(3) != 1 or k_scale_out.stride(3) != 1 or v_scale_out.stride(2) != 1:
        raise ValueError("the K and V codes must share strides, contiguous along the last dim (scales too)")
    tiles = -(-T // SCALE_TILE)
    _write_int4_kernel[(2 * H, B * tiles)](
        y, k_out, v_out, k_scale_out, v_scale_out, T, tiles, H,
        y.stride(0), y.stride(1), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        k_scale_out.stride(0), k_scale_out.stride(1), k_scale_out.stride(2),
        v_scale_out.stride(0), v_scale_out.stride(1),
        BLOCK_M=SCALE_TILE, HALF=half, num_warps=num_warps,
    )  # fmt: skip


@jit
def _nibbles(x, scale):
    """round-half-up(x / scale) clamped to [-7, 7], + 8, as uint8 (scale broadcast to x)."""
    q = tl.floor(tl.div_rn(x, scale) + 0.5)
    q = tl.minimum(tl.maximum(q, -7.0), 7.0) + 8.0
    return q.to(tl.uint8)


@jit
def _write_int4_kernel(
    y_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, T, n_tiles, H,
    stride_yb, stride_yt, stride_cs, stride_ch, stride_ct,
    stride_kss, stride_ksh, stride_kst, stride_vss, stride_vsh,
    BLOCK_M: tl.constexpr, HALF: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(0)  # head among the 2H columns groups of y: K's heads, then V's
    pid = tl.program_id(1)
    b = (pid // n_tiles).to(tl.int64)
    tile = pid % n_tiles
    t0 = tile * BLOCK_M
    rows = t0 + tl.arange(0, BLOCK_M)
    row_ok = rows < T
    d = tl.arange(0, HALF)
    src = y_ptr + b * stride_yb + rows[:, None].to(tl.int64) * stride_yt + g * (2 * HALF)
    lo = tl.load(src + d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    hi = tl.load(src + HALF + d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    is_v = g >= H
    h = tl.where(is_v, g - H, g)
    dst = b * stride_cs + h.to(tl.int64) * stride_ch + rows[:, None].to(tl.int64) * stride_ct + d[None, :]
    if is_v:  # one scale per position
        amax = tl.maximum(tl.max(tl.abs(lo), axis=1), tl.max(tl.abs(hi), axis=1))
        scale = tl.maximum(tl.div_rn(amax, 7.0), 6.103515625e-05).to(tl.float16).to(tl.float32)  # SCALE_FLOOR
        packed = _nibbles(lo, scale[:, None]) | (_nibbles(hi, scale[:, None]) << 4)
        tl.store(v_ptr + dst, packed, mask=row_ok[:, None])
        tl.store(vs_ptr + b * stride_vss + h * stride_vsh + rows, scale.to(tl.float16), mask=row_ok)
    else:  # one scale per channel over the tile's positions
        s_lo = tl.maximum(tl.div_rn(tl.max(tl.abs(lo), axis=0), 7.0), 6.103515625e-05).to(tl.float16).to(tl.float32)
        s_hi = tl.maximum(tl.div_rn(tl.max(tl.abs(hi), axis=0), 7.0), 6.103515625e-05).to(tl.float16).to(tl.float32)
        packed = _nibbles(lo, s_lo[None, :]) | (_nibbles(hi, s_hi[None, :]) << 4)
        tl.store(k_ptr + dst, packed, mask=row_ok[:, None])
        s_base = ks_ptr + b * stride_kss + h * stride_ksh + tile * stride_kst
        tl.store(s_base + d, s_lo.to(tl.float16))
        tl.store(s_base + HALF + d, s_hi.to(tl.float16))


# ---- decode attention over the cache ----------------------------------------------------------

def decode_attention_int4(q: Tensor, k_codes: Tensor, v_codes: Tensor, k_scale: Tensor, v_scale: Tensor,
                          slot_ids: Tensor | None = None) -> Tensor:
    """Attention of q [B, H, D] over every position of its slot's 4-bit cross K/V: the kernel on
    CUDA, the reference elsewhere."""
    if q.is_cuda and triton_usable(q.device):
        return decode_attention_int4_triton(q, k_codes, v_codes, k_scale, v_scale, slot_ids)
    return decode_attention_int4_reference(q, k_codes, v_codes, k_scale, v_scale, slot_ids)


def decode_attention_int4_triton(q: Tensor, k_codes: Tensor, v_codes: Tensor, k_scale: Tensor, v_scale: Tensor,
                                 slot_ids: Tensor | None = None, *, out: Tensor | None = None,
                                 num_splits: int | None = None, block_t: int = BLOCK_T, num_warps: int = NUM_WARPS,
                                 stages: int = STAGES) -> Tensor:
    """The kernel on q's device (CUDA, or the CPU under TRITON_INTERPRET=1) -> [B, H, D] in q's dtype.

    Splits of the positions: as the FP8 tile cache's rule (`auto_fp8_tile_splits`: whole 128-position
    tiles until B x H x splits reaches 4 programs per SM), merged by attention.py's pass 2.
    DECODE_KERNEL "v2" (STREAMER_INT4_ATTN_KERNEL=v2) runs decode_attention_int4_v2_triton instead.
    """
    if DECODE_KERNEL == "v2":  # the launch arguments of v1 do not apply
        return decode_attention_int4_v2_triton(q, k_codes, v_codes, k_scale, v_scale, slot_ids, out=out,
                                               num_splits=num_splits)
    _check(q, k_codes, v_codes, k_scale, v_scale, slot_ids)
    B, H, D = q.shape
    T = k_codes.shape[2]
    if SCALE_TILE % block_t or D % 8:
        raise ValueError(f"block_t must divide SCALE_TILE={SCALE_TILE} (got {block_t}) and D be a multiple of 8 (got {D})")
    out = torch.empty_like(q) if out is None else out
    splits = num_splits or auto_fp8_tile_splits(B * H, T, num_sms(q.device), WAVES_FP8)
    chunk = triton.cdiv(triton.cdiv(T, splits), SCALE_TILE) * SCALE_TILE
    splits = triton.cdiv(T, chunk)
    part_m = torch.empty(B * H * splits, device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(B * H * splits, D, device=q.device, dtype=torch.float32)
    kw, vw = k_codes.view(torch.int32), v_codes.view(torch.int32)  # 4 code bytes (8 values) a word
    if kw.stride(2) != D // 8:
        raise ValueError("the codes' positions must be contiguous rows of D/2 bytes")
    _decode_int4_kernel[(B * H, splits)](
        q, kw, vw, k_scale, v_scale, slot_ids if slot_ids is not None else part_m,
        part_m, part_l, part_acc, out, math.log2(math.e) / math.sqrt(D), H, T, chunk,
        q.stride(0), q.stride(1), kw.stride(0), kw.stride(1),
        k_scale.stride(0), k_scale.stride(1), k_scale.stride(2), v_scale.stride(0), v_scale.stride(1),
        out.stride(0), out.stride(1), splits,
        HAS_SLOTS=slot_ids is not None, BLOCK_T=block_t, SCALE_TILE=SCALE_TILE, WORDS=D // 8, STAGES=stages,
        num_warps=num_warps, num_stages=max(1, stages),
    )  # fmt: skip
    if splits > 1:
        _decode_reduce_kernel[(B * H,)](
            part_m, part_l, part_acc, out, H, splits, out.stride(0), out.stride(1), out.stride(2),
            BLOCK_S=triton.next_power_of_2(splits), HEAD_DIM=D, num_warps=1,
        )  # fmt: skip
    return out


# Unpacking without int -> float conversions, whose quarter rate bound the first version of this kernel
# (35 % of copy bandwidth against FP8's 100 %; H200, session 13): nibble n moved to mantissa bits 19-22
# and OR-ed into the exponent of 16.0 is the float 16 + n (one shift and one LOP3), i.e. q + 24 for
# the stored code q + 8; the 24s are taken out once per tile (K: 24 x the sum of q x scale over the
# channels) and once per row (V: 24 x the lanes' sum of p x scale). A row of D values is D / 8 int32
# words; nibble j of word w (bits 4j..4j+3) holds channel 4w + j // 2 (even j: a byte's low nibble)
# or D/2 + 4w + j // 2 (odd j). The kernel keeps the 8 nibbles of a word as 8 [BLOCK_T, WORDS]
# tiles in the words' own layout: no data moves between threads until the row's score is summed.


@jit
def _nib(words, J: tl.constexpr):
    """Nibble J of each int32 word as the float 16 + n."""
    if J <= 4:
        bits = words << (19 - 4 * J)
    else:
        bits = words >> (4 * J - 19)
    return ((bits & 0x00780000) | 0x41800000).to(tl.float32, bitcast=True)


@jit
def _ch(w, J: tl.constexpr, WORDS: tl.constexpr):
    """Channel of nibble J of word w."""
    if J % 2 == 0:
        return 4 * w + J // 2
    else:
        return 4 * WORDS + 4 * w + J // 2


@jit
def _acc(acc, alpha, pv, vw, J: tl.constexpr):
    return acc * alpha[:, None] + pv[:, None] * _nib(vw, J)


@jit
def _int4_step(t0, end, q0, q1, q2, q3, q4, q5, q6, q7, m_i, l_i, lv,
               a0, a1, a2, a3, a4, a5, a6, a7, k_base, v_base, ks_base, vs_base, w,
               stride_kst, BLOCK_T: tl.constexpr, SCALE_TILE: tl.constexpr, WORDS: tl.constexpr):
    """Positions [t0, t0 + BLOCK_T): per-lane online softmax, as attention.py's v7."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    mask_t = offs_t < end
    rows = offs_t[:, None] * WORDS + w[None, :]  # rows contiguous: WORDS a constant, so loads are 16-byte vectors
    kw = tl.load(k_base + rows, mask=mask_t[:, None], other=0)  # masked: s = -inf, p = 0
    vw = tl.load(v_base + rows, mask=mask_t[:, None], other=0)
    ks = ks_base + (t0 // SCALE_TILE) * stride_kst  # BLOCK_T divides the tile: one scale row a step
    k0 = q0 * tl.load(ks + _ch(w, 0, WORDS)).to(tl.float32)
    k1 = q1 * tl.load(ks + _ch(w, 1, WORDS)).to(tl.float32)
    k2 = q2 * tl.load(ks + _ch(w, 2, WORDS)).to(tl.float32)
    k3 = q3 * tl.load(ks + _ch(w, 3, WORDS)).to(tl.float32)
    k4 = q4 * tl.load(ks + _ch(w, 4, WORDS)).to(tl.float32)
    k5 = q5 * tl.load(ks + _ch(w, 5, WORDS)).to(tl.float32)
    k6 = q6 * tl.load(ks + _ch(w, 6, WORDS)).to(tl.float32)
    k7 = q7 * tl.load(ks + _ch(w, 7, WORDS)).to(tl.float32)
    offset = 24.0 * tl.sum(k0 + k1 + k2 + k3 + k4 + k5 + k6 + k7, axis=0)
    s2 = _nib(kw, 0) * k0[None, :] + _nib(kw, 1) * k1[None, :] + _nib(kw, 2) * k2[None, :] + _nib(kw, 3) * k3[None, :]
    s2 += _nib(kw, 4) * k4[None, :] + _nib(kw, 5) * k5[None, :] + _nib(kw, 6) * k6[None, :] + _nib(kw, 7) * k7[None, :]
    s = tl.where(mask_t, tl.sum(s2, axis=1) - offset, float("-inf"))  # base-2 logits
    vsc = tl.load(vs_base + offs_t, mask=mask_t, other=0.0).to(tl.float32)
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    pv = p * vsc
    a0 = _acc(a0, alpha, pv, vw, 0)
    a1 = _acc(a1, alpha, pv, vw, 1)
    a2 = _acc(a2, alpha, pv, vw, 2)
    a3 = _acc(a3, alpha, pv, vw, 3)
    a4 = _acc(a4, alpha, pv, vw, 4)
    a5 = _acc(a5, alpha, pv, vw, 5)
    a6 = _acc(a6, alpha, pv, vw, 6)
    a7 = _acc(a7, alpha, pv, vw, 7)
    return m_new, l_i * alpha + p, lv * alpha + pv, a0, a1, a2, a3, a4, a5, a6, a7


@jit
def _store_nib(out, acc, wt, lv_sum, inv, w, J: tl.constexpr, WORDS: tl.constexpr):
    o = (tl.sum(acc * wt[:, None], axis=0) - 24.0 * lv_sum) * inv
    tl.store(out + _ch(w, J, WORDS), o.to(out.dtype.element_ty))


@jit
def _store_all(out, a0, a1, a2, a3, a4, a5, a6, a7, wt, lv_sum, inv, w, WORDS: tl.constexpr):
    """The row's output (or a split's unnormalised partial, inv = 1) at each nibble tile's channels."""
    _store_nib(out, a0, wt, lv_sum, inv, w, 0, WORDS)
    _store_nib(out, a1, wt, lv_sum, inv, w, 1, WORDS)
    _store_nib(out, a2, wt, lv_sum, inv, w, 2, WORDS)
    _store_nib(out, a3, wt, lv_sum, inv, w, 3, WORDS)
    _store_nib(out, a4, wt, lv_sum, inv, w, 4, WORDS)
    _store_nib(out, a5, wt, lv_sum, inv, w, 5, WORDS)
    _store_nib(out, a6, wt, lv_sum, inv, w, 6, WORDS)
    _store_nib(out, a7, wt, lv_sum, inv, w, 7, WORDS)


@jit
def _decode_int4_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    qk_scale, H, T, chunk,
    stride_qb, stride_qh, stride_cs, stride_ch,
    stride_kss, stride_ksh, stride_kst, stride_vss, stride_vsh,
    stride_ob, stride_oh, num_splits,
    HAS_SLOTS: tl.constexpr, BLOCK_T: tl.constexpr, SCALE_TILE: tl.constexpr, WORDS: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    # k_ptr, v_ptr: the codes as int32 words [S, H, T, WORDS], each slot-head's T x WORDS contiguous
    pid = tl.program_id(0)  # b * H + h
    split = tl.program_id(1)
    b = pid // H
    h = pid % H
    start = split * chunk
    end = tl.minimum(start + chunk, T)
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + b).to(tl.int64)
    else:
        slot = b.to(tl.int64)
    w = tl.arange(0, WORDS)
    qb = q_ptr + b * stride_qb + h * stride_qh
    q0 = tl.load(qb + _ch(w, 0, WORDS)).to(tl.float32) * qk_scale
    q1 = tl.load(qb + _ch(w, 1, WORDS)).to(tl.float32) * qk_scale
    q2 = tl.load(qb + _ch(w, 2, WORDS)).to(tl.float32) * qk_scale
    q3 = tl.load(qb + _ch(w, 3, WORDS)).to(tl.float32) * qk_scale
    q4 = tl.load(qb + _ch(w, 4, WORDS)).to(tl.float32) * qk_scale
    q5 = tl.load(qb + _ch(w, 5, WORDS)).to(tl.float32) * qk_scale
    q6 = tl.load(qb + _ch(w, 6, WORDS)).to(tl.float32) * qk_scale
    q7 = tl.load(qb + _ch(w, 7, WORDS)).to(tl.float32) * qk_scale
    k_base = k_ptr + slot * stride_cs + h * stride_ch
    v_base = v_ptr + slot * stride_cs + h * stride_ch
    ks_base = ks_ptr + slot * stride_kss + h * stride_ksh
    vs_base = vs_ptr + slot * stride_vss + h * stride_vsh
    m_i = tl.full((BLOCK_T,), -1e30, tl.float32)
    l_i = tl.zeros((BLOCK_T,), tl.float32)
    lv = tl.zeros((BLOCK_T,), tl.float32)
    a0 = tl.zeros((BLOCK_T, WORDS), tl.float32)
    a1, a2, a3, a4, a5, a6, a7 = a0, a0, a0, a0, a0, a0, a0
    if STAGES >= 2:
        for t0 in tl.range(start, end, BLOCK_T, num_stages=STAGES):
            m_i, l_i, lv, a0, a1, a2, a3, a4, a5, a6, a7 = _int4_step(
                t0, end, q0, q1, q2, q3, q4, q5, q6, q7, m_i, l_i, lv, a0, a1, a2, a3, a4, a5, a6, a7,
                k_base, v_base, ks_base, vs_base, w, stride_kst, BLOCK_T, SCALE_TILE, WORDS)
    else:
        for t0 in range(start, end, BLOCK_T):
            m_i, l_i, lv, a0, a1, a2, a3, a4, a5, a6, a7 = _int4_step(
                t0, end, q0, q1, q2, q3, q4, q5, q6, q7, m_i, l_i, lv, a0, a1, a2, a3, a4, a5, a6, a7,
                k_base, v_base, ks_base, vs_base, w, stride_kst, BLOCK_T, SCALE_TILE, WORDS)
    m_max = tl.max(m_i, axis=0)
    wt = tl.exp2(m_i - m_max)
    l_sum = tl.sum(l_i * wt, axis=0)
    lv_sum = tl.sum(lv * wt, axis=0)
    if num_splits == 1:
        inv = tl.where(l_sum > 0, 1.0 / tl.maximum(l_sum, 1e-30), 0.0)  # length 0 -> zeros
        _store_all(out_ptr + b * stride_ob + h * stride_oh, a0, a1, a2, a3, a4, a5, a6, a7, wt, lv_sum, inv, w, WORDS)
    else:
        part = pid * num_splits + split
        tl.store(part_m_ptr + part, m_max)
        tl.store(part_l_ptr + part, l_sum)
        _store_all(part_acc_ptr + part * (8 * WORDS), a0, a1, a2, a3, a4, a5, a6, a7, wt, lv_sum, 1.0, w, WORDS)


# ---- decode attention, v2: packed fp16x2 arithmetic on the codes (issue 15) ------------------------
#
# The same cache (no format change). A row's 32 code bytes are read as 4 int64 elements; element e
# (bytes 8e..8e+7) holds, per 32-bit half h (base byte b = 8e + 4h), four fp16x2 pairs that one
# AND each puts in the mantissa of an fp16 subnormal (exponent 0: the value is mantissa x 2^-24):
#   pair j=0: x & 0x000F000F           -> channels (b, b+2)              as n x 2^-24
#   pair j=1: x & 0x00F000F0           -> (D/2+b, D/2+b+2)               as 16n x 2^-24
#   pair j=2: (x >> 8) & 0x000F000F    -> (b+1, b+3)                     as n x 2^-24
#   pair j=3: (x >> 8) & 0x00F000F0    -> (D/2+b+1, D/2+b+3)             as 16n x 2^-24
# so 8 values cost one shift and four LOP3, with no conversion and no subtraction: the codes' +8 and
# the 16s are folded into per-tile constants.
# - Q.K: a prologue folds q, qk_scale and K's per-(tile, channel) scale into fp16x2 pairs q''
#   (per 128-position tile, normalised so that the tile's largest |q x scale| is 2^14; the high
#   nibbles' pairs divided by 16) and writes them, with the tile's multiplier d and offset
#   (the score of an all-8 row), to a scratch buffer; the loop reads a tile's pairs once (L1) and
#   a position's score is 8 HFMA2 per int64 element (fp16 sums over 16 products), converted to fp32.
# - Softmax: one max per 128-position tile (the loop step), 1-D over positions (a position's
#   score lives on the threads that hold its elements), sums l and the +8 correction in fp32.
# - P.V: p'' = p x v_scale x 2^14 / (the tile's largest v_scale) as an fp16x2 broadcast; the
#   products (HMUL2 on the subnormal codes) summed in fp16 over the positions a thread holds in the
#   tile (8 at one warp), then added to fp32 accumulators once per tile (x alpha, x the tile's
#   multiplier).
# USE_ASM=False runs the same data flow with plain Triton ops (the interpreter cannot run inline asm).

# One warp a program (the loop's layout: 16 positions x E elements a group); cp.async stages of the loop.
# 2 stages: 174 us at B = 256 against 180 at 3 and 201 at 4 on the H200 (session 15 sweep).
V2_WARPS, V2_STAGES = 1, int(os.environ.get("STREAMER_INT4_V2_STAGES", "2"))
V2_WAVES = 8  # split T until B x H x splits reaches 8 one-warp programs per SM
# Which decode kernel decode_attention_int4_triton runs: "v2" (default: 1.18-1.48x FP8 v7's speed at
# B >= 32 on the H200, session 15) or "v1" (the session-13 kernel above, 0.54-0.71x; A/B only).
DECODE_KERNEL = os.environ.get("STREAMER_INT4_ATTN_KERNEL", "v2")
if DECODE_KERNEL not in ("v1", "v2"):
    raise ValueError(f"STREAMER_INT4_ATTN_KERNEL must be v1 or v2, got {DECODE_KERNEL!r}")


@jit
def _h2(x):
    """The low and high fp16 halves of int32 words (plain ops)."""
    lo = (x & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    hi = (x >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return lo, hi


@jit
def _pack_h2(lo, hi):
    """Two fp16 tensors -> int32 words (lo in bits 0-15)."""
    lo_bits = lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi_bits = hi.to(tl.int16, bitcast=True).to(tl.int32)
    return lo_bits | (hi_bits << 16)


@jit
def _add_h2(a, b):
    """fp16x2 add of int32 words (the reduce's combine)."""
    return tl.inline_asm_elementwise("add.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=1)


@jit
def _add_h2_plain(a, b):
    alo, ahi = _h2(a)
    blo, bhi = _h2(b)
    return _pack_h2(alo + blo, ahi + bhi)


@jit
def _halves_plain(word):
    """int64 elements -> their low and high 32-bit words."""
    lo = (word & 0xFFFFFFFF).to(tl.int32)
    hi = (word >> 32).to(tl.int32)
    return lo, hi


@jit
def _qk_plain(x, qa, qb, qc, qd, acc_lo, acc_hi):
    """The 4 pairs of one 32-bit word against 4 q'' pairs, fp16 sums (plain ops)."""
    for j in tl.static_range(4):
        if j == 0:
            m = x & 0x000F000F
            qp = qa
        elif j == 1:
            m = x & 0x00F000F0
            qp = qb
        elif j == 2:
            m = (x >> 8) & 0x000F000F
            qp = qc
        else:
            m = (x >> 8) & 0x00F000F0
            qp = qd
        vlo, vhi = _h2(m)
        qlo, qhi = _h2(qp)
        acc_lo = acc_lo + vlo * qlo
        acc_hi = acc_hi + vhi * qhi
    return acc_lo, acc_hi


@jit
def _k_dot(word, q0, q1, q2, q3, q4, q5, q6, q7, USE_ASM: tl.constexpr):
    """int64 elements of K codes [.., E] . their 16 channels' q'' -> fp32 (units 2^-24)."""
    if USE_ASM:
        r = tl.inline_asm_elementwise(
            """{
            .reg .b32 lo, hi, t, a, acc;
            .reg .b16 h0, h1;
            .reg .f32 f0, f1;
            mov.b64 {lo, hi}, $1;
            and.b32 a, lo, 0x000F000F;
            mul.rn.f16x2 acc, a, $2;
            and.b32 a, lo, 0x00F000F0;
            fma.rn.f16x2 acc, a, $3, acc;
            shr.u32 t, lo, 8;
            and.b32 a, t, 0x000F000F;
            fma.rn.f16x2 acc, a, $4, acc;
            and.b32 a, t, 0x00F000F0;
            fma.rn.f16x2 acc, a, $5, acc;
            and.b32 a, hi, 0x000F000F;
            fma.rn.f16x2 acc, a, $6, acc;
            and.b32 a, hi, 0x00F000F0;
            fma.rn.f16x2 acc, a, $7, acc;
            shr.u32 t, hi, 8;
            and.b32 a, t, 0x000F000F;
            fma.rn.f16x2 acc, a, $8, acc;
            and.b32 a, t, 0x00F000F0;
            fma.rn.f16x2 acc, a, $9, acc;
            mov.b32 {h0, h1}, acc;
            cvt.f32.f16 f0, h0;
            cvt.f32.f16 f1, h1;
            add.f32 $0, f0, f1;
            }""",
            "=f,l,r,r,r,r,r,r,r,r", [word, q0, q1, q2, q3, q4, q5, q6, q7], dtype=tl.float32, is_pure=True, pack=1)
    else:
        lo, hi = _halves_plain(word)
        z = tl.zeros(lo.shape, tl.float16)
        a_lo, a_hi = _qk_plain(lo, q0, q1, q2, q3, z, z)
        a_lo, a_hi = _qk_plain(hi, q4, q5, q6, q7, a_lo, a_hi)
        r = a_lo.to(tl.float32) + a_hi.to(tl.float32)
    return r


@jit
def _pv_plain(x, pp, j: tl.constexpr):
    if j == 0:
        m = x & 0x000F000F
    elif j == 1:
        m = x & 0x00F000F0
    elif j == 2:
        m = (x >> 8) & 0x000F000F
    else:
        m = (x >> 8) & 0x00F000F0
    vlo, vhi = _h2(m)
    plo, phi = _h2(pp)
    return _pack_h2(vlo * plo, vhi * phi)


@jit
def _v_prod(word, pp, USE_ASM: tl.constexpr):
    """int64 elements of V codes x the position's p'' (fp16x2 broadcast) -> 8 fp16x2 products."""
    if USE_ASM:
        r0, r1, r2, r3, r4, r5, r6, r7 = tl.inline_asm_elementwise(
            """{
            .reg .b32 lo, hi, t, a;
            mov.b64 {lo, hi}, $8;
            and.b32 a, lo, 0x000F000F;
            mul.rn.f16x2 $0, a, $9;
            and.b32 a, lo, 0x00F000F0;
            mul.rn.f16x2 $1, a, $9;
            shr.u32 t, lo, 8;
            and.b32 a, t, 0x000F000F;
            mul.rn.f16x2 $2, a, $9;
            and.b32 a, t, 0x00F000F0;
            mul.rn.f16x2 $3, a, $9;
            and.b32 a, hi, 0x000F000F;
            mul.rn.f16x2 $4, a, $9;
            and.b32 a, hi, 0x00F000F0;
            mul.rn.f16x2 $5, a, $9;
            shr.u32 t, hi, 8;
            and.b32 a, t, 0x000F000F;
            mul.rn.f16x2 $6, a, $9;
            and.b32 a, t, 0x00F000F0;
            mul.rn.f16x2 $7, a, $9;
            }""",
            "=r,=r,=r,=r,=r,=r,=r,=r,l,r", [word, pp], dtype=(tl.int32,) * 8, is_pure=True, pack=1)
    else:
        lo, hi = _halves_plain(word)
        r0 = _pv_plain(lo, pp, 0)
        r1 = _pv_plain(lo, pp, 1)
        r2 = _pv_plain(lo, pp, 2)
        r3 = _pv_plain(lo, pp, 3)
        r4 = _pv_plain(hi, pp, 0)
        r5 = _pv_plain(hi, pp, 1)
        r6 = _pv_plain(hi, pp, 2)
        r7 = _pv_plain(hi, pp, 3)
    return r0, r1, r2, r3, r4, r5, r6, r7


@jit
def _pv_fma_plain(x, pp, acc, j: tl.constexpr):
    if j == 0:
        m = x & 0x000F000F
    elif j == 1:
        m = x & 0x00F000F0
    elif j == 2:
        m = (x >> 8) & 0x000F000F
    else:
        m = (x >> 8) & 0x00F000F0
    vlo, vhi = _h2(m)
    plo, phi = _h2(pp)
    alo, ahi = _h2(acc)
    return _pack_h2(alo + vlo * plo, ahi + vhi * phi)


@jit
def _v_fma(word, pp, a0, a1, a2, a3, a4, a5, a6, a7, USE_ASM: tl.constexpr):
    """acc_j += p'' x pair j of int64 elements of V codes (fp16x2): one position's 16 values."""
    if USE_ASM:
        a0, a1, a2, a3, a4, a5, a6, a7 = tl.inline_asm_elementwise(
            """{
            .reg .b32 lo, hi, t, a;
            mov.b64 {lo, hi}, $8;
            and.b32 a, lo, 0x000F000F;
            fma.rn.f16x2 $0, a, $9, $10;
            and.b32 a, lo, 0x00F000F0;
            fma.rn.f16x2 $1, a, $9, $11;
            shr.u32 t, lo, 8;
            and.b32 a, t, 0x000F000F;
            fma.rn.f16x2 $2, a, $9, $12;
            and.b32 a, t, 0x00F000F0;
            fma.rn.f16x2 $3, a, $9, $13;
            and.b32 a, hi, 0x000F000F;
            fma.rn.f16x2 $4, a, $9, $14;
            and.b32 a, hi, 0x00F000F0;
            fma.rn.f16x2 $5, a, $9, $15;
            shr.u32 t, hi, 8;
            and.b32 a, t, 0x000F000F;
            fma.rn.f16x2 $6, a, $9, $16;
            and.b32 a, t, 0x00F000F0;
            fma.rn.f16x2 $7, a, $9, $17;
            }""",
            "=r,=r,=r,=r,=r,=r,=r,=r,l,r,r,r,r,r,r,r,r,r", [word, pp, a0, a1, a2, a3, a4, a5, a6, a7],
            dtype=(tl.int32,) * 8, is_pure=True, pack=1)
    else:
        lo, hi = _halves_plain(word)
        a0 = _pv_fma_plain(lo, pp, a0, 0)
        a1 = _pv_fma_plain(lo, pp, a1, 1)
        a2 = _pv_fma_plain(lo, pp, a2, 2)
        a3 = _pv_fma_plain(lo, pp, a3, 3)
        a4 = _pv_fma_plain(hi, pp, a4, 0)
        a5 = _pv_fma_plain(hi, pp, a5, 1)
        a6 = _pv_fma_plain(hi, pp, a6, 2)
        a7 = _pv_fma_plain(hi, pp, a7, 3)
    return a0, a1, a2, a3, a4, a5, a6, a7


@jit
def _k_group(k_base, t0, I: tl.constexpr, end, q0, q1, q2, q3, q4, q5, q6, q7, d, od, gg, ee,
             G: tl.constexpr, E: tl.constexpr, USE_ASM: tl.constexpr):
    """Base-2 logits [G] of positions t0 + I x G + gg (-inf past end)."""
    offs = t0 + I * G + gg
    mask = offs < end
    kw = tl.load(k_base + offs[:, None] * E + ee[None, :], mask=mask[:, None], other=0)
    s = tl.sum(_k_dot(kw, q0, q1, q2, q3, q4, q5, q6, q7, USE_ASM), axis=1) * d - od
    return tl.where(mask, s, float("-inf"))


@jit
def _p_group(vs_base, t0, I: tl.constexpr, end, s, m_new, gg, G: tl.constexpr):
    """(p, p x v_scale) of positions t0 + I x G + gg, their logits s."""
    offs = t0 + I * G + gg
    vsc = tl.load(vs_base + offs, mask=offs < end, other=0.0).to(tl.float32)
    p = tl.exp2(s - m_new)
    return p, p * vsc


@jit
def _v_group(v_base, t0, I: tl.constexpr, end, pv, pscale, gg, ee, a0, a1, a2, a3, a4, a5, a6, a7,
             G: tl.constexpr, E: tl.constexpr, USE_ASM: tl.constexpr):
    """The V products of positions t0 + I x G + gg with weight p'' = p x v_scale x pscale (fp16) added
    to the fp16x2 sums a0..a7."""
    offs = t0 + I * G + gg
    mask = offs < end
    vw = tl.load(v_base + offs[:, None] * E + ee[None, :], mask=mask[:, None], other=0)
    ph = (pv * pscale).to(tl.float16)
    pp = _pack_h2(ph, ph)
    return _v_fma(vw, pp[:, None], a0, a1, a2, a3, a4, a5, a6, a7, USE_ASM)


@jit
def _f2(x, USE_ASM: tl.constexpr):
    """int32 fp16x2 words -> (fp32 low, fp32 high)."""
    if USE_ASM:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b16 h0, h1; mov.b32 {h0, h1}, $2; cvt.f32.f16 $0, h0; cvt.f32.f16 $1, h1; }",
            "=f,=f,r", [x], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        a, b = _h2(x)
        lo, hi = a.to(tl.float32), b.to(tl.float32)
    return lo, hi


@jit
def _sum_h2(prod, USE_ASM: tl.constexpr):
    """fp16x2 sum over axis 0 (the positions a thread holds: no data moves between threads)."""
    if USE_ASM:
        r = tl.reduce(prod, 0, _add_h2)
    else:
        r = tl.reduce(prod, 0, _add_h2_plain)
    return r


@jit
def _flush(acc_lo, acc_hi, s16, alpha, c, USE_ASM: tl.constexpr):
    lo, hi = _f2(s16, USE_ASM)
    return acc_lo * alpha + lo * c, acc_hi * alpha + hi * c


@jit
def _pair_channel(k, u, HALF: tl.constexpr):
    """Channel of half u of pair k (k = 8e + 4h + j, the order the loop consumes)."""
    j = k % 4
    return (k - j) + j // 2 + 2 * u + (j % 2) * HALF


@jit
def _store_pair(ptr, a_lo, a_hi, lv, inv, e, J: tl.constexpr, HALF: tl.constexpr):
    """Channels of pair 8e + J: (sum over lanes x (1/16 for high nibbles) - 8 lv) x inv."""
    f = 1.0 if J % 2 == 0 else 0.0625
    k = 8 * e + J
    o_lo = (tl.sum(a_lo, axis=0) * f - 8.0 * lv) * inv
    o_hi = (tl.sum(a_hi, axis=0) * f - 8.0 * lv) * inv
    tl.store(ptr + _pair_channel(k, 0, HALF), o_lo.to(ptr.dtype.element_ty))
    tl.store(ptr + _pair_channel(k, 1, HALF), o_hi.to(ptr.dtype.element_ty))


@jit
def _store_pairs(ob, c0l, c0h, c1l, c1h, c2l, c2h, c3l, c3h, c4l, c4h, c5l, c5h, c6l, c6h, c7l, c7h, lv, inv, ee,
                 HALF: tl.constexpr):
    _store_pair(ob, c0l, c0h, lv, inv, ee, 0, HALF)
    _store_pair(ob, c1l, c1h, lv, inv, ee, 1, HALF)
    _store_pair(ob, c2l, c2h, lv, inv, ee, 2, HALF)
    _store_pair(ob, c3l, c3h, lv, inv, ee, 3, HALF)
    _store_pair(ob, c4l, c4h, lv, inv, ee, 4, HALF)
    _store_pair(ob, c5l, c5h, lv, inv, ee, 5, HALF)
    _store_pair(ob, c6l, c6h, lv, inv, ee, 6, HALF)
    _store_pair(ob, c7l, c7h, lv, inv, ee, 7, HALF)


@jit
def _decode_int4_v2_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, slot_ptr, qs_ptr, qd_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    qk_scale, H, T, chunk, n_tiles,
    stride_qb, stride_qh, stride_cs, stride_ch,
    stride_kss, stride_ksh, stride_kst, stride_vss, stride_vsh,
    stride_ob, stride_oh, num_splits,
    HAS_SLOTS: tl.constexpr, G: tl.constexpr, E: tl.constexpr, HALF: tl.constexpr,
    STAGES: tl.constexpr, USE_ASM: tl.constexpr,
):  # fmt: skip
    # k_ptr, v_ptr: the codes as int64 elements [S, H, T, E] (E = D/16), each slot-head's T x E contiguous.
    # qs_ptr: int32 scratch [B x H, n_tiles, HALF] (q'' pairs), qd_ptr: fp32 [B x H, n_tiles, 2] (d, d x offset).
    # One loop step = one 128-position scale tile = 8 groups of G = 16 positions ([G, E] tensors, one warp).
    pid = tl.program_id(0)  # b * H + h
    split = tl.program_id(1)
    b = pid // H
    h = pid % H
    start = split * chunk
    end = tl.minimum(start + chunk, T)
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + b).to(tl.int64)
    else:
        slot = b.to(tl.int64)
    ks_base = ks_ptr + slot * stride_kss + h * stride_ksh
    vs_base = vs_ptr + slot * stride_vss + h * stride_vsh
    qs_base = qs_ptr + pid.to(tl.int64) * (n_tiles * HALF)
    qd_base = qd_ptr + pid.to(tl.int64) * (n_tiles * 2)

    # Prologue: q'' pairs, multiplier and offset of each tile of this split.
    kk = tl.arange(0, HALF)
    ch0 = _pair_channel(kk, 0, HALF)
    ch1 = _pair_channel(kk, 1, HALF)
    hi_nib = (kk % 2) == 1
    qb = q_ptr + b * stride_qb + h * stride_qh
    qv0 = tl.load(qb + ch0).to(tl.float32) * qk_scale
    qv1 = tl.load(qb + ch1).to(tl.float32) * qk_scale
    div = tl.where(hi_nib, 0.0625, 1.0)
    for tile in range(start // 128, tl.cdiv(end, 128)):
        a0 = qv0 * tl.load(ks_base + tile * stride_kst + ch0).to(tl.float32)
        a1 = qv1 * tl.load(ks_base + tile * stride_kst + ch1).to(tl.float32)
        amax = tl.max(tl.maximum(tl.abs(a0), tl.abs(a1)), axis=0)
        # products q'' x n x 2^-24: the largest q'' at 2^14 keeps them normal
        qn: tl.constexpr = 16384.0
        unit: tl.constexpr = 5.9604644775390625e-08
        norm = tl.where(amax > 0, qn / tl.maximum(amax, 1e-30), 0.0)
        h0 = (a0 * norm * div).to(tl.float16)
        h1 = (a1 * norm * div).to(tl.float16)
        d = amax / qn / unit  # logits per unit of the fp16 sums
        tl.store(qs_base + tile * HALF + kk, _pack_h2(h0, h1))
        tl.store(qd_base + tile * 2, d)
        # the codes' +8: the score of an all-8 row, taken out per position
        offset = tl.sum((h0.to(tl.float32) + h1.to(tl.float32)) / div, axis=0) * (8.0 * 5.9604644775390625e-08)
        tl.store(qd_base + tile * 2 + 1, d * offset)
    tl.debug_barrier()

    gg = tl.arange(0, G)
    ee = tl.arange(0, E)
    k_base = k_ptr + slot * stride_cs + h * stride_ch
    v_base = v_ptr + slot * stride_cs + h * stride_ch
    m_i = tl.full((), -1e30, tl.float32)
    l_i = tl.zeros((G,), tl.float32)
    lv_i = tl.zeros((G,), tl.float32)
    z = tl.zeros((G, E), tl.float32)
    c0l, c0h, c1l, c1h, c2l, c2h, c3l, c3h = z, z, z, z, z, z, z, z
    c4l, c4h, c5l, c5h, c6l, c6h, c7l, c7h = z, z, z, z, z, z, z, z
    zi = tl.zeros((G, E), tl.int32)
    for t0 in tl.range(start, end, 128, num_stages=STAGES):
        tile = t0 // 128
        qrow = qs_base + tile * HALF + 8 * ee[None, :]
        q0 = tl.load(qrow)
        q1 = tl.load(qrow + 1)
        q2 = tl.load(qrow + 2)
        q3 = tl.load(qrow + 3)
        q4 = tl.load(qrow + 4)
        q5 = tl.load(qrow + 5)
        q6 = tl.load(qrow + 6)
        q7 = tl.load(qrow + 7)
        d = tl.load(qd_base + tile * 2)
        od = tl.load(qd_base + tile * 2 + 1)
        s0 = _k_group(k_base, t0, 0, end, q0, q1, q2, q3, q4, q5, q6, q7, d, od, gg, ee, G, E, USE_ASM)
        s1 = _k_group(k_base, t0, 1, end, q0, q1, q2, q3, q4, q5, q6, q7, d, od, gg, ee, G, E, USE_ASM)
        s2 = _k_group(k_base, t0, 2, end, q0, q1, q2, q3, q4, q5, q6, q7, d, od, gg, ee, G, E, USE_ASM)
        s3 = _k_group(k_base, t0, 3, end, q0, q1, q2, q3, q4, q5, q6, q7, d, od, gg, ee, G, E, USE_ASM)
        s4 = _k_group(k_base, t0, 4, end, q0, q1, q2, q3, q4, q5, q6, q7, d, od, gg, ee, G, E, USE_ASM)
        s5 = _k_group(k_base, t0, 5, end, q0, q1, q2, q3, q4, q5, q6, q7, d, od, gg, ee, G, E, USE_ASM)
        s6 = _k_group(k_base, t0, 6, end, q0, q1, q2, q3, q4, q5, q6, q7, d, od, gg, ee, G, E, USE_ASM)
        s7 = _k_group(k_base, t0, 7, end, q0, q1, q2, q3, q4, q5, q6, q7, d, od, gg, ee, G, E, USE_ASM)
        mx = tl.maximum(tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3)),
                        tl.maximum(tl.maximum(s4, s5), tl.maximum(s6, s7)))
        m_new = tl.maximum(m_i, tl.max(mx, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p0, v0 = _p_group(vs_base, t0, 0, end, s0, m_new, gg, G)
        p1, v1 = _p_group(vs_base, t0, 1, end, s1, m_new, gg, G)
        p2, v2 = _p_group(vs_base, t0, 2, end, s2, m_new, gg, G)
        p3, v3 = _p_group(vs_base, t0, 3, end, s3, m_new, gg, G)
        p4, v4 = _p_group(vs_base, t0, 4, end, s4, m_new, gg, G)
        p5, v5 = _p_group(vs_base, t0, 5, end, s5, m_new, gg, G)
        p6, v6 = _p_group(vs_base, t0, 6, end, s6, m_new, gg, G)
        p7, v7 = _p_group(vs_base, t0, 7, end, s7, m_new, gg, G)
        # p'' = p x v_scale scaled so that the tile's largest is 2^14: its products n x p'' x 2^-24 are
        # normal fp16; smaller ones may be subnormal, with an absolute error (2^-25) far below it
        vmax = tl.max(tl.maximum(tl.maximum(tl.maximum(v0, v1), tl.maximum(v2, v3)),
                                 tl.maximum(tl.maximum(v4, v5), tl.maximum(v6, v7))), axis=0)
        pscale = tl.where(vmax > 0, 16384.0 / tl.maximum(vmax, 1e-30), 0.0)
        c = vmax * (1.0 / 16384.0)
        a0, a1, a2, a3, a4, a5, a6, a7 = zi, zi, zi, zi, zi, zi, zi, zi
        a0, a1, a2, a3, a4, a5, a6, a7 = _v_group(v_base, t0, 0, end, v0, pscale, gg, ee, a0, a1, a2, a3, a4, a5, a6,
                                                  a7, G, E, USE_ASM)
        a0, a1, a2, a3, a4, a5, a6, a7 = _v_group(v_base, t0, 1, end, v1, pscale, gg, ee, a0, a1, a2, a3, a4, a5, a6,
                                                  a7, G, E, USE_ASM)
        a0, a1, a2, a3, a4, a5, a6, a7 = _v_group(v_base, t0, 2, end, v2, pscale, gg, ee, a0, a1, a2, a3, a4, a5, a6,
                                                  a7, G, E, USE_ASM)
        a0, a1, a2, a3, a4, a5, a6, a7 = _v_group(v_base, t0, 3, end, v3, pscale, gg, ee, a0, a1, a2, a3, a4, a5, a6,
                                                  a7, G, E, USE_ASM)
        a0, a1, a2, a3, a4, a5, a6, a7 = _v_group(v_base, t0, 4, end, v4, pscale, gg, ee, a0, a1, a2, a3, a4, a5, a6,
                                                  a7, G, E, USE_ASM)
        a0, a1, a2, a3, a4, a5, a6, a7 = _v_group(v_base, t0, 5, end, v5, pscale, gg, ee, a0, a1, a2, a3, a4, a5, a6,
                                                  a7, G, E, USE_ASM)
        a0, a1, a2, a3, a4, a5, a6, a7 = _v_group(v_base, t0, 6, end, v6, pscale, gg, ee, a0, a1, a2, a3, a4, a5, a6,
                                                  a7, G, E, USE_ASM)
        a0, a1, a2, a3, a4, a5, a6, a7 = _v_group(v_base, t0, 7, end, v7, pscale, gg, ee, a0, a1, a2, a3, a4, a5, a6,
                                                  a7, G, E, USE_ASM)
        l_i = l_i * alpha + (((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)))
        lv_i = lv_i * alpha + (((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)))
        c0l, c0h = _flush(c0l, c0h, a0, alpha, c, USE_ASM)
        c1l, c1h = _flush(c1l, c1h, a1, alpha, c, USE_ASM)
        c2l, c2h = _flush(c2l, c2h, a2, alpha, c, USE_ASM)
        c3l, c3h = _flush(c3l, c3h, a3, alpha, c, USE_ASM)
        c4l, c4h = _flush(c4l, c4h, a4, alpha, c, USE_ASM)
        c5l, c5h = _flush(c5l, c5h, a5, alpha, c, USE_ASM)
        c6l, c6h = _flush(c6l, c6h, a6, alpha, c, USE_ASM)
        c7l, c7h = _flush(c7l, c7h, a7, alpha, c, USE_ASM)
        m_i = m_new
    # c..: per lane, sums over positions of p x v_scale x code x 2^-24 (x16 for high nibbles): the products
    # p'' x code x 2^-24 with p'' = p x v_scale x 2^14 / vmax, times c = vmax / 2^14; x 2^24 at the store.
    l_sum = tl.sum(l_i, axis=0)
    lv = tl.sum(lv_i, axis=0) * 5.9604644775390625e-08  # x 2^-24: the codes' units
    if num_splits == 1:
        inv = tl.where(l_sum > 0, 16777216.0 / tl.maximum(l_sum, 1e-30), 0.0)  # length 0 -> zeros
        _store_pairs(out_ptr + b * stride_ob + h * stride_oh, c0l, c0h, c1l, c1h, c2l, c2h, c3l, c3h,
                     c4l, c4h, c5l, c5h, c6l, c6h, c7l, c7h, lv, inv, ee, HALF)
    else:  # an unnormalised partial (the pointer types differ, so each branch stores its own)
        part = pid * num_splits + split
        tl.store(part_m_ptr + part, m_i)
        tl.store(part_l_ptr + part, l_sum)
        _store_pairs(part_acc_ptr + part * (2 * HALF), c0l, c0h, c1l, c1h, c2l, c2h, c3l, c3h,
                     c4l, c4h, c5l, c5h, c6l, c6h, c7l, c7h, lv, 16777216.0, ee, HALF)


def decode_attention_int4_v2_triton(q: Tensor, k_codes: Tensor, v_codes: Tensor, k_scale: Tensor, v_scale: Tensor,
                                    slot_ids: Tensor | None = None, *, out: Tensor | None = None,
                                    num_splits: int | None = None, num_warps: int = V2_WARPS, stages: int = V2_STAGES,
                                    use_asm: bool | None = None) -> Tensor:
    """The v2 kernel on q's device (CUDA, or the CPU under TRITON_INTERPRET=1) -> [B, H, D] in q's dtype.

    Splits: whole 128-position tiles until B x H x splits reaches V2_WAVES programs per SM, merged by
    attention.py's pass 2. `use_asm` (default: not under the interpreter) picks the inline-asm data
    flow or the same one in plain Triton ops.
    """
    _check(q, k_codes, v_codes, k_scale, v_scale, slot_ids)
    B, H, D = q.shape
    T = k_codes.shape[2]
    if D % 16 or D < 16:
        raise ValueError(f"the v2 kernel needs a head dim that is a multiple of 16, got {D}")
    if SCALE_TILE != 128:
        raise ValueError("the v2 kernel steps over 128-position scale tiles")
    if use_asm is None:
        use_asm = not interpreter_active()
    out = torch.empty_like(q) if out is None else out
    splits = num_splits or auto_fp8_tile_splits(B * H, T, num_sms(q.device), V2_WAVES)
    chunk = triton.cdiv(triton.cdiv(T, splits), SCALE_TILE) * SCALE_TILE
    splits = triton.cdiv(T, chunk)
    n_tiles = triton.cdiv(T, SCALE_TILE)
    part_m = torch.empty(B * H * splits, device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(B * H * splits, D, device=q.device, dtype=torch.float32)
    qs = torch.empty(B * H * n_tiles * (D // 2), device=q.device, dtype=torch.int32)
    qd = torch.empty(B * H * n_tiles * 2, device=q.device, dtype=torch.float32)
    kw, vw = k_codes.view(torch.int64), v_codes.view(torch.int64)  # 8 code bytes (16 values) an element
    if kw.stride(2) != D // 16 or vw.stride() != kw.stride():
        raise ValueError("the codes' positions must be contiguous rows of D/2 bytes, K and V alike")
    _decode_int4_v2_kernel[(B * H, splits)](
        q, kw, vw, k_scale, v_scale, slot_ids if slot_ids is not None else part_m, qs, qd,
        part_m, part_l, part_acc, out, math.log2(math.e) / math.sqrt(D), H, T, chunk, n_tiles,
        q.stride(0), q.stride(1), kw.stride(0), kw.stride(1),
        k_scale.stride(0), k_scale.stride(1), k_scale.stride(2), v_scale.stride(0), v_scale.stride(1),
        out.stride(0), out.stride(1), splits,
        HAS_SLOTS=slot_ids is not None, G=16, E=D // 16, HALF=D // 2, STAGES=stages,
        USE_ASM=use_asm, num_warps=num_warps, num_stages=max(1, stages),
    )  # fmt: skip
    if splits > 1:
        _decode_reduce_kernel[(B * H,)](
            part_m, part_l, part_acc, out, H, splits, out.stride(0), out.stride(1), out.stride(2),
            BLOCK_S=triton.next_power_of_2(splits), HEAD_DIM=D, num_warps=1,
        )  # fmt: skip
    return out
