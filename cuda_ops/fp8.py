"""FP8 (e4m3) linear layers for Hopper: per-token activation and per-channel weight scales.

`torch._scaled_mm` with row-wise scales runs at ~1000 TFLOP/s on an H200 against ~650 for fp16
at Whisper's encoder shapes, but only pays when the activation arrives already quantised: the
kernels here (and `layernorm.py`) emit FP8 plus a float32 scale per row in the same pass that
produces the activation. Each kernel has a pure-PyTorch reference beside it; the dispatchers
(`quantize_rows`, `bias_gelu`, `bias_gelu_quant`, `fp8_linear`) use the kernels on CUDA and the
references elsewhere, so everything also runs (slowly) on the CPU. The `*_triton` launchers run
the kernels on any device, CPU tensors included under TRITON_INTERPRET=1 (that is how the tests
reach them without a GPU). Design notes and measured tuning: docs/kernels-fp8.md.

Scale convention: `x ~= x_fp8.float() * scale[..., None]`, which is what `_scaled_mm` expects.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from cuda_ops._triton import eager_small

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: every dispatcher below falls back to its reference
    triton = None

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
AMAX_FLOOR = 1e-12  # an all-zero row (padding) must still get a finite, non-zero scale
MATMUL_ALIGN = 16  # _scaled_mm needs K and N to be multiples of 16


def _as_rows(x: Tensor) -> Tensor:
    """[..., K] -> contiguous [M, K] (kernels index rows by one stride, columns by 1)."""
    return x.reshape(-1, x.shape[-1]).contiguous()


@dataclass(frozen=True)
class RowLaunch:
    """How a row-wise kernel covers a row of n columns.

    Triton blocks are powers of two, and Whisper's widths are not (1280 = 1024 + 256, 5120 =
    4096 + 1024): padding 1280 to 2048 wasted 37% of every instruction, and these kernels are
    bound by instructions as much as by bytes on the H200 (docs/kernels-fp8.md). So a row is a
    power-of-two head plus a power-of-two tail, both held in registers: one read, one write.
    """

    block_m: int  # rows per program
    head: int  # largest power of two <= n
    tail: int  # next power of two >= n - head (1, fully masked, when n is a power of two)
    num_warps: int


def row_launch(n: int, on_gpu: bool = True) -> RowLaunch:
    """Launch shape for row-wise kernels; rows per program and warps measured on the H200.

    Under the interpreter (`on_gpu=False`) every program costs milliseconds of Python, so a
    program takes many rows there; the kernel code is the same.
    """
    head = 1 << (n.bit_length() - 1)
    tail = 1 << (n - head - 1).bit_length() if n > head else 1
    if not on_gpu:
        return RowLaunch(max(1, 16384 // head), head, tail, 1)
    # At least 1024 elements a program, one warp per 1024 (M = 24000 rows on the H200): at 1280,
    # one row and one warp (add + LayerNorm -> fp8 63 us; 2 rows x 2 warps 67; 1 row x 8 warps
    # 111); at 5120, one row and 8 warps (bias_gelu_quant 218 us; 4 warps 219; 2 rows x 8: 490)
    block_m = max(1, 1024 // head)
    num_warps = min(8, triton.next_power_of_2(max(1, block_m * n // 1024)))
    return RowLaunch(block_m, head, tail, num_warps)


if triton is not None:

    @triton.jit
    def _round_to_e4m3(q):
        """fp32 in [-448, 448] -> the nearest e4m3 value (ties to even), still as fp32.

        Only under the interpreter, whose fp32 -> fp8 cast drops the mantissa carry (124.3
        became 64): after this the cast is exact. The GPU's own cast rounds correctly, and
        these kernels are instruction-bound there, so it is not done on the GPU.
        """
        bits = q.to(tl.uint32, bitcast=True)
        lsb = (bits >> 20) & 1  # lowest of the 3 mantissa bits kept
        normal = (((bits + 0x7FFFF + lsb) >> 20) << 20).to(tl.float32, bitcast=True)
        # Below 2^-6 e4m3 is subnormal with a fixed step of 2^-9: around 1.5 * 2^14 the fp32 step
        # is 2^-9 too, so adding and subtracting it rounds to that grid.
        subnormal = (q + 24576.0) - 24576.0
        return tl.where(tl.abs(q) < 0.015625, subnormal, normal)

    @triton.jit
    def _row_amax(y, mask):
        return tl.max(tl.where(mask, tl.abs(y), 0.0), axis=1)

    @triton.jit
    def _fp8_scales(amax):
        """Row amax -> (scale = amax / 448, its inverse), each one correctly rounded divide."""
        amax = tl.maximum(amax, 1e-12)  # AMAX_FLOOR
        return tl.div_rn(amax, 448.0), tl.div_rn(448.0, amax)

    @triton.jit
    def _to_e4m3(y, inv, SOFT_ROUND: tl.constexpr):
        """y * inv (per row) clamped to +-448, as e4m3; NaN stays NaN."""
        q = y * inv[:, None]
        if SOFT_ROUND:  # the interpreter; the GPU's cast saturates to +-448 itself (cvt .satfinite)
            q = _round_to_e4m3(tl.where(q > 448.0, 448.0, tl.where(q < -448.0, -448.0, q)))
        return q.to(tl.float8e4nv)

    @triton.jit
    def _quantize_rows_kernel(
        x_ptr, q_ptr, scale_ptr, M, N, stride_x, stride_q,
        SOFT_ROUND: tl.constexpr, BLOCK_M: tl.constexpr, HEAD: tl.constexpr, TAIL: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows[:, None] < M
        cols_a = tl.arange(0, HEAD)[None, :]  # always inside the row
        cols_b = HEAD + tl.arange(0, TAIL)[None, :]
        mask_b = row_ok & (cols_b < N)
        x_ptrs = x_ptr + rows[:, None] * stride_x
        xa = tl.load(x_ptrs + cols_a, mask=row_ok, other=0.0).to(tl.float32)
        xb = tl.load(x_ptrs + cols_b, mask=mask_b, other=0.0).to(tl.float32)
        scale, inv = _fp8_scales(tl.maximum(_row_amax(xa, row_ok), _row_amax(xb, mask_b)))
        q_ptrs = q_ptr + rows[:, None] * stride_q
        tl.store(q_ptrs + cols_a, _to_e4m3(xa, inv, SOFT_ROUND), mask=row_ok)
        tl.store(q_ptrs + cols_b, _to_e4m3(xb, inv, SOFT_ROUND), mask=mask_b)
        tl.store(scale_ptr + rows, scale, mask=rows < M)

    @triton.jit
    def _approx(x, ASM: tl.constexpr, ON_GPU: tl.constexpr):
        """The PTX approximation `ASM` ("rcp" or "ex2", .approx.ftz.f32: one MUFU instruction; Triton's
        own 1 / x and exp2 add range and denormal fixups, ~3-6 instructions each) on the GPU; the
        same function in plain Triton under the interpreter, which runs no inline PTX."""
        if ON_GPU:
            return tl.inline_asm_elementwise(ASM + ".approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)
        elif ASM == "rcp":
            return 1.0 / x
        else:
            return tl.exp2(x)

    @triton.jit
    def _gelu(h, ON_GPU: tl.constexpr):
        """Exact GELU, h * Phi(h) as Whisper was trained, with erf within 1.5e-7 (Abramowitz & Stegun
        7.1.26, erf(a) = 1 - p(t) exp(-a^2), t = 1 / (1 + 0.3275911 a), a >= 0): one formula for every
        h, constants as immediates, ~16 instructions. libdevice's erff picks one of two polynomials per
        element, and compiled for sm_90 each coefficient became a predicated move: with it the bias +
        GELU + FP8 kernel cost 56 instructions an element, ~2x its memory time."""
        # With a = |h| / sqrt(2): t and exp(-a^2) = 2^(-a^2 log2 e) straight from h, p's coefficients halved.
        t = _approx(1.0 + 0.23164188826636 * tl.abs(h), "rcp", ON_GPU)
        p = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
        w = h * p * _approx(h * h * -0.7213475204444817, "ex2", ON_GPU)  # 0.5 h (1 - erf(a))
        return tl.where(h < 0, w, h - w)

    @triton.jit
    def _gelu_part(h_ptrs, bias_ptr, cols, mask, col_mask, HAS_BIAS: tl.constexpr, ON_GPU: tl.constexpr):
        h = tl.load(h_ptrs + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            h += tl.load(bias_ptr + cols, mask=col_mask).to(tl.float32)
        return _gelu(h, ON_GPU)

    @triton.jit
    def _bias_gelu_kernel(
        h_ptr, bias_ptr, out_ptr, scale_ptr, M, N, stride_h, stride_out,
        HAS_BIAS: tl.constexpr, QUANTIZE: tl.constexpr, SOFT_ROUND: tl.constexpr,
        BLOCK_M: tl.constexpr, HEAD: tl.constexpr, TAIL: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows[:, None] < M
        cols_a = tl.arange(0, HEAD)[None, :]  # always inside the row
        cols_b = HEAD + tl.arange(0, TAIL)[None, :]
        mask_b = row_ok & (cols_b < N)
        h_ptrs = h_ptr + rows[:, None] * stride_h
        ga = _gelu_part(h_ptrs, bias_ptr, cols_a, row_ok, None, HAS_BIAS, not SOFT_ROUND)
        gb = _gelu_part(h_ptrs, bias_ptr, cols_b, mask_b, cols_b < N, HAS_BIAS, not SOFT_ROUND)
        out_ptrs = out_ptr + rows[:, None] * stride_out
        if QUANTIZE:
            scale, inv = _fp8_scales(tl.maximum(_row_amax(ga, row_ok), _row_amax(gb, mask_b)))
            tl.store(out_ptrs + cols_a, _to_e4m3(ga, inv, SOFT_ROUND), mask=row_ok)
            tl.store(out_ptrs + cols_b, _to_e4m3(gb, inv, SOFT_ROUND), mask=mask_b)
            tl.store(scale_ptr + rows, scale, mask=rows < M)
        else:
            tl.store(out_ptrs + cols_a, ga.to(out_ptr.dtype.element_ty), mask=row_ok)
            tl.store(out_ptrs + cols_b, gb.to(out_ptr.dtype.element_ty), mask=mask_b)


def _use_kernel(x: Tensor) -> bool:
    return x.is_cuda and triton is not None


def _empty_fp8(shape: torch.Size, device: torch.device) -> Tensor:
    return torch.empty(shape, dtype=FP8_DTYPE, device=device)


# ---- per-row quantisation -------------------------------------------------------------------

def quantize_rows_reference(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., K] -> (e4m3 [..., K], float32 scale [...]) with scale = rowwise amax / 448."""
    x32 = x.float()
    amax = x32.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    # 448 as a tensor: with a Python scalar PyTorch divides by multiplying with a reciprocal,
    # one rounding more than the kernel's true divide
    fp8_max = torch.full_like(amax, FP8_MAX)
    q = (x32 * (fp8_max / amax)[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, amax / fp8_max


def quantize_rows_triton(
    x: Tensor, *, out: Tensor | None = None, scale_out: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Kernel version of `quantize_rows_reference` (one read of x, one write of x_fp8)."""
    x2 = _as_rows(x)
    M, N = x2.shape
    q = _empty_fp8(x2.shape, x.device) if out is None else out.view(M, N)
    scale = torch.empty(M, dtype=torch.float32, device=x.device) if scale_out is None else scale_out.view(M)
    launch = row_launch(N, x.is_cuda)
    _quantize_rows_kernel[(triton.cdiv(M, launch.block_m),)](
        x2, q, scale, M, N, x2.stride(0), q.stride(0), SOFT_ROUND=not x.is_cuda,
        BLOCK_M=launch.block_m, HEAD=launch.head, TAIL=launch.tail, num_warps=launch.num_warps,
    )
    return q.view(x.shape), scale.view(x.shape[:-1])


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token FP8 quantisation: the kernel on CUDA, the reference elsewhere."""
    return quantize_rows_triton(x) if _use_kernel(x) else quantize_rows_reference(x)


def quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [N, K] -> (e4m3 [N, K], float32 scale [N]) per output channel; once, at load time."""
    return quantize_rows_reference(w)


# ---- bias + GELU (+ quantisation) -----------------------------------------------------------

def bias_gelu_reference(h: Tensor, bias: Tensor | None) -> Tensor:
    """GELU(h + bias) in fp32 math, returned in h's dtype."""
    h32 = h.float() if bias is None else h.float() + bias.float()
    return F.gelu(h32).to(h.dtype)


def bias_gelu_quant_reference(h: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """GELU(h + bias) quantised per row, from the fp32 activation (no intermediate rounding)."""
    h32 = h.float() if bias is None else h.float() + bias.float()
    return quantize_rows_reference(F.gelu(h32))


def bias_gelu_triton(
    h: Tensor,
    bias: Tensor | None,
    quantize: bool,
    *,
    out: Tensor | None = None,
    scale_out: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Kernel: (GELU(h + bias) in h's dtype, None), or (e4m3, scale [...]) when `quantize`."""
    h2 = _as_rows(h)
    M, N = h2.shape
    if out is None:
        out = _empty_fp8(h2.shape, h.device) if quantize else torch.empty_like(h2)
    out = out.view(M, N)
    scale = None
    if quantize:
        scale = torch.empty(M, dtype=torch.float32, device=h.device) if scale_out is None else scale_out.view(M)
    launch = row_launch(N, h.is_cuda)
    _bias_gelu_kernel[(triton.cdiv(M, launch.block_m),)](
        h2, h2 if bias is None else bias.contiguous(), out, scale if quantize else h2,
        M, N, h2.stride(0), out.stride(0), HAS_BIAS=bias is not None, QUANTIZE=quantize,
        SOFT_ROUND=not h.is_cuda, BLOCK_M=launch.block_m, HEAD=launch.head, TAIL=launch.tail,
        num_warps=launch.num_warps,
    )
    return out.view(h.shape), None if scale is None else scale.view(h.shape[:-1])


def bias_gelu(h: Tensor, bias: Tensor | None) -> Tensor:
    """GELU(h + bias) in h's dtype: the kernel on CUDA, PyTorch's GELU for a small eager tensor there
    (`eager_small`: the cheaper launch; it computes in fp32 too), the reference elsewhere."""
    if _use_kernel(h) and bias is None and eager_small(h):
        return F.gelu(h)
    return bias_gelu_triton(h, bias, quantize=False)[0] if _use_kernel(h) else bias_gelu_reference(h, bias)


def bias_gelu_quant(h: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """GELU(h + bias) as (e4m3, per-row scale), ready for the next FP8 linear."""
    if _use_kernel(h):
        q, scale = bias_gelu_triton(h, bias, quantize=True)
        return q, scale
    return bias_gelu_quant_reference(h, bias)


# ---- the FP8 matmul -------------------------------------------------------------------------

def fp8_linear_reference(
    x_fp8: Tensor, x_scale: Tensor, w_fp8: Tensor, w_scale: Tensor,
    bias: Tensor | None = None, out_dtype: torch.dtype = torch.float16,
) -> Tensor:
    """Dequantise both operands and matmul in fp32: x [..., K], w [N, K] -> [..., N]."""
    x = x_fp8.float() * x_scale[..., None].float()
    w = w_fp8.float() * w_scale[:, None].float()
    y = x @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def fp8_linear(
    x_fp8: Tensor, x_scale: Tensor, w_fp8: Tensor, w_scale: Tensor,
    bias: Tensor | None = None, out_dtype: torch.dtype = torch.float16,
) -> Tensor:
    """y = (x_fp8 * x_scale) @ (w_fp8 * w_scale).T + bias through `torch._scaled_mm` on CUDA.

    x_fp8 [..., K] e4m3, x_scale [...] fp32 (per token); w_fp8 [N, K] e4m3, w_scale [N] fp32
    (per output channel). K and N must be multiples of 16 (checked by `FP8Linear.from_linear`).
    """
    if not x_fp8.is_cuda:
        return fp8_linear_reference(x_fp8, x_scale, w_fp8, w_scale, bias, out_dtype)
    K = x_fp8.shape[-1]
    a = x_fp8.reshape(-1, K)
    if a.stride(-1) != 1:
        a = a.contiguous()
    y = torch._scaled_mm(
        a,
        w_fp8.t(),  # [K, N] column-major, as cuBLAS wants the second operand
        scale_a=x_scale.reshape(-1, 1).float(),
        scale_b=w_scale.reshape(1, -1).float(),
        bias=None if bias is None else bias.to(out_dtype),
        out_dtype=out_dtype,
    )
    return y.view(*x_fp8.shape[:-1], w_fp8.shape[0])


QuantizedInput = tuple[Tensor, Tensor]  # (e4m3 [..., K], float32 scale [...])


class FP8Linear(nn.Module):
    """A linear layer with e4m3 weights (per-output-channel scales) for `torch._scaled_mm`.

    `forward` takes a plain tensor (quantised here, one extra pass) or an already quantised
    `(x_fp8, scale)` pair from a fused producer (`layer_norm(..., out_fp8=True)`,
    `bias_gelu_quant`), which is the case where FP8 pays. Build it after the model has its final
    device: `.half()` or `.to(dtype)` would cast the e4m3 weight too.
    """

    def __init__(self, weight_fp8: Tensor, weight_scale: Tensor, bias: Tensor | None, out_dtype: torch.dtype):
        super().__init__()
        self.register_buffer("weight_fp8", weight_fp8)  # [N, K] e4m3
        self.register_buffer("weight_scale", weight_scale)  # [N] fp32
        self.register_buffer("bias", bias)  # [N] in out_dtype, or None
        self.out_dtype = out_dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear, out_dtype: torch.dtype | None = None) -> FP8Linear:
        N, K = linear.weight.shape
        if K % MATMUL_ALIGN or N % MATMUL_ALIGN:
            raise ValueError(f"FP8Linear needs in/out features divisible by {MATMUL_ALIGN}, got {K} -> {N}")
        out_dtype = out_dtype or linear.weight.dtype
        w_fp8, w_scale = quantize_weight(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach().to(out_dtype)
        return cls(w_fp8, w_scale, bias, out_dtype)

    @property
    def in_features(self) -> int:
        return self.weight_fp8.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight_fp8.shape[0]

    def forward(self, x: Tensor | QuantizedInput, *, add_bias: bool = True) -> Tensor:
        """x [..., K] (any float dtype) or (x_fp8, scale) -> [..., N] in `out_dtype`.

        `add_bias=False` leaves the bias to a fused epilogue that follows (`bias_gelu_quant`).
        """
        x_fp8, x_scale = x if isinstance(x, tuple) else quantize_rows(x)
        bias = self.bias if add_bias else None
        return fp8_linear(x_fp8, x_scale, self.weight_fp8, self.weight_scale, bias, self.out_dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, out_dtype={self.out_dtype}"


def ffn_fp8(x: Tensor | QuantizedInput, fc1: FP8Linear, fc2: FP8Linear) -> Tensor:
    """Whisper's MLP, fc2(GELU(fc1(x))), with every activation handed over in FP8.

    fc1 writes fp16 without its bias; one kernel adds the bias, applies GELU and quantises per
    token for fc2, so the 4x-wide hidden activation is read once and written once at 1 byte.
    """
    h = fc1(x, add_bias=False)
    return fc2(bias_gelu_quant(h, fc1.bias))
