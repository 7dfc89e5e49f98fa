"""Fused residual + LayerNorm kernel against its fp32 reference, on CUDA or Triton's interpreter.

Tolerance rule (flash-attention's): the kernel's max error against the fp32 reference is at
most 2x PyTorch's own low-precision error on the same inputs (F.layer_norm in the input dtype),
plus half an ulp of the largest output for low-precision dtypes (a 1e-6 fp32 difference in the
statistics may flip the rounding of any element) or 2^-17 of it for fp32 (reduction order).
FP8 outputs: e4m3 keeps 3 mantissa bits, so after scaling each element is within 2^-4 of its
value (relative), or within half the subnormal step (2^-10 * scale) near zero.
Outputs are poisoned with NaN before each run, and NaN never passes a comparison.
"""

from __future__ import annotations


import pytest
import torch

from cuda_ops import _triton
from torch.nn import functional as F

ON_CUDA = torch.cuda.is_available()  # else tests/kernels/conftest.py has set up Triton's interpreter
triton = pytest.importorskip("triton")

from cuda_ops import fp8, layernorm

DEVICE = "cuda" if ON_CUDA else "cpu"
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
EPS = 1e-5
# The interpreter casts fp32 -> bf16 by truncation, not rounding: one more bf16 ulp there.
BF16_TRUNCATION = not ON_CUDA


def _ulp_slack(dtype: torch.dtype, magnitude: float) -> float:
    if dtype == torch.float32:
        return 2.0**-17 * magnitude
    slack = 0.5 * torch.finfo(dtype).eps * magnitude
    if dtype == torch.bfloat16 and BF16_TRUNCATION:
        slack += torch.finfo(dtype).eps * magnitude
    return slack


