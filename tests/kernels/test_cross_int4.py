"""The 4-bit cross-attention cache (cuda_ops/cross_int4.py): its writer and its decode attention
against their PyTorch references (CUDA, or Triton's interpreter on the CPU), on odd shapes: partial
last tiles, one to 20 heads, head dims 16-128, an outlier channel, an all-zero head, slot ids.

Tolerance rules:
- Writer: codes and scales equal the reference's exactly (both divide correctly rounded, round half
  up, and round the scale to fp16 the same way).
- Decode attention: flash-attention's rule against the fp32 reference over the same dequantised
  K/V: within 2x the error of SDPA in fp16 on those K/V, + 1e-5.
- The format: dequantised K/V within 1/14 of their group's amax (half a code step) of the input.
- Decode attention v2 (fp16x2 arithmetic on the codes, issue 15): fp16 partial sums (16 products per
  score piece, 8 positions per output piece) against the fp32 reference, within 1/20 of the 4-bit
  format's own error (the reference against attention over the unquantised K/V) + 2x SDPA's fp16
  error: the kernel's arithmetic may add no more than a twentieth of what the codes cost.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cuda_ops.attention import SCALE_TILE
from cuda_ops.cross_int4 import (
    _pack, _unpack, cross_kv_int4_reference, decode_attention_int4_reference, decode_attention_int4_triton,
    decode_attention_int4_v2_triton, dequantize_k, dequantize_v, write_cross_kv_int4_triton,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

# (B, T, H, Dh): partial last tiles (1, 127, 129, 300, 1500), one to 20 heads, every head dim
if CUDA:
    SHAPES = [(1, 1, 1, 64), (3, 127, 3, 64), (2, 129, 5, 32), (2, 300, 6, 64), (4, 1500, 20, 64),
              (1, 257, 2, 128), (3, 77, 4, 16), (16, 1500, 20, 64)]
else:
    SHAPES = [(1, 1, 1, 64), (2, 129, 3, 32), (1, 300, 2, 64), (1, 130, 1, 128), (2, 77, 4, 16)]


def make_projection(B, T, H, Dh, dtype=torch.float16, seed=0):
    """A random projection [B, T, 2 H Dh] with tiles and channels of different ranges, an outlier
    channel in K, an all-zero V head and a large value."""
    gen = torch.Generator().manual_seed(seed)
    N = 2 * H * Dh
    y = torch.randn(B, T, N, generator=gen) * torch.linspace(0.1, 4, T)[None, :, None]
    y = y * (torch.rand(1, 1, N, generator=gen) * 3 + 0.01)
    y[..., min(3, Dh - 1)] *= 40  # an outlier channel of K's first head
    y[-1, -1, -1] = 60000.0
    y[0, :, H * Dh:H * Dh + Dh] = 0  # an all-zero V head: floor scales, codes 8 (zero)
    return y.to(dtype).to(DEVICE)


def empty_cache(S, T, H, Dh):
    """Poisoned outputs (codes 0x00 = -8 in both nibbles, NaN scales) for slots [S]."""
    tiles = -(-T // SCALE_TILE)
    kc = torch.zeros(S, H, T, Dh // 2, dtype=torch.uint8, device=DEVICE)
    vc = torch.zeros_like(kc)
    ks = torch.full((S, H, tiles, Dh), float("nan"), dtype=torch.float16, device=DEVICE)
    vs = torch.full((S, H, T), float("nan"), dtype=torch.float16, device=DEVICE)
    return kc, vc, ks, vs


def test_pack_and_unpack_are_inverse_and_put_the_halves_in_the_nibbles():
    q = torch.randint(-7, 8, (3, 5, 64))
    codes = _pack(q)
    assert codes.shape == (3, 5, 32) and codes.dtype == torch.uint8
    assert torch.equal(_unpack(codes), q.float())
    assert torch.equal(codes[..., 0] & 15, (q[..., 0] + 8).to(torch.uint8))
    assert torch.equal(codes[..., 0] >> 4, (q[..., 32] + 8).to(torch.uint8))


@pytest.mark.parametrize("shape", SHAPES)
def test_writer_equals_the_reference_exactly(shape):
    B, T, H, Dh = shape
    y = make_projection(B, T, H, Dh)
    S = B + 2  # slots 1..B written, 0 and B+1 stay poisoned
    kc, vc, ks, vs = empty_cache(S, T, H, Dh)
    write_cross_kv_int4_triton(y, kc[1:B + 1], vc[1:B + 1], ks[1:B + 1], vs[1:B + 1])
    rk, rv, rks, rvs = (t.to(DEVICE) for t in cross_kv_int4_reference(y, H))
    assert torch.equal(kc[1:B + 1], rk) and torch.equal(vc[1:B + 1], rv)
    assert torch.equal(ks[1:B + 1], rks) and torch.equal(vs[1:B + 1], rvs)
    for s in (0, S - 1):  # untouched
        assert not kc[s].any() and not vc[s].any() and ks[s].isnan().all() and vs[s].isnan().all()


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_dequantised_values_are_within_half_a_code_step(shape):
    B, T, H, Dh = shape
    y = make_projection(B, T, H, Dh, dtype=torch.float32)
    kc, vc, ks, vs = cross_kv_int4_reference(y, H)
    kv = y.float().cpu().reshape(B, T, 2, H, Dh).permute(2, 0, 3, 1, 4)
    k, v = dequantize_k(kc.cpu(), ks.cpu()), dequantize_v(vc.cpu(), vs.cpu())
    step_k = ks.float().cpu().repeat_interleave(SCALE_TILE, dim=2)[:, :, :T]  # per channel and tile
    step_v = vs.float().cpu()[..., None]
    # half a step, + fp16's rounding of the scale (2^-11 relative) times the largest code (7)
    assert ((k - kv[0]).abs() <= step_k * (0.5 + 7 * 2**-11) + 1e-6).all()
    assert ((v - kv[1]).abs() <= step_v * (0.5 + 7 * 2**-11) + 1e-6).all()
    assert (v[0, 0] == 0).all()  # the all-zero head stays zero


def _check_attention(q, kc, vc, ks, vs, slot_ids=None, **launch):
    ours = decode_attention_int4_triton(q, kc, vc, ks, vs, slot_ids, **launch).float()
    ref = decode_attention_int4_reference(q, kc, vc, ks, vs, slot_ids).float()
    k, v = dequantize_k(kc, ks), dequantize_v(vc, vs)
    if slot_ids is not None:
        k, v = k[slot_ids.long()], v[slot_ids.long()]
    sdpa = F.scaled_dot_product_attention(q.half()[:, :, None], k.half(), v.half())[:, :, 0].float()
    tol = 2 * (sdpa - ref).abs().max().item() + 1e-5
    err = (ours - ref).abs().max().item()
    assert err <= tol, (err, tol, launch)


@pytest.fixture
def v1(monkeypatch):
    """`decode_attention_int4_triton` through the v1 kernel (the default is v2, tested below)."""
    import cuda_ops.cross_int4 as C

    monkeypatch.setattr(C, "DECODE_KERNEL", "v1")


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_attention_matches_the_reference(shape, v1):
    B, T, H, Dh = shape
    y = make_projection(B, T, H, Dh)
    kc, vc, ks, vs = empty_cache(B, T, H, Dh)
    write_cross_kv_int4_triton(y, kc, vc, ks, vs)
    q = (torch.randn(B, H, Dh, generator=torch.Generator().manual_seed(1)) * 2).half().to(DEVICE)
    _check_attention(q, kc, vc, ks, vs)  # the automatic split count
    for splits in (1, 2, 3) if CUDA else (2,):  # the interpreter: one launch of each kind (auto is 1 or more)
        _check_attention(q, kc, vc, ks, vs, num_splits=splits)
    _check_attention(q, kc, vc, ks, vs, num_splits=1, stages=1)


def test_decode_attention_reads_the_slots_given(v1):
    B, T, H, Dh = 3, 300, 2, 64
    y = make_projection(B, T, H, Dh)
    kc, vc, ks, vs = empty_cache(B, T, H, Dh)
    write_cross_kv_int4_triton(y, kc, vc, ks, vs)
    q = torch.randn(5, H, Dh, generator=torch.Generator().manual_seed(2)).half().to(DEVICE)
    slots = torch.tensor([2, 0, 2, 1, 0], dtype=torch.int32, device=DEVICE)
    _check_attention(q, kc, vc, ks, vs, slots, num_splits=1)
    _check_attention(q, kc, vc, ks, vs, slots, num_splits=2)
    # each row is the attention over its own slot alone
    alone = decode_attention_int4_triton(q[1:2], kc[:1], vc[:1], ks[:1], vs[:1])
    assert torch.allclose(decode_attention_int4_triton(q, kc, vc, ks, vs, slots)[1:2].float(), alone.float(), atol=1e-3)


def test_bad_shapes_are_refused():
    B, T, H, Dh = 1, 130, 2, 64
    kc, vc, ks, vs = empty_cache(B, T, H, Dh)
    q = torch.zeros(B, H, Dh, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="uint8 codes"):
        decode_attention_int4_triton(q, kc.float(), vc, ks, vs)
    with pytest.raises(ValueError, match="fp16 scales"):
        decode_attention_int4_triton(q, kc, vc, ks.float(), vs)
    with pytest.raises(ValueError, match="cache must have B=2"):
        decode_attention_int4_triton(torch.zeros(2, H, Dh, dtype=torch.float16, device=DEVICE), kc, vc, ks, vs)
    with pytest.raises(ValueError, match="y must be"):
        write_cross_kv_int4_triton(torch.zeros(B, T, 3 * H * Dh, device=DEVICE), kc, vc, ks, vs)


# ---- v2 (issue 15): on the CPU the interpreter runs its plain-op data flow (use_asm=False) --------

# (B, T, H, Dh, splits): odd batches, T off the 128-position tile, every head dim, one to several splits
V2_CASES = [(3, 300, 2, 64, None), (1, 129, 1, 32, 2), (3, 77, 3, 16, 1), (1, 257, 2, 128, 3), (5, 1, 1, 64, 1)]
if CUDA:
    V2_CASES += [(4, 1500, 20, 64, None), (33, 1500, 20, 64, None), (7, 1500, 6, 64, 12), (2, 1500, 20, 64, 5)]


def _check_v2(y, q, kc, vc, ks, vs, slot_ids=None, **launch):
    """v2 against the fp32 reference, within 1/20 of the format's error + 2x SDPA's fp16 error."""
    ours = decode_attention_int4_v2_triton(q, kc, vc, ks, vs, slot_ids, **launch).float()
    assert torch.isfinite(ours).all()
    ref = decode_attention_int4_reference(q, kc, vc, ks, vs, slot_ids).float()
    B, T, N = y.shape
    H, Dh = kc.shape[1], 2 * kc.shape[3]
    kv = y.float().reshape(B, T, 2, H, Dh).permute(2, 0, 3, 1, 4)  # the unquantised K/V
    k, v = dequantize_k(kc, ks), dequantize_v(vc, vs)
    if slot_ids is not None:
        kv, k, v = kv[:, slot_ids.long()], k[slot_ids.long()], v[slot_ids.long()]
    true = F.scaled_dot_product_attention(q.float()[:, :, None], kv[0], kv[1])[:, :, 0]
    sdpa = F.scaled_dot_product_attention(q.half()[:, :, None], k.half(), v.half())[:, :, 0].float()
    quant = (true - ref).abs().max().item()
    tol = quant / 20 + 2 * (sdpa - ref).abs().max().item() + 1e-5
    err = (ours - ref).abs().max().item()
    assert err <= tol, (err, tol, quant, launch)
    return err, quant


@pytest.mark.parametrize("case", V2_CASES)
def test_v2_decode_attention_matches_the_reference(case):
    B, T, H, Dh, splits = case
    y = make_projection(B, T, H, Dh, seed=3)
    kc, vc, ks, vs = empty_cache(B, T, H, Dh)
    write_cross_kv_int4_triton(y, kc, vc, ks, vs)
    q = (torch.randn(B, H, Dh, generator=torch.Generator().manual_seed(4)) * 2).half().to(DEVICE)
    _check_v2(y, q, kc, vc, ks, vs, num_splits=splits)


def test_v2_reads_the_slots_given():
    B, T, H, Dh = 3, 300, 2, 64
    y = make_projection(B, T, H, Dh, seed=5)
    kc, vc, ks, vs = empty_cache(B, T, H, Dh)
    write_cross_kv_int4_triton(y, kc, vc, ks, vs)
    q = torch.randn(5, H, Dh, generator=torch.Generator().manual_seed(6)).half().to(DEVICE)
    slots = torch.tensor([2, 0, 2, 1, 0], dtype=torch.int32, device=DEVICE)
    for splits in (1, 2):
        _check_v2(y, q, kc, vc, ks, vs, slots, num_splits=splits)
    alone = decode_attention_int4_v2_triton(q[1:2], kc[:1], vc[:1], ks[:1], vs[:1])
    both = decode_attention_int4_v2_triton(q, kc, vc, ks, vs, slots)
    assert torch.allclose(both[1:2].float(), alone.float(), atol=1e-3)


def test_v2_is_the_kernel_selected_by_the_switch(monkeypatch):
    import cuda_ops.cross_int4 as C

    B, T, H, Dh = 1, 130, 2, 32
    y = make_projection(B, T, H, Dh, seed=7)
    kc, vc, ks, vs = empty_cache(B, T, H, Dh)
    write_cross_kv_int4_triton(y, kc, vc, ks, vs)
    q = torch.randn(B, H, Dh, generator=torch.Generator().manual_seed(8)).half().to(DEVICE)
    monkeypatch.setattr(C, "DECODE_KERNEL", "v2")
    assert torch.equal(C.decode_attention_int4_triton(q, kc, vc, ks, vs, num_splits=2),
                       decode_attention_int4_v2_triton(q, kc, vc, ks, vs, num_splits=2))
