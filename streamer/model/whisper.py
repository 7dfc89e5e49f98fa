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

        # FP8 cross K/V (e4m3, one scale per slot and head) halve the largest read of a decode step.
        cross_dtype = torch.float8_e4m3fn if cross_fp8 else dtype
        self.self_k = [make(dims.n_text_ctx) for _ in range(dims.n_text_layer)]
        self.self_v = [make(dims.n_text_ctx) for _ in range(dims.n_text_layer)]
        self.cross_k = [make(dims.n_audio_ctx, cross_dtype) for _ in range(dims.n_text_layer)]
        self.cross_v = [make(dims.n_audio_ctx, cross_dtype) for _ in range(dims.n_text_layer)]
        ones = [torch.ones(n_slots, h, device=device) for _ in range(2 * dims.n_text_layer)] if cross_fp8 else []
        self.cross_k_scale, self.cross_v_scale = ones[::2], ones[1::2]

    def cross(self, layer: int, s: slice) -> tuple:
        """(k, v, k_scale, v_scale) of slots `s` in `layer`; scales are None for fp16/fp32 K/V."""
        if self.cross_fp8:
            return self.cross_k[layer][s], self.cross_v[layer][s], self.cross_k_scale[layer][s], self.cross_v_scale[layer][s]
        return self.cross_k[layer][s], self.cross_v[layer][s], None, None

    def move(self, src: int, dst: int) -> None:
        """Copy slot `src` into slot `dst` (compaction when a sequence leaves)."""
        for buffers in (self.self_k, self.self_v, self.cross_k, self.cross_v, self.cross_k_scale, self.cross_v_scale):
            for b in buffers:
                b[dst].copy_(b[src])

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
        # [in, out] copies of the widening projections (qkv, fc1) for the CPU, set by
        # `TextDecoder.cpu_layout()`: a one-token step reads them 1.7x faster in this layout
        # (tiny.en, one core: 16.8 against 9.2 GB/s); the narrowing fc2 is faster as it is.
        self.qkv_t: Tensor | None = None
        self.fc1_t: Tensor | None = None

    def forward(self, x: Tensor, index: tuple[Tensor, Tensor], mask: Tensor, self_k: Tensor, self_v: Tensor,
                cross: tuple) -> Tensor:
        # x: [B, T, D]; index: (row [B, T], position [B, T]) where the new K/V go;
        # mask: [B, 1, T, n_text_ctx] True where attending is allowed;
        # self_k/v: this batch's slots, [B, H, n_text_ctx, Dh] views of the cache;
        # cross: (k, v, k_scale, v_scale) of this batch's slots, [B, H, 1500, Dh] (+ [B, H] FP8 scales).
        if self.fused:
            from streamer.model.fused import decoder_block

            return decoder_block(self, x, index, mask, self_k, self_v, cross)
        cross_k, cross_v, _, _ = cross
        q, k, v = _project(self.qkv, self.qkv_t, self.attn_ln(x)).chunk(3, dim=-1)
        q, k, v = (_split_heads(t, self.n_head) for t in (q, k, v))
        rows, positions = index
        self_k[rows, :, positions] = k.transpose(1, 2)  # [B, T, H, Dh] at (row, position)
        self_v[rows, :, positions] = v.transpose(1, 2)
        a = _attend(q, self_k, self_v, mask)
        x = x + self.attn_out(_merge_heads(a))
        q = _split_heads(self.cross_q(self.cross_ln(x)), self.n_head)
        a = _attend(q, cross_k, cross_v)
        x = x + self.cross_out(_merge_heads(a))
        return x + self.fc2(F.gelu(_project(self.fc1, self.fc1_t, self.mlp_ln(x))))


def _project(linear: nn.Linear, weight_t: Tensor | None, x: Tensor) -> Tensor:
    """`linear(x)`, through its [in, out] copy when there is one."""
    if weight_t is None:
        return linear(x)
    return torch.addmm(linear.bias, x.reshape(-1, x.shape[-1]), weight_t).view(*x.shape[:-1], -1)


class TextDecoder(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        d = dims.n_text_state
        self.dims = dims
        self.token_embedding = nn.Embedding(dims.n_vocab, d)
        self.register_buffer("positional_embedding", torch.zeros(dims.n_text_ctx, d))
        self.blocks = nn.ModuleList(DecoderBlock(d, dims.n_text_head) for _ in range(dims.n_text_layer))
        self.ln = nn.LayerNorm(d)
        # [D, V] row-major copy of the tied output projection, for the CPU: there a one-token step's
        # logits are a GEMV over the whole vocabulary, 2.5x faster over this layout than over the
        # embedding's [V, D] (tiny.en: 7.5 against 19 ms on 2 cores). Set by `cpu_layout()`.
        self.proj_t: torch.Tensor | None = None

    def cpu_layout(self) -> None:
        """Copies of the weights in the layouts a one-token step reads fastest on the CPU
        (memory-bound GEMVs): the output projection and each block's qkv and fc1."""
        self.proj_t = self.token_embedding.weight.detach().t().contiguous()
        for block in self.blocks:
            if block.fused:  # a precision preset's path (kernels, FP8 linears) reads its own weights
                continue
            block.qkv_t = block.qkv.weight.detach().t().contiguous()
            block.fc1_t = block.fc1.weight.detach().t().contiguous()

    def write_cross_kv(self, audio_features: Tensor, cache: KVCache, start: int) -> None:
        """Cross-attention K/V of `audio_features` [B, 1500, D] into slots [start, start + B)."""
        b = audio_features.shape[0]
        s = slice(start, start + b)
        for i, block in enumerate(self.blocks):
            k, v = (_split_heads(t, block.n_head) for t in block.cross_kv(audio_features).chunk(2, dim=-1))
            if cache.cross_fp8:
                from cuda_ops.attention import quantize_kv

                (cache.cross_k[i][s], cache.cross_k_scale[i][s]), (cache.cross_v[i][s], cache.cross_v_scale[i][s]) = \
                    quantize_kv(k), quantize_kv(v)
            else:
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
        weight = self.proj_t if self.proj_t is not None else self.token_embedding.weight.t()
        return (self.ln(hidden) @ weight).float()


class Whisper(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims)
        self.decoder = TextDecoder(dims)
