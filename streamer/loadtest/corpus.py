"""The real recordings a load test streams: a manifest (`manifest.jsonl`: audio path, text,
language, duration per line) in an audio directory such as the repository's `../shared/audio`."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from streamer.audio import SAMPLE_RATE


def manifest(audio_dir: str | Path, language: str | None = None, folder: str = "asterisk/") -> list[dict]:
    """The rows of `audio_dir`'s manifest in `folder` (and `language`), each with its absolute `path`."""
    audio_dir = Path(audio_dir)
    lines = (audio_dir / "manifest.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    for r in rows:
        r["path"] = str(audio_dir / r["audio"])
    return [r for r in rows if (language is None or r["language"] == language) and folder in r["audio"]]


@functools.lru_cache(maxsize=None)
def decode_audio(path: str) -> np.ndarray:
    """A recording as 16-kHz float32, decoded once per process (load tests reuse each many times)."""
    from streamer.audio.decode import decode_audio as decode

    audio = decode(path)
    audio.flags.writeable = False
    return audio


def concat(paths: list[str], seconds: float, gap: float = 0.5) -> tuple[np.ndarray, list[str]]:
    """Recordings joined with `gap` s pauses until `seconds` long; returns audio and the files used."""
    parts, used, total = [], [], 0.0
    silence = np.zeros(int(gap * SAMPLE_RATE), np.float32)
    while total < seconds:
        for p in paths:
            a = decode_audio(p)
            if total + len(a) / SAMPLE_RATE > seconds:
                return np.concatenate(parts) if parts else a[: int(seconds * SAMPLE_RATE)], used
            parts += [a, silence]
            used.append(p)
            total += len(a) / SAMPLE_RATE + gap
    return np.concatenate(parts), used
