"""Fused residual add + LayerNorm over the last dim, optionally emitting FP8 for the next linear.

Whisper's pre-norm blocks do `x = x + sublayer(ln(x))`; one kernel here reads the sublayer
output and the residual once, writes the new residual and the normalised activation, and can
write that activation as e4m3 with a float32 scale per token (amax / 448) instead, which is the
form `fp8.FP8Linear` consumes. `layer_norm` runs the kernel on CUDA and the fp32 reference
elsewhere; `layer_norm_triton` runs the kernel on any device (CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from ._triton import eager_small
from .fp8 import FP8_DTYPE, quantize_rows_reference, row_launch

try:
    import triton
    import triton.language as tl

    from .fp8 import _fp8_scales, _row_amax, _to_e4m3
except ImportError:  # CPU-only installs: `layer_norm` falls back to the reference
    triton = None

# (y, residual_out, scale): y in x's dtype, or e4m3 with scale [...] float32 when out_fp8;
# residual_out = x + residual in x's dtype when a residual was given.
LayerNormOutput = tuple[Tensor, Tensor | None, Tensor | None]


if triton is not None:

    @triton.jit
    def _load_part(x_ptrs, res_ptrs, res_out_ptrs, cols, mask, HAS_RESIDUAL: tl.constexpr):
        """One part (head or tail) of the rows as fp32; with a residual, the rounded sum, stored."""
        x = tl.load(x_ptrs + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptrs + cols, mask=mask, other=0.0)
            # round the sum to the stream's dtype before normalising, as the unfused model does
            x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptrs.dtype.element_ty)
            tl.store(res_out_ptrs + cols, x, mask=mask)
        return x.to(tl.float32)

    @triton.jit
    def _affine_part(xc, rstd, w_ptr, b_ptr, cols, col_mask):
        w = tl.load(w_ptr + cols, mask=col_mask).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=col_mask).to(tl.float32)
        return xc * rstd[:, None] * w + b

    @triton.jit
    def _layer_norm_kernel(
        x_ptr, res_ptr, res_out_ptr, w_ptr, b_ptr, y_ptr, scale_ptr,
        M, D, stride_x, stride_res, stride_res_out, stride_y, eps,
        HAS_RESIDUAL: tl.constexpr, OUT_FP8: tl.constexpr, SOFT_ROUND: tl.constexpr,
        BLOCK_M: tl.constexpr, HEAD: tl.constexpr, TAIL: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows[:, None] < M
        cols_a = tl.arange(0, HEAD)[None, :]  # always inside the row
        cols_b = HEAD + tl.arange(0, TAIL)[None, :]
        mask_b = row_ok & (cols_b < D)
        x_ptrs = x_ptr + rows[:, None] * stride_x
        res_ptrs = res_ptr + rows[:, None] * stride_res
        res_out_ptrs = res_out_ptr + rows[:, None] * stride_res_out
        xa = _load_part(x_ptrs, res_ptrs, res_out_ptrs, cols_a, row_ok, HAS_RESIDUAL)
        xb = _load_part(x_ptrs, res_ptrs, res_out_ptrs, cols_b, mask_b, HAS_RESIDUAL)
        mean = (tl.sum(xa, axis=1) + tl.sum(xb, axis=1)) / D
        xa = xa - mean[:, None]
        xb = tl.where(mask_b, xb - mean[:, None], 0.0)
        rstd = tl.math.rsqrt((tl.sum(xa * xa, axis=1) + tl.sum(xb * xb, axis=1)) / D + eps)
        ya = _affine_part(xa, rstd, w_ptr, b_ptr, cols_a, None)
        yb = _affine_part(xb, rstd, w_ptr, b_ptr, cols_b, cols_b < D)
        y_ptrs = y_ptr + rows[:, None] * stride_y
        if OUT_FP8:
            scale, inv = _fp8_scales(tl.maximum(_row_amax(ya, row_ok), _row_amax(yb, mask_b)))
            tl.store(y_ptrs + cols_a, _to_e4m3(ya, inv, SOFT_ROUND), mask=row_ok)
            tl.store(y_ptrs + cols_b, _to_e4m3(yb, inv, SOFT_ROUND), mask=mask_b)
            tl.store(scale_ptr + rows, scale, mask=rows < M)
        else:
            tl.store(y_ptrs + cols_a, ya.to(y_ptr.dtype.element_ty), mask=row_ok)
            tl.store(y_ptrs + cols_b, yb.to(y_ptr.dtype.element_ty), mask=mask_b)


def layer_norm_reference(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5,
    residual: Tensor | None = None, out_fp8: bool = False,
) -> LayerNormOutput:
    """The same contract in PyTorch with fp32 math (the residual sum is rounded to x's dtype)."""
    residual_out = None
    if residual is not None:
        residual_out = (x.float() + residual.float()).to(x.dtype)
        x = residual_out
    y = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps)
    if out_fp8:
        q, scale = quantize_rows_reference(y)
        return q, residual_out, scale
    return y.to(x.dtype), residual_out, None


