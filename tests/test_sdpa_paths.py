"""Which attention backends each engine path may use (issue 15): cuDNN where shapes are fixed and
planned before serving (the captured decoder step, the encoder), never where a new shape can come
with a live window (prefill, the eager step, `Engine.call`)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from torch.nn.attention import SDPBackend

from streamer.audio.decode import decode_audio
from streamer.config import EngineConfig
from streamer.engine.engine import Engine
from streamer.engine.request import DecodeOptions
from streamer.engine.runner import SDPA_BACKENDS, Runner, attention_for, sdpa_backends
from streamer.model.weights import load_model
from streamer.model.whisper import AudioEncoder, TextDecoder

CUDNN = SDPBackend.CUDNN_ATTENTION


def _flags() -> tuple[bool, int]:
    """(cuDNN attention enabled, the backend first in torch's priority order) right now."""
    return torch.backends.cuda.cudnn_sdp_enabled(), torch._C._get_sdp_priority_order()[0]


def test_fixed_shape_paths_put_cudnn_first_and_variable_ones_exclude_it():
    assert sdpa_backends("graph_step")[0] == CUDNN
    assert CUDNN in sdpa_backends("encoder")
    for path in ("prefill", "eager_step", "calls"):
        assert CUDNN not in sdpa_backends(path), path
        assert SDPBackend.FLASH_ATTENTION in sdpa_backends(path)
    assert CUDNN not in SDPA_BACKENDS  # engine.py's Engine.call
    with pytest.raises(KeyError, match="decode"):  # no such path
        sdpa_backends("decode")


@pytest.mark.parametrize("inner", ["graph_step", "encoder"])
def test_planned_paths_put_cudnn_first_inside_the_prefill_context_and_restore_it(inner):
    """A step runs in the prefill context; graph capture and the encoder enter theirs inside it."""
    with attention_for("prefill"):
        assert _flags() == (False, int(SDPBackend.FLASH_ATTENTION))
        with attention_for(inner):
            assert _flags() == (True, int(CUDNN))
        assert _flags() == (False, int(SDPBackend.FLASH_ATTENTION))


def _record(monkeypatch) -> list:
    """Each decoder and encoder forward appends (module, inside Runner._capture, *flags it ran with)."""
    calls, capture = [], []

    def wrap(cls, name, label):
        original = getattr(cls, name)

        def wrapper(self, *args, **kw):
            calls.append((label, bool(capture), *_flags()))
            return original(self, *args, **kw)

        monkeypatch.setattr(cls, name, wrapper)

    wrap(TextDecoder, "forward", "decoder")
    wrap(AudioEncoder, "forward", "encoder")
    original_capture = Runner._capture

    def capturing(self, *args):
        capture.append(True)
        try:
            return original_capture(self, *args)
        finally:
            capture.pop()

    monkeypatch.setattr(Runner, "_capture", capturing)
    return calls


def _transcribe(engine, audio, n: int):
    async def main():
        return await asyncio.gather(*(engine.transcribe(audio, DecodeOptions(temperatures=(0.0,), prompt="hello " * i))
                                      for i in range(n)))

    return asyncio.run(main())


def test_eager_steps_and_prefill_run_without_cudnn(monkeypatch, jfk_path):
    calls = _record(monkeypatch)
    engine = Engine(load_model("tiny.en"), EngineConfig(max_slots=4, cuda_graphs=False))
    try:
        results = _transcribe(engine, decode_audio(jfk_path), 2)
    finally:
        engine.close()
    assert all(r.text for r in results)
    decoder = [c for c in calls if c[0] == "decoder"]
    assert len(decoder) > 2 and all(not cudnn for _, _, cudnn, _ in decoder), decoder
    assert all(cudnn and first == int(CUDNN) for label, _, cudnn, first in calls if label == "encoder")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (graph capture)")
def test_captured_steps_use_cudnn_and_prefill_does_not(monkeypatch, jfk_path):
    calls = _record(monkeypatch)
    engine = Engine(load_model("tiny.en", "cuda", torch.float16), EngineConfig(max_slots=8))
    try:
        _transcribe(engine, decode_audio(jfk_path), 3)
    finally:
        engine.close()
    steps = [c for c in calls if c[0] == "decoder" and c[1]]  # warm-up and capture of each bucket
    prefills = [c for c in calls if c[0] == "decoder" and not c[1]]
    encoder = [c for c in calls if c[0] == "encoder"]
    assert len(steps) >= 3  # per bucket: two warm-up runs and the capture
    assert all(cudnn and first == int(CUDNN) for _, _, cudnn, first in steps), steps
    assert prefills and all(not cudnn for _, _, cudnn, _ in prefills), prefills
    assert encoder and all(cudnn and first == int(CUDNN) for _, _, cudnn, first in encoder), encoder
