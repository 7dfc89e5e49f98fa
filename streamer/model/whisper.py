"""Whisper as plain `nn.Module`s: an audio encoder and a text decoder over preallocated caches.

No I/O, no scheduling. The decoder reads and writes a `KVCache` of fixed-size slots: each live
sequence owns one slot holding its self-attention K/V (up to `n_text_ctx` positions) and the
cross-attention K/V of its window (computed once, right after the encoder). A decoder call works
on a contiguous range of slots `[start, start + B)`, so that a batch is a view, never a gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamer.model import cpu_linear
from streamer.model.cpu_linear import HalfWeightLinear

HALF_LINEARS = ("qkv", "attn_out", "cross_q", "cross_out", "fc1", "fc2")
CROSS_SCALE_TILE = 128
"""Positions per scale of an FP8 cross cache (= cuda_ops.attention.SCALE_TILE; tests check it)."""
"""The linears of a decoder block that run per token (cross_kv runs once per window)."""


@dataclass(frozen=True)
class ModelDims:
    n_mels: int
    n_audio_ctx: int  # encoder frames per 30-s window (1500)
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int  # decoder positions (448)
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    @property
    def head_dim(self) -> int:
        return self.n_text_state // self.n_text_head


def _split_heads(x: Tensor, n_head: int) -> Tensor:
    # x: [B, T, D] -> [B, H, T, Dh]
    b, t, d = x.shape
    return x.view(b, t, n_head, d // n_head).transpose(1, 2)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Attention of q [B, H, T, Dh] over k, v [B, H, S, Dh].

    One query token on the CPU goes through two plain matmuls: SDPA's CPU flash kernel costs
    ~240 us of setup per call there against ~40 us of work (tiny.en: 8 calls per decoder step).
    """
    if q.shape[2] == 1 and not q.is_cuda:
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ v
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _merge_heads(x: Tensor) -> Tensor:
    # x: [B, H, T, Dh] -> [B, T, D]
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)


class EncoderBlock(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.attn_ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)  # the key bias is zero in Whisper; fused for one GEMM
        self.attn_out = nn.Linear(d, d)
        self.mlp_ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.fused = False  # set by streamer.model.fused.apply_precision (CUDA kernels, FP8 sites)

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, T, D]
        if self.fused:
            from streamer.model.fused import encoder_block

            return encoder_block(self, x)
        q, k, v = self.qkv(self.attn_ln(x)).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(*(_split_heads(t, self.n_head) for t in (q, k, v)))
        x = x + self.attn_out(_merge_heads(a))
        return x + self.fc2(F.gelu(self.fc1(self.mlp_ln(x))))


