"""Which Whisper matmul sites run in FP8 (e4m3, `fp8.FP8Linear`) and which stay fp16.

FP8 pays where the activation is produced by a fused kernel that can emit it quantised
(`layernorm.layer_norm(out_fp8=True)`, `fp8.bias_gelu_quant`) and where the GEMM is large enough
to be compute-bound (encoder: M = 1500 tokens x batch). A site whose input would need a separate
quantisation pass loses more to that pass than it gains (measured on an H200: a large-v3
encoder with separately quantised FP8 linears ran at 112 windows/s against 214 in fp16).
The decoder runs one token per live sequence, so its linears are bound by reading weights; FP8
halves those bytes, but decoder errors compound token after token, so only the widest layers
are converted in the mixed preset. Quality of a preset is judged by WER against fp16, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Literal

SiteDtype = Literal["fp16", "fp8"]
_SITE_DTYPES = ("fp16", "fp8")
CacheFormat = Literal["auto", "fp16", "fp8", "int4", "absorbed", "hybrid"]
CACHE_FORMATS = ("fp16", "fp8", "int4", "absorbed", "hybrid")  # the cross cache's storage (model/whisper.py, LayerKV)
X_FORMATS = ("absorbed", "hybrid")  # the formats that hold each window's encoder states X
FP16_KV_FORMATS = ("fp16", "hybrid")  # the formats with fp16 K/V (a hybrid cache's for its first slots)
CACHE_CHOICES = ("auto", *CACHE_FORMATS)  # what PrecisionConfig.cross_kv_cache takes ("auto": model/fused.py decides)
_SWITCHES = ("cross_kv_epilogue", "use_fused_layernorm")  # the bool fields
_INTS = ("fp8_min_width", "hybrid_kv_slots")  # every field in neither tuple is a site


@dataclass(frozen=True)
class PrecisionConfig:
    """Per-site numeric format of the Whisper encoder/decoder ("fp16" or "fp8")."""

    encoder_qkv: SiteDtype = "fp16"
    """Encoder q/k/v projections. FP8 is safe and fast: the input is LayerNorm output (no
    outliers beyond what per-token scales absorb), emitted in FP8 by the fused LayerNorm."""

    encoder_out_proj: SiteDtype = "fp16"
    """Encoder attention output projection. Its input comes out of the attention kernel, which
    does not emit FP8, so FP8 here needs a separate quantisation pass (measured to be a loss)."""

    encoder_ffn: SiteDtype = "fp16"
    """Encoder fc1/fc2: two thirds of encoder FLOPs. Safe and fast: fc1's input is fused
    LayerNorm output, fc2's is GELU output quantised in the bias+GELU kernel."""

    decoder_self_qkv: SiteDtype = "fp16"
    """Decoder self-attention q/k/v. Its K/V enter the cache and every later token attends to
    them, so errors compound; small matrices, little to gain."""

    decoder_cross_q: SiteDtype = "fp16"
    """Decoder cross-attention query projection: one 1280x1280 matrix per layer, little to gain;
    its error moves every attention weight over the audio."""

    decoder_out_proj: SiteDtype = "fp16"
    """Decoder self- and cross-attention output projections: inputs come from attention
    (no fused quantiser), so FP8 costs a separate pass on every decode step."""

    decoder_ffn: SiteDtype = "fp16"
    """Decoder fc1/fc2: the widest decoder weights (2 x 1280 x 5120 per layer), read in full on
    every decode step; FP8 halves those bytes, and inputs come from the fused LayerNorm and GELU.
    On the H200 it pays only at large decode batches (fc1: 6.8 vs 8.0 us at 256 rows, but 6.9 vs
    4.6 us at 16: cuBLAS's row-wise FP8 GEMM has a fixed cost). At large-v3 that is ~0.08 ms of an
    18 ms step gained at 256 sequences and ~0.1-0.15 ms of a 5 ms step lost at 32, so mixed_fp8
    keeps it in fp16 (mixed_fp8 must be at least as fast as full_fp16 at every batch)."""

    cross_kv_proj: SiteDtype = "fp16"
    """Projection of the encoder output to cross-attention K/V, once per window (M = 1500 x
    batch, compute-bound); its input is the encoder's final LayerNorm, which can emit FP8."""

    cross_kv_cache: CacheFormat = "fp16"
    """Storage of the cross-attention K/V cache (1500 tokens x 2 x d_model per layer, read on
    every decode step: the largest decoder read). "fp8" (e4m3, a scale per 128-position tile of a
    head) halves it and doubles the number of decoder slots that fit; "int4" (cuda_ops/cross_int4.py:
    K scaled per channel and tile, V per position) holds 0.53x of FP8's bytes with the same WER on
    tiny.en and base; its packed-math decode kernel (v2) runs 1.18-1.48x FP8's at B >= 32 on the H200,
    and 256 large-v3 windows reach rtf 3,514 against 3,238 (docs/benchmarks.md, session 15): mixed_fp8
    uses it. "absorbed" (cuda_ops/cross_absorbed.py): no K/V at all; the cache holds each window's encoder
    states X [1500, D] once for every layer, and the step folds the K projection into the query and
    the V projection into the output (one read of X a layer: half fp16 K/V's bytes, 1/64 the memory,
    no cross-K/V projection at admission); needs an fp16 `cross_kv_proj` (its weights are applied per
    step). "hybrid": the absorbed cache plus fp16 K/V for the first `hybrid_kv_slots` slots; a decoder
    call whose slots all lie below that reads the K/V (cuDNN's attention, one kernel a layer: the
    absorbed path's four lose at 1-8 rows, 0.76x at one large-v3 window on an H100, docs/benchmarks.md
    session 24), a larger one reads X. "auto" (full_fp16's, measured on an H100 in session 28):
    "hybrid" for models at least `HYBRID_MIN_WIDTH` wide where the absorbed path's tensor-core kernel runs (cuda_ops/cross_absorbed_mma.py: CUDA,
    fp16, sm80+, widths a multiple of 128 up to 1280) and `absorbable`, else "fp16"
    (`streamer.model.fused.cross_cache_format` decides)."""

    hybrid_kv_slots: int = 16
    """A "hybrid" cross cache's slots with fp16 K/V too: decoder calls over slots below it (the steps
    of up to this many sequences, graph buckets included) read K/V, larger ones the encoder states.
    The absorbed path overtakes fp16 K/V between 8 and 32 large-v3 windows (H100, session 24).
    K/V cost 64x X's memory (245 MB a large-v3 slot); they are projected from X when a call first
    needs them (`TextDecoder.fill_cross_kv`), so a busy engine does not pay that projection."""

    cross_kv_epilogue: bool = False
    """With an FP8 cross cache and an fp16 `cross_kv` linear: True: the projection is a Triton GEMM
    whose epilogue quantises each 128-position tile of a head and writes the cache
    (cuda_ops/cross_kv.py); False (default): cuBLAS's GEMM, then one quantise pass over its output
    (one read, one write). On the H200 the Triton GEMM ran at 157 TFLOP/s against cuBLAS's 584; to
    pay it would need >= ~490 TFLOP/s with its epilogue (docs/kernels-fp8.md), so it is an A/B only."""

    fp8_min_width: int = 1024
    """Models narrower than this (d_model) keep every linear in fp16 whatever the sites say: their
    GEMMs are too small for FP8 to pay. Measured on the H200: the tiny.en (384) encoder ran at
    5,324 windows/s in mixed_fp8 against 6,492 in full_fp16 (5,604 / 7,259 the day before), while
    large-v3 (1280) ran at 267 against 196. The FP8 cross cache is not a linear: it follows
    `cross_kv_cache` at every width (half the memory). 0 converts at every width (A/B, WER)."""

    use_fused_layernorm: bool = True
    """Residual add + LayerNorm in one kernel. Numerically the same as the unfused ops (fp32
    math, the residual sum rounded to the stream dtype), so safe in every preset; required
    for any FP8 site fed by a LayerNorm."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            allowed = CACHE_CHOICES if f.name == "cross_kv_cache" else _SITE_DTYPES
            if f.name not in _SWITCHES + _INTS and value not in allowed:
                raise ValueError(f"PrecisionConfig.{f.name} must be one of {allowed}, got {value!r}")
        ln_fed = (self.encoder_qkv, self.encoder_ffn, self.decoder_ffn, self.cross_kv_proj)
        if not self.use_fused_layernorm and "fp8" in ln_fed:
            raise ValueError("FP8 sites fed by a LayerNorm need use_fused_layernorm=True")
        if not self.use_fused_layernorm and self.cross_kv_cache not in ("fp16", "auto"):  # only the fused blocks read it
            raise ValueError(f"an {self.cross_kv_cache} cross_kv_cache needs use_fused_layernorm=True")
        if self.cross_kv_cache in X_FORMATS and not self.absorbable:  # unfused was refused above
            raise ValueError(f"an {self.cross_kv_cache} cross_kv_cache needs cross_kv_proj='fp16' (its weights fold into "
                             "each step)")

    @property
    def absorbable(self) -> bool:
        """Whether the absorbed cross cache fits these sites: only the fused blocks read it, and its K/V
        weights fold into each step, so they stay fp16."""
        return self.use_fused_layernorm and self.cross_kv_proj == "fp16"


def full_fp16() -> PrecisionConfig:
    """Every linear and cache in fp16: the reference for quality. The cross cache is "auto": the
    hybrid cache (fp16 too, read through the absorbed path past 16 rows) for wide models on CUDA."""
    return PrecisionConfig(cross_kv_cache="auto")


def mixed_fp8() -> PrecisionConfig:
    """FP8 where a fused kernel produces the input and the error does not compound; the cross-attention
    cache in 4 bits (0.53x FP8's bytes; WER as FP8's, docs/benchmarks.md sessions 13 and 15)."""
    return PrecisionConfig(encoder_qkv="fp8", encoder_ffn="fp8", cross_kv_cache="int4")


def aggressive_fp8() -> PrecisionConfig:
    """Every linear and the cross-attention cache in FP8: the most throughput, least margin."""
    return PrecisionConfig(**{f.name: "fp8" for f in fields(PrecisionConfig) if f.name not in _SWITCHES + _INTS})


PRESETS: dict[str, Callable[[], PrecisionConfig]] = {
    "full_fp16": full_fp16,
    "mixed_fp8": mixed_fp8,
    "aggressive_fp8": aggressive_fp8,
}


def get_preset(name: str) -> PrecisionConfig:
    """The preset called `name` (the PRECISION setting), optionally with fields overridden:
    "mixed_fp8:decoder_ffn=fp8:cross_kv_epilogue=0:fp8_min_width=0" (A/B runs of single sites;
    ":" separates, since bench_engine's --precisions is a comma list)."""
    base, *overrides = name.split(":")
    try:
        config = PRESETS[base]()
    except KeyError:
        raise ValueError(f"unknown precision preset {base!r}; valid: {', '.join(PRESETS)}") from None
    changes: dict[str, object] = {}
    names = {f.name for f in fields(PrecisionConfig)}
    for item in filter(None, overrides):
        key, _, value = item.partition("=")
        if key not in names:
            raise ValueError(f"unknown PrecisionConfig field {key!r} in {name!r}; valid: {', '.join(sorted(names))}")
        if key in _SWITCHES:
            if value not in ("0", "1"):
                raise ValueError(f"{key} takes 0 or 1, got {value!r}")
            changes[key] = value == "1"
        elif key in _INTS:
            if not value.isdigit():
                raise ValueError(f"{key} takes a whole number, got {value!r}")
            changes[key] = int(value)
        else:
            changes[key] = value
    return replace(config, **changes)
