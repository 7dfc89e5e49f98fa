"""Absorbed cross-attention (cuda_ops/cross_absorbed.py) against its fp32 reference and against the
head-split attention it replaces, on CUDA or through Triton's interpreter on the CPU.

Shapes cover the paths: widths that split in one power of two (384, 512, 1024) or two (768 =
512 + 256, 1280 = 1024 + 256), head counts below, at and above a group (6, 16, 20), one span and
several (splits), partial last blocks (T = 1, 33, 300, 1500), a windows index (beams reading one
window), both launch orientations. Tolerance: flash-attention's rule, 2x the error of the same
computation in fp16 through PyTorch's ops (against the fp32 reference), + 1e-4.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cuda_ops.cross_absorbed import (AbsorbedLaunch, absorb_query, absorbed_attention_reference,
                                     absorbed_attention_triton, absorbed_output, width_parts)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

# (B, H, T, D, windows?)
if CUDA:
    SHAPES = [(1, 6, 1, 384, False), (3, 6, 33, 384, True), (5, 8, 1500, 512, False), (2, 12, 300, 768, True),
              (7, 16, 1500, 1024, False), (4, 20, 1500, 1280, True), (33, 20, 1500, 1280, False)]
    LAUNCHES = [AbsorbedLaunch(), AbsorbedLaunch(32, 32, 1, 8, 2), AbsorbedLaunch(16, 16, 0, 4, 2, True),
                AbsorbedLaunch(32, 32, 0, 16, 2, False, True), AbsorbedLaunch(16, 16, 1, 8, 3, False, True),
                AbsorbedLaunch(16, 32, 1, 8, 1, False, True, True), AbsorbedLaunch(16, 16, 0, 8, 1, False, False, True),
                AbsorbedLaunch(16, 64, 1, 8, 1, True)]
else:
    SHAPES = [(1, 6, 1, 384, False), (2, 6, 33, 384, True), (1, 20, 70, 1280, True), (2, 3, 300, 768, False)]
    LAUNCHES = [AbsorbedLaunch(16, 32, 0, 4, 1), AbsorbedLaunch(16, 16, 1, 4, 1, True),
                AbsorbedLaunch(16, 16, 0, 4, 1, False, True), AbsorbedLaunch(16, 16, 0, 4, 1, False, True, True),
                AbsorbedLaunch(16, 32, 1, 4, 1, False, False, True)]


def make_case(B, H, T, D, windows, seed=0):
    gen = torch.Generator().manual_seed(seed)
    W = B + 2 if windows else B
    x = torch.randn(W, T, D, generator=gen)
    x = x * torch.linspace(0.3, 2.0, T)[None, :, None]  # positions of different ranges
    qa = torch.randn(B, H, D, generator=gen) * D**-0.5 * 3  # peaked and flat heads
    qa = qa * torch.rand(1, H, 1, generator=gen) * 2
    win = torch.randint(0, W, (B,), generator=gen, dtype=torch.int32) if windows else None
    return qa.half().to(DEVICE), x.half().to(DEVICE), (win.to(DEVICE) if windows else None)


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: "/".join(map(str, l)))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_reference(shape, launch):
    qa, x, win = make_case(*shape)
    ref = absorbed_attention_reference(qa, x, win)
    xs = x if win is None else x[win.long()]
    torch_fp16 = ((qa @ xs.transpose(1, 2)).float().softmax(-1).half() @ xs).float()
    bound = 2 * (torch_fp16 - ref).abs().max().item() + 1e-4
    try:
        got = absorbed_attention_triton(qa, x, win, launch, torch.float32)
    except Exception as e:  # a launch too large for this width (shared memory): not a wrong result
        if type(e).__name__ != "OutOfResources":
            raise
        pytest.skip(f"{e} (a launch that does not fit this width)")
    assert got.shape == ref.shape
    assert torch.isfinite(got).all()
    err = (got - ref).abs().max().item()
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"


def test_absorbed_equals_head_split_attention():
    """The folding identity: absorb_query, the attention over X and absorbed_output give the head-split
    cross-attention over K = X W_k^T and V = X W_v^T + b_v (the cache the absorbed form replaces)."""
    B, H, Dh, T = 3, 6, 64, 50
    D = H * Dh
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    q = torch.randn(B, H, Dh, generator=gen, dtype=torch.float64)
    w_k = torch.randn(D, D, generator=gen, dtype=torch.float64) * D**-0.5
    w_v = torch.randn(D, D, generator=gen, dtype=torch.float64) * D**-0.5
    b_v = torch.randn(D, generator=gen, dtype=torch.float64)
    k = (x @ w_k.t()).view(B, T, H, Dh).transpose(1, 2)
    v = (x @ w_v.t() + b_v).view(B, T, H, Dh).transpose(1, 2)
    want = F.scaled_dot_product_attention(q[:, :, None], k, v)[:, :, 0]
    got = absorbed_output(absorbed_attention_reference(absorb_query(q, w_k), x).double(), w_v, b_v)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # the reference runs in fp32


def test_parse_launch():
    from cuda_ops.cross_absorbed import parse_launch

    assert parse_launch("32/32/1/8/2/False/True") == AbsorbedLaunch(32, 32, 1, 8, 2, False, True)
    assert parse_launch("16/16/1/8/1/0/1/1") == AbsorbedLaunch(16, 16, 1, 8, 1, False, True, True)
    assert parse_launch("16/64/0/4/2") == AbsorbedLaunch(16, 64, 0, 4, 2)
    with pytest.raises(ValueError, match="g/bt/splits"):
        parse_launch("16/64")


def test_width_parts():
    assert [width_parts(d) for d in (384, 512, 768, 1024, 1280)] == [(256, 128), (512, 0), (512, 256), (1024, 0),
                                                                     (1024, 256)]
    with pytest.raises(ValueError):
        width_parts(1000)


def test_bad_inputs_are_refused():
    qa, x, _ = make_case(3, 6, 33, 384, False)
    with pytest.raises(ValueError, match="windows index"):
        absorbed_attention_triton(qa, x[:2])
    with pytest.raises(ValueError, match="int32"):
        absorbed_attention_triton(qa, x, torch.zeros(3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="disagree"):
        absorbed_attention_triton(qa[..., :128], x)


# The tensor-core kernel (cross_absorbed_mma.py, CUDA C++ through NVRTC): (B, Hq, T, D, windows?, splits),
# query rows in one block of 8 (6), 16 and 24 (20) and in several groups (40, 100: a prompt's tokens x heads),
# every Whisper width, partial last tiles, one span and several.
MMA_SHAPES = [(1, 6, 1, 384, False, 0), (3, 6, 33, 384, True, 0), (5, 16, 1500, 512, False, 1),
              (2, 12, 300, 768, True, 3), (7, 16, 1500, 1024, False, 0), (4, 20, 1500, 1280, True, 1),
              (33, 20, 1500, 1280, False, 0), (2, 40, 1500, 1280, False, 2), (3, 100, 77, 1280, True, 0),
              (130, 20, 1500, 1280, False, 1)]


def fp16_bound(qa, x, win, ref) -> float:
    """Twice the error of a plain fp16 computation of the reference, plus one fp16 rounding of the output."""
    xs = x if win is None else x[win.long()]
    torch_fp16 = ((qa @ xs.transpose(1, 2)).float().softmax(-1).half() @ xs).float()
    return 2 * (torch_fp16 - ref).abs().max().item() + 1e-3


@pytest.mark.skipif(not CUDA, reason="the tensor-core kernel runs on CUDA only")
@pytest.mark.parametrize("shape", MMA_SHAPES, ids=str)
def test_mma_kernel_matches_reference(shape):
    from cuda_ops import cross_absorbed_mma

    *case, splits = shape
    qa, x, win = make_case(*case)
    assert cross_absorbed_mma.usable(qa, x)
    ref = absorbed_attention_reference(qa, x, win)
    bound = fp16_bound(qa, x, win, ref)
    got = cross_absorbed_mma.absorbed_attention_mma(qa, x, win, splits=splits, out_dtype=torch.float32)
    assert got.shape == ref.shape and torch.isfinite(got).all()
    err = (got - ref).abs().max().item()
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"


# Every tile the kernel can take (positions x stages), on shapes with partial last tiles, windows and spans.
MMA_TILES = [(32, 2), (32, 3), (16, 2), (16, 5)]
MMA_TILE_SHAPES = [(3, 6, 33, 384, True, 0), (4, 20, 1500, 1280, True, 1), (33, 20, 1500, 1280, False, 0),
                   (2, 16, 77, 1024, False, 3)]


@pytest.mark.skipif(not CUDA, reason="the tensor-core kernel runs on CUDA only")
@pytest.mark.parametrize("tile", MMA_TILES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("shape", MMA_TILE_SHAPES, ids=str)
def test_mma_kernel_tiles_match_reference(shape, tile):
    from cuda_ops import cross_absorbed_mma

    *case, splits = shape
    qa, x, win = make_case(*case)
    limit = cross_absorbed_mma._device_facts(qa.device.index or 0)[0]
    if not cross_absorbed_mma.fits(x.shape[-1], cross_absorbed_mma.Tile(*tile), limit):
        with pytest.raises(ValueError, match="does not fit"):
            cross_absorbed_mma.absorbed_attention_mma(qa, x, win, splits=splits, tile=tile)
        return
    ref = absorbed_attention_reference(qa, x, win)
    got = cross_absorbed_mma.absorbed_attention_mma(qa, x, win, splits=splits, out_dtype=torch.float32, tile=tile)
    err = (got - ref).abs().max().item()
    assert err <= fp16_bound(qa, x, win, ref), f"max error {err:.3g}"


def test_tile_choice_and_parsing():
    from cuda_ops import cross_absorbed_mma as m

    h100 = 227 * 1024
    assert m.choose_tile(384, h100) == (32, 3) and m.choose_tile(1024, h100) == (32, 3)
    assert m.choose_tile(1280, h100) == (32, 2)  # three 32-row stages of D 1280 do not fit
    assert m.choose_tile(1280, 48 * 1024) is None
    assert m.parse_tile("16x4") == (16, 4) and not m.fits(1280, m.Tile(32, 3), h100)
    for bad in ("16", "8x4", "32x1", "axb", "32x2x8"):
        with pytest.raises(ValueError, match="tile"):
            m.parse_tile(bad)


@pytest.mark.skipif(not CUDA, reason="the tensor-core kernel runs on CUDA only")
def test_mma_kernel_is_what_absorbed_attention_runs_and_refuses_bad_inputs():
    from cuda_ops import cross_absorbed_mma
    from cuda_ops.cross_absorbed import absorbed_attention

    qa, x, _ = make_case(3, 20, 1500, 1280, False)
    torch.testing.assert_close(absorbed_attention(qa, x), cross_absorbed_mma.absorbed_attention_mma(qa, x), rtol=0, atol=0)
    assert not cross_absorbed_mma.usable(qa.float(), x.float())  # fp32: the Triton kernel's
    with pytest.raises(ValueError, match="windows index"):
        cross_absorbed_mma.absorbed_attention_mma(qa, x[:2])
    with pytest.raises(ValueError, match="int32"):
        cross_absorbed_mma.absorbed_attention_mma(qa, x, torch.zeros(3, dtype=torch.int64, device=DEVICE))


@pytest.mark.skipif(not CUDA, reason="cuBLAS's float32-output bmm runs on CUDA only")
@pytest.mark.parametrize("case", [(3, 100, 77, 1280, True), (2, 49, 1500, 384, False), (5, 80, 1500, 1280, False)], ids=str)
def test_gemm_path_for_many_query_rows(case):
    """Above GEMM_ROWS query rows a window (a prompt's prefill) absorbed_attention runs two GEMMs: within
    the bound of a plain fp16 computation of the reference, like the kernels."""
    from cuda_ops.cross_absorbed import GEMM_ROWS, absorbed_attention, absorbed_attention_gemm

    qa, x, win = make_case(*case)
    assert qa.shape[1] > GEMM_ROWS
    ref = absorbed_attention_reference(qa, x, win)
    bound = fp16_bound(qa, x, win, ref)
    got = absorbed_attention(qa, x, win)
    torch.testing.assert_close(got, absorbed_attention_gemm(qa, x, win), rtol=0, atol=0)
    assert got.dtype == torch.float16 and (got.float() - ref).abs().max().item() <= bound