class AudioEncoder(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        d = dims.n_audio_state
        self.conv1 = nn.Conv1d(dims.n_mels, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", torch.zeros(dims.n_audio_ctx, d))
        self.blocks = nn.ModuleList(EncoderBlock(d, dims.n_audio_head) for _ in range(dims.n_audio_layer))
        self.ln_post = nn.LayerNorm(d)

    def forward(self, mel: Tensor) -> Tensor:
        # mel: [B, n_mels, 3000] -> [B, 1500, D]
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        x = x + self.positional_embedding
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


class KVCache(nn.Module):
    """Per-slot decoder state: self-attention K/V and the window's cross-attention K/V.

    Buffers are [slots, heads, positions, head_dim] per layer, allocated once.
    """

    def __init__(self, dims: ModelDims, n_slots: int, device=None, dtype=None, cross_fp8: bool = False):
        super().__init__()
        h, dh = dims.n_text_head, dims.head_dim
        self.n_slots = n_slots
        self.cross_fp8 = cross_fp8

        def make(t, dtype=dtype):
            return torch.zeros(n_slots, h, t, dh, device=device, dtype=dtype)

        # FP8 cross K/V (e4m3, one scale per slot, head and 128 positions: cuda_ops.attention's
        # SCALE_TILE, written by cuda_ops.cross_kv) halve the largest read of a decode step.
        cross_dtype = torch.float8_e4m3fn if cross_fp8 else dtype
        self.self_k = [make(dims.n_text_ctx) for _ in range(dims.n_text_layer)]
        self.self_v = [make(dims.n_text_ctx) for _ in range(dims.n_text_layer)]
        self.cross_k = [make(dims.n_audio_ctx, cross_dtype) for _ in range(dims.n_text_layer)]
        self.cross_v = [make(dims.n_audio_ctx, cross_dtype) for _ in range(dims.n_text_layer)]
        tiles = -(-dims.n_audio_ctx // CROSS_SCALE_TILE)
        ones = [torch.ones(n_slots, h, tiles, device=device) for _ in range(2 * dims.n_text_layer)] if cross_fp8 else []
        self.cross_k_scale, self.cross_v_scale = ones[::2], ones[1::2]

    def cross(self, layer: int, s: slice) -> tuple:
        """(k, v, k_scale, v_scale) of slots `s` in `layer`; scales are None for fp16/fp32 K/V."""
        if self.cross_fp8:
            return self.cross_k[layer][s], self.cross_v[layer][s], self.cross_k_scale[layer][s], self.cross_v_scale[layer][s]
        return self.cross_k[layer][s], self.cross_v[layer][s], None, None

    def move_rows(self, src: Tensor, dst: Tensor) -> None:
        """Copy slots `src` into slots `dst` (compaction when sequences leave; the two disjoint)."""
        for buffers in (self.self_k, self.self_v, self.cross_k, self.cross_v, self.cross_k_scale, self.cross_v_scale):
            for b in buffers:
                b[dst] = b[src]

    def copy_slots(self, src: Tensor, dst: Tensor, upto: int | None = None) -> None:
        """Self-attention K/V of slots `src` into slots `dst` (beam search reordering), positions
        [0, upto) only: the rest is unwritten, and copying all 448 was 12 % of a CPU beam search."""
        for buffers in (self.self_k, self.self_v):
            for b in buffers:
                b[dst, :, :upto] = b[src, :, :upto]

    @staticmethod
    def bytes_per_slot(dims: ModelDims, itemsize: int, cross_fp8: bool = False) -> int:
        width = 2 * dims.n_text_head * dims.head_dim
        per_layer = width * dims.n_text_ctx * itemsize + width * dims.n_audio_ctx * (1 if cross_fp8 else itemsize)
        return per_layer * dims.n_text_layer


class DecoderBlock(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.attn_ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_out = nn.Linear(d, d)
        self.cross_ln = nn.LayerNorm(d)
        self.cross_q = nn.Linear(d, d)
        self.cross_kv = nn.Linear(d, 2 * d)  # applied once per window, not per token
        self.cross_out = nn.Linear(d, d)
        self.mlp_ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.fused = False  # set by streamer.model.fused.apply_precision (CUDA kernels, FP8 sites)
        # float16-weight copies of the per-token linears for the CPU, by name; set by
        # `TextDecoder.cpu_half_weights()`.
        self.half_weights: dict[str, HalfWeightLinear] = {}

    def forward(self, x: Tensor, index: tuple[Tensor, Tensor], mask: Tensor, self_k: Tensor, self_v: Tensor,
                cross: tuple) -> Tensor:
        # x: [B, T, D]; index: (row [B, T], position [B, T]) where the new K/V go;
        # mask: [B, 1, T, n_text_ctx] True where attending is allowed;
        # self_k/v: this batch's slots, [B, H, n_text_ctx, Dh] views of the cache;
        # cross: (k, v, k_scale, v_scale) of this batch's slots, [B, H, 1500, Dh] (+ [B, H, 12] FP8 scales).
        if self.fused:
            from streamer.model.fused import decoder_block

            return decoder_block(self, x, index, mask, self_k, self_v, cross)
        cross_k, cross_v, _, _ = cross
        q, k, v = self._linear("qkv", self.attn_ln(x)).chunk(3, dim=-1)
        q, k, v = (_split_heads(t, self.n_head) for t in (q, k, v))
        rows, positions = index
        self_k[rows, :, positions] = k.transpose(1, 2)  # [B, T, H, Dh] at (row, position)
        self_v[rows, :, positions] = v.transpose(1, 2)
        a = _attend(q, self_k, self_v, mask)
        x = x + self._linear("attn_out", _merge_heads(a))
        q = _split_heads(self._linear("cross_q", self.cross_ln(x)), self.n_head)
        a = _attend(q, cross_k, cross_v)
        x = x + self._linear("cross_out", _merge_heads(a))
        return x + self._linear("fc2", F.gelu(self._linear("fc1", self.mlp_ln(x))))

    def _linear(self, name: str, x: Tensor) -> Tensor:
        half = self.half_weights.get(name)
        return getattr(self, name)(x) if half is None else half(x)


class TextDecoder(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        d = dims.n_text_state
        self.dims = dims
        self.token_embedding = nn.Embedding(dims.n_vocab, d)
        self.register_buffer("positional_embedding", torch.zeros(dims.n_text_ctx, d))
        self.blocks = nn.ModuleList(DecoderBlock(d, dims.n_text_head) for _ in range(dims.n_text_layer))
        self.ln = nn.LayerNorm(d)
        # FP8 cross cache: quantised by a pass after cuBLAS's GEMM (False) or in a Triton GEMM's epilogue
        # (True, A/B); set by streamer.model.fused.apply_precision (PrecisionConfig.cross_kv_epilogue).
        self.cross_kv_epilogue = False
        # float16-weight copy of the tied output projection for the CPU, set by `cpu_half_weights()`.
        self.proj_half: HalfWeightLinear | None = None

    def cpu_half_weights(self) -> bool:
        """Float16-weight copies of the linears a decoder step reads (`cpu_linear`): half the bytes
        of a memory-bound step, the same float32 arithmetic. Only where every such weight is a
        float16 value (true of OpenAI's checkpoints and CTranslate2 bundles), so outputs keep their
        float32 values; returns whether the copies were made (or were there already: every runner
        over a shared model calls this)."""
        if self.proj_half is not None:
            return True
        blocks = [b for b in self.blocks if not b.fused]  # a preset's fused path reads its own weights
        linears = [(b, name) for b in blocks for name in HALF_LINEARS]
        weights = [self.token_embedding.weight] + [getattr(b, name).weight for b, name in linears]
        if not cpu_linear.available() or any(w.dtype != torch.float32 or not cpu_linear.exact_in_fp16(w)
                                             for w in weights):
            return False
        for b, name in linears:
            linear = getattr(b, name)
            b.half_weights[name] = HalfWeightLinear(linear.weight, linear.bias)
        self.proj_half = HalfWeightLinear(self.token_embedding.weight)
        return True

    def write_cross_kv(self, audio_features: Tensor, cache: KVCache, start: int) -> None:
        """Cross-attention K/V of `audio_features` [B, 1500, D] into slots [start, start + B)."""
        b = audio_features.shape[0]
        s = slice(start, start + b)
        for i, block in enumerate(self.blocks):
            if cache.cross_fp8:  # the fp16 projection never reaches memory (cuda_ops/cross_kv.py)
                from cuda_ops.cross_kv import write_cross_kv_fp8

                out = cache.cross_k[i][s], cache.cross_v[i][s], cache.cross_k_scale[i][s], cache.cross_v_scale[i][s]
                lin = block.cross_kv
                if isinstance(lin, nn.Linear) and self.cross_kv_epilogue:
                    write_cross_kv_fp8(audio_features, lin.weight, lin.bias, *out)
                else:  # an FP8 linear (or the A/B switch): its output, quantised in one pass
                    write_cross_kv_fp8(lin(audio_features), None, None, *out)
                continue
            k, v = (_split_heads(t, block.n_head) for t in block.cross_kv(audio_features).chunk(2, dim=-1))
            cache.cross_k[i][s], cache.cross_v[i][s] = k, v

    def forward(self, tokens: Tensor, positions: Tensor, start: int, cache: KVCache, kv_len: int | None = None) -> Tensor:
        """Hidden states [B, T, D] of `tokens` [B, T] at `positions` [B, T] in slots [start, start + B).

        Each row attends to its own slot's earlier positions (≤ its position), so rows of different
        lengths share one call. Slots are a contiguous range: the batch is a view of the cache.
        `kv_len` (> every position) limits self-attention to the cache's used prefix; without it
        the whole context is read (static shapes, for CUDA graphs).
        """
        b = tokens.shape[0]
        kv_len = kv_len or self.dims.n_text_ctx
        x = self.token_embedding(tokens) + self.positional_embedding[positions]
        rows = torch.arange(b, device=tokens.device)[:, None].expand_as(positions)
        key_pos = torch.arange(kv_len, device=tokens.device)
        mask = (key_pos[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, kv_len]
        s = slice(start, start + b)
        for i, block in enumerate(self.blocks):
            x = block(x, (rows, positions), mask, cache.self_k[i][s, :, :kv_len], cache.self_v[i][s, :, :kv_len],
                      cache.cross(i, s))
        return x

    def logits(self, hidden: Tensor) -> Tensor:
        # hidden: [..., D] -> [..., n_vocab] in float32 (the output projection is tied to the embedding)
        if self.proj_half is not None:
            return self.proj_half(self.ln(hidden))
        return (self.ln(hidden) @ self.token_embedding.weight.t()).float()


class Whisper(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims)
        self.decoder = TextDecoder(dims)
