"""How measured figures are reported: WER after Whisper's normaliser, the machine a result came
from, and plain-text tables. jiwer and whisper-normalizer (the `test` extra) are imported only
when a WER is asked for."""

from __future__ import annotations

import functools
import platform
import time


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
