"""Shared fixtures: the real recordings of ../shared/audio and their references."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

AUDIO_DIR = Path(os.environ.get("STREAMER_AUDIO_DIR", Path(__file__).resolve().parents[2] / "shared" / "audio"))


def load_manifest() -> list[dict]:
    """Every recording: {'audio': absolute path, 'text', 'language', 'duration', ...}."""
    rows = [json.loads(line) for line in (AUDIO_DIR / "manifest.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        row["audio"] = str(AUDIO_DIR / row["audio"])
    return rows


@pytest.fixture(scope="session")
def audio_dir() -> Path:
    if not (AUDIO_DIR / "manifest.jsonl").exists():
        pytest.fail(f"real audio not found at {AUDIO_DIR}; set STREAMER_AUDIO_DIR")
    return AUDIO_DIR


@pytest.fixture(scope="session")
def manifest(audio_dir) -> list[dict]:
    return load_manifest()


@pytest.fixture(scope="session")
def jfk_path(audio_dir) -> str:
    return str(audio_dir / "en" / "jfk.ogg")


@pytest.fixture(scope="session")
def engine():
    """One tiny.en engine (default settings) shared by the server tests: loading is the slow part."""
    from streamer.config import load_settings
    from streamer.engine.engine import Engine

    settings = load_settings({})
    engine = Engine.load(settings.model, settings.engine)
    yield engine
    engine.close()
