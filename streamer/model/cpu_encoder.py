"""The audio encoder on the CPU in bfloat16, where the CPU multiplies bfloat16 natively.

On the CPU the encoder is most of a window's cost: tiny.en's pass over a 30-s window took 272 ms
in float32 on 2 cores of this project's Sapphire Rapids machine, and the decoder step 3.9 ms
(`bench_cpu_step.py`). Its GEMMs are large (1500 frames) and compute-bound; with AMX (or
AVX512-BF16), oneDNN runs them in bfloat16 at several times the float32 rate: 60 ms for the same
pass (docs/benchmarks.md, session 10). The decoder is left in float32 (its float16-weight linears,
`cpu_linear.py`): its step is small, and its errors compound token after token.

A CPU without native bfloat16 would emulate it, slower than float32: `auto` keeps float32 there.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from streamer.model.whisper import AudioEncoder, Whisper, with_children

SETTINGS = ("auto", "float32", "bfloat16")


def native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 matrix instructions (AMX tiles or AVX512-BF16)."""
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch.cpu, torch >= 2.3
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def resolve(setting: str) -> torch.dtype:
    """The encoder dtype that `setting` (ModelConfig.cpu_encoder) means on this CPU."""
    if setting not in SETTINGS:
        raise ValueError(f"cpu_encoder {setting!r}: use {', '.join(SETTINGS)}")
    if setting == "auto":
        return torch.bfloat16 if native_bfloat16() else torch.float32
    return getattr(torch, setting)


class CastEncoder(nn.Module):
    """An encoder run in another dtype: float32 mel in, float32 features out (what the decoder's
    cross-attention projection and the word alignment take)."""

    def __init__(self, encoder: AudioEncoder, dtype: torch.dtype):
        super().__init__()
        self.inner = copy.deepcopy(encoder).to(dtype)  # its own weights: the model's stay float32
        self.dtype = dtype

    def forward(self, mel: Tensor) -> Tensor:
        return self.inner(mel.to(self.dtype)).float()


def with_cpu_encoder(model: Whisper, dtype: torch.dtype) -> Whisper:
    """`model` with its encoder run in `dtype` (a float32 model on the CPU; else `model` itself).
    `model` is left as it was."""
    if dtype == torch.float32 or next(model.parameters()).device.type != "cpu" \
            or next(model.encoder.parameters()).dtype != torch.float32:
        return model
    return with_children(model, encoder=CastEncoder(model.encoder, dtype))
