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


def errors_by_prompt(spans: list[tuple[float, float, str]], hypothesis: str, language: str) -> dict[int, list[tuple]]:
    """Word errors of `hypothesis` against the join's reference, per prompt (index into `spans`):
    [('sub'|'del', reference words, hypothesis words) | ('ins', hypothesis words)], after Whisper's
    normaliser; an insertion counts for the prompt whose reference word follows it."""
    import jiwer

    from common import normalizer

    norm = normalizer(language)
    words, owner = [], []
    for i, (_, _, text) in enumerate(spans):
        w = norm(text).split()
        words += w
        owner += [i] * len(w)
    hyp = norm(hypothesis).split()
    out: dict[int, list[tuple]] = {}
    for chunk in jiwer.process_words(" ".join(words), " ".join(hyp)).alignments[0]:
        if chunk.type == "equal":
            continue
        i = owner[min(chunk.ref_start_idx, len(owner) - 1)]
        got = " ".join(hyp[chunk.hyp_start_idx:chunk.hyp_end_idx])
        out.setdefault(i, []).append(("ins", got) if chunk.type == "insert"
                                     else (chunk.type[:3], " ".join(words[chunk.ref_start_idx:chunk.ref_end_idx]), got))
    return out


def main() -> None:
    """Per-prompt word errors of the transcripts in bench_live_accuracy JSON files on one join:
    where the extra and missing words are (after long pauses, noise gaps, window cuts)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("results", nargs="+", help="JSON files with runs: [{'file', 'system', 'text'}]")
    parser.add_argument("--join", default="en-8-0", help="LANG-MINUTES-SEED")
    args = parser.parse_args()
    language, minutes, seed = args.join.split("-")
    name, _, _, spans = messy_join(language, float(minutes), int(seed))
    texts = {r["system"]: r["text"] for f in args.results for r in json.load(open(f))["runs"] if r["file"] == name}
    errors = {system: errors_by_prompt(spans, text, language) for system, text in texts.items()}
    for i, (start, end, text) in enumerate(spans):
        if any(i in e for e in errors.values()):
            pause = start - (spans[i - 1][1] if i else 0.0)
            print(f"#{i} {start:.1f}-{end:.1f} s, pause before {pause:.1f} s | {text}")
            for system, e in errors.items():
                if i in e:
                    print(f"    {system}: {e[i]}")


if __name__ == "__main__":
    main()
