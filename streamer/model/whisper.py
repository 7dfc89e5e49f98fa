"""Whisper as plain `nn.Module`s: an audio encoder and a text decoder over preallocated caches.

No I/O, no scheduling. The decoder reads and writes a `KVCache` of fixed-size slots: each live
sequence owns one slot holding its self-attention K/V (up to `n_text_ctx` positions) and the
cross-attention K/V of its window (computed once, right after the encoder). A decoder call works
on a contiguous range of slots `[start, start + B)`, so that a batch is a view, never a gather.

These forwards are the reference. Variants are other modules swapped in, never flags read here
(gpt-fast's way): `model/fused.py` (our kernels, FP8 linears, the FP8 cross cache) and
`model/cpu_linear.py` (float16-weight linears for the CPU step) each return a new module tree that
shares the unchanged weights and leaves the model it was given as it was (`with_children`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cuda_ops.precision import CACHE_FORMATS, FP16_KV_FORMATS, X_FORMATS  # torch-free: PrecisionConfig's cache formats

CROSS_SCALE_TILE = 128
"""Positions per scale of an FP8 cross cache (= cuda_ops.attention.SCALE_TILE; tests check it)."""

M = TypeVar("M", bound=nn.Module)


def with_children(module: M, **children: nn.Module) -> M:
    """A copy of `module` with `children` in place of its own: every other parameter, buffer and
    submodule is shared, not copied, and `module` itself is left as it was (engines may share one
    loaded model, and a variant must not change what the others run)."""
    new = copy.copy(module)
    for name, value in vars(module).items():  # nn.Module's registries (parts, hooks): copied, not shared
        if isinstance(value, (dict, set)):
            new.__dict__[name] = copy.copy(value)
    new._modules.update(children)
    return new


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
        return _matmul_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


class SharedCross(NamedTuple):
    """A one-token step's rows whose cross K/V are copies of one window's (the beams of a beam search):
    each group attends with its queries as query positions over one copy, so the window's K/V are
    read once, not once a beam (95.6 % of a CPU `accurate` run's rows are beams, and reading the
    copies was 38 % of its engine thread; benchmarks/probe_grouped_cross.py: 5.2x less time)."""

    groups: list[tuple[int, Tensor]]
    """(a row of the group, the group's rows [n] int64, ascending) per group of two or more rows."""
    alone: list[tuple[int, int]]
    """Runs [lo, hi) of the other rows, each reading its own copy."""


def _attend_shared(q: Tensor, k: Tensor, v: Tensor, shared: SharedCross) -> Tensor:
    """`_attend(q, k, v)` for one query token [B, H, 1, Dh], each group of `shared` over one copy."""
    out = torch.empty_like(q)
    for lo, hi in shared.alone:
        out[lo:hi] = _attend(q[lo:hi], k[lo:hi], v[lo:hi])
    for first, rows in shared.groups:
        grouped = q[rows].transpose(0, 2)  # [1, H, n, Dh]: the group's queries as positions
        out[rows] = _matmul_attention(grouped, k[first:first + 1], v[first:first + 1]).transpose(0, 2)
    return out


def _merge_heads(x: Tensor) -> Tensor:
    # x: [B, H, T, Dh] -> [B, T, D]
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)


def cross_qk(q: Tensor, k: Tensor, heads: list[int]) -> Tensor:
    """Pre-softmax cross-attention logits of `heads`, [B, len(heads), T, S] in float32, from q
    [B, H, T, Dh] and k [B, H, S, Dh]: computed apart, since SDPA never materialises its weights."""
    return q[:, heads].float() @ k[:, heads].float().transpose(-1, -2) * q.shape[-1] ** -0.5


def project_cross_kv(block: nn.Module, audio_features: Tensor) -> tuple[Tensor, Tensor]:
    """A decoder block's cross-attention K and V [B, H, 1500, Dh] of `audio_features` [B, 1500, D]."""
    k, v = block.cross_kv(audio_features).chunk(2, dim=-1)
    return _split_heads(k, block.n_head), _split_heads(v, block.n_head)


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

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, T, D]
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

    def embed(self, mel: Tensor) -> Tensor:
        """The convolution stem: mel [B, n_mels, 3000] -> [B, 1500, D] with positions added."""
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        return x + self.positional_embedding

    def forward(self, mel: Tensor) -> Tensor:
        # mel: [B, n_mels, 3000] -> [B, 1500, D]
        x = self.embed(mel)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


