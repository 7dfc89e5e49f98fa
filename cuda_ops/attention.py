"""Decode attention (one query token per sequence) over an FP8 or fp16/bf16 K/V cache.

Flash-decoding in two passes: pass 1 gives each (row, head, split) a contiguous chunk of the
positions and writes its partial softmax state (running max, sum, unnormalised output); pass 2
merges the splits of each (row, head). With one split, pass 1 normalises and writes the output
itself and pass 2 is not launched. FP8 (e4m3) K/V are dequantised in registers, with one scale per
(slot, head) or per (slot, head, SCALE_TILE positions): a per-head K scale is folded into q and the V
scale applied once to the accumulator; a per-tile scale costs one scalar load per tile and one
multiply per position (on the scores, and on p for V). Design, tuning and tolerances:
docs/kernels-attention-mel.md.

Shapes: q [B, H, D]; k, v [S, H, T, D] (a cache of S slots, T = Tmax); row b reads slot
slot_ids[b] (or slot b when slot_ids is None, then S == B); lengths [B] int32 valid positions of
each row (clamped to T; a row of length 0 gives zeros, e.g. padding rows of a CUDA-graph bucket).
"""

from __future__ import annotations

import json
import math
import os
from typing import NamedTuple

import torch

from cuda_ops._triton import interpreter_active, jit, num_sms, tl, triton, triton_usable

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn: amax maps onto it, so no value saturates

# Tuning, measured on an H200 with large-v3 shapes (H=20, D=64) under CUDA-graph replay;
# docs/kernels-attention-mel.md has the tables.
BLOCK_T = 128  # best for fp16 at every batch and fp8 at B >= 128; 64 was 7-10% faster for fp8 at B = 8-32
NUM_WARPS = 4  # 8 warps was 10-35% slower
NUM_STAGES = 2  # 2 and 3 measured the same
WAVES = 2  # fp16: split until B*H*splits reaches WAVES x SMs programs (B=1: 12 splits of T=1500, B=8: 2)
# FP8 with tile scales (the engine's cross cache): BLOCK_T 64 and split until B*H*splits reaches 4
# programs per SM (528 on 132 SMs; a 4-warp program of ~100 registers, ~4-5 resident per SM). The
# H200 sweep of 2026-12-01 (benchmarks/results/bench_attention_fp8.json, 18 launches per batch) had
# BLOCK_T 64 best at every batch (1.3-1.7x faster than 128 from B=32) and, with it, 12 splits best
# at B=1, 4 at B=8, 1 at B>=32 (32 x 20 = 640 programs already fill the SMs): exactly this rule.
# (The rule before, 8 waves at BLOCK_T 128, chose 6 / 2 splits at B=8 / 32: 1.4x / 1.7x slower.)
WAVES_FP8 = 4
BLOCK_T_FP8 = 64
WAVES_FP8_HEAD = 8  # FP8 with one scale per (slot, head), BLOCK_T 128: the 2026-11-30 sweep's rule
# fp16 K/V is the engine's self-attention: rows of 1 to ~230 valid positions in a 448-position
# cache (prompt + sampled tokens), one launch for every length under CUDA graphs. BLOCK_T 32 with
# one warp: the fastest in sum over B = 16-256 and lengths <= 32 / 104 / 224 in the H200 sweep of
# session 12 (benchmarks/sweep_self_attention.py; raw results/sweep_self_attention_s12_h200.json):
# 181 µs against 285 for BLOCK_T 128 x 4 warps, 23 against 45 µs at B=256, lengths <= 104 (a short
# row no longer holds a 128-position tile in registers). STREAMER_FP16_ATTN_LAUNCH="64x2" overrides.
BLOCK_T_FP16, NUM_WARPS_FP16 = (int(x) for x in os.environ.get("STREAMER_FP16_ATTN_LAUNCH", "32x1").split("x"))
SCALE_TILE = 128  # positions per scale of a tiled FP8 cache (cross_kv.py writes them); a multiple of BLOCK_T
CONST_STRIDES = False  # shapes and strides as compile-time constants: A/B pending on the H200
PREFETCH = False  # K/V of the next tile loaded before this tile's math (registers): A/B pending
MMA = False  # q.K^T and P.V on the tensor cores (fp16 q only; 16 identical rows): A/B pending
MAX_SPLITS = 32  # bounds pass 2's tile (splits x D floats in one warp) for very long T


class Launch(NamedTuple):
    """One launch of decode attention over a tile-scaled FP8 cache (the engine's cross cache).

    kernel: "v6" (session 6: K/V tiles loaded into registers by a plain loop, one tile in flight
      per program) or "v7" (the same math, the loop a `tl.range(num_stages=stages)` that Triton
      software-pipelines: K/V tiles copied into shared memory by cp.async `stages - 1` tiles ahead,
      so bytes in flight no longer cost registers).
    splits: 0 = automatic (split T until B*H*splits >= WAVES_FP8 x SMs, whole scale tiles); else
      the count wanted (rounded to whole 128-position scale tiles).
    block_t, num_warps: the tile of positions per loop step, warps per program.
    stages: v7 only; >= 2 pipelines the loads (0 or 1: a plain loop, i.e. v6's schedule).
    one_pass: v7 with splits > 1: the last program of each (row, head) to finish merges the splits
      (an atomic counter per (row, head)), so there is no second launch.
    const: every shape and stride a compile-time constant (one compile per cache layout).
    maxnreg: v7 only: a register cap per thread (0: the compiler's choice), so that more programs
      fit an SM (65536 registers: 4 warps at <= 96 registers -> 5 programs, <= 64 -> 8).
    scalar_scales: v7 only: one scalar load of each tile scale per loop step, as v6 (not pipelined)
      instead of a per-position vector load pipelined with the tile (a fallback, should a Triton
      refuse to pipeline the vector; compiled with triton 3.9 for sm_90 both are pipelined).
    """

    kernel: str = "v6"
    splits: int = 0
    block_t: int = 64
    num_warps: int = 4
    stages: int = 0
    one_pass: bool = False
    const: bool = False
    maxnreg: int = 0
    scalar_scales: bool = False


