"""Messy long recordings built reproducibly from ../shared/audio: prompts of one language in a
seeded order, joined with 1-6 s pauses, 3-s noise gaps now and then, and a low noise floor under
everything (a real room is never digitally silent). The same seed gives the same file, so that
systems are compared on several files rather than tuned on one.

    from messy import messy_join
    name, audio, reference, spans = messy_join("en", minutes=15, seed=0)
"""

from __future__ import annotations

import numpy as np

from common import manifest

from streamer.audio import SAMPLE_RATE

PAUSE_S = (1.0, 6.0)
"""Pause between two prompts, uniform in this range."""
NOISE_GAP_S = 3.0
NOISE_GAP_EVERY = 4
"""On average every this many pauses hold a 3-s stretch of noise as well."""
NOISE_GAP_RMS = 0.03
"""Loud enough to wake a VAD now and then (about -30 dBFS), not speech."""
FLOOR_RMS = 0.002
"""Noise floor under the whole file (about -54 dBFS)."""


def _noise(rng: np.random.Generator, n: int, rms: float) -> np.ndarray:
    """Noise falling off above 200 Hz like a fan or traffic (white noise shaped in the frequency
    domain), scaled to `rms`."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    out = np.fft.irfft(spectrum / np.sqrt(1 + (freqs / 200.0) ** 2), n)
    return (out * (rms / max(1e-12, float(np.sqrt(np.mean(out ** 2)))))).astype(np.float32)


def messy_join(language: str, minutes: float, seed: int = 0) -> tuple[str, np.ndarray, str, list[tuple[float, float, str]]]:
    """(name, audio 16 kHz float32, reference text, [(start s, end s, text)] per prompt)."""
    from streamer.audio.decode import decode_audio

    rng = np.random.default_rng(seed)
    rows = sorted(manifest(language), key=lambda r: r["audio"])
    order = rng.permutation(len(rows))
    parts: list[np.ndarray] = [np.zeros(int(0.5 * SAMPLE_RATE), np.float32)]
    spans: list[tuple[float, float, str]] = []
    total = len(parts[0])
    limit = int(minutes * 60 * SAMPLE_RATE)
    i = 0
    while True:
        row = rows[order[i % len(order)]]
        i += 1
        audio = decode_audio(row["path"])
        if total + len(audio) > limit:
            break
        spans.append((total / SAMPLE_RATE, (total + len(audio)) / SAMPLE_RATE, row["text"]))
        parts.append(audio)
        total += len(audio)
        gap = [np.zeros(int(rng.uniform(*PAUSE_S) * SAMPLE_RATE), np.float32)]
        if rng.random() < 1 / NOISE_GAP_EVERY:
            gap += [_noise(rng, int(NOISE_GAP_S * SAMPLE_RATE), NOISE_GAP_RMS),
                    np.zeros(int(rng.uniform(*PAUSE_S) * SAMPLE_RATE), np.float32)]
        for g in gap:
            parts.append(g)
            total += len(g)
    audio = np.concatenate(parts)
    audio = audio + _noise(rng, len(audio), FLOOR_RMS)
    name = f"messy_{language}_{minutes:g}min_s{seed}"
    return name, audio.astype(np.float32), " ".join(t for _, _, t in spans), spans
