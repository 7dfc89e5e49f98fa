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
from streamer.engine import runner as runner_mod
from streamer.engine.engine import Engine
from streamer.engine.request import DecodeOptions
from streamer.engine.runner import SDPA_BACKENDS, Runner, attention_for, sdpa_backends
from streamer.model.weights import load_model

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
    with pytest.raises(KeyError):
        sdpa_backends("decode")


def test_the_capture_context_enables_cudnn_inside_the_prefill_one_and_restores_it():
    with attention_for("prefill"):
        assert _flags() == (False, int(SDPBackend.FLASH_ATTENTION))
        with attention_for("graph_step"):
            assert _flags() == (True, int(CUDNN))
        assert _flags() == (False, int(SDPBackend.FLASH_ATTENTION))


def _record(monkeypatch, calls: list):
    """Wrap the runner's prefill and decoder-step entries so that each records the flags it ran with."""
    for name in ("_admit", "_decode_rows"):
        original = getattr(Runner, name)

        def wrapper(self, *args, _original=original, _name=name, **kw):
            capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
            calls.append((_name, capturing, *_flags()))
            return _original(self, *args, **kw)

        monkeypatch.setattr(Runner, name, wrapper)


def _transcribe(engine, audio, n: int):
    async def main():
        return await asyncio.gather(*(engine.transcribe(audio, DecodeOptions(temperatures=(0.0,), prompt="hello " * i))
                                      for i in range(n)))

    return asyncio.run(main())


def test_eager_steps_and_prefill_run_without_cudnn(monkeypatch, jfk_path):
    calls = []
    _record(monkeypatch, calls)
    engine = Engine(load_model("tiny.en"), EngineConfig(max_slots=4, cuda_graphs=False))
    try:
        results = _transcribe(engine, decode_audio(jfk_path), 2)
    finally:
        engine.close()
    assert all(r.text for r in results)
    assert {name for name, *_ in calls} == {"_admit", "_decode_rows"}
    assert all(not cudnn for _, _, cudnn, _ in calls), calls


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (graph capture)")
def test_captured_steps_use_cudnn_and_prefill_does_not(monkeypatch, jfk_path):
    calls = []
    _record(monkeypatch, calls)
    engine = Engine(load_model("tiny.en", "cuda", torch.float16), EngineConfig(max_slots=8))
    try:
        _transcribe(engine, decode_audio(jfk_path), 3)
    finally:
        engine.close()
    steps = [c for c in calls if c[0] == "_decode_rows"]
    admits = [c for c in calls if c[0] == "_admit"]
    assert any(capturing for _, capturing, _, _ in steps)  # warmup captured its buckets through here
    assert all(cudnn and first == int(CUDNN) for _, _, cudnn, first in steps), steps
    assert admits and all(not cudnn for _, _, cudnn, _ in admits), admits
    assert runner_mod.SDPA_PATHS["graph_step"][0] == CUDNN
