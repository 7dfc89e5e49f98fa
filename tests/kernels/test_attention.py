"""Decode attention kernels against the fp32 reference, on CUDA or through Triton's interpreter.

Tolerance rule (flash-attention's): the kernel's max error against the fp32 reference may be at
most 2x PyTorch's own error when it runs the same attention (SDPA) in the low-precision dtype,
plus 1e-5 so that an exact baseline (e.g. one position: output = v) leaves room for rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cuda_ops.attention import (
    FP8_DTYPE,
    choose_num_splits,
    decode_attention_reference,
    decode_attention_triton,
    dequantize_kv,
    quantize_kv,
    quantize_kv_tiles,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
D = 64  # every Whisper size has head dim 64

# The interpreter runs each program in numpy, so the CPU gets the shapes that cover the paths
# (one split and several, partial tiles, length 1, slots, both H) at small B*H; CUDA gets all.
if CUDA:
    SHAPES = [(b, h, t) for b in (1, 3, 7) for h in (6, 20) for t in (1, 17, 448, 1500)]
else:
    SHAPES = [(1, 6, 1), (3, 6, 17), (7, 6, 17), (3, 6, 448), (1, 20, 448), (1, 6, 1500)]


def make_case(B, H, T, kv, slots, seed=0, q_dtype=torch.float16):
    """Random q/K/V and per-row lengths (row 0 has length 1, the last row all T)."""
    gen = torch.Generator().manual_seed(seed)
    S = B + 3 if slots else B
    q = torch.randn(B, H, D, generator=gen).to(q_dtype)
    k = torch.randn(S, H, T, D, generator=gen)
    v = torch.randn(S, H, T, D, generator=gen)
    k = k * torch.rand(S, H, 1, 1, generator=gen) * 4  # heads of different ranges -> different scales
    lengths = torch.randint(1, T + 1, (B,), generator=gen, dtype=torch.int32)
    lengths[0] = 1
    lengths[-1] = T
    slot_ids = torch.randperm(S, generator=gen)[:B].to(torch.int32) if slots else None
    args = dict(k_scale=None, v_scale=None, slot_ids=slot_ids)
    if kv == "fp8":
        k, args["k_scale"] = quantize_kv(k)
        v, args["v_scale"] = quantize_kv(v)
    elif kv == "fp8tile":  # one scale per (slot, head, 128 positions), as cross_kv.py writes them
        k = k * torch.linspace(0.1, 3, T)[None, None, :, None]  # tiles of different ranges
        k, args["k_scale"] = quantize_kv_tiles(k)
        v, args["v_scale"] = quantize_kv_tiles(v)
    else:
        k, v = k.to(kv), v.to(kv)
    move = lambda x: None if x is None else x.to(DEVICE)  # noqa: E731
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), lengths.to(DEVICE), {n: move(x) for n, x in args.items()}


def bound(q, k, v, lengths, args, ref32):
    """2x the error of PyTorch's SDPA run in q's dtype on the same (dequantised) K/V, + 1e-5."""
    kf = k.float() if args["k_scale"] is None else dequantize_kv(k, args["k_scale"])
    vf = v.float() if args["v_scale"] is None else dequantize_kv(v, args["v_scale"])
    if args["slot_ids"] is not None:
        kf, vf = kf[args["slot_ids"].long()], vf[args["slot_ids"].long()]
    T = k.shape[2]
    mask = torch.arange(T, device=q.device)[None, :] < lengths[:, None]  # [B, T]
    low = F.scaled_dot_product_attention(
        q[:, :, None], kf.to(q.dtype), vf.to(q.dtype), attn_mask=mask[:, None, None, :]
    )[:, :, 0]
    return 2 * (low.float() - ref32).abs().max().item() + 1e-5


def check(out, ref32, tol):
    assert torch.isfinite(out).all(), "kernel output has NaN/inf (or unwritten poison)"
    err = (out.float() - ref32).abs().max().item()
    assert err <= tol, f"max error {err:.3g} > bound {tol:.3g}"


@pytest.mark.parametrize("slots", [False, True], ids=["direct", "slots"])
@pytest.mark.parametrize("kv", ["fp8", torch.float16], ids=["fp8", "fp16"])
@pytest.mark.parametrize("B,H,T", SHAPES)
def test_matches_reference(B, H, T, kv, slots):
    q, k, v, lengths, args = make_case(B, H, T, kv, slots)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    result = decode_attention_triton(q, k, v, lengths, **args, out=out)
    assert result is out and out.dtype == q.dtype
    check(out, ref32, bound(q, k, v, lengths, args, ref32))


def test_bf16_cross_attention():
    """bf16 q/K/V, every row at the full encoder length (cross-attention)."""
    B, H, T = (3, 20, 1500) if CUDA else (1, 6, 1500)
    q, k, v, lengths, args = make_case(B, H, T, torch.bfloat16, False, q_dtype=torch.bfloat16)
    lengths.fill_(T)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    out = decode_attention_triton(q, k, v, lengths, **args)
    assert out.dtype == torch.bfloat16
    check(out, ref32, bound(q, k, v, lengths, args, ref32))


@pytest.mark.parametrize("kv", ["fp8", torch.float16], ids=["fp8", "fp16"])
def test_split_counts_agree(kv):
    """One split (pass 1 writes the output), 2 and the chosen 3 (pass 2 merges) agree."""
    q, k, v, lengths, args = make_case(3, 6, 300, kv, True, seed=1)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    for splits in (1, 2, None):
        check(decode_attention_triton(q, k, v, lengths, **args, num_splits=splits), ref32, tol)


def test_zero_length_rows_give_zeros():
    """Padding rows of a CUDA-graph batch bucket have length 0: zeros, never NaN."""
    q, k, v, lengths, args = make_case(3, 6, 200, "fp8", False)
    lengths[1] = 0
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    assert torch.equal(ref32[1], torch.zeros_like(ref32[1]))
    for splits in (1, 2):
        out = torch.full_like(q, float("nan"))
        decode_attention_triton(q, k, v, lengths, **args, out=out, num_splits=splits)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        check(out, ref32, 1e-2)  # accuracy is test_matches_reference's job; this one checks the zero row


def test_strided_cache_view():
    """A cache stored [S, T, H, D] and viewed as [S, H, T, D] (non-contiguous) is read correctly."""
    q, k, v, lengths, args = make_case(3, 6, 17, torch.float16, True, seed=2)
    k_sthd, v_sthd = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    out = decode_attention_triton(q, k_sthd.transpose(1, 2), v_sthd.transpose(1, 2), lengths, **args)
    check(out, ref32, bound(q, k, v, lengths, args, ref32))


def test_quantize_kv_round_trip():
    """e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals, absolute <= 2^-10 x scale below."""
    x = torch.randn(2, 3, 50, D) * torch.tensor([1e-3, 1.0, 300.0])[None, :, None, None]
    x[1, 2] = 0  # an all-zero head must not divide by zero
    x8, scale = quantize_kv(x.half())
    assert x8.dtype == FP8_DTYPE and scale.shape == (2, 3) and scale.dtype == torch.float32
    assert scale[1, 2] == 1.0 and torch.equal(x8[1, 2].float(), torch.zeros(50, D))
    back = dequantize_kv(x8, scale)
    xh = x.half().float()
    assert (back - xh).abs().le(xh.abs() * 2**-4 + scale[:, :, None, None] * 2**-10).all()
    assert torch.allclose(back.abs().amax(dim=(2, 3))[scale != 1.0], xh.abs().amax(dim=(2, 3))[scale != 1.0], rtol=2**-4)


def test_choose_num_splits_fills_the_gpu():
    """Small batches split T until ~2 programs per SM, in whole tiles; large batches and short T do not."""
    assert choose_num_splits(1 * 20, 1500, 132) == 12  # 12 tiles of 128 cap the 14 wanted
    assert choose_num_splits(8 * 20, 1500, 132) == 2
    assert choose_num_splits(32 * 20, 1500, 132) == 1
    assert choose_num_splits(1 * 20, 448, 132) == 4
    assert choose_num_splits(3 * 6, 1500, 132) == 12
    assert choose_num_splits(5 * 6, 1500, 132) == 6  # 9 wanted -> chunks of 2 tiles -> 6 splits
    assert choose_num_splits(1 * 6, 100, 132) == 1
    assert all(1 <= choose_num_splits(bh, t, 132) <= 32 for bh in (1, 6, 20, 5120) for t in (1, 448, 1500, 10**6))


def test_fp8_tile_launch_fills_the_sms():
    """Tile-scaled FP8 (the engine's cross cache): T is split until B*H*splits >= 4 x 132 programs
    (or every split is one 128-position scale tile): the counts the H200 sweeps of 2026-12-01 found
    best (B=1 12, B=8 4, B>=32 1); from B=32 the table's v7 launches use BLOCK_T 32."""
    from cuda_ops.attention import WAVES_FP8, choose_launch

    assert [choose_launch(b * 20, 1500, 132, "fp8tile") for b in (1, 8, 32, 128, 256)] == [
        (12, 64), (4, 64), (1, 32), (1, 32), (1, 32)]
    for bh in (1, 6, 20, 48, 60, 120, 160, 320, 527, 528, 640, 5120):
        splits, _ = choose_launch(bh, 1500, 132, "fp8tile")
        assert bh * splits >= WAVES_FP8 * 132 or splits == 12, (bh, splits)
    assert choose_launch(1, 10**6, 132, "fp8tile")[0] == 32  # MAX_SPLITS
    assert choose_launch(1, 1, 132, "fp8tile")[0] == 1
    assert choose_launch(8 * 20, 1500, 132, "fp16") == (2, 32)  # fp16: BLOCK_T_FP16 (self-attention sweep)
    assert choose_launch(8 * 20, 1500, 132, "fp8") == (6, 128)


def test_reference_rejects_bad_inputs():
    q, k, v, lengths, args = make_case(3, 6, 17, "fp8", False)
    with pytest.raises(ValueError, match="k_scale"):
        decode_attention_reference(q, k, v, lengths)
    with pytest.raises(ValueError, match="lengths"):
        decode_attention_reference(q, k, v, lengths.long(), **args)
    with pytest.raises(ValueError, match="slot_ids"):
        decode_attention_reference(q, k[:2], v[:2], lengths, **args)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_graph_replay_with_new_lengths():
    """The engine captures the decode step once per batch bucket and replays it as lengths grow."""
    q, k, v, lengths, args = make_case(7, 20, 448, "fp8", True, seed=3)
    out = torch.empty_like(q)
    decode_attention_triton(q, k, v, lengths, **args, out=out)  # compile before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention_triton(q, k, v, lengths, **args, out=out)
    for step in range(3):
        lengths.copy_(torch.clamp(lengths + 50 * step, max=448))
        q.copy_(torch.randn_like(q))
        graph.replay()
        ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
        check(out, ref32, bound(q, k, v, lengths, args, ref32))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_partials_are_written_before_read():
    """Poison the caching allocator with NaN so that an unwritten partial would show."""
    q, k, v, lengths, args = make_case(1, 20, 1500, "fp8", False, seed=4)
    lengths.fill_(37)  # 1 of 12 splits holds positions; the other 11 write empty partials
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    # Blocks under 1 MiB come from the allocator's small pool: fill it with NaN, then free it.
    poison = [torch.full((64 * 1024,), float("nan"), device=DEVICE) for _ in range(64)]
    del poison
    check(decode_attention_triton(q, k, v, lengths, **args), ref32, tol)


TILE_SHAPES = [(3, 20, 1500), (7, 6, 300), (1, 6, 448)] if CUDA else [(3, 6, 300), (1, 6, 1500)]


@pytest.mark.parametrize("slots", [False, True], ids=["direct", "slots"])
@pytest.mark.parametrize("B,H,T", TILE_SHAPES)
def test_tile_scales_match_reference(B, H, T, slots):
    """FP8 K/V with a scale per 128-position tile: every split count and BLOCK_T 64 and 128."""
    q, k, v, lengths, args = make_case(B, H, T, "fp8tile", slots, seed=3)
    assert args["k_scale"].shape == (k.shape[0], H, -(-T // 128))
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    for splits, block_t in ((1, 128), (2, 64), (None, 128)):
        out = torch.full_like(q, float("nan"))
        decode_attention_triton(q, k, v, lengths, **args, out=out, num_splits=splits, block_t=block_t)
        check(out, ref32, tol)


@pytest.mark.parametrize("kv", ["fp8tile", "fp8", torch.float16], ids=["fp8tile", "fp8", "fp16"])
def test_tensor_core_path_matches_reference(kv):
    """mma=True (q.K^T and P.V by tl.dot on 16 broadcast rows): the same bound, with one split and
    several, BLOCK_T 64 and 32, slots, partial tiles and a row of length 1."""
    shapes = [(3, 20, 1500), (7, 6, 300), (1, 6, 17)] if CUDA else [(2, 3, 300), (1, 2, 17)]
    for B, H, T in shapes:
        q, k, v, lengths, args = make_case(B, H, T, kv, True, seed=5)
        ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
        tol = bound(q, k, v, lengths, args, ref32)
        for splits, block_t in ((1, 64), (2, 32), (None, None)):
            out = torch.full_like(q, float("nan"))
            decode_attention_triton(q, k, v, lengths, **args, out=out, num_splits=splits, block_t=block_t, mma=True)
            check(out, ref32, tol)


def test_quantize_kv_tiles_round_trip():
    """Per-tile scales: each tile's amax maps to 448 and every element is within the e4m3 step."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 300, D, generator=gen) * torch.linspace(0.01, 5, 300)[None, None, :, None]
    x8, scale = quantize_kv_tiles(x.half())
    assert x8.dtype == FP8_DTYPE and scale.shape == (2, 3, 3) and x8.is_contiguous()
    xh = x.half().float()
    ref = torch.stack([xh[:, :, i * 128:(i + 1) * 128].abs().amax(dim=(2, 3)) for i in range(3)], dim=2) / 448
    assert torch.allclose(scale, ref, rtol=1e-6, atol=0)
    back = dequantize_kv(x8, scale)
    step = scale.repeat_interleave(128, dim=2)[:, :, :300, None] * 2.0**-9  # half the subnormal step
    assert ((back - xh).abs() <= xh.abs() * 2.0**-4 + step).all()


@pytest.mark.parametrize("kv", ["fp8tile", torch.float16], ids=["fp8tile", "fp16"])
def test_const_strides_kernel_agrees(kv):
    """The compile-time-strides variant of pass 1 (CONST_STRIDES) computes the same function."""
    q, k, v, lengths, args = make_case(3, 6, 300, kv, True, seed=5)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    for splits in (1, 3):
        out = torch.full_like(q, float("nan"))
        decode_attention_triton(q, k, v, lengths, **args, out=out, num_splits=splits, const_strides=True)
        check(out, ref32, tol)


@pytest.mark.parametrize("kv", ["fp8tile", "fp8", torch.float16], ids=["fp8tile", "fp8", "fp16"])
def test_prefetch_agrees(kv):
    """Loading the next tile before this tile's math (PREFETCH) computes the same function,
    partial tiles, length-1 rows and empty chunks included."""
    q, k, v, lengths, args = make_case(3, 6, 300, kv, True, seed=7)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    for splits, block_t in ((1, 128), (3, 64)):
        out = torch.full_like(q, float("nan"))
        decode_attention_triton(q, k, v, lengths, **args, out=out, num_splits=splits, block_t=block_t, prefetch=True)
        check(out, ref32, tol)


@pytest.mark.parametrize("const", [False, True], ids=["runtime", "const"])
def test_full_length_reads_no_lengths(const):
    """full_length=True (cross-attention: every row sees all T) ignores the lengths' values."""
    q, k, v, lengths, args = make_case(3, 6, 300, "fp8tile", False, seed=6)
    lengths.fill_(300)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    for splits in (1, 2):
        out = torch.full_like(q, float("nan"))
        decode_attention_triton(q, k, v, torch.zeros_like(lengths), **args, out=out, num_splits=splits,
                                const_strides=const, full_length=True)
        check(out, ref32, tol)


# Session 7: the v7 kernel (cp.async-pipelined loop, per-position tile scales, one-pass split merge)
# and the launch table. The interpreter runs every launch's code path at small B*H; CUDA adds the
# large-v3 cross shape and graph replay of the one-pass merge.
from cuda_ops.attention import (  # noqa: E402
    FP8_TILE_TABLE,
    Launch,
    _LOCKS,
    choose_fp8_tile_launch,
    load_fp8_table,
)

V7_LAUNCHES = [
    Launch("v7", 1, 64, 4, 3),  # pipelined, one split (pass 1 writes the output)
    Launch("v7", 1, 32, 4, 5, maxnreg=64),  # deeper pipeline, register cap (ignored by the interpreter)
    Launch("v7", 2, 32, 4, 4, one_pass=True),  # the last program of each (row, head) merges
    Launch("v7", 3, 64, 2, 3, one_pass=True, const=True),
    Launch("v7", 2, 128, 8, 2),  # two-pass merge (_decode_reduce_kernel)
    Launch("v7", 1, 32, 4, 0),  # plain loop (no pipelining)
    Launch("v7", 2, 64, 4, 4, one_pass=True, scalar_scales=True),  # a scalar scale load per tile
]
V7_SHAPES = [(3, 20, 1500), (7, 6, 300), (32, 20, 1500)] if CUDA else [(3, 3, 300), (2, 2, 1500)]


@pytest.mark.parametrize("slots", [False, True], ids=["direct", "slots"])
@pytest.mark.parametrize("B,H,T", V7_SHAPES)
def test_v7_tile_scales_match_reference(B, H, T, slots):
    """Every v7 launch shape against the fp32 reference: partial last tiles, a length-1 row, tiles of
    different ranges, poisoned output; the one-pass counters are back to zero after each call."""
    q, k, v, lengths, args = make_case(B, H, T, "fp8tile", slots, seed=11)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    for launch in V7_LAUNCHES:
        out = torch.full_like(q, float("nan"))
        decode_attention_triton(q, k, v, lengths, **args, out=out, launch=launch)
        check(out, ref32, tol)
        if launch.one_pass:
            assert int(_LOCKS[str(q.device)].abs().sum()) == 0, launch


@pytest.mark.parametrize("kv", ["fp8", torch.float16], ids=["fp8", "fp16"])
def test_v7_other_caches_match_reference(kv):
    """v7 also takes fp16 K/V and a scale per (slot, head) (not in the table; kept correct)."""
    q, k, v, lengths, args = make_case(3, 3, 300, kv, True, seed=12)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    for launch in (Launch("v7", 1, 64, 4, 3), Launch("v7", 2, 32, 4, 3, one_pass=True)):
        out = torch.full_like(q, float("nan"))
        decode_attention_triton(q, k, v, lengths, **args, out=out, launch=launch)
        check(out, ref32, tol)


def test_v7_one_pass_zero_lengths_and_repeats():
    """Rows of length 0 (every split empty) give zeros through the one-pass merge, and a second
    call on the same counters gives the same output bit for bit."""
    q, k, v, lengths, args = make_case(3, 2, 300, "fp8tile", False, seed=13)
    lengths[1] = 0
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    launch = Launch("v7", 3, 32, 4, 3, one_pass=True)
    first = decode_attention_triton(q, k, v, lengths, **args, launch=launch)
    second = decode_attention_triton(q, k, v, lengths, **args, launch=launch)
    assert torch.equal(first[1], torch.zeros_like(first[1]))
    assert torch.equal(first, second)
    check(first, ref32, 1e-2)


def test_v7_full_length_reads_no_lengths():
    q, k, v, lengths, args = make_case(2, 3, 300, "fp8tile", False, seed=14)
    lengths.fill_(300)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    for launch in (Launch("v7", 1, 64, 4, 3), Launch("v7", 2, 32, 4, 3, one_pass=True, const=True)):
        out = torch.full_like(q, float("nan"))
        decode_attention_triton(q, k, v, torch.zeros_like(lengths), **args, out=out, launch=launch, full_length=True)
        check(out, ref32, tol)


def test_the_h200_table_runs_v7_from_b32_and_every_launch_is_exact():
    """The module's table (session 8's H200 sweep): the session-6 rule below B=32, one-split v7 from
    B=32 at H=20; each of its launches, run through the kernel, matches the fp32 reference."""
    assert choose_fp8_tile_launch(8 * 20, 1500, 132) == Launch(splits=4)
    for b in (32, 64, 128, 256):
        launch = choose_fp8_tile_launch(b * 20, 1500, 132)
        assert launch.kernel == "v7" and launch.splits == 1, (b, launch)
    q, k, v, lengths, args = make_case(3, 4, 300, "fp8", True, seed=5)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    for _, launch in FP8_TILE_TABLE[1:]:
        check(decode_attention_triton(q, k, v, lengths, **args, launch=launch), ref32, 2e-2)


def test_fp8_tile_table_rows_and_json(tmp_path):
    """The last row whose min_batch_heads <= B*H applies; split 0 is the automatic rule; counts are
    rounded to whole scale tiles; a JSON table (the sweep's --table-out) loads to the same rows."""
    assert FP8_TILE_TABLE[0][0] == 0
    table = ((0, Launch()), (640, Launch("v7", 1, 32, 4, 4)), (2560, Launch("v7", 5, 64, 4, 3, maxnreg=96)))
    assert choose_fp8_tile_launch(8 * 20, 1500, 132, table) == Launch(splits=4)  # auto: 4 at B=8
    assert choose_fp8_tile_launch(639, 1500, 132, table) == Launch(splits=1)
    assert choose_fp8_tile_launch(640, 1500, 132, table) == Launch("v7", 1, 32, 4, 4)
    assert choose_fp8_tile_launch(5120, 1500, 132, table) == Launch("v7", 4, 64, 4, 3, maxnreg=96)  # 5 -> chunks of 3
    path = tmp_path / "table.json"
    path.write_text(__import__("json").dumps([[bh, launch._asdict()] for bh, launch in table]))
    assert load_fp8_table(str(path)) == table
    path.write_text('[[640, {"kernel": "v7"}]]')
    with pytest.raises(ValueError, match="min_batch_heads 0"):
        load_fp8_table(str(path))
    path.write_text('[[0, {"kernel": "v9"}]]')
    with pytest.raises(ValueError, match="unknown kernel"):
        load_fp8_table(str(path))


def test_launch_overrides_apply_to_the_chosen_launch():
    """num_splits / block_t / num_warps / const_strides override fields of the launch given."""
    q, k, v, lengths, args = make_case(2, 2, 300, "fp8tile", False, seed=15)
    ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
    tol = bound(q, k, v, lengths, args, ref32)
    out = decode_attention_triton(q, k, v, lengths, **args, launch=Launch("v7", 0, 64, 4, 3), num_splits=2, block_t=32)
    check(out, ref32, tol)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_v7_one_pass_under_graph_replay():
    """The one-pass merge inside a CUDA graph, replayed with new queries: counters reset every replay."""
    q, k, v, lengths, args = make_case(7, 20, 1500, "fp8tile", False, seed=16)
    launch = Launch("v7", 3, 32, 4, 4, one_pass=True)
    out = torch.empty_like(q)
    decode_attention_triton(q, k, v, lengths, **args, out=out, launch=launch)  # compile, make the counters
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention_triton(q, k, v, lengths, **args, out=out, launch=launch)
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        graph.replay()
        ref32 = decode_attention_reference(q.float(), k, v, lengths, **args)
        check(out, ref32, bound(q, k, v, lengths, args, ref32))
    assert int(_LOCKS[str(q.device)].abs().sum()) == 0