class LayerKV(nn.Module):
    """One decoder layer's slots: self-attention K/V [slots, H, n_text_ctx, Dh] and the windows'
    cross-attention K/V, stored as `cross_format` says (the largest read of a decode step):
    - "fp16": K/V [slots, H, n_audio_ctx, Dh] in the model's dtype, no scales;
    - "fp8": e4m3 K/V of the same shape, one fp32 scale per slot, head and CROSS_SCALE_TILE positions
      [slots, H, tiles] (written by cuda_ops.cross_kv);
    - "int4": 4-bit codes [slots, H, n_audio_ctx, Dh / 2] uint8, K scales per tile and channel
      [slots, H, tiles, Dh] and V scales per position [slots, H, n_audio_ctx], fp16 (cuda_ops.cross_int4);
    - "absorbed": none of its own: every layer reads the windows' encoder states X [slots, n_audio_ctx, D],
      held once by the `KVCache` (`shared_x`), through cuda_ops.cross_absorbed;
    - "hybrid": X as "absorbed", and fp16 K/V for the first `kv_slots` slots only: a call over slots
      that all lie below `kv_slots` reads the K/V, any other X (`read_format`).
    """

    def __init__(self, dims: ModelDims, n_slots: int, device=None, dtype=None, cross_format: str = "fp16",
                 shared_x: Tensor | None = None, kv_slots: int = 0):
        super().__init__()
        if cross_format not in CACHE_FORMATS:
            raise ValueError(f"cross_format must be one of {CACHE_FORMATS}, got {cross_format!r}")
        h, dh, t = dims.n_text_head, dims.head_dim, dims.n_audio_ctx
        self.cross_format = cross_format
        self.shared_x = shared_x  # a plain attribute, not a buffer: the KVCache owns (and moves) it
        self.kv_slots = kv_slots if cross_format == "hybrid" else 0

        def make(t, width=dh, dtype=dtype, slots=n_slots):
            return torch.zeros(slots, h, t, width, device=device, dtype=dtype)

        tiles = -(-t // CROSS_SCALE_TILE)
        cross = {
            "fp16": lambda: (make(t), make(t), None, None),
            "fp8": lambda: (make(t, dtype=torch.float8_e4m3fn), make(t, dtype=torch.float8_e4m3fn),
                            torch.ones(n_slots, h, tiles, device=device), torch.ones(n_slots, h, tiles, device=device)),
            "int4": lambda: (make(t, dh // 2, torch.uint8), make(t, dh // 2, torch.uint8),
                             torch.ones(n_slots, h, tiles, dh, device=device, dtype=torch.float16),
                             torch.ones(n_slots, h, t, device=device, dtype=torch.float16)),
            "absorbed": lambda: (None, None, None, None),
            "hybrid": lambda: (make(t, slots=self.kv_slots), make(t, slots=self.kv_slots), None, None),
        }[cross_format]()
        # Registered (not persistent: state, not weights), so that `.to()` and `buffers()` see them.
        buffers = {"self_k": make(dims.n_text_ctx), "self_v": make(dims.n_text_ctx),
                   **dict(zip(("cross_k", "cross_v", "cross_k_scale", "cross_v_scale"), cross))}
        for name, buffer in buffers.items():
            self.register_buffer(name, buffer, persistent=False)

    def self_kv(self, s: slice, kv_len: int) -> tuple[Tensor, Tensor]:
        """Self-attention K and V of slots `s`, positions [0, kv_len): views the decoder writes into."""
        return self.self_k[s, :, :kv_len], self.self_v[s, :, :kv_len]

    def cross(self, s: slice) -> tuple:
        """(k, v, k_scale, v_scale) of slots `s`; the scales are None for fp16/fp32 K/V. Absorbed:
        (X of slots `s` [B, n_audio_ctx, D], None, None, None): a block knows it by v being None."""
        fmt = self.read_format(s.stop)
        if fmt == "absorbed":
            return self.shared_x[s], None, None, None
        if fmt == "fp16":
            return self.cross_k[s], self.cross_v[s], None, None
        return self.cross_k[s], self.cross_v[s], self.cross_k_scale[s], self.cross_v_scale[s]

    def read_format(self, stop: int) -> str:
        """The format a call over slots [..., stop) reads: a hybrid layer's "fp16" where all of them lie
        below `kv_slots`, else "absorbed"; any other layer's own."""
        if self.cross_format != "hybrid":
            return self.cross_format
        return "fp16" if stop <= self.kv_slots else "absorbed"


def _as_words(t: Tensor) -> Tensor:
    """`t` viewed as 8-byte elements along its last dimension where its layout allows (last dimension
    contiguous; its bytes, the offset and every other stride multiples of 8 bytes): a copy moves one
    element per thread, so 1-byte FP8 codes or 2-byte halves moved as such take 4-8x the threads."""
    ratio = 8 // t.element_size()
    if (t.stride(-1) == 1 and t.shape[-1] % ratio == 0 and t.storage_offset() % ratio == 0
            and all(st % ratio == 0 for st in t.stride()[:-1])):
        return t.view(torch.int64)
    return t


def copy_words(dst: Tensor, src: Tensor) -> None:
    """`dst.copy_(src)` (same shape and dtype), as 8-byte words where both layouts allow. The fp16
    cross K/V leave their projection as head-split views of [B, 1500, 2 x D]: copied as halves, that
    strided copy ran at ~1 TB/s, 0.118 s of 256 large-v3 windows on the H200 (session 15)."""
    d, s = _as_words(dst), _as_words(src)
    if d.dtype != s.dtype:
        d, s = dst, src
    d.copy_(s)


class KVCache(nn.Module):
    """Per-slot decoder state, one `LayerKV` per decoder layer, allocated once.

    A "hybrid" cache keeps, on the host, which of its first `kv_slots` slots lack K/V (`missing`):
    X is written at admission, K/V are projected from it only when a call that reads them comes
    (`TextDecoder.fill_cross_kv`), and compaction carries them where it can."""

    def __init__(self, dims: ModelDims, n_slots: int, device=None, dtype=None, cross_format: str = "fp16",
                 kv_slots: int = 16):
        super().__init__()
        self.n_slots = n_slots
        self.cross_format = cross_format
        self.kv_slots = min(kv_slots, n_slots) if cross_format == "hybrid" else 0
        self.missing = set(range(self.kv_slots))
        x = None
        if cross_format in X_FORMATS:  # one copy of each window's encoder states for every layer
            x = torch.zeros(n_slots, dims.n_audio_ctx, dims.n_audio_state, device=device, dtype=dtype)
        self.register_buffer("cross_x", x, persistent=False)
        self.layers = nn.ModuleList(LayerKV(dims, n_slots, device, dtype, cross_format, x, self.kv_slots)
                                    for _ in range(dims.n_text_layer))

    def read_format(self, stop: int) -> str:
        """The format a call over slots [..., stop) reads (`LayerKV.read_format`)."""
        return self.layers[0].read_format(stop)

    def write_x(self, audio_features: Tensor, s: slice) -> None:
        """An absorbed or hybrid cache's windows: `audio_features` [B, 1500, D] into slots `s` (a hybrid
        cache's K/V of those slots are now stale)."""
        copy_words(self.cross_x[s], audio_features)
        self.missing.update(range(s.start, min(s.stop, self.kv_slots)))

    def missing_runs(self, s: slice, stop: int | None = None) -> list[slice]:
        """The runs of slots in `s` whose K/V are missing, if a call over slots [..., `stop`) reads K/V
        (`stop`: a captured step's bucket, past the live rows `s`; by default `s.stop`)."""
        if self.read_format(s.stop if stop is None else stop) != "fp16" or not self.kv_slots:
            return []
        runs: list[slice] = []
        for i in sorted(self.missing.intersection(range(s.start, s.stop))):
            if runs and runs[-1].stop == i:
                runs[-1] = slice(runs[-1].start, i + 1)
            else:
                runs.append(slice(i, i + 1))
        return runs

    def move_rows(self, src: Tensor, dst: Tensor, upto: int | None = None,
                  pairs: list[tuple[int, int]] | None = None) -> None:
        """Copy slots `src` into slots `dst` (compaction when sequences leave; the two disjoint): the
        cross K/V and scales whole, the self-attention K/V positions [0, upto) only (the rest is
        unwritten: 448 positions of a large-v3 slot are 73 MB, ~100 used are 17). A hybrid cache
        needs the moves on the host too (`pairs`, (src, dst)): its K/V go only where both slots hold
        them; a slot below `kv_slots` filled from above it is marked missing."""
        pool = self._pool_moves(src, dst, pairs)
        for name, b in self.named_buffers():  # every layer's, and an absorbed cache's X
            w = _as_words(b)
            leaf = name.split(".")[-1]
            if leaf.startswith("self_"):
                w[dst, :, :upto] = w[src, :, :upto]
            elif self.kv_slots and leaf in ("cross_k", "cross_v"):
                if pool is not None:
                    w[pool[1]] = w[pool[0]]
            else:
                w[dst] = w[src]

    def _pool_moves(self, src: Tensor, dst: Tensor, pairs: list[tuple[int, int]] | None) -> tuple[Tensor, Tensor] | None:
        """The moves that carry a hybrid cache's K/V, (src, dst) on the device, or None; `missing`
        updated for every move into the K/V slots."""
        if not self.kv_slots:
            return None
        if pairs is None:
            raise ValueError("a hybrid cache's move_rows needs the moves on the host (pairs)")
        carried = []
        for a, b in pairs:
            if b >= self.kv_slots:
                continue
            if a < self.kv_slots and a not in self.missing:
                carried.append((a, b))
                self.missing.discard(b)
            else:
                self.missing.add(b)
        if not carried:
            return None
        if len(carried) == len(pairs):  # every move within the K/V slots (a light load): the given tensors
            return src, dst
        moves = torch.tensor(carried).t()
        if src.device.type == "cuda":  # through pinned memory: a pageable copy would wait for the queued steps
            moves = moves.pin_memory()
        return tuple(moves.to(src.device, non_blocking=True))

    def copy_slots(self, src: Tensor, dst: Tensor, upto: int | None = None) -> None:
        """Self-attention K/V of slots `src` into slots `dst` (beam search reordering), positions
        [0, upto) only: the rest is unwritten, and copying all 448 was 12 % of a CPU beam search."""
        for layer in self.layers:
            for b in (layer.self_k, layer.self_v):
                b[dst, :, :upto] = b[src, :, :upto]

    @staticmethod
    def bytes_per_slot(dims: ModelDims, itemsize: int, cross_format: str = "fp16", self_len: float | None = None) -> int:
        """A slot's K/V bytes: all of them (memory), or with `self_len` those a decode step reads
        (the self-attention's valid positions only; every cross position, scales included; an absorbed
        cache's X is stored once and read by every layer)."""
        # The cross buffers as LayerKV allocates them (on the meta device: shapes only, no memory).
        # A hybrid cache's K/V are a fixed pool (`pool_bytes`), not a slot's.
        layer = LayerKV(dims, 1, "meta", {2: torch.float16, 4: torch.float32}[itemsize], cross_format)
        cross = sum(b.numel() * b.element_size() for name, b in layer.named_buffers() if name.startswith("cross"))
        x = dims.n_audio_ctx * dims.n_audio_state * itemsize if cross_format in X_FORMATS else 0
        x_copies = 1 if self_len is None else dims.n_text_layer  # held once; read by every layer
        self_len = dims.n_text_ctx if self_len is None else self_len
        per_layer = 2 * dims.n_text_head * dims.head_dim * self_len * itemsize + cross
        return int(per_layer * dims.n_text_layer + x * x_copies)

    @staticmethod
    def pool_bytes(dims: ModelDims, itemsize: int, cross_format: str, kv_slots: int) -> int:
        """A hybrid cache's fp16 K/V slots, held whatever the slot count (0 for any other format)."""
        if cross_format != "hybrid":
            return 0
        return kv_slots * 2 * dims.n_text_layer * dims.n_audio_ctx * dims.n_text_state * itemsize


class PassCache:
    """Decoder state for one pass over whole sequences, without slots (word alignment), with the
    layer interface of `KVCache`: the self K/V of the pass's own tokens, one buffer that every layer
    reuses (a layer attends only to its own K/V, written just before), and each layer's cross K/V
    projected from `audio_features` when the pass reaches it, so that one layer's exist at a time
    (a KVCache of 8 large-v3 windows would hold ~2 GB of them)."""

    def __init__(self, decoder: "TextDecoder", audio_features: Tensor, n_tokens: int):
        d = decoder.dims
        shape = (audio_features.shape[0], d.n_text_head, n_tokens, d.head_dim)
        self_k = audio_features.new_zeros(shape)
        self_v = audio_features.new_zeros(shape)
        self.layers = [_PassLayer(block, audio_features, self_k, self_v) for block in decoder.blocks]


@dataclass
class _PassLayer:
    block: nn.Module
    audio_features: Tensor
    self_k: Tensor
    self_v: Tensor

    def self_kv(self, s: slice, kv_len: int) -> tuple[Tensor, Tensor]:
        return self.self_k[s, :, :kv_len], self.self_v[s, :, :kv_len]

    def cross(self, s: slice) -> tuple:
        return *project_cross_kv(self.block, self.audio_features[s]), None, None


class StepIndex(NamedTuple):
    """Where a decoder call's tokens go, made once per call (not per layer: in a captured large-v3
    step each tensor op is a kernel launch, 32 times over)."""

    rows: Tensor
    """[B, T] each token's row in the batch (its slot, relative to the batch's first)."""
    positions: Tensor
    """[B, T] each token's position in its slot."""
    lengths: Tensor
    """[B] int32: each row's self-attention length once the call's tokens are in (last position + 1)."""
    shared: SharedCross | None = None
    """Rows that share one window's cross K/V (a one-token step on the CPU), or None."""


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

    def forward(self, x: Tensor, index: StepIndex, mask: Tensor, self_k: Tensor, self_v: Tensor,
                cross: tuple, cross_qk_heads: list[int] | None = None) -> tuple[Tensor, Tensor | None]:
        # x: [B, T, D]; index: where the new K/V go (StepIndex);
        # mask: [B, 1, T, kv_len] True where attending is allowed;
        # self_k/v: this batch's slots, [B, H, kv_len, Dh] views of the cache;
        # cross: (k, v, k_scale, v_scale) of this batch's slots, [B, H, 1500, Dh] (+ [B, H, 12] FP8 scales).
        # Returns (x, the cross-attention logits of `cross_qk_heads`, or None: `cross_qk`).
        cross_k, cross_v, _, _ = cross
        if cross_v is None:
            raise ValueError("an absorbed cross cache is read by the fused blocks (model/fused.py), not the plain ones")
        q, k, v = self.qkv(self.attn_ln(x)).chunk(3, dim=-1)
        q, k, v = (_split_heads(t, self.n_head) for t in (q, k, v))
        self_k[index.rows, :, index.positions] = k.transpose(1, 2)  # [B, T, H, Dh] at (row, position)
        self_v[index.rows, :, index.positions] = v.transpose(1, 2)
        a = _attend(q, self_k, self_v, mask)
        x = x + self.attn_out(_merge_heads(a))
        q = _split_heads(self.cross_q(self.cross_ln(x)), self.n_head)
        if index.shared is not None and q.shape[2] == 1:
            a = _attend_shared(q, cross_k, cross_v, index.shared)
        else:
            a = _attend(q, cross_k, cross_v)
        qk = None if cross_qk_heads is None else cross_qk(q, cross_k, cross_qk_heads)
        x = x + self.cross_out(_merge_heads(a))
        return x + self.fc2(F.gelu(self.fc1(self.mlp_ln(x)))), qk

    def write_cross_kv(self, audio_features: Tensor, layer: LayerKV, s: slice) -> None:
        """Cross-attention K/V of `audio_features` [B, 1500, D] into `layer`'s slots `s`."""
        if layer.cross_format not in FP16_KV_FORMATS:
            raise ValueError(f"a {layer.cross_format} cross cache is written by the fused blocks (model/fused.py), "
                             "not the plain ones")
        k, v = project_cross_kv(self, audio_features)
        copy_words(layer.cross_k[s], k), copy_words(layer.cross_v[s], v)


class TiedProjection(nn.Module):
    """The output projection, tied to the token embedding: logits = x @ Eᵀ in float32. It holds no
    parameter (E is passed in), so that checkpoints and state dicts hold the matrix once."""

    def forward(self, x: Tensor, embedding: Tensor, upcast: bool = True) -> Tensor:
        y = x @ embedding.t()
        return y.float() if upcast else y


class TextDecoder(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        d = dims.n_text_state
        self.dims = dims
        self.token_embedding = nn.Embedding(dims.n_vocab, d)
        self.register_buffer("positional_embedding", torch.zeros(dims.n_text_ctx, d))
        self.blocks = nn.ModuleList(DecoderBlock(d, dims.n_text_head) for _ in range(dims.n_text_layer))
        self.ln = nn.LayerNorm(d)
        self.proj = TiedProjection()

    def write_cross_kv(self, audio_features: Tensor, cache: KVCache, start: int) -> None:
        """Cross-attention K/V of `audio_features` [B, 1500, D] into slots [start, start + B) (an
        absorbed or hybrid cache: the encoder states themselves, once for every layer)."""
        s = slice(start, start + audio_features.shape[0])
        if cache.cross_format in X_FORMATS:
            cache.write_x(audio_features, s)
            return
        for block, layer in zip(self.blocks, cache.layers):
            block.write_cross_kv(audio_features, layer, s)

    def fill_cross_kv(self, cache: KVCache, s: slice, stop: int | None = None) -> None:
        """Before a call over slots `s` (up to `stop`: a captured step's bucket): a hybrid cache's K/V
        that the call reads and that are missing, projected from the slots' X (a no-op for every
        other format and call)."""
        for run in cache.missing_runs(s, stop):
            for block, layer in zip(self.blocks, cache.layers):
                block.write_cross_kv(cache.cross_x[run], layer, run)
            cache.missing.difference_update(range(run.start, run.stop))

    def forward(self, tokens: Tensor, positions: Tensor, start: int, cache: KVCache | PassCache,
                kv_len: int | None = None, cross_qk_heads: list[tuple[int, int]] | None = None,
                shared_cross: SharedCross | None = None):
        """Hidden states [B, T, D] of `tokens` [B, T] at `positions` [B, T] in slots [start, start + B).

        Each row attends to its own slot's earlier positions (≤ its position), so rows of different
        lengths share one call. Slots are a contiguous range: the batch is a view of the cache.
        `kv_len` (> every position) limits self-attention to the cache's used prefix; without it
        the whole context is read (static shapes, for CUDA graphs).
        With `cross_qk_heads` ((layer, head) pairs; word alignment) the result is (hidden, qk): the
        pre-softmax cross-attention logits of those heads [B, len(heads), T, 1500] in float32, in
        layer order. `shared_cross`: rows whose cross K/V are copies of one window's (`SharedCross`;
        the plain blocks read one copy a group, the fused ones ignore it).
        """
        b = tokens.shape[0]
        kv_len = kv_len or self.dims.n_text_ctx
        x = self.token_embedding(tokens) + self.positional_embedding[positions]
        rows = torch.arange(b, device=tokens.device)[:, None].expand_as(positions)
        index = StepIndex(rows, positions, (positions[:, -1] + 1).to(torch.int32), shared_cross)
        key_pos = torch.arange(kv_len, device=tokens.device)
        mask = (key_pos[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, kv_len]
        s = slice(start, start + b)
        heads_of: dict[int, list[int]] = {}
        for layer, head in cross_qk_heads or ():
            heads_of.setdefault(layer, []).append(head)
        layers = [(layer.self_kv(s, kv_len), layer.cross(s)) for layer in cache.layers]
        x, captured = self.run_blocks(x, index, mask, layers, heads_of)
        if cross_qk_heads is None:
            return x
        return x, torch.cat(captured, dim=1)

    def run_blocks(self, x: Tensor, index: StepIndex, mask: Tensor, layers: list[tuple[tuple, tuple]],
                   heads_of: dict[int, list[int]]) -> tuple[Tensor, list[Tensor]]:
        """x through every block, layer i over layers[i] = (its self K/V views, its cross cache);
        (x, the cross-attention logits of the heads in heads_of, in layer order)."""
        captured = []
        for i, (block, (self_kv, cross)) in enumerate(zip(self.blocks, layers)):
            x, qk = block(x, index, mask, *self_kv, cross, heads_of.get(i))
            if qk is not None:
                captured.append(qk)
        return x, captured

    def logits(self, hidden: Tensor, upcast: bool = True) -> Tensor:
        """hidden [..., D] -> logits [..., n_vocab] in float32, or in the model's dtype (`upcast=False`:
        for the fused sampler, which reads them as they are)."""
        return self.proj(self.ln(hidden), self.token_embedding.weight, upcast)


class Whisper(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims)
        self.decoder = TextDecoder(dims)
