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
from torch import Tensor, nn

from streamer.model.whisper import DecoderBlock, Whisper, with_children

HALF_LINEARS = ("qkv", "attn_out", "cross_q", "cross_out", "fc1", "fc2")
"""The linears of a decoder block that run per token (cross_kv runs once per window)."""


def available() -> bool:
    """Whether this PyTorch build has FBGEMM (x86); elsewhere the step uses the float32 weights."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def exact_in_fp16(weight: Tensor) -> bool:
    """Whether every value of `weight` is a float16 value, so that packing it loses nothing."""
    return torch.equal(weight.to(torch.float16).to(weight.dtype), weight)


class HalfWeightLinear(nn.Module):
    """`F.linear(x, weight, bias)` for float32 `x` of any leading shape, reading float16 weights."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        super().__init__()
        self.packed = torch.ops.quantized.linear_prepack_fp16(
            weight.detach().float(), None if bias is None else bias.detach().float())

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)


class HalfWeightProjection(HalfWeightLinear):
    """`TiedProjection` over a float16 copy of the token embedding (the `embedding` argument, the
    float32 matrix, is not read)."""

    def forward(self, x: Tensor, embedding: Tensor | None = None, upcast: bool = True) -> Tensor:
        return super().forward(x)  # float32 already


def with_half_weights(model: Whisper) -> Whisper:
    """`model` with float16-weight copies of the linears a CPU decoder step reads: half the bytes of a
    memory-bound step, the same float32 arithmetic. Only where every such weight is a float16 value
    (true of OpenAI's checkpoints and CTranslate2 bundles), so that outputs keep their float32
    values; else (or without FBGEMM) `model` itself. Blocks a precision preset swapped (model/fused.py)
    read their own weights and are kept; `model` is left as it was."""
    decoder = model.decoder
    plain = [i for i, b in enumerate(decoder.blocks) if type(b) is DecoderBlock]
    weights = [decoder.token_embedding.weight] + [getattr(decoder.blocks[i], n).weight for i in plain for n in HALF_LINEARS]
    if not available() or any(w.dtype != torch.float32 or not exact_in_fp16(w) for w in weights):
        return model
    blocks = list(decoder.blocks)
    for i in plain:
        block = blocks[i]
        blocks[i] = with_children(block, **{n: HalfWeightLinear(getattr(block, n).weight, getattr(block, n).bias)
                                            for n in HALF_LINEARS})
    decoder = with_children(decoder, blocks=nn.ModuleList(blocks),
                            proj=HalfWeightProjection(decoder.token_embedding.weight))
    return with_children(model, decoder=decoder)
