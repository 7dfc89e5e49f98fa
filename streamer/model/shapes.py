"""Whisper shapes with random weights: speed-only stand-ins for checkpoints this machine lacks.

`load_model("shape:large-v3-turbo")` (or `shape:NAME:/path/tokenizer.json`) builds the model of
that shape with random float16 weights and a real multilingual tokenizer (base's, when no path
is given). End-of-text is suppressed and each window decodes `SYNTHETIC_TOKENS_PER_S` tokens per
second of its audio, then ends: the engine and the server do the work of that model on
speech of that rate. The text is meaningless; every output built on it says "speed only".
"""

from __future__ import annotations

from pathlib import Path

import torch

from streamer.model.whisper import ModelDims

SHAPES: dict[str, dict] = {
    "tiny": dict(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=4,
                 n_vocab=51865, n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4),
    "large-v3": dict(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
                     n_vocab=51866, n_text_ctx=448, n_text_state=1280, n_text_head=20, n_text_layer=32),
    "large-v3-turbo": dict(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
                           n_vocab=51866, n_text_ctx=448, n_text_state=1280, n_text_head=20, n_text_layer=4),
}
SYNTHETIC_TOKENS_PER_S = 3.0
"""Tokens a window of a speed-only model decodes per second of audio (fast English speech)."""


def parse_shape(name: str) -> tuple[str, str | None] | None:
    """`shape:NAME[:TOKENIZER]` -> (NAME, TOKENIZER or None); None for any other model name."""
    if not name.startswith("shape:"):
        return None
    shape, _, tokenizer = name[len("shape:"):].partition(":")
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    return shape, tokenizer or None


def default_tokenizer() -> Path:
    """base's multilingual tokenizer.json (the `[base]` extra)."""
    from streamer.model.weights import WeightsError, _embedded

    try:
        path, _ = _embedded("base")
    except WeightsError as e:
        raise WeightsError(f"a speed-only shape needs a multilingual tokenizer: {e}, or name one "
                           "(shape:NAME:/path/tokenizer.json)") from None
    return path / "tokenizer.json"


def random_weights(shape: str, device: torch.device | str, dtype: torch.dtype, seed: int = 0):
    """The shape's `Whisper` with N(0, 0.02) weights (seeded)."""
    from streamer.model.whisper import Whisper

    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.device("meta"):
        model = Whisper(ModelDims(**SHAPES[shape]))
    state = {k: torch.randn(v.shape, generator=generator, device=device, dtype=dtype) * 0.02
             for k, v in model.state_dict().items()}
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval()