def layer_norm_triton(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5,
    residual: Tensor | None = None, out_fp8: bool = False,
    *, out: Tensor | None = None, residual_out: Tensor | None = None, scale_out: Tensor | None = None,
) -> LayerNormOutput:
    """Kernel version of `layer_norm_reference`; `out`, `residual_out`, `scale_out` may be given."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D).contiguous()
    M = x2.shape[0]
    if out is None:
        out = torch.empty(x2.shape, dtype=FP8_DTYPE if out_fp8 else x.dtype, device=x.device)
    out = out.view(M, D)
    scale = None
    if out_fp8:
        scale = torch.empty(M, dtype=torch.float32, device=x.device) if scale_out is None else scale_out.view(M)
    res2 = None
    if residual is not None:
        res2 = residual.reshape(-1, D).contiguous()
        residual_out = torch.empty_like(x2) if residual_out is None else residual_out.view(M, D)
    launch = row_launch(D, x.is_cuda)
    _layer_norm_kernel[(triton.cdiv(M, launch.block_m),)](
        x2, x2 if res2 is None else res2, x2 if res2 is None else residual_out,
        weight.contiguous(), bias.contiguous(), out, x2 if scale is None else scale,
        M, D, x2.stride(0), 0 if res2 is None else res2.stride(0),
        0 if res2 is None else residual_out.stride(0), out.stride(0), eps,
        HAS_RESIDUAL=res2 is not None, OUT_FP8=out_fp8, SOFT_ROUND=not x.is_cuda,
        BLOCK_M=launch.block_m, HEAD=launch.head, TAIL=launch.tail, num_warps=launch.num_warps,
    )
    return (
        out.view(x.shape),
        None if res2 is None else residual_out.view(x.shape),
        None if scale is None else scale.view(x.shape[:-1]),
    )


def layer_norm(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5,
    residual: Tensor | None = None, out_fp8: bool = False,
) -> LayerNormOutput:
    """LayerNorm(x + residual) over the last dim: the fused kernel on CUDA, the reference elsewhere.

    x, residual [..., D] in fp16/bf16/fp32; weight, bias [D]. Returns (y, residual_out, scale):
    y in x's dtype, or e4m3 with scale [...] float32 (y ~= y_fp8 * scale[..., None]) when out_fp8;
    residual_out = x + residual in x's dtype (None without a residual).
    """
    if x.is_cuda and triton is not None and not out_fp8 and eager_small(x):
        # outside graph capture, a small batch: PyTorch's add and LayerNorm launch cheaper than ours
        # (fp32 statistics of the sum rounded to x's dtype, as the kernel does)
        residual_out = None if residual is None else x + residual
        y = F.layer_norm(x if residual is None else residual_out, (x.shape[-1],), weight, bias, eps)
        return y, residual_out, None
    if x.is_cuda and triton is not None:
        return layer_norm_triton(x, weight, bias, eps, residual, out_fp8)
    return layer_norm_reference(x, weight, bias, eps, residual, out_fp8)
