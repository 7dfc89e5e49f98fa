"""FP8 quantisation kernels, the FP8 linear and the encoder-FFN chain, on CUDA or Triton's interpreter.

Tolerances:
- quantize_rows: the kernel equals the reference bit for bit (same IEEE divide and rounding).
- Round trip: e4m3 keeps 3 mantissa bits, so each element is within 2^-4 of its value
  (relative) after scaling, or within half the subnormal step (2^-10 * scale) near zero.
- bias_gelu (fp16 out): max error against fp32 at most 2x PyTorch's own fp16 error plus half an
  ulp of the largest output (a 1 ulp fp32 erf difference may flip any element's rounding).
- FP8Linear against the fp32 linear: relative Frobenius error < 5e-2. Two e4m3 operands with
  ~2.6% RMS rounding error each give ~3.7% on random data (measured), so 3e-2 would be too tight.
- The LN -> fc1 -> bias_gelu_quant -> fc2 chain (four e4m3 operands, ~5.4% measured) < 8e-2,
  and the kernels' chain at most 1.1x the error of the reference chain.
- _scaled_mm against the dequantising reference on the same e4m3 inputs (fp32 accumulation in
  both, one fp16 rounding): relative Frobenius < 2e-3.
Outputs are poisoned with NaN before each run, and NaN never passes a comparison.
"""

from __future__ import annotations


import pytest
import torch
from torch import nn
from torch.nn import functional as F

ON_CUDA = torch.cuda.is_available()  # else tests/kernels/conftest.py has set up Triton's interpreter
triton = pytest.importorskip("triton")

from cuda_ops import fp8, layernorm, precision

DEVICE = "cuda" if ON_CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="needs CUDA (torch._scaled_mm on FP8 tensor cores)")
NAN_FP8 = 0x7F  # the e4m3fn NaN byte


def _poisoned(shape, dtype: torch.dtype) -> torch.Tensor:
    if dtype == fp8.FP8_DTYPE:
        return torch.full(shape, NAN_FP8, dtype=torch.uint8, device=DEVICE).view(dtype)
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def _rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert torch.isfinite(actual).all()
    a, e = actual.double(), expected.double()
    return (torch.linalg.vector_norm(a - e) / torch.linalg.vector_norm(e)).item()


