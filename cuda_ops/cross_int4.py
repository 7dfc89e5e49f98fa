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

Status: an A/B (`PRECISION=mixed_fp8:cross_kv_cache=int4`), in no preset. The decode kernel below is
bound by instructions, not bytes: 0.54-0.71x the FP8 tile kernel's speed at B >= 32 on the H200
(docs/benchmarks.md, session 13). A position costs ~1,000 thread-instructions here against FP8's 736,
and both issue ~21 T/s; to pay, under ~350 (packed fp16x2 unpacking into tensor-core products).

Each kernel has a pure-PyTorch reference; the dispatchers use the kernels on CUDA and the references
elsewhere. Under TRITON_INTERPRET=1 the `*_triton` launchers run on the CPU (the tests).
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from cuda_ops._triton import jit, num_sms, tl, triton, triton_usable
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
    """
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
