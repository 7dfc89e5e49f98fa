"""Linear layers of the CPU's decoder step over float16 weights, computed in float32.

A decoder step on the CPU is a chain of GEMVs, bound by the bytes of weights it reads (tiny.en:
33 MB of block linears and an 80 MB vocabulary projection in float32). Whisper's weights are
float16 values (OpenAI's checkpoints and every CTranslate2 bundle are stored that way), so reading
them as float16 and widening them in registers computes the same float32 products from half the
bytes. FBGEMM's fp16 GEMM (`quantized::linear_dynamic_fp16`, shipped in x86 builds of PyTorch)
does exactly that: float32 activations, float16 weights, float32 accumulation and output.
"""

from __future__ import annotations

import torch
from torch import Tensor


def available() -> bool:
    """Whether this PyTorch build has FBGEMM (x86); elsewhere the step uses the float32 weights."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def exact_in_fp16(weight: Tensor) -> bool:
    """Whether every value of `weight` is a float16 value, so that packing it loses nothing."""
    return torch.equal(weight.to(torch.float16).to(weight.dtype), weight)


class HalfWeightLinear:
    """`F.linear(x, weight, bias)` for float32 `x` of any leading shape, reading float16 weights."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        self.packed = torch.ops.quantized.linear_prepack_fp16(
            weight.detach().float(), None if bias is None else bias.detach().float())

    def __call__(self, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
