"""The blocks' forward passes through our kernels (`cuda_ops`), and the precision presets that
switch them on.

The plain forwards in `whisper.py` are the reference; these compute the same function with fused
residual + LayerNorm (emitting FP8 + per-token scales where the next linear is FP8), FP8 linears
through `torch._scaled_mm`, decode attention that reads only each slot's valid positions, and an
FP8 cross-attention cache. Every `cuda_ops` op falls back to its PyTorch reference off CUDA, so the
same code runs (slowly, FP8 simulated) on the CPU for tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from cuda_ops.attention import decode_attention, dequantize_kv
from cuda_ops.fp8 import FP8Linear, ffn_fp8
from cuda_ops.layernorm import layer_norm
from cuda_ops.precision import PrecisionConfig
from streamer.model.whisper import Whisper, _merge_heads, _split_heads

PREFILL_ROWS_MAX = 16
"""Prompt tokens up to which a prefill reads an FP8 cross cache through decode attention (the
cache read once per token, in FP8) rather than dequantising it (fp8 read, fp32 write and read,
fp16 write, then SDPA's fp16 read: about 8 bytes per cached byte, i.e. break-even near 8-16 tokens).
Long previous-text prompts (up to 224 tokens) take the dequantising path."""


def _ln(x: Tensor, ln: torch.nn.LayerNorm, residual: Tensor | None = None, fp8: bool = False):
    """(normed or (fp8, scale), residual sum) of LayerNorm(x + residual)."""
    y, res, scale = layer_norm(x, ln.weight, ln.bias, ln.eps, residual=residual, out_fp8=fp8)
    return ((y, scale) if fp8 else y), res


def _mlp(block, x: Tensor, a: Tensor) -> Tensor:
    """x + a, then + MLP(LN(x + a)); FP8 end to end when fc1 is FP8."""
    fp8 = isinstance(block.fc1, FP8Linear)
    h, x = _ln(a, block.mlp_ln, residual=x, fp8=fp8)
    return x + (ffn_fp8(h, block.fc1, block.fc2) if fp8 else block.fc2(F.gelu(block.fc1(h))))


def encoder_block(block, x: Tensor) -> Tensor:
    h, _ = _ln(x, block.attn_ln, fp8=isinstance(block.qkv, FP8Linear))
    q, k, v = block.qkv(h).chunk(3, dim=-1)
    a = F.scaled_dot_product_attention(*(_split_heads(t, block.n_head) for t in (q, k, v)))
    return _mlp(block, x, block.attn_out(_merge_heads(a)))


def decoder_block(block, x: Tensor, index: tuple[Tensor, Tensor], mask: Tensor, self_k: Tensor, self_v: Tensor,
                  cross: tuple) -> Tensor:
    rows, positions = index
    one_token = x.shape[1] == 1
    h, _ = _ln(x, block.attn_ln, fp8=isinstance(block.qkv, FP8Linear))
    q, k, v = (_split_heads(t, block.n_head) for t in block.qkv(h).chunk(3, dim=-1))
    self_k[rows, :, positions] = k.transpose(1, 2)
    self_v[rows, :, positions] = v.transpose(1, 2)
    if one_token:  # read each slot's valid positions only, not the whole context
        lengths = (positions[:, 0] + 1).to(torch.int32)
        a = decode_attention(q[:, :, 0], self_k, self_v, lengths)[:, :, None]
    else:
        a = F.scaled_dot_product_attention(q, self_k, self_v, attn_mask=mask)
    h, x = _ln(block.attn_out(_merge_heads(a)), block.cross_ln, residual=x, fp8=isinstance(block.cross_q, FP8Linear))
    q = _split_heads(block.cross_q(h), block.n_head)
    ck, cv, k_scale, v_scale = cross
    B, H, T, Dh = q.shape
    if k_scale is not None and T <= PREFILL_ROWS_MAX:
        # Cross-attention has no mask, so each query token is one decode-attention row over its
        # slot's FP8 cache (slot_ids repeat the slot): no dequantised copy of the cache is made.
        rows = q.transpose(1, 2).reshape(B * T, H, Dh)
        lengths = torch.full((B * T,), ck.shape[2], dtype=torch.int32, device=q.device)
        slots = None if T == 1 else torch.arange(B, dtype=torch.int32, device=q.device).repeat_interleave(T)
        a = decode_attention(rows, ck, cv, lengths, k_scale=k_scale, v_scale=v_scale, slot_ids=slots)
        a = a.view(B, T, H, Dh).transpose(1, 2)
    else:
        if k_scale is not None:  # a long prompt over an FP8 cache: dequantise this batch's slots once
            ck, cv = dequantize_kv(ck, k_scale).to(q.dtype), dequantize_kv(cv, v_scale).to(q.dtype)
        a = F.scaled_dot_product_attention(q, ck, cv)
    return _mlp(block, x, block.cross_out(_merge_heads(a)))


def apply_precision(model: Whisper, config: PrecisionConfig) -> Whisper:
    """Switch `model` (already on its device and dtype) to the fused kernels and FP8 sites of `config`.

    The cross-attention cache format (`config.cross_kv_cache`) is the KV cache's business: the
    runner allocates it. Linears become FP8Linear with per-output-channel scales, quantised once,
    in models at least `config.fp8_min_width` wide.
    """
    def fp8(module, *names):
        if model.dims.n_audio_state < config.fp8_min_width:  # too narrow for FP8 GEMMs to pay
            return
        for name in names:
            linear = getattr(module, name)
            if isinstance(linear, torch.nn.Linear):
                setattr(module, name, FP8Linear.from_linear(linear))

    for block in model.encoder.blocks:
        block.fused = config.use_fused_layernorm
        if config.encoder_qkv == "fp8":
            fp8(block, "qkv")
        if config.encoder_out_proj == "fp8":
            fp8(block, "attn_out")
        if config.encoder_ffn == "fp8":
            fp8(block, "fc1", "fc2")
    model.decoder.cross_kv_epilogue = config.cross_kv_epilogue
    for block in model.decoder.blocks:
        block.fused = config.use_fused_layernorm
        if config.decoder_self_qkv == "fp8":
            fp8(block, "qkv")
        if config.decoder_cross_q == "fp8":
            fp8(block, "cross_q")
        if config.decoder_out_proj == "fp8":
            fp8(block, "attn_out", "cross_out")
        if config.decoder_ffn == "fp8":
            fp8(block, "fc1", "fc2")
        if config.cross_kv_proj == "fp8":
            fp8(block, "cross_kv")
    return model
