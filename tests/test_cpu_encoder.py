"""The CPU encoder in bfloat16 (`model/cpu_encoder.py`): chosen only where the CPU multiplies
bfloat16 natively, close to float32 on real speech, the same transcript through the engine."""

from __future__ import annotations

import asyncio

import pytest
import torch

from streamer.audio.decode import decode_audio
from streamer.audio.features import log_mel_spectrogram
from streamer.config import ModelConfig, load_settings
from streamer.engine.engine import Engine
from streamer.model import cpu_encoder
from streamer.model.weights import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny.en")


def test_auto_follows_the_cpu_and_bad_settings_fail():
    assert cpu_encoder.resolve("auto") == (torch.bfloat16 if cpu_encoder.native_bfloat16() else torch.float32)
    assert cpu_encoder.resolve("float32") == torch.float32
    assert cpu_encoder.resolve("bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match="cpu_encoder 'fp8'"):
        cpu_encoder.resolve("fp8")


def test_the_env_var_sets_it():
    assert load_settings({"CPU_ENCODER": "float32"}).model.cpu_encoder == "float32"
    assert load_settings({}).model.cpu_encoder == "auto"


def test_bfloat16_encoder_is_close_and_leaves_the_model_alone(tiny, jfk_path):
    assert cpu_encoder.with_cpu_encoder(tiny.model, torch.float32) is tiny.model
    model = cpu_encoder.with_cpu_encoder(tiny.model, torch.bfloat16)
    assert next(tiny.model.encoder.parameters()).dtype == torch.float32  # the given model is unchanged
    assert model.decoder is tiny.model.decoder  # only the encoder is another module
    mel = log_mel_spectrogram([decode_audio(jfk_path)], tiny.dims.n_mels)  # [1, n_mels, 3000]
    with torch.inference_mode():
        ref, out = tiny.model.encoder(mel), model.encoder(mel)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    # bfloat16 keeps 8 significant bits: ~0.4 % per product, which the LayerNorms keep from growing.
    rel = (out - ref).norm() / ref.norm()
    assert rel < 0.02, rel
    assert (out - ref).abs().max() < 0.05 * ref.abs().max()


def test_engine_transcript_is_the_same_in_both(jfk_path):
    audio = decode_audio(jfk_path)
    texts = {}
    for setting in ("float32", "bfloat16"):
        engine = Engine.load(ModelConfig(cpu_encoder=setting))
        try:
            assert isinstance(engine.loaded.model.encoder, cpu_encoder.CastEncoder) == (setting == "bfloat16")
            texts[setting] = asyncio.run(engine.transcribe(audio)).text
        finally:
            engine.close()
    assert texts["float32"] == texts["bfloat16"]
    assert "ask not what your country can do for you" in texts["bfloat16"]