def _round_trip_bound(expected: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return 2.0**-4 * expected.abs() + 2.0**-10 * scale[..., None]


def _shapes():
    small = [(rows, cols) for rows in (1, 7) for cols in (300, 384, 1280)]
    return small + ([(1501, c) for c in (300, 1280)] if ON_CUDA else [(1501, 300)])


def _activations(rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 1, rows).unsqueeze(1)  # rows of unlike size
    x[:, 5] *= 30  # an outlier channel, as transformer activations have
    x[0, 7:40] = 1e-6  # far below the row's amax: lands in e4m3's subnormal range
    return x.to(dtype).to(DEVICE)


# ---- quantize_rows ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("rows,cols", _shapes())
def test_quantize_rows_kernel_equals_reference(rows, cols, dtype):
    x = _activations(rows, cols, dtype)
    q, scale = fp8.quantize_rows_triton(
        x, out=_poisoned((rows, cols), fp8.FP8_DTYPE), scale_out=_poisoned((rows,), torch.float32)
    )
    q_ref, scale_ref = fp8.quantize_rows_reference(x)
    assert q.dtype == fp8.FP8_DTYPE and scale.dtype == torch.float32 and scale.shape == (rows,)
    assert not torch.isnan(q.float()).any()
    torch.testing.assert_close(scale, scale_ref, rtol=0, atol=0)
    torch.testing.assert_close(q.float(), q_ref.float(), rtol=0, atol=0)  # -0 and +0 compare equal


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_quantize_round_trip_error_bounded(dtype):
    x = _activations(7, 1280, dtype, seed=1)
    q, scale = fp8.quantize_rows_triton(x)
    deq = q.float() * scale[:, None]
    assert torch.isfinite(deq).all()
    assert ((deq - x.float()).abs() <= _round_trip_bound(x.float(), scale)).all()
    assert (deq.abs().amax(dim=1) == x.float().abs().amax(dim=1)).all()  # the row's amax maps to 448 exactly


def test_quantize_all_zero_row():
    q, scale = fp8.quantize_rows_triton(torch.zeros(3, 384, device=DEVICE, dtype=torch.float16))
    assert torch.isfinite(scale).all() and (scale > 0).all() and (q.float() == 0).all()


def test_quantize_weight_per_output_channel():
    w = torch.randn(48, 32) * torch.linspace(0.01, 10, 48).unsqueeze(1)
    w_fp8, w_scale = fp8.quantize_weight(w)
    assert w_fp8.shape == (48, 32) and w_scale.shape == (48,)
    torch.testing.assert_close(w_scale, w.abs().amax(dim=1) / fp8.FP8_MAX, rtol=0, atol=0)
    deq = w_fp8.float() * w_scale[:, None]
    assert ((deq - w).abs() <= _round_trip_bound(w, w_scale)).all()


# ---- bias + GELU -----------------------------------------------------------------------------

@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,cols", [(1, 1280), (7, 300), (33, 5120)])
def test_bias_gelu_matches_reference(rows, cols, dtype, with_bias):
    h = (torch.randn(rows, cols) * 2).to(dtype).to(DEVICE)
    bias = (torch.randn(cols) * 0.5).to(dtype).to(DEVICE) if with_bias else None
    out, scale = fp8.bias_gelu_triton(h, bias, quantize=False, out=_poisoned((rows, cols), dtype))
    assert scale is None and out.dtype == dtype
    h32 = h.float() + (0 if bias is None else bias.float())
    expected = F.gelu(h32)
    torch_own = F.gelu(h if bias is None else h + bias)  # PyTorch in the input dtype
    assert torch.isfinite(out).all()
    err = (out.float() - expected).abs().max().item()
    torch_err = (torch_own.float() - expected).abs().max().item()
    ulp = torch.finfo(dtype).eps * expected.abs().max().item()
    slack = 1.5 * ulp if (dtype == torch.bfloat16 and not ON_CUDA) else 0.5 * ulp  # interpreter truncates bf16
    assert err <= 2 * torch_err + slack, (err, torch_err)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("rows,cols", [(1, 1280), (7, 300), (33, 5120)])
def test_bias_gelu_quant_round_trip(rows, cols, with_bias):
    h = (torch.randn(rows, cols) * 2).half().to(DEVICE)
    bias = (torch.randn(cols) * 0.5).half().to(DEVICE) if with_bias else None
    q, scale = fp8.bias_gelu_triton(
        h, bias, quantize=True,
        out=_poisoned((rows, cols), fp8.FP8_DTYPE), scale_out=_poisoned((rows,), torch.float32),
    )
    expected = F.gelu(h.float() + (0 if bias is None else bias.float()))
    amax = expected.abs().amax(dim=1)
    torch.testing.assert_close(scale, amax / fp8.FP8_MAX, rtol=1e-6, atol=0)
    deq = q.float() * scale[:, None]
    assert torch.isfinite(deq).all()
    bound = _round_trip_bound(expected, scale) + 2.0**-20 * amax[:, None]  # + fp32 erf differences
    assert ((deq - expected).abs() <= bound).all()


# ---- FP8 linear ------------------------------------------------------------------------------

def _linear(k: int, n: int, dtype: torch.dtype, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(k, n).to(dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("rows", [1, 7, 1501])
def test_fp8_linear_close_to_linear(rows):
    """Through _scaled_mm on CUDA, through the dequantising reference on the CPU."""
    lin = _linear(384, 512, torch.float16)
    q_lin = fp8.FP8Linear.from_linear(lin)
    x = torch.randn(rows, 384, device=DEVICE).half()
    expected = F.linear(x.float(), lin.weight.float(), lin.bias.float())
    y = q_lin(x)
    assert y.dtype == torch.float16 and y.shape == (rows, 512)
    assert _rel(y, expected) < 5e-2
    # a pre-quantised (x_fp8, scale) pair gives the same result as quantising inside
    torch.testing.assert_close(q_lin(fp8.quantize_rows(x)), y, rtol=0, atol=0)


def test_fp8_linear_keeps_leading_dims_and_bias_switch():
    lin = _linear(256, 128, torch.float16)
    q_lin = fp8.FP8Linear.from_linear(lin)
    x = torch.randn(2, 5, 256, device=DEVICE).half()
    y = q_lin(x)
    y_nobias = q_lin(x, add_bias=False)
    assert y.shape == (2, 5, 128)
    torch.testing.assert_close(y.float() - y_nobias.float(), lin.bias.float().expand(2, 5, 128), rtol=0, atol=2e-3)


def test_from_linear_rejects_unaligned_dims():
    with pytest.raises(ValueError, match="divisible by 16"):
        fp8.FP8Linear.from_linear(nn.Linear(300, 512))


@needs_cuda
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("rows", [1, 7, 1501])
def test_scaled_mm_matches_dequantised_reference(rows, with_bias, out_dtype):
    x_fp8, x_scale = fp8.quantize_rows(torch.randn(rows, 1280, device="cuda").half())
    w_fp8, w_scale = fp8.quantize_weight(torch.randn(5120, 1280, device="cuda") / 36)
    bias = torch.randn(5120, device="cuda").to(out_dtype) if with_bias else None
    y = fp8.fp8_linear(x_fp8, x_scale, w_fp8, w_scale, bias, out_dtype)
    expected = fp8.fp8_linear_reference(x_fp8, x_scale, w_fp8, w_scale, bias, torch.float32)
    assert y.dtype == out_dtype
    assert _rel(y, expected) < 2e-3


# ---- the encoder FFN chain -------------------------------------------------------------------

def test_ffn_chain_close_to_fp32():
    """LN(->fp8) -> fc1 -> bias_gelu_quant(->fp8) -> fc2, the kernels against the references."""
    d, hidden, rows = 384, 1536, 64
    torch.manual_seed(0)
    fc1, fc2 = _linear(d, hidden, torch.float16, 1), _linear(hidden, d, torch.float16, 2)
    ln_w = (1 + 0.2 * torch.randn(d, device=DEVICE)).half()
    ln_b = (0.1 * torch.randn(d, device=DEVICE)).half()
    x = (torch.randn(rows, d, device=DEVICE) * 2).half()
    q1, q2 = fp8.FP8Linear.from_linear(fc1), fp8.FP8Linear.from_linear(fc2)

    y32 = F.layer_norm(x.float(), (d,), ln_w.float(), ln_b.float(), 1e-5)
    expected = F.linear(F.gelu(F.linear(y32, fc1.weight.float(), fc1.bias.float())), fc2.weight.float(), fc2.bias.float())

    # the kernels on this device (interpreter on the CPU), _scaled_mm or its reference between them
    x_fp8, _, x_scale = layernorm.layer_norm_triton(x, ln_w, ln_b, 1e-5, out_fp8=True)
    h = q1((x_fp8, x_scale), add_bias=False)
    out = q2(fp8.bias_gelu_triton(h, fc1.bias, quantize=True))
    # the same chain built from the references alone
    r_fp8, _, r_scale = layernorm.layer_norm_reference(x, ln_w, ln_b, 1e-5, out_fp8=True)
    h_ref = fp8.fp8_linear_reference(r_fp8, r_scale, q1.weight_fp8, q1.weight_scale)
    g_fp8, g_scale = fp8.bias_gelu_quant_reference(h_ref, fc1.bias)
    out_ref = fp8.fp8_linear_reference(g_fp8, g_scale, q2.weight_fp8, q2.weight_scale, q2.bias)

    err, ref_err = _rel(out, expected), _rel(out_ref, expected)
    assert ref_err < 8e-2 and err < 8e-2
    assert err <= 1.1 * ref_err
    # the public chain (kernels on CUDA, references on the CPU) is as good
    assert _rel(fp8.ffn_fp8((x_fp8, x_scale), q1, q2), expected) <= 1.1 * ref_err


@pytest.mark.skipif(not ON_CUDA, reason="the interpreter casts NaN to e4m3 as 384")
def test_fp8_nan_stays_visible():
    """A NaN in an activation must come out as NaN, not as a clamped +-448."""
    x = torch.randn(4, 384, device="cuda").half()
    x[1, 3] = float("nan")
    q, _ = fp8.quantize_rows_triton(x)
    assert torch.isnan(q[1].float()).any()
    assert not torch.isnan(q[[0, 2, 3]].float()).any()


# ---- precision presets -----------------------------------------------------------------------

def test_presets():
    full = precision.full_fp16()
    assert full == precision.PrecisionConfig(cross_kv_cache="auto") and "fp8" not in vars(full).values()
    mixed = precision.get_preset("mixed_fp8")
    assert (mixed.encoder_qkv, mixed.encoder_ffn, mixed.cross_kv_cache) == ("fp8", "fp8", "int4")
    assert (mixed.encoder_out_proj, mixed.decoder_self_qkv, mixed.decoder_cross_q, mixed.decoder_ffn) == ("fp16",) * 4
    assert not mixed.cross_kv_epilogue  # cuBLAS + the quantise pass
    aggressive = precision.aggressive_fp8()
    assert aggressive.decoder_self_qkv == aggressive.encoder_out_proj == "fp8"
    assert set(precision.PRESETS) == {"full_fp16", "mixed_fp8", "aggressive_fp8"}


def test_preset_overrides():
    """"PRESET:field=value:..." changes single sites for A/B runs; switches take 0/1."""
    old = precision.get_preset("mixed_fp8:decoder_ffn=fp8:cross_kv_epilogue=1")
    assert old.decoder_ffn == "fp8" and old.cross_kv_epilogue and old.encoder_ffn == "fp8"
    assert precision.get_preset("full_fp16:") == precision.full_fp16()
    with pytest.raises(ValueError, match="decoder_ffn"):
        precision.get_preset("mixed_fp8:decoder_fnn=fp8")
    with pytest.raises(ValueError, match="0 or 1"):
        precision.get_preset("mixed_fp8:cross_kv_epilogue=yes")
    with pytest.raises(ValueError, match="must be one of"):
        precision.get_preset("mixed_fp8:decoder_ffn=int4")
    assert precision.get_preset("mixed_fp8:fp8_min_width=0").fp8_min_width == 0
    with pytest.raises(ValueError, match="whole number"):
        precision.get_preset("mixed_fp8:fp8_min_width=wide")


def test_preset_errors_are_clear():
    with pytest.raises(ValueError, match="full_fp16, mixed_fp8, aggressive_fp8"):
        precision.get_preset("fp4")
    with pytest.raises(ValueError, match="encoder_ffn"):
        precision.PrecisionConfig(encoder_ffn="int8")
    with pytest.raises(ValueError, match="use_fused_layernorm"):
        precision.PrecisionConfig(encoder_ffn="fp8", use_fused_layernorm=False)
    with pytest.raises(ValueError, match="fp8 cross_kv_cache needs use_fused_layernorm"):
        precision.PrecisionConfig(cross_kv_cache="fp8", use_fused_layernorm=False)