# Launch per batch for tile-scaled FP8 (cross-attention, T = 1500 at large-v3): rows are
# (min_batch_heads, Launch); the last row whose min_batch_heads <= B*H applies. B*H = B x 20 at
# large-v3 (B = 32 -> 640, 64 -> 1280, 128 -> 2560, 256 -> 5120); tiny/base have H = 6 / 8.
# From the H200 sweep of 2026-12-01, session 8 (`gpu_attn7.sh`, benchmarks/README.md; raw
# benchmarks/results/bench_attention_sweep_attn7_s8_h200.json): the fastest launch per B*H (T=1500,
# H=20, D=64, timed under CUDA graphs). Below B=32 the session-6 rule (splits over T).
FP8_TILE_TABLE: tuple[tuple[int, Launch], ...] = (
    (0, Launch()),
    (640, Launch(kernel="v7", splits=1, block_t=32, stages=5, maxnreg=64, scalar_scales=True)),  # B=32: 82.3 % of copy
    (1280, Launch(kernel="v7", splits=1, stages=3, maxnreg=96)),  # B=64: 87.4 %
    (2560, Launch(kernel="v7", splits=1, block_t=32, stages=5, maxnreg=64, scalar_scales=True)),  # B=128: 94.4 %, B=256: 99.0 %
)
# A sweep's table as JSON ([[min_batch_heads, {Launch fields}], ...]) replaces the one above at
# import (bench_attention.py --table-out writes one; session 8's gpu_attn7.sh reran the standard rows so).
_TABLE_ENV = "STREAMER_FP8_ATTN_TABLE"


def load_fp8_table(path: str) -> tuple[tuple[int, Launch], ...]:
    """[[min_batch_heads, {field: value}], ...] (a JSON file) -> FP8_TILE_TABLE's form, sorted."""
    with open(path) as f:
        rows = json.load(f)
    table = tuple(sorted((int(bh), Launch(**fields)) for bh, fields in rows))
    if not table or table[0][0] != 0:
        raise ValueError(f"{path}: the first row must start at min_batch_heads 0")
    for _, launch in table:
        _check_launch(launch)
    return table


def _check_launch(launch: Launch) -> None:
    if launch.kernel not in ("v6", "v7"):
        raise ValueError(f"unknown kernel {launch.kernel!r}")
    if launch.block_t not in (16, 32, 64, 128) or launch.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"bad block_t / num_warps in {launch}")
    if launch.stages < 0 or launch.splits < 0 or not (launch.maxnreg == 0 or 24 <= launch.maxnreg <= 255):
        raise ValueError(f"bad stages / splits / maxnreg in {launch}")


