"""G.711 telephony audio: μ-law (PCMU) and A-law (PCMA), one byte per sample, 8 kHz on the phone
network. Decoding is a 256-entry table (ITU-T G.711's expansion); encoding, which only tests and
benchmarks need, picks the nearest code (the reference encoders truncate within a step instead:
they agree on 95-97 % of samples and err by at most as much)."""

from __future__ import annotations

import numpy as np

ENCODINGS = ("mulaw", "alaw")
"""The names the wire protocols use; `audio/pcmu` and `audio/pcma` (Realtime) map onto them."""


def _mulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 0x07, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (a >> 4) & 0x07, a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


LINEAR = {"mulaw": _mulaw_table(), "alaw": _alaw_table()}
"""Code -> 16-bit linear sample."""
_FLOAT = {name: (table.astype(np.float32) / 32768.0) for name, table in LINEAR.items()}


def decode(data: bytes, encoding: str) -> np.ndarray:
    """G.711 bytes -> float32 in [-1, 1], one sample per byte (interleaved as given)."""
    return _FLOAT[encoding][np.frombuffer(data, dtype=np.uint8)]


def _encoder(encoding: str) -> np.ndarray:
    """16-bit linear (offset by 32768) -> the code whose value is nearest."""
    table = LINEAR[encoding].astype(np.int32)
    order = np.argsort(table, kind="stable")
    values = table[order]
    x = np.arange(-32768, 32768, dtype=np.int32)
    i = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    nearer_low = (x - values[i - 1]) <= (values[i] - x)
    return order[np.where(nearer_low, i - 1, i)].astype(np.uint8)


_ENCODERS: dict[str, np.ndarray] = {}


def encode(audio: np.ndarray, encoding: str) -> bytes:
    """float audio in [-1, 1] (or int16) -> G.711 bytes."""
    if encoding not in _ENCODERS:
        _ENCODERS[encoding] = _encoder(encoding)
    audio = np.asarray(audio)
    if audio.dtype != np.int16:
        audio = np.clip(np.round(audio.astype(np.float32) * 32768.0), -32768, 32767).astype(np.int16)
    return _ENCODERS[encoding][audio.astype(np.int32) + 32768].tobytes()
