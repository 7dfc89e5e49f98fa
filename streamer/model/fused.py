"""The blocks' forward passes through our kernels (`cuda_ops`), as modules swapped into a model,
and `apply_precision`, which swaps them in for a precision preset.

The plain blocks in `whisper.py` are the reference; `FusedEncoderBlock` and `FusedDecoderBlock`
compute the same function with fused residual + LayerNorm (emitting FP8 + per-token scales where
the next linear is FP8), FP8 linears through `torch._scaled_mm` (`FP8Linear` in place of
`nn.Linear`), decode attention that reads only each slot's valid positions, and an FP8
cross-attention cache. Every `cuda_ops` op falls back to its PyTorch reference off CUDA, so the
same code runs (slowly, FP8 simulated) on the CPU for tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cuda_ops.attention import decode_attention, dequantize_kv
from cuda_ops import cross_absorbed_mma
from cuda_ops.cross_absorbed import absorb_query, absorbed_attention, absorbed_output
from cuda_ops.cross_int4 import decode_attention_int4, dequantize_k, dequantize_v, write_cross_kv_int4
from cuda_ops.cross_kv import write_cross_kv_fp8
from cuda_ops.decode_linear import linear
from cuda_ops.fp8 import FP8Linear, bias_gelu, ffn_fp8
from cuda_ops.kv_write import write_kv
from cuda_ops.layernorm import layer_norm
from cuda_ops.precision import FP16_KV_FORMATS, PrecisionConfig
from streamer.model.whisper import (AudioEncoder, DecoderBlock, EncoderBlock, LayerKV, StepIndex, TextDecoder, Whisper,
                                    _merge_heads, _split_heads, cross_qk, project_cross_kv, with_children)

PREFILL_ROWS_MAX = 16
"""Prompt tokens up to which a prefill reads a quantised (FP8 or 4-bit) cross cache through decode
attention (the cache read once per token) rather than dequantising it (a quantised read, fp32 write
and read, fp16 write, then SDPA's fp16 read: about 8 bytes per cached byte, i.e. break-even near
8-16 tokens). Long previous-text prompts (up to 224 tokens) take the dequantising path."""


def _dequantize_cross(ck: Tensor, cv: Tensor, k_scale: Tensor, v_scale: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 K and V [S, H, 1500, Dh] of a quantised cross cache's slots (FP8 or 4-bit codes)."""
    if ck.dtype == torch.uint8:
        return dequantize_k(ck, k_scale), dequantize_v(cv, v_scale)
    return dequantize_kv(ck, k_scale), dequantize_kv(cv, v_scale)


def _ln(x: Tensor, ln: nn.LayerNorm, residual: Tensor | None = None, fp8: bool = False):
    """(normed or (fp8, scale), residual sum) of LayerNorm(x + residual)."""
    y, res, scale = layer_norm(x, ln.weight, ln.bias, ln.eps, residual=residual, out_fp8=fp8)
    return ((y, scale) if fp8 else y), res


def _linear(lin: nn.Module, h, gelu: bool = False) -> Tensor:
    """lin(h), then GELU: an nn.Linear through `decode_linear.linear` (cuBLAS and our GELU kernel, which
    PyTorch's erff-based GELU, bound by instructions, was 1.4x slower than; our split-K GEMM only as
    an A/B, STREAMER_DECODE_LINEAR), an FP8 linear as it is."""
    if isinstance(lin, nn.Linear):
        return linear(h, lin.weight, lin.bias, gelu)
    y = lin(h)
    return bias_gelu(y, None) if gelu else y