if os.environ.get(_TABLE_ENV):
    FP8_TILE_TABLE = load_fp8_table(os.environ[_TABLE_ENV])


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, H, T, D] fp16/bf16/fp32 -> (x_fp8 [B, H, T, D] float8_e4m3fn, scale [B, H] fp32).

    scale = amax / 448 per (b, h), so x ~= x_fp8 * scale; an all-zero (b, h) gets scale 1.
    """
    xf = x.float()
    amax = xf.abs().amax(dim=(2, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    x_fp8 = (xf / scale[:, :, None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x_fp8, scale


def quantize_kv_tiles(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, H, T, D] -> (x_fp8 [B, H, T, D], scale [B, H, ceil(T / SCALE_TILE)] fp32): one scale per
    SCALE_TILE positions of a head (amax / 448, floored at 1e-12 like fp8.quantize_rows)."""
    B, H, T, D = x.shape
    tile = SCALE_TILE
    nt = -(-T // tile)
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, nt * tile - T)).view(B, H, nt, tile, D)
    amax = xf.abs().amax(dim=(3, 4)).clamp_min(1e-12)
    # Tensor divides (correctly rounded, as the kernels' div_rn) and a multiply by 448 / amax, as
    # fp8.quantize_rows_reference and cross_kv.py's epilogue: kernel and reference agree bit for bit.
    fp8_max = torch.full_like(amax, FP8_MAX)
    x_fp8 = (xf * (fp8_max / amax)[..., None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    scale = amax / fp8_max
    return x_fp8.view(B, H, nt * tile, D)[:, :, :T].contiguous(), scale


def expand_scale(scale: torch.Tensor, T: int) -> torch.Tensor:
    """A [S, H] or [S, H, n_tiles] scale as [S, H, T, 1] (one value per position)."""
    if scale.dim() == 2:
        return scale[:, :, None, None]
    return scale.repeat_interleave(SCALE_TILE, dim=2)[:, :, :T, None]


def dequantize_kv(x_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize_kv / quantize_kv_tiles, in fp32: x_fp8 [S, H, T, D], scale [S, H] or
    [S, H, ceil(T / SCALE_TILE)] -> [S, H, T, D]."""
    return x_fp8.float() * expand_scale(scale.float(), x_fp8.shape[2])


def decode_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    sm_scale: float | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    slot_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain PyTorch decode attention in fp32 (same contract as decode_attention)."""
    _check(q, k, v, lengths, k_scale, v_scale, slot_ids)
    B, H, D = q.shape
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    kf = k.float() if k_scale is None else dequantize_kv(k, k_scale)
    vf = v.float() if v_scale is None else dequantize_kv(v, v_scale)
    if slot_ids is not None:
        kf, vf = kf[slot_ids.long()], vf[slot_ids.long()]
    scores = torch.einsum("bhd,bhtd->bht", q.float(), kf) * sm_scale
    valid = torch.arange(k.shape[2], device=q.device)[None, :] < lengths[:, None].long()  # [B, T]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of length 0 attends to nothing
    return torch.einsum("bht,bhtd->bhd", probs, vf).to(q.dtype)


def choose_num_splits(batch_heads: int, max_len: int, sms: int, waves: int = WAVES, block_t: int = BLOCK_T) -> int:
    """Splits of the position axis per (row, head), each a whole number of BLOCK_T tiles.

    Decode attention is bound by reading K/V, and HBM needs many loads in flight: the grid should
    hold about WAVES programs per SM. B*H alone does that for batches from B=16 at H=20; smaller
    batches split T, down to one tile per split (cross-attention at B=1: 12 splits of 128).
    Depends only on shapes, not on the lengths' values, so the launch is fixed under CUDA graphs.
    """
    tiles = max(1, -(-max_len // block_t))
    wanted = -(-waves * sms // batch_heads)
    splits = max(1, min(wanted, tiles, MAX_SPLITS))
    chunk_tiles = -(-tiles // splits)
    return -(-tiles // chunk_tiles)  # the count after rounding each chunk up to whole tiles


def choose_launch(batch_heads: int, max_len: int, sms: int, kv: str = "fp16") -> tuple[int, int]:
    """(splits, BLOCK_T) that decode_attention_triton picks for a cache of kind `kv`: "fp16" (or
    bf16), "fp8" (a scale per (slot, head)) or "fp8tile" (a scale per 128-position tile: the
    engine's cross cache; the whole launch is choose_fp8_tile_launch's)."""
    if kv == "fp16":
        return choose_num_splits(batch_heads, max_len, sms, WAVES, BLOCK_T_FP16), BLOCK_T_FP16
    if kv != "fp8tile":
        return choose_num_splits(batch_heads, max_len, sms, WAVES_FP8_HEAD), BLOCK_T
    launch = choose_fp8_tile_launch(batch_heads, max_len, sms)
    return launch.splits, launch.block_t


def auto_fp8_tile_splits(batch_heads: int, max_len: int, sms: int, waves: int = WAVES_FP8) -> int:
    """Splits of whole scale tiles until B*H*splits >= waves x SMs programs (or every split is one
    scale tile, or MAX_SPLITS). Rounded so that the count reaches the wanted one (never below it,
    unlike choose_num_splits, which rounds the chunk up and can halve the programs)."""
    tiles = max(1, -(-max_len // SCALE_TILE))
    wanted = -(-waves * sms // batch_heads)
    chunk_tiles = max(1, tiles // wanted, -(-tiles // MAX_SPLITS))
    return -(-tiles // chunk_tiles)


def round_fp8_tile_splits(splits: int, max_len: int) -> int:
    """The split count a launch really gets: chunks of whole scale tiles, so 5 splits of 12 tiles
    become chunks of 3 tiles, i.e. 4 splits (at most MAX_SPLITS)."""
    tiles = max(1, -(-max_len // SCALE_TILE))
    chunk_tiles = max(1, -(-tiles // max(1, min(splits, MAX_SPLITS))))
    return -(-tiles // chunk_tiles)


def choose_fp8_tile_launch(batch_heads: int, max_len: int, sms: int,
                           table: tuple[tuple[int, Launch], ...] | None = None) -> Launch:
    """FP8_TILE_TABLE's launch for B*H = batch_heads, with its split count resolved (automatic
    when the row says 0) and rounded to whole scale tiles. Depends on shapes only (CUDA graphs)."""
    rows = FP8_TILE_TABLE if table is None else table
    launch = rows[0][1]
    for min_bh, row in rows:
        if batch_heads >= min_bh:
            launch = row
    splits = launch.splits or auto_fp8_tile_splits(batch_heads, max_len, sms)
    return launch._replace(splits=round_fp8_tile_splits(splits, max_len))


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    sm_scale: float | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    slot_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention: the Triton kernels on CUDA, the fp32 reference on the CPU. `slot_ids`: a
    prefill's query rows over an FP8 cross cache repeat their slot (`model/fused.py`)."""
    if q.is_cuda and triton_usable(q.device):
        return decode_attention_triton(q, k, v, lengths, sm_scale, k_scale=k_scale, v_scale=v_scale, slot_ids=slot_ids)
    return decode_attention_reference(q, k, v, lengths, sm_scale, k_scale=k_scale, v_scale=v_scale, slot_ids=slot_ids)


def decode_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    sm_scale: float | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    slot_ids: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_t: int | None = None,
    num_warps: int | None = None,
    const_strides: bool | None = None,
    full_length: bool = False,
    prefetch: bool | None = None,
    mma: bool | None = None,
    launch: Launch | None = None,
) -> torch.Tensor:
    """The Triton kernels on q's device (CUDA, or the CPU under TRITON_INTERPRET=1) -> [B, H, D].

    `out` (optional, [B, H, D] in q's dtype) is written in place, as under a CUDA graph.
    The launch: for tile-scaled FP8 K/V, `launch` (a Launch; default choose_fp8_tile_launch, i.e.
    FP8_TILE_TABLE); for fp16/bf16 and per-head FP8, the v6 kernel with choose_launch's splits and
    BLOCK_T. `num_splits`, `block_t` (a power of two; with tile scales dividing SCALE_TILE for v6),
    `num_warps` and `const_strides` override the chosen launch's fields (benchmarks and tests).
    `full_length=True` promises that every row's length is T (cross-attention): the kernel then
    reads no lengths (their values are ignored); `prefetch` PREFETCH (v6: the next tile's loads
    issued before this tile's math, in registers); `mma` MMA (v6: tensor-core products; fp16 q
    only, else ignored). `prefetch` or `mma` set True selects the v6 kernel.
    """
    _check(q, k, v, lengths, k_scale, v_scale, slot_ids)
    if q.shape[2] not in (16, 32, 64, 128, 256):
        raise ValueError(f"the kernels take a head dim that is a power of two in [16, 256], got {q.shape[2]}")
    if not triton_usable(q.device):
        raise RuntimeError(f"Triton cannot run on {q.device}; on the CPU set TRITON_INTERPRET=1 before import")
    B, H, D = q.shape
    T = k.shape[2]
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    tile_scale = k_scale is not None and k_scale.dim() == 3
    sms = num_sms(q.device)
    if launch is None:
        if tile_scale:
            launch = choose_fp8_tile_launch(B * H, T, sms)
        else:
            kind = "fp16" if k_scale is None else "fp8"
            splits0, block_t0 = choose_launch(B * H, T, sms, kind)
            warps = NUM_WARPS_FP16 if kind == "fp16" else NUM_WARPS
            launch = Launch("v6", splits0, block_t0, warps, 0, False, CONST_STRIDES)
    if launch.splits == 0 and num_splits is None:  # a given launch with an automatic split count
        auto = (auto_fp8_tile_splits(B * H, T, sms) if tile_scale
                else choose_launch(B * H, T, sms, "fp16" if k_scale is None else "fp8")[0])
        launch = launch._replace(splits=auto)
    overrides = {name: value for name, value in (("splits", num_splits), ("block_t", block_t), ("num_warps", num_warps),
                                                 ("const", const_strides)) if value is not None}
    launch = launch._replace(**overrides)
    use_prefetch = PREFETCH if prefetch is None else prefetch
    use_mma = (MMA if mma is None else mma) and q.dtype == torch.float16 and k.dtype in (torch.float16, FP8_DTYPE)
    if use_prefetch or use_mma:
        launch = launch._replace(kernel="v6")
    _check_launch(launch)
    block_t = launch.block_t
    if tile_scale and (launch.kernel == "v6" or launch.scalar_scales) and SCALE_TILE % block_t:
        raise ValueError(f"block_t must divide SCALE_TILE={SCALE_TILE}, got {block_t}")
    # Whole tiles per split; with per-tile scales whole scale tiles too (a BLOCK_T tile never
    # straddles two scales in v6; v7 reads a scale per position), so the chunk is rounded to
    # SCALE_TILE there (and to BLOCK_T when BLOCK_T is larger).
    unit = max(SCALE_TILE, block_t) if tile_scale else block_t
    chunk = triton.cdiv(triton.cdiv(T, max(1, launch.splits)), unit) * unit
    splits = triton.cdiv(T, chunk)  # a num_splits override may round down like choose_num_splits
    # Partial state per (row, head, split); every program writes its entry, empty chunks included
    # (m = -1e30, l = 0), so the merge reads nothing unwritten.
    part_m = torch.empty(B * H * splits, device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(B * H * splits, D, device=q.device, dtype=torch.float32)
    has_scale = k_scale is not None
    scales = (k_scale, v_scale) if has_scale else (part_m, part_m)  # placeholders, never read
    strides = (
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        scales[0].stride(0) if has_scale else 0, scales[0].stride(1) if has_scale else 0,
        scales[1].stride(0) if has_scale else 0, scales[1].stride(1) if has_scale else 0,
        out.stride(0), out.stride(1), out.stride(2),
    )  # fmt: skip
    slot_arg = slot_ids if slot_ids is not None else lengths
    if launch.kernel == "v7":
        one_pass = launch.one_pass and splits > 1
        locks = _split_locks(q.device, B * H) if one_pass else part_m  # placeholder when unused
        kernel = _decode_v7_kernel_const if launch.const else _decode_v7_kernel
        kernel[(B * H, splits)](
            q, k, v, scales[0], scales[1], slot_arg, lengths, part_m, part_l, part_acc, locks, out,
            sm_scale * math.log2(math.e), H, T, chunk, *strides, splits,
            HAS_SCALE=has_scale, TILE_SCALE=tile_scale, HAS_SLOTS=slot_ids is not None,
            SPLIT_MODE=0 if splits == 1 else (2 if one_pass else 1), BLOCK_T=block_t, SCALE_TILE=SCALE_TILE,
            HEAD_DIM=D, FULL_T=full_length, STAGES=launch.stages, BLOCK_S=triton.next_power_of_2(splits),
            SCALAR_SCALES=launch.scalar_scales,
            num_warps=launch.num_warps, num_stages=max(1, launch.stages), **_maxnreg(launch),
        )  # fmt: skip
        if splits == 1 or one_pass:
            return out
    else:
        kernel = _decode_partial_kernel_const if launch.const else _decode_partial_kernel
        kernel[(B * H, splits)](
            q, k, v, scales[0], scales[1], slot_arg, lengths, part_m, part_l, part_acc, out,
            sm_scale * math.log2(math.e), H, T, chunk, *strides,
            splits, HAS_SCALE=has_scale, TILE_SCALE=tile_scale, HAS_SLOTS=slot_ids is not None,
            SINGLE_SPLIT=splits == 1, BLOCK_T=block_t, SCALE_TILE=SCALE_TILE, HEAD_DIM=D, FULL_T=full_length,
            PREFETCH=use_prefetch, MMA=use_mma,
            num_warps=launch.num_warps, num_stages=NUM_STAGES,
        )  # fmt: skip
        if splits == 1:
            return out
    # Pass 2 is tiny (splits x D floats per program): one warp per (row, head) suffices.
    _decode_reduce_kernel[(B * H,)](
        part_m, part_l, part_acc, out, H, splits, out.stride(0), out.stride(1), out.stride(2),
        BLOCK_S=triton.next_power_of_2(splits), HEAD_DIM=D, num_warps=1,
    )  # fmt: skip
    return out


def _maxnreg(launch: Launch) -> dict:
    """The register cap as a launch option (none unless asked: the interpreter takes no options)."""
    return {"maxnreg": launch.maxnreg} if launch.maxnreg and not interpreter_active() else {}


# One-pass split merge (here and cuda_ops/decode_linear.py): an int32 counter per (row, head) or
# output tile, zero between launches (the program that merges puts it back to 0), one buffer per
# device. Launches in stream order may share it (the engine's decode step, CUDA-graph replays on one
# stream; the encoder on the engine's side stream launches neither); two one-pass launches running at the
# same time on two streams of one device would share counters and must not be used together.
# Made at the first call outside a capture (the warm-up); a call inside a CUDA-graph capture that
# finds none (or one too small) gets a buffer of its own whose zero-fill is captured (every replay
# starts from zeros), not kept.
_LOCKS: dict = {}


def _split_locks(device: torch.device, n: int) -> torch.Tensor:
    key = str(device)
    buf = _LOCKS.get(key)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.zeros(n, dtype=torch.int32, device=device)
        buf = torch.zeros(max(n, 8192), dtype=torch.int32, device=device)
        _LOCKS[key] = buf
    return buf


def _check(q, k, v, lengths, k_scale, v_scale, slot_ids) -> None:
    """Fail loudly on shapes and dtypes that the kernels would misread."""
    if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"need q [B, H, D] and k, v [S, H, T, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, D = q.shape
    S, Hk, _, Dk = k.shape
    if (Hk, Dk) != (H, D):
        raise ValueError(f"k/v heads and dim {(Hk, Dk)} differ from q's {(H, D)}")
    if lengths.shape != (B,) or lengths.dtype != torch.int32:
        raise ValueError(f"lengths must be int32 [{B}], got {lengths.dtype} {tuple(lengths.shape)}")
    if slot_ids is None and S != B:
        raise ValueError(f"without slot_ids the cache must have B={B} rows, got {S}")
    if slot_ids is not None and (slot_ids.shape != (B,) or slot_ids.dtype != torch.int32):
        raise ValueError(f"slot_ids must be int32 [{B}], got {slot_ids.dtype} {tuple(slot_ids.shape)}")
    is_fp8 = k.dtype == FP8_DTYPE
    if is_fp8 != (k_scale is not None) or is_fp8 != (v_scale is not None) or v.dtype != k.dtype:
        raise ValueError("fp8 K/V need k_scale and v_scale [S, H]; fp16/bf16 K/V take none")
    tiles = (S, H, -(-k.shape[2] // SCALE_TILE))
    if is_fp8 and not (k_scale.shape == v_scale.shape and k_scale.shape in ((S, H), tiles)):
        raise ValueError(f"k_scale and v_scale must be [{S}, {H}] or {list(tiles)}, got {tuple(k_scale.shape)}")
    if is_fp8 and (k_scale.stride(-1) != 1 or v_scale.stride(-1) != 1):
        raise ValueError("k_scale and v_scale must be contiguous along their last dim")
    if is_fp8 and (k_scale.dtype != torch.float32 or v_scale.dtype != torch.float32):
        raise ValueError("k_scale and v_scale must be float32")


@jit
def _load_tile(k_base, v_base, t0, end, offs_d, stride_kt, stride_kd, stride_vt, stride_vd, BLOCK_T: tl.constexpr):
    """K and V of positions [t0, t0 + BLOCK_T), zeros past `end`."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    mask = (offs_t < end)[:, None]
    kt = tl.load(k_base + offs_t[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=mask, other=0.0)
    vt = tl.load(v_base + offs_t[:, None] * stride_vt + offs_d[None, :] * stride_vd, mask=mask, other=0.0)
    return kt, vt


@jit
def _tile_update(kt, vt, t0, end, q, m_i, l_i, acc, ks_base, vs_base,
                 TILE_SCALE: tl.constexpr, SCALE_TILE: tl.constexpr, BLOCK_T: tl.constexpr):
    """One tile of the per-lane online softmax: (m_i, l_i, acc) after positions [t0, t0 + BLOCK_T)."""
    mask_t = t0 + tl.arange(0, BLOCK_T) < end
    s = tl.sum(kt.to(tl.float32) * q[None, :], axis=1)  # [BLOCK_T], base-2 logits
    if TILE_SCALE:  # the tile's scales: one load each, a multiply per position (not per element)
        s = s * tl.load(ks_base + t0 // SCALE_TILE)
    s = tl.where(mask_t, s, float("-inf"))
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    pv = p
    if TILE_SCALE:
        pv = p * tl.load(vs_base + t0 // SCALE_TILE)
    acc = acc * alpha[:, None] + pv[:, None] * vt.to(tl.float32)
    l_i = l_i * alpha + p
    return m_new, l_i, acc


@jit
def _lanes(q, k_base, v_base, ks_base, vs_base, start, end, offs_d, stride_kt, stride_kd, stride_vt, stride_vd,
           TILE_SCALE: tl.constexpr, SCALE_TILE: tl.constexpr, BLOCK_T: tl.constexpr, HEAD_DIM: tl.constexpr,
           PREFETCH: tl.constexpr):
    """The per-lane online softmax over positions [start, end) -> (max, sum, unnormalised out [D])."""
    m_i = tl.full((BLOCK_T,), -1e30, tl.float32)
    l_i = tl.zeros((BLOCK_T,), tl.float32)
    acc = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    if PREFETCH:
        # Registers double-buffered by hand: tile i+1's K/V loads are issued before tile i's math,
        # so their latency overlaps it (A/B: whether Triton pipelines these plain loads itself is
        # not known). The load past `end` is fully masked: no memory traffic.
        kt, vt = _load_tile(k_base, v_base, start, end, offs_d, stride_kt, stride_kd, stride_vt, stride_vd, BLOCK_T)
        for t0 in range(start, end, BLOCK_T):
            kn, vn = _load_tile(k_base, v_base, t0 + BLOCK_T, end, offs_d, stride_kt, stride_kd, stride_vt, stride_vd,
                                BLOCK_T)
            m_i, l_i, acc = _tile_update(kt, vt, t0, end, q, m_i, l_i, acc, ks_base, vs_base,
                                         TILE_SCALE, SCALE_TILE, BLOCK_T)
            kt, vt = kn, vn
    else:
        for t0 in range(start, end, BLOCK_T):
            # Both loads first, so that V's is in flight while the scores are computed.
            kt, vt = _load_tile(k_base, v_base, t0, end, offs_d, stride_kt, stride_kd, stride_vt, stride_vd, BLOCK_T)
            m_i, l_i, acc = _tile_update(kt, vt, t0, end, q, m_i, l_i, acc, ks_base, vs_base,
                                         TILE_SCALE, SCALE_TILE, BLOCK_T)
    m_max = tl.max(m_i, axis=0)
    w = tl.exp2(m_i - m_max)
    l_sum = tl.sum(l_i * w, axis=0)
    o = tl.sum(acc * w[:, None], axis=0)  # [HEAD_DIM]
    return m_max, l_sum, o


@jit
def _decode_partial(
    q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    H, T, chunk,
    stride_qb, stride_qh, stride_qd,
    stride_ks, stride_kh, stride_kt, stride_kd,
    stride_vs, stride_vh, stride_vt, stride_vd,
    stride_kss, stride_ksh, stride_vss, stride_vsh,
    stride_ob, stride_oh, stride_od,
    num_splits,
    HAS_SCALE: tl.constexpr, TILE_SCALE: tl.constexpr, HAS_SLOTS: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, SCALE_TILE: tl.constexpr, HEAD_DIM: tl.constexpr, FULL_T: tl.constexpr,
    PREFETCH: tl.constexpr, MMA: tl.constexpr,
):  # fmt: skip
    """Pass 1's body; the two kernels below differ only in which arguments are compile-time."""
    pid = tl.program_id(0)  # b * H + h
    split = tl.program_id(1)
    b = pid // H
    h = pid % H
    if FULL_T:  # every row attends to all T positions (cross-attention): no load before the loop
        length = T
    else:
        length = tl.minimum(tl.load(len_ptr + b), T)
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + b).to(tl.int64)
    else:
        slot = b.to(tl.int64)

    # HEAD_DIM is exact (a power of two), so no load is masked along it: a mask that varies along
    # the contiguous axis stops vector loads (the fp8 path was 10% slower with one).
    offs_d = tl.arange(0, HEAD_DIM)
    q_in = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_d * stride_qd).to(tl.float32)
    scale = qk_scale
    if HAS_SCALE and not TILE_SCALE:
        scale = scale * tl.load(k_scale_ptr + slot * stride_kss + h * stride_ksh)
    q = q_in * scale  # folding both scales into q costs D multiplies instead of one per position
    ks_base = k_scale_ptr + slot * stride_kss + h * stride_ksh
    vs_base = v_scale_ptr + slot * stride_vss + h * stride_vsh

    k_base = k_ptr + slot * stride_ks + h * stride_kh
    v_base = v_ptr + slot * stride_vs + h * stride_vh
    # Per-lane online softmax: lane t of every tile keeps its own running max m, sum l and
    # output row acc[t, :], so the loop has no reduction across warps (the q.k sum runs along D
    # inside a warp); the lanes are merged once after the loop. This ran 1.3-1.5x faster than
    # reducing p @ V to [D] in every tile. The finite start (-1e30, not -inf) keeps exp2(m - m_new)
    # at 0 or 1 for lanes that have seen no valid position yet, never NaN.
    if MMA:
        # Tensor cores (A/B, `mma=True`): q is broadcast to 16 identical rows, q.K^T and P.V are
        # tl.dot of fp16 operands with fp32 accumulation, so each K/V element costs half an
        # e4m3x2 -> f16x2 conversion and no fp32 conversion, multiply or cross-lane sum (the
        # per-lane path spends ~1.5 conversions, ~1.5 shuffles and ~2 fp32 ops per element).
        # P is rounded to fp16 for the second product, as flash-attention does.
        qm = (tl.zeros((16, HEAD_DIM), tl.float32) + q_in[None, :]).to(tl.float16)
        m_r = tl.full((16,), -1e30, tl.float32)
        l_r = tl.zeros((16,), tl.float32)
        acc_r = tl.zeros((16, HEAD_DIM), tl.float32)
        for t0 in range(start, end, BLOCK_T):
            kt, vt = _load_tile(k_base, v_base, t0, end, offs_d, stride_kt, stride_kd, stride_vt, stride_vd, BLOCK_T)
            mask_t = t0 + tl.arange(0, BLOCK_T) < end
            sc = scale
            if TILE_SCALE:
                sc = sc * tl.load(ks_base + t0 // SCALE_TILE)
            s = tl.dot(qm, tl.trans(kt.to(tl.float16))) * sc  # [16, BLOCK_T], base-2 logits
            s = tl.where(mask_t[None, :], s, float("-inf"))
            m_new = tl.maximum(m_r, tl.max(s, axis=1))
            alpha = tl.exp2(m_r - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_r = l_r * alpha + tl.sum(p, axis=1)
            pv = tl.dot(p.to(tl.float16), vt.to(tl.float16))  # [16, HEAD_DIM]
            if TILE_SCALE:
                pv = pv * tl.load(vs_base + t0 // SCALE_TILE)
            acc_r = acc_r * alpha[:, None] + pv
            m_r = m_new
        row0 = tl.arange(0, 16) == 0  # the 16 rows are equal; take row 0 exactly
        m_max = tl.max(tl.where(row0, m_r, -1e30), axis=0)
        l_sum = tl.sum(tl.where(row0, l_r, 0.0), axis=0)
        o = tl.sum(tl.where(row0[:, None], acc_r, 0.0), axis=0)
    else:
        m_max, l_sum, o = _lanes(q, k_base, v_base, ks_base, vs_base, start, end, offs_d,
                                 stride_kt, stride_kd, stride_vt, stride_vd,
                                 TILE_SCALE, SCALE_TILE, BLOCK_T, HEAD_DIM, PREFETCH)
    if HAS_SCALE and not TILE_SCALE:
        o = o * tl.load(vs_base)

    if SINGLE_SPLIT:
        o = tl.where(l_sum > 0, o / tl.maximum(l_sum, 1e-30), 0.0)  # length 0 -> zeros, not NaN
        out_ptrs = out_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty))
    else:
        part = pid * num_splits + split
        tl.store(part_m_ptr + part, m_max)
        tl.store(part_l_ptr + part, l_sum)
        tl.store(part_acc_ptr + part * HEAD_DIM + offs_d, o)


@jit
def _decode_partial_kernel(
    q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    qk_scale, H, T, chunk,
    stride_qb, stride_qh, stride_qd,
    stride_ks, stride_kh, stride_kt, stride_kd,
    stride_vs, stride_vh, stride_vt, stride_vd,
    stride_kss, stride_ksh, stride_vss, stride_vsh,
    stride_ob, stride_oh, stride_od,
    num_splits,  # runtime, so that batch buckets of different split counts share one compiled kernel
    HAS_SCALE: tl.constexpr, TILE_SCALE: tl.constexpr, HAS_SLOTS: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, SCALE_TILE: tl.constexpr, HEAD_DIM: tl.constexpr, FULL_T: tl.constexpr,
    PREFETCH: tl.constexpr, MMA: tl.constexpr,
):  # fmt: skip
    _decode_partial(
        q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
        part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, qk_scale, H, T, chunk,
        stride_qb, stride_qh, stride_qd, stride_ks, stride_kh, stride_kt, stride_kd,
        stride_vs, stride_vh, stride_vt, stride_vd, stride_kss, stride_ksh, stride_vss, stride_vsh,
        stride_ob, stride_oh, stride_od, num_splits,
        HAS_SCALE, TILE_SCALE, HAS_SLOTS, SINGLE_SPLIT, BLOCK_T, SCALE_TILE, HEAD_DIM, FULL_T, PREFETCH, MMA,
    )  # fmt: skip


@jit
def _decode_partial_kernel_const(
    q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    qk_scale, H: tl.constexpr, T: tl.constexpr, chunk: tl.constexpr,
    stride_qb: tl.constexpr, stride_qh: tl.constexpr, stride_qd: tl.constexpr,
    stride_ks: tl.constexpr, stride_kh: tl.constexpr, stride_kt: tl.constexpr, stride_kd: tl.constexpr,
    stride_vs: tl.constexpr, stride_vh: tl.constexpr, stride_vt: tl.constexpr, stride_vd: tl.constexpr,
    stride_kss: tl.constexpr, stride_ksh: tl.constexpr, stride_vss: tl.constexpr, stride_vsh: tl.constexpr,
    stride_ob: tl.constexpr, stride_oh: tl.constexpr, stride_od: tl.constexpr,
    num_splits: tl.constexpr,
    HAS_SCALE: tl.constexpr, TILE_SCALE: tl.constexpr, HAS_SLOTS: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, SCALE_TILE: tl.constexpr, HEAD_DIM: tl.constexpr, FULL_T: tl.constexpr,
    PREFETCH: tl.constexpr, MMA: tl.constexpr,
):  # fmt: skip
    # Every shape and stride compile-time (one compile per call site and split count; fixed under
    # CUDA graphs). The A/B for the 25-30 % fp8 gap a prototype with constant strides showed
    # (docs/kernels-attention-mel.md, Open); chosen by decode_attention_triton(const_strides=...).
    _decode_partial(
        q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
        part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, qk_scale, H, T, chunk,
        stride_qb, stride_qh, stride_qd, stride_ks, stride_kh, stride_kt, stride_kd,
        stride_vs, stride_vh, stride_vt, stride_vd, stride_kss, stride_ksh, stride_vss, stride_vsh,
        stride_ob, stride_oh, stride_od, num_splits,
        HAS_SCALE, TILE_SCALE, HAS_SLOTS, SINGLE_SPLIT, BLOCK_T, SCALE_TILE, HEAD_DIM, FULL_T, PREFETCH, MMA,
    )  # fmt: skip


@jit
def _decode_reduce_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    H, num_splits, stride_ob, stride_oh, stride_od,
    BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)  # b * H + h
    b = pid // H
    h = pid % H
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < num_splits
    offs_d = tl.arange(0, HEAD_DIM)
    part = pid * num_splits + offs_s
    m = tl.load(part_m_ptr + part, mask=mask_s, other=float("-inf"))
    l = tl.load(part_l_ptr + part, mask=mask_s, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_s[:, None], other=0.0)
    m_max = tl.max(m, axis=0)  # finite: an empty chunk's partial has m = -1e30 and l = 0
    w = tl.exp2(m - m_max)  # the tile's padding (-inf) weighs 0
    l_sum = tl.sum(w * l, axis=0)
    o = tl.sum(w[:, None] * acc, axis=0)
    o = tl.where(l_sum > 0, o / tl.maximum(l_sum, 1e-30), 0.0)
    out_ptrs = out_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od
    tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty))


@jit
def _decode_v7(
    q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
    part_m_ptr, part_l_ptr, part_acc_ptr, lock_ptr, out_ptr,
    qk_scale, H, T, chunk,
    stride_qb, stride_qh, stride_qd,
    stride_ks, stride_kh, stride_kt, stride_kd,
    stride_vs, stride_vh, stride_vt, stride_vd,
    stride_kss, stride_ksh, stride_vss, stride_vsh,
    stride_ob, stride_oh, stride_od,
    num_splits,
    HAS_SCALE: tl.constexpr, TILE_SCALE: tl.constexpr, HAS_SLOTS: tl.constexpr, SPLIT_MODE: tl.constexpr,
    BLOCK_T: tl.constexpr, SCALE_TILE: tl.constexpr, HEAD_DIM: tl.constexpr, FULL_T: tl.constexpr,
    STAGES: tl.constexpr, BLOCK_S: tl.constexpr, SCALAR_SCALES: tl.constexpr,
):  # fmt: skip
    """Pass 1 of v7 (Launch.kernel "v7"): v6's per-lane online softmax, with
    - the loop a tl.range(num_stages=STAGES) when STAGES >= 2: Triton pipelines loops without a dot
      only when the loop itself carries num_stages; then every K/V tile is copied to shared memory
      by cp.async STAGES - 1 tiles ahead of its math (v6's plain range loads each tile into
      registers and waits on it: one tile of bytes in flight per program);
    - tile scales read as one value per position (offs_t // SCALE_TILE: a broadcast load, pipelined
      with the tile; v6 loads a scalar per tile and waits on it), so BLOCK_T need not divide
      SCALE_TILE;
    - SPLIT_MODE 0: one split, the output written here; 1: partials for _decode_reduce_kernel;
      2: partials, then the last program of the (row, head) (an atomic counter in lock_ptr) merges
      them and writes the output: no second launch.
    """
    pid = tl.program_id(0)  # b * H + h
    split = tl.program_id(1)
    b = pid // H
    h = pid % H
    if FULL_T:
        length = T
    else:
        length = tl.minimum(tl.load(len_ptr + b), T)
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + b).to(tl.int64)
    else:
        slot = b.to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    scale = qk_scale
    if HAS_SCALE and not TILE_SCALE:
        scale = scale * tl.load(k_scale_ptr + slot * stride_kss + h * stride_ksh)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_d * stride_qd).to(tl.float32) * scale
    ks_base = k_scale_ptr + slot * stride_kss + h * stride_ksh
    vs_base = v_scale_ptr + slot * stride_vss + h * stride_vsh
    k_base = k_ptr + slot * stride_ks + h * stride_kh
    v_base = v_ptr + slot * stride_vs + h * stride_vh

    m_i = tl.full((BLOCK_T,), -1e30, tl.float32)
    l_i = tl.zeros((BLOCK_T,), tl.float32)
    acc = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    if STAGES >= 2:
        for t0 in tl.range(start, end, BLOCK_T, num_stages=STAGES):
            m_i, l_i, acc = _v7_step(t0, end, q, m_i, l_i, acc, k_base, v_base, ks_base, vs_base, offs_d,
                                     stride_kt, stride_kd, stride_vt, stride_vd, TILE_SCALE, SCALE_TILE, BLOCK_T,
                                     SCALAR_SCALES)
    else:
        for t0 in range(start, end, BLOCK_T):
            m_i, l_i, acc = _v7_step(t0, end, q, m_i, l_i, acc, k_base, v_base, ks_base, vs_base, offs_d,
                                     stride_kt, stride_kd, stride_vt, stride_vd, TILE_SCALE, SCALE_TILE, BLOCK_T,
                                     SCALAR_SCALES)
    m_max = tl.max(m_i, axis=0)
    w = tl.exp2(m_i - m_max)
    l_sum = tl.sum(l_i * w, axis=0)
    o = tl.sum(acc * w[:, None], axis=0)  # [HEAD_DIM]
    if HAS_SCALE and not TILE_SCALE:
        o = o * tl.load(vs_base)

    out_ptrs = out_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od
    if SPLIT_MODE == 0:
        o = tl.where(l_sum > 0, o / tl.maximum(l_sum, 1e-30), 0.0)  # length 0 -> zeros, not NaN
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty))
    else:
        part = pid * num_splits + split
        tl.store(part_m_ptr + part, m_max)
        tl.store(part_l_ptr + part, l_sum)
        tl.store(part_acc_ptr + part * HEAD_DIM + offs_d, o)
        if SPLIT_MODE == 2:
            # Every thread's partial stores come before the counter's release (the CUTLASS
            # semaphore's order: barrier, then one release by one thread); the program that takes
            # the count to num_splits - 1 acquires, reads all partials from L2 (.cg: never a stale
            # L1 line), merges, writes the output and zeroes the counter for the next launch.
            tl.debug_barrier()
            count = tl.atomic_add(lock_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if count == num_splits - 1:
                offs_s = tl.arange(0, BLOCK_S)
                mask_s = offs_s < num_splits
                parts = pid * num_splits + offs_s
                pm = tl.load(part_m_ptr + parts, mask=mask_s, other=float("-inf"), cache_modifier=".cg")
                pl = tl.load(part_l_ptr + parts, mask=mask_s, other=0.0, cache_modifier=".cg")
                pacc = tl.load(part_acc_ptr + parts[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_s[:, None],
                               other=0.0, cache_modifier=".cg")
                mm = tl.max(pm, axis=0)  # finite: an empty chunk's partial has m = -1e30 and l = 0
                ww = tl.exp2(pm - mm)
                ll = tl.sum(ww * pl, axis=0)
                oo = tl.sum(ww[:, None] * pacc, axis=0)
                oo = tl.where(ll > 0, oo / tl.maximum(ll, 1e-30), 0.0)
                tl.store(out_ptrs, oo.to(out_ptr.dtype.element_ty))
                tl.atomic_xchg(lock_ptr + pid, 0, sem="relaxed", scope="gpu")


@jit
def _v7_step(t0, end, q, m_i, l_i, acc, k_base, v_base, ks_base, vs_base, offs_d,
             stride_kt, stride_kd, stride_vt, stride_vd,
             TILE_SCALE: tl.constexpr, SCALE_TILE: tl.constexpr, BLOCK_T: tl.constexpr, SCALAR_SCALES: tl.constexpr):
    """Positions [t0, t0 + BLOCK_T) of v7's loop: loads (K, V and, with tile scales, each
    position's two scales), then v6's per-lane online-softmax update."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    mask_t = offs_t < end
    kt = tl.load(k_base + offs_t[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=mask_t[:, None], other=0.0)
    vt = tl.load(v_base + offs_t[:, None] * stride_vt + offs_d[None, :] * stride_vd, mask=mask_t[:, None], other=0.0)
    s = tl.sum(kt.to(tl.float32) * q[None, :], axis=1)  # [BLOCK_T], base-2 logits
    if TILE_SCALE:
        if SCALAR_SCALES:  # BLOCK_T divides SCALE_TILE: one scale for the whole tile
            ksc = tl.load(ks_base + t0 // SCALE_TILE)
            vsc = tl.load(vs_base + t0 // SCALE_TILE)
        else:
            tile = offs_t // SCALE_TILE
            ksc = tl.load(ks_base + tile, mask=mask_t, other=0.0)
            vsc = tl.load(vs_base + tile, mask=mask_t, other=0.0)
        s = s * ksc
    s = tl.where(mask_t, s, float("-inf"))
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    pv = p
    if TILE_SCALE:
        pv = p * vsc
    acc = acc * alpha[:, None] + pv[:, None] * vt.to(tl.float32)
    l_i = l_i * alpha + p
    return m_new, l_i, acc


@jit
def _decode_v7_kernel(
    q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
    part_m_ptr, part_l_ptr, part_acc_ptr, lock_ptr, out_ptr,
    qk_scale, H, T, chunk,
    stride_qb, stride_qh, stride_qd,
    stride_ks, stride_kh, stride_kt, stride_kd,
    stride_vs, stride_vh, stride_vt, stride_vd,
    stride_kss, stride_ksh, stride_vss, stride_vsh,
    stride_ob, stride_oh, stride_od,
    num_splits,
    HAS_SCALE: tl.constexpr, TILE_SCALE: tl.constexpr, HAS_SLOTS: tl.constexpr, SPLIT_MODE: tl.constexpr,
    BLOCK_T: tl.constexpr, SCALE_TILE: tl.constexpr, HEAD_DIM: tl.constexpr, FULL_T: tl.constexpr,
    STAGES: tl.constexpr, BLOCK_S: tl.constexpr, SCALAR_SCALES: tl.constexpr,
):  # fmt: skip
    _decode_v7(
        q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
        part_m_ptr, part_l_ptr, part_acc_ptr, lock_ptr, out_ptr, qk_scale, H, T, chunk,
        stride_qb, stride_qh, stride_qd, stride_ks, stride_kh, stride_kt, stride_kd,
        stride_vs, stride_vh, stride_vt, stride_vd, stride_kss, stride_ksh, stride_vss, stride_vsh,
        stride_ob, stride_oh, stride_od, num_splits,
        HAS_SCALE, TILE_SCALE, HAS_SLOTS, SPLIT_MODE, BLOCK_T, SCALE_TILE, HEAD_DIM, FULL_T, STAGES, BLOCK_S,
        SCALAR_SCALES,
    )  # fmt: skip


@jit
def _decode_v7_kernel_const(
    q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
    part_m_ptr, part_l_ptr, part_acc_ptr, lock_ptr, out_ptr,
    qk_scale, H: tl.constexpr, T: tl.constexpr, chunk: tl.constexpr,
    stride_qb: tl.constexpr, stride_qh: tl.constexpr, stride_qd: tl.constexpr,
    stride_ks: tl.constexpr, stride_kh: tl.constexpr, stride_kt: tl.constexpr, stride_kd: tl.constexpr,
    stride_vs: tl.constexpr, stride_vh: tl.constexpr, stride_vt: tl.constexpr, stride_vd: tl.constexpr,
    stride_kss: tl.constexpr, stride_ksh: tl.constexpr, stride_vss: tl.constexpr, stride_vsh: tl.constexpr,
    stride_ob: tl.constexpr, stride_oh: tl.constexpr, stride_od: tl.constexpr,
    num_splits: tl.constexpr,
    HAS_SCALE: tl.constexpr, TILE_SCALE: tl.constexpr, HAS_SLOTS: tl.constexpr, SPLIT_MODE: tl.constexpr,
    BLOCK_T: tl.constexpr, SCALE_TILE: tl.constexpr, HEAD_DIM: tl.constexpr, FULL_T: tl.constexpr,
    STAGES: tl.constexpr, BLOCK_S: tl.constexpr, SCALAR_SCALES: tl.constexpr,
):  # fmt: skip
    # Shapes and strides compile-time (v6's CONST_STRIDES A/B: 86 against 78 % of copy at B = 256
    # on the H200 in session 6); strides of a [S, H, T, D] cache do not depend on S, so one compile
    # serves every batch bucket of a split count.
    _decode_v7(
        q_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, len_ptr,
        part_m_ptr, part_l_ptr, part_acc_ptr, lock_ptr, out_ptr, qk_scale, H, T, chunk,
        stride_qb, stride_qh, stride_qd, stride_ks, stride_kh, stride_kt, stride_kd,
        stride_vs, stride_vh, stride_vt, stride_vd, stride_kss, stride_ksh, stride_vss, stride_vsh,
        stride_ob, stride_oh, stride_od, num_splits,
        HAS_SCALE, TILE_SCALE, HAS_SLOTS, SPLIT_MODE, BLOCK_T, SCALE_TILE, HEAD_DIM, FULL_T, STAGES, BLOCK_S,
        SCALAR_SCALES,
    )  # fmt: skip