def _inputs(rows: int, hidden: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # an offset mean and uneven scale, as real residual streams have
    x = (torch.randn(rows, hidden, generator=g) * 3 + 1).to(dtype)
    r = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (1 + 0.3 * torch.randn(hidden, generator=g)).to(dtype)
    b = (0.2 * torch.randn(hidden, generator=g)).to(dtype)
    return [t.to(DEVICE) for t in (x, r, w, b)]


def _poisoned(shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=DEVICE).to(dtype)  # NaN in every float8/16/32


def _run_kernel(x, r, w, b, residual: bool, out_fp8: bool):
    rows, hidden = x.shape
    return layernorm.layer_norm_triton(
        x, w, b, EPS, r if residual else None, out_fp8,
        out=_poisoned((rows, hidden), fp8.FP8_DTYPE if out_fp8 else x.dtype),
        residual_out=_poisoned((rows, hidden), x.dtype) if residual else None,
        scale_out=_poisoned((rows,), torch.float32) if out_fp8 else None,
    )


def _check_residual(res_out, x, r):
    """The same fp32 add rounded once: bit-exact, except the interpreter's bf16 truncation."""
    expected = (x.float() + r.float()).to(x.dtype).float()
    assert torch.isfinite(res_out).all()
    err = (res_out.float() - expected).abs().max().item()
    truncation = x.dtype == torch.bfloat16 and BF16_TRUNCATION
    assert err <= (torch.finfo(x.dtype).eps * expected.abs().max().item() if truncation else 0.0)


def _shapes():
    small = [(rows, hidden) for rows in (1, 7) for hidden in (300, 384, 1280)]
    # 1501 rows: one case per hidden size on CUDA; one under the interpreter to keep it fast
    large = [(1501, h) for h in (300, 384, 1280)] if ON_CUDA else [(1501, 384)]
    return small + large


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden", _shapes())
def test_layer_norm_matches_reference(rows, hidden, dtype, residual):
    x, r, w, b = _inputs(rows, hidden, dtype)
    y, res_out, scale = _run_kernel(x, r, w, b, residual, out_fp8=False)
    assert scale is None and y.dtype == dtype
    if residual:
        _check_residual(res_out, x, r)
        ln_in = res_out  # judge the norm on the sum the kernel actually normalised
    else:
        assert res_out is None
        ln_in = x
    expected = F.layer_norm(ln_in.float(), (hidden,), w.float(), b.float(), EPS)
    torch_own = F.layer_norm(ln_in, (hidden,), w, b, EPS)  # PyTorch in the input dtype
    assert torch.isfinite(y).all()
    err = (y.float() - expected).abs().max().item()
    torch_err = (torch_own.float() - expected).abs().max().item()
    assert err <= 2 * torch_err + _ulp_slack(dtype, expected.abs().max().item()), (err, torch_err)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden", _shapes())
def test_layer_norm_fp8_output(rows, hidden, dtype, residual):
    x, r, w, b = _inputs(rows, hidden, dtype, seed=1)
    q, res_out, scale = _run_kernel(x, r, w, b, residual, out_fp8=True)
    assert q.dtype == fp8.FP8_DTYPE and scale.shape == (rows,) and scale.dtype == torch.float32
    if residual:
        _check_residual(res_out, x, r)
    ln_in = res_out if residual else x
    expected = F.layer_norm(ln_in.float(), (hidden,), w.float(), b.float(), EPS)
    amax = expected.abs().amax(dim=1)
    torch.testing.assert_close(scale, amax / fp8.FP8_MAX, rtol=1e-5, atol=0)
    deq = q.float() * scale[:, None]
    assert torch.isfinite(deq).all()
    bound = 2.0**-4 * expected.abs() + 2.0**-10 * scale[:, None] + 2.0**-17 * amax[:, None]
    assert ((deq - expected).abs() <= bound).all(), ((deq - expected).abs() - bound).max()


def test_all_zero_rows_get_finite_scale():
    """Padding rows (all zeros, bias zero) must quantise to zeros, not NaN."""
    x = torch.zeros(5, 384, device=DEVICE, dtype=torch.float16)
    w = torch.ones(384, device=DEVICE, dtype=torch.float16)
    b = torch.zeros(384, device=DEVICE, dtype=torch.float16)
    q, _, scale = layernorm.layer_norm_triton(x, w, b, EPS, out_fp8=True)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert (q.float() == 0).all()


def test_nan_input_row_stays_nan():
    """A NaN upstream must surface in its own row and leave the other rows intact."""
    x, r, w, b = _inputs(4, 384, torch.float16)
    x[2, 17] = float("nan")
    y, _, _ = layernorm.layer_norm_triton(x, w, b, EPS)
    assert torch.isnan(y[2]).all()
    assert torch.isfinite(y[[0, 1, 3]]).all()


@pytest.mark.parametrize("eager_torch", [True, False], ids=["eager-torch-ops", "kernel"])
@pytest.mark.parametrize("out_fp8", [False, True], ids=["fp16", "fp8"])
def test_dispatcher_matches_unfused_torch(out_fp8, eager_torch, monkeypatch):
    """`layer_norm` on this machine's device against torch's residual add + F.layer_norm: on CUDA with
    STREAMER_EAGER_OPS=lean a small eager call takes PyTorch's ops (`_triton.eager_small`), else (or
    with FP8 out) the kernel."""
    monkeypatch.setattr(_triton, "EAGER_OPS", "lean" if eager_torch else "kernels")
    x, r, w, b = _inputs(33, 1280, torch.float16, seed=2)
    x3, r3 = x.view(3, 11, 1280), r.view(3, 11, 1280)  # [B, T, D]
    y, res_out, scale = layernorm.layer_norm(x3, w, b, EPS, residual=r3, out_fp8=out_fp8)
    assert res_out.shape == (3, 11, 1280) and y.shape == (3, 11, 1280)
    s = x + r
    torch.testing.assert_close(res_out.view(33, 1280), s, rtol=0, atol=0)
    expected = F.layer_norm(s.float(), (1280,), w.float(), b.float(), EPS)
    if out_fp8:
        assert y.dtype == fp8.FP8_DTYPE and scale.shape == (3, 11)
        deq = y.view(33, 1280).float() * scale.reshape(33, 1)
        rel = torch.linalg.vector_norm(deq - expected) / torch.linalg.vector_norm(expected)
        assert rel < 0.04  # e4m3 RMS rounding error is ~2.6%
    else:
        assert scale is None
        torch.testing.assert_close(y.view(33, 1280).float(), expected, rtol=2e-3, atol=4e-3)