def _mlp_delta(block: nn.Module, x: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    """(x + a, MLP(LN(x + a))): the block's output as residual and delta, for the next LayerNorm to
    add; FP8 end to end when fc1 is FP8."""
    fp8 = isinstance(block.fc1, FP8Linear)
    h, x = _ln(a, block.mlp_ln, residual=x, fp8=fp8)
    return x, (ffn_fp8(h, block.fc1, block.fc2) if fp8 else _linear(block.fc2, _linear(block.fc1, h, gelu=True)))


def _adopt(module: nn.Module, block: nn.Module) -> None:
    """Give `module` the sublayers of `block` (the same modules: weights shared, not copied)."""
    module.n_head = block.n_head
    for name, child in block.named_children():
        module.add_module(name, child)


class FusedEncoderBlock(nn.Module):
    """`EncoderBlock`'s function through the fused LayerNorm (FP8 out when qkv or fc1 is FP8), on
    the residual stream as (x, delta): the block takes x + delta and returns its output as a new
    (x, delta), so that each residual add happens inside the next LayerNorm (`FusedAudioEncoder`)
    instead of in an add kernel of its own (0.028 s of 256 large-v3 windows on the H200)."""

    def __init__(self, block: EncoderBlock):
        super().__init__()
        _adopt(self, block)

    def forward(self, x: Tensor, delta: Tensor | None = None) -> tuple[Tensor, Tensor]:
        fp8 = isinstance(self.qkv, FP8Linear)
        if delta is None:
            h, _ = _ln(x, self.attn_ln, fp8=fp8)
        else:
            h, x = _ln(delta, self.attn_ln, residual=x, fp8=fp8)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(*(_split_heads(t, self.n_head) for t in (q, k, v)))
        return _mlp_delta(self, x, self.attn_out(_merge_heads(a)))


class FusedAudioEncoder(AudioEncoder):
    """`AudioEncoder` over `FusedEncoderBlock`s: the residual stream passes between blocks as
    (x, delta), and the final LayerNorm adds the last delta."""

    def forward(self, mel: Tensor) -> Tensor:
        x, delta = self.embed(mel), None
        for block in self.blocks:
            x, delta = block(x, delta)
        return _ln(delta, self.ln_post, residual=x)[0]


def _retyped(module: nn.Module, cls: type, blocks: list[nn.Module]) -> nn.Module:
    """`module` with `blocks` as a `cls` (a subclass of its class that only changes how the blocks
    are run): every other part shared."""
    new = with_children(module, blocks=nn.ModuleList(blocks))
    new.__class__ = cls
    return new


class FusedDecoderBlock(nn.Module):
    """`DecoderBlock`'s function (same arguments and results) through our kernels, over an fp16 or
    an FP8 cross cache.

    `cross_kv_epilogue`: with an FP8 cross cache and an fp16 `cross_kv` linear, the projection is
    the Triton GEMM whose epilogue quantises and writes the cache (True) or cuBLAS's GEMM followed
    by one quantise pass (PrecisionConfig.cross_kv_epilogue).
    """

    def __init__(self, block: DecoderBlock, cross_kv_epilogue: bool = False):
        super().__init__()
        _adopt(self, block)
        self.cross_kv_epilogue = cross_kv_epilogue

    def forward(self, x: Tensor, index: StepIndex, mask: Tensor, self_k: Tensor, self_v: Tensor,
                cross: tuple, cross_qk_heads: list[int] | None = None) -> tuple[Tensor, Tensor | None]:
        x, delta, qk = self.carry(x, None, index, mask, self_k, self_v, cross, cross_qk_heads)
        return x + delta, qk

    def carry(self, x: Tensor, delta: Tensor | None, index: StepIndex, mask: Tensor, self_k: Tensor, self_v: Tensor,
              cross: tuple, cross_qk_heads: list[int] | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """`forward` on the residual stream as (x, delta), as `FusedEncoderBlock`: takes x + delta
        (delta None: x) and returns its output as (x, delta, qk), its last residual add left to the
        next LayerNorm (`FusedTextDecoder`: 31 add kernels fewer in a large-v3 step)."""
        one_token = x.shape[1] == 1
        fp8 = isinstance(self.qkv, FP8Linear)
        if delta is None:
            h, _ = _ln(x, self.attn_ln, fp8=fp8)
        else:
            h, x = _ln(delta, self.attn_ln, residual=x, fp8=fp8)
        q, k, v = (_split_heads(t, self.n_head) for t in _linear(self.qkv, h).chunk(3, dim=-1))
        write_kv(k.transpose(1, 2), v.transpose(1, 2), self_k, self_v, index.rows, index.positions)
        if one_token:  # read each slot's valid positions only, not the whole context
            a = decode_attention(q[:, :, 0], self_k, self_v, index.lengths)[:, :, None]
        else:
            a = F.scaled_dot_product_attention(q, self_k, self_v, attn_mask=mask)
        h, x = _ln(_linear(self.attn_out, _merge_heads(a)), self.cross_ln, residual=x, fp8=isinstance(self.cross_q, FP8Linear))
        q = _split_heads(_linear(self.cross_q, h), self.n_head)
        ck, cv, k_scale, v_scale = cross
        B, H, T, Dh = q.shape
        if cv is None:  # an absorbed cache: ck is the windows' encoder states X [B, 1500, D]
            a, qk = self._absorbed_cross(q, ck, cross_qk_heads)
            return *_mlp_delta(self, x, _linear(self.cross_out, _merge_heads(a))), qk
        if k_scale is not None and T <= PREFILL_ROWS_MAX:
            # Cross-attention has no mask, so each query token is one decode-attention row over its
            # slot's quantised cache (slot_ids repeat the slot): no dequantised copy of it is made.
            rows = q.transpose(1, 2).reshape(B * T, H, Dh)
            slots = None if T == 1 else torch.arange(B, dtype=torch.int32, device=q.device).repeat_interleave(T)
            if ck.dtype == torch.uint8:
                a = decode_attention_int4(rows, ck, cv, k_scale, v_scale, slot_ids=slots)
            else:
                lengths = torch.full((B * T,), ck.shape[2], dtype=torch.int32, device=q.device)
                a = decode_attention(rows, ck, cv, lengths, k_scale=k_scale, v_scale=v_scale, slot_ids=slots)
            a = a.view(B, T, H, Dh).transpose(1, 2)
        else:
            if k_scale is not None:  # a long prompt over a quantised cache: dequantise this batch's slots once
                ck, cv = (t.to(q.dtype) for t in _dequantize_cross(ck, cv, k_scale, v_scale))
                k_scale = None
            a = F.scaled_dot_product_attention(q, ck, cv)
        qk = None
        if cross_qk_heads is not None:  # word alignment: over the keys as the attention read them
            keys = ck if k_scale is None else _dequantize_cross(ck, cv, k_scale, v_scale)[0]
            qk = cross_qk(q, keys, cross_qk_heads)
        return *_mlp_delta(self, x, _linear(self.cross_out, _merge_heads(a))), qk

    def _absorbed_cross(self, q: Tensor, x: Tensor, cross_qk_heads: list[int] | None) -> tuple[Tensor, Tensor | None]:
        """Cross-attention of q [B, H, T, Dh] over the windows' encoder states x [B, 1500, D]:
        (a [B, H, T, Dh], the logits of `cross_qk_heads` or None). Up to Dh query tokens a row, the
        K projection folds into the queries and V's into the output (cuda_ops.cross_absorbed: one
        read of X); beyond that (long prompts) the multiply-adds of the folded form, T x H x D per
        position, pass the projection's D x D, so K and V are projected for the call."""
        B, H, T, Dh = q.shape
        D = H * Dh
        w, bias = self.cross_kv.weight, self.cross_kv.bias
        keys = None
        if T <= Dh:
            # A row's T tokens x H heads are one row's T*H queries over its window: one read of X per
            # group of queries (not per token), and groups filled across tokens (20 heads pad to 32 alone).
            qa = absorb_query(q.transpose(1, 2).reshape(B * T, H, Dh), w[:D])
            z = absorbed_attention(qa.reshape(B, T * H, D), x).view(B * T, H, D)
            a = absorbed_output(z, w[D:], None if bias is None else bias[D:]).view(B, T, H, Dh).transpose(1, 2)
        else:
            keys, values = project_cross_kv(self, x)
            a = F.scaled_dot_product_attention(q, keys, values)
        if cross_qk_heads is None:
            return a, None
        if keys is not None:
            return a, cross_qk(q, keys, cross_qk_heads)
        # word alignment without projected keys: those heads' keys alone
        n = len(cross_qk_heads)
        keys = _split_heads(F.linear(x, w[:D].view(H, Dh, -1)[cross_qk_heads].reshape(n * Dh, -1)), n)
        return a, cross_qk(q[:, cross_qk_heads], keys, list(range(n)))

    def write_cross_kv(self, audio_features: Tensor, layer: LayerKV, s: slice) -> None:
        """Cross-attention K/V of `audio_features` [B, 1500, D] into `layer`'s slots `s`: quantised in
        one pass over the projection (cuda_ops/cross_kv.py, cross_int4.py), or with the FP8 epilogue
        switch inside the projection's GEMM, where the fp16 projection never reaches memory."""
        if layer.cross_format in FP16_KV_FORMATS:
            DecoderBlock.write_cross_kv(self, audio_features, layer, s)
            return
        out = layer.cross_k[s], layer.cross_v[s], layer.cross_k_scale[s], layer.cross_v_scale[s]
        lin = self.cross_kv
        if layer.cross_format == "int4":
            write_cross_kv_int4(lin(audio_features), *out)
            return
        if isinstance(lin, nn.Linear) and self.cross_kv_epilogue:
            write_cross_kv_fp8(audio_features, lin.weight, lin.bias, *out)
        else:  # an FP8 linear (or the A/B switch): its output, quantised in one pass
            write_cross_kv_fp8(lin(audio_features), None, None, *out)


class FusedTextDecoder(TextDecoder):
    """`TextDecoder` over `FusedDecoderBlock`s: the residual stream passes between blocks as
    (x, delta), each add inside the next block's first LayerNorm, and one add after the last."""

    def run_blocks(self, x: Tensor, index: StepIndex, mask: Tensor, layers: list[tuple[tuple, tuple]],
                   heads_of: dict[int, list[int]]) -> tuple[Tensor, list[Tensor]]:
        captured, delta = [], None
        for i, (block, (self_kv, cross)) in enumerate(zip(self.blocks, layers)):
            x, delta, qk = block.carry(x, delta, index, mask, *self_kv, cross, heads_of.get(i))
            if qk is not None:
                captured.append(qk)
        return x + delta, captured


class PaddedTiedProjection(nn.Module):
    """`TiedProjection` over the token embedding stored with its rows padded to a multiple of 64.

    cuBLAS picks a Hopper kernel for the vocabulary GEMM only when each row of its output is 16-byte
    aligned: with the multilingual vocabulary (51,865 or 51,866 columns) it ran an sm80 "align2"
    kernel, 167 µs of a 12-ms captured large-v3 step at 256 rows (H200, session 12). `embedding`
    becomes the first rows of the padded buffer (`with_padded_vocabulary`), so nothing is stored twice.
    """

    def __init__(self, padded: Tensor, n_vocab: int):
        super().__init__()
        self.n_vocab = n_vocab
        self.register_buffer("padded", padded, persistent=False)

    def forward(self, x: Tensor, embedding: Tensor, upcast: bool = True) -> Tensor:
        y = (x @ self.padded.t())[..., :self.n_vocab]
        return y.float() if upcast else y


def with_padded_vocabulary(decoder: nn.Module, multiple: int = 64) -> nn.Module:
    """`decoder` (a TextDecoder) with its token embedding a view into a buffer padded to `multiple`
    rows and a `PaddedTiedProjection` over it; as it is when the logits' rows are 16-byte aligned
    already (English-only vocabularies: 51,864)."""
    weight = decoder.token_embedding.weight
    v, d = weight.shape
    if (v * weight.element_size()) % 16 == 0:
        return decoder
    padded = weight.new_zeros(-(-v // multiple) * multiple, d)
    padded[:v] = weight.detach()
    embedding = nn.Embedding(v, d, _weight=padded[:v], _freeze=True, device=weight.device, dtype=weight.dtype)
    return with_children(decoder, token_embedding=embedding, proj=PaddedTiedProjection(padded, v))


def apply_precision(model: Whisper, config: PrecisionConfig) -> Whisper:
    """`model` (already on its device and dtype) with the fused blocks and FP8 sites of `config`:
    a new module tree that shares every unconverted weight with `model`, which is left as it was.

    The cross-attention cache format (`config.cross_kv_cache`) is the KV cache's business: the
    runner allocates it. Linears become FP8Linear with per-output-channel scales, quantised once,
    in models at least `config.fp8_min_width` wide.
    """
    wide = model.dims.n_audio_state >= config.fp8_min_width  # narrower: FP8 GEMMs too small to pay

    def convert(block: nn.Module, sites: dict[str, str]) -> nn.Module:
        fp8 = {name: FP8Linear.from_linear(getattr(block, name)) for name, dtype in sites.items()
               if wide and dtype == "fp8" and isinstance(getattr(block, name), nn.Linear)}
        return with_children(block, **fp8)

    encoder_sites = {"qkv": config.encoder_qkv, "attn_out": config.encoder_out_proj,
                     "fc1": config.encoder_ffn, "fc2": config.encoder_ffn}
    decoder_sites = {"qkv": config.decoder_self_qkv, "cross_q": config.decoder_cross_q,
                     "attn_out": config.decoder_out_proj, "cross_out": config.decoder_out_proj,
                     "fc1": config.decoder_ffn, "fc2": config.decoder_ffn, "cross_kv": config.cross_kv_proj}
    encoder_blocks, decoder_blocks = [], []
    for block in model.encoder.blocks:
        block = convert(block, encoder_sites)
        encoder_blocks.append(FusedEncoderBlock(block) if config.use_fused_layernorm else block)
    for block in model.decoder.blocks:
        block = convert(block, decoder_sites)
        decoder_blocks.append(FusedDecoderBlock(block, config.cross_kv_epilogue) if config.use_fused_layernorm else block)
    fused = config.use_fused_layernorm
    encoder = _retyped(model.encoder, FusedAudioEncoder if fused else type(model.encoder), encoder_blocks)
    decoder = with_padded_vocabulary(_retyped(model.decoder, FusedTextDecoder if fused else type(model.decoder),
                                              decoder_blocks))
    return with_children(model, encoder=encoder, decoder=decoder)


HYBRID_MIN_WIDTH = 1024
""""auto" picks the hybrid cache for models at least this wide (medium, large, turbo). On an H100
(session 28) it won at large-v3's width (rtf 1,837 -> 2,249 at 128 windows, and 256 windows fit) and
turbo's (wall 0.91-0.98x at 1-256), and lost wall time at tiny.en's (1.07-1.35x at 128 windows),
where a step is launch-bound and the cross K/V are small."""


def cross_cache_format(model: Whisper, config: PrecisionConfig) -> str:
    """The cross-attention cache format `config` gives `model` (on its device and dtype): its
    `cross_kv_cache`, with "auto" resolved to "hybrid" where the absorbed path's tensor-core kernel runs
    and the model is at least `HYBRID_MIN_WIDTH` wide (from `hybrid_kv_slots` rows up one read of the
    encoder states a layer instead of K and V, 1/64 of fp16 K/V's memory; below, fp16 K/V), else "fp16"."""
    if config.cross_kv_cache != "auto":
        return config.cross_kv_cache
    p = next(model.parameters())
    width = model.dims.n_audio_state
    kernel = config.absorbable and cross_absorbed_mma.supported(p.device, p.dtype, width)
    return "hybrid" if kernel and width >= HYBRID_MIN_WIDTH else "fp16"
