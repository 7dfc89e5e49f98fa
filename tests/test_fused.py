"""The kernel path of the model (fused LayerNorm, decode attention, FP8 sites and FP8 cross K/V)
against the plain PyTorch model, on real weights and audio. Off CUDA every `cuda_ops` op runs its
PyTorch reference (FP8 simulated in fp32), so this checks the wiring and the numerics of the
presets; tests/kernels check the kernels themselves against the same references."""

from __future__ import annotations

import asyncio
import dataclasses
import difflib

import pytest
import torch

from streamer.config import EngineConfig
from streamer.engine.engine import Engine
from streamer.engine.request import DecodeOptions
from streamer.audio.features import log_mel_spectrogram
from streamer.model.fused import FusedAudioEncoder, FusedDecoderBlock, FusedEncoderBlock, FusedTextDecoder, apply_precision
from streamer.model.weights import load_model
from streamer.model.whisper import AudioEncoder, DecoderBlock, KVCache, ModelDims, TextDecoder, Whisper
from cuda_ops.fp8 import FP8Linear
from cuda_ops.precision import get_preset


@pytest.fixture(scope="module")
def clips(manifest):
    from streamer.audio.decode import decode_audio  # here: PyAV is not on the GPU machine, where the kernel tests run

    rows = [r for r in manifest if r["language"] == "en" and "asterisk/" in r["audio"]][5::25][:4]
    return [decode_audio(r["audio"]) for r in rows]


def _run(precision, clips, check=None, loaded=None, beams=(1,), max_slots=8):
    """Results of `clips` through an engine with `precision` over `loaded` (tiny.en on the CPU by
    default), window i a beam search of width beams[i % len(beams)] (1: greedy); `check(engine)` after them."""
    engine = Engine(loaded or load_model("tiny.en"), EngineConfig(max_slots=max_slots), precision=precision)

    async def main():
        return await asyncio.gather(*(engine.transcribe(a, DecodeOptions(temperatures=(0.0,), beam_size=beams[i % len(beams)]))
                                      for i, a in enumerate(clips)))

    try:
        results = asyncio.run(main())
        if check is not None:
            check(engine)
        return results
    finally:
        engine.close()


@pytest.fixture(scope="module")
def plain(clips):
    return _run(None, clips)


# tiny.en is narrower than fp8_min_width: ":fp8_min_width=0" puts its FP8 linears in anyway.
@pytest.mark.parametrize("precision", ["full_fp16", "mixed_fp8:fp8_min_width=0", "aggressive_fp8:fp8_min_width=0",
                                       "mixed_fp8:cross_kv_cache=int4", "full_fp16:cross_kv_cache=absorbed"])
def test_presets_transcribe_like_the_plain_model(precision, clips, plain):
    results = _run(precision, clips)
    if precision.startswith("full_fp16"):  # same function, fp32 here: the same greedy tokens
        assert [r.tokens for r in results] == [r.tokens for r in plain]
    else:  # FP8 or a 4-bit cross cache may move a token; the transcript must stay the same in substance
        import jiwer  # here, so that the file's CUDA tests run where jiwer is not installed (the GPU machine)

        for ours, ref in zip(results, plain):
            words = jiwer.process_words(ref.text, ours.text)
            assert ours.text and words.substitutions + words.deletions + words.insertions <= 2, (ref.text, ours.text)


def test_apply_precision_swaps_the_chosen_sites_in_a_new_model():
    plain = load_model("tiny.en").model
    model = apply_precision(plain, get_preset("mixed_fp8:fp8_min_width=0"))
    enc, dec = model.encoder.blocks[0], model.decoder.blocks[0]
    assert isinstance(enc, FusedEncoderBlock) and isinstance(dec, FusedDecoderBlock)
    assert isinstance(enc.qkv, FP8Linear) and isinstance(enc.fc1, FP8Linear) and not isinstance(enc.attn_out, FP8Linear)
    assert not isinstance(dec.fc2, FP8Linear) and not isinstance(dec.qkv, FP8Linear)
    # The model it was given is untouched (engines may share it); unconverted weights are shared.
    assert type(plain.decoder.blocks[0]) is DecoderBlock and not any(isinstance(m, FP8Linear) for m in plain.modules())
    assert dec.qkv is plain.decoder.blocks[0].qkv and model.decoder.token_embedding is plain.decoder.token_embedding
    assert model.state_dict().keys() - plain.state_dict().keys() == {
        f"encoder.blocks.{i}.{name}.{part}" for i in range(len(plain.encoder.blocks))
        for name in ("qkv", "fc1", "fc2") for part in ("weight_fp8", "weight_scale")}
    old = apply_precision(plain, get_preset("mixed_fp8:decoder_ffn=fp8:fp8_min_width=0"))
    assert isinstance(old.decoder.blocks[0].fc1, FP8Linear) and isinstance(old.decoder.blocks[0].fc2, FP8Linear)
    narrow = apply_precision(plain, get_preset("mixed_fp8"))  # 384 < fp8_min_width
    assert not any(isinstance(m, FP8Linear) for m in narrow.modules())
    assert isinstance(narrow.encoder.blocks[0], FusedEncoderBlock)
    unfused = apply_precision(plain, get_preset("full_fp16:use_fused_layernorm=0"))
    assert type(unfused.decoder.blocks[0]) is DecoderBlock


def test_fused_encoder_adds_each_residual_inside_the_next_layer_norm(clips):
    """full_fp16's encoder passes (x, delta) between blocks and adds them in the next LayerNorm (no
    add kernel): the plain encoder's function, on real audio; the plain model keeps its encoder."""
    plain = load_model("tiny.en")
    model = apply_precision(plain.model, get_preset("full_fp16"))
    assert isinstance(model.encoder, FusedAudioEncoder) and type(plain.model.encoder) is AudioEncoder
    assert model.encoder.conv1 is plain.model.encoder.conv1 and model.encoder.ln_post is plain.model.encoder.ln_post
    mel = log_mel_spectrogram(clips[0], plain.dims.n_mels)
    with torch.inference_mode():
        ours, ref = model.encoder(mel), plain.model.encoder(mel)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    unfused = apply_precision(plain.model, get_preset("full_fp16:use_fused_layernorm=0"))
    assert type(unfused.encoder) is AudioEncoder


def test_fused_decoder_adds_each_residual_inside_the_next_layer_norm(clips):
    """full_fp16's decoder passes (x, delta) between blocks (`FusedTextDecoder`) and reads one
    StepIndex per call: the plain decoder's hidden states for a prompt and then one token a row at
    different positions, on real audio; the plain model keeps its decoder."""
    plain = load_model("tiny.en")
    model = apply_precision(plain.model, get_preset("full_fp16"))
    assert isinstance(model.decoder, FusedTextDecoder) and type(plain.model.decoder) is TextDecoder
    mel = log_mel_spectrogram(list(clips[:2]), plain.dims.n_mels)
    tokens = torch.tensor([[50257, 50362, 383, 2068], [50257, 50362, 314, 892]])
    positions = torch.arange(4).expand(2, 4)
    hidden = []
    with torch.inference_mode():
        for m in (model, plain.model):
            cache = KVCache(plain.dims, 2)
            m.decoder.write_cross_kv(m.encoder(mel), cache, 0)
            first = m.decoder(tokens[:, :3], positions[:, :3], 0, cache)
            # the second row one position behind: its own length, not the batch's
            step = m.decoder(tokens[:, 3:], torch.tensor([[3], [2]]), 0, cache)
            hidden.append((first, step))
    for ours, ref in zip(*hidden):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    unfused = apply_precision(plain.model, get_preset("full_fp16:use_fused_layernorm=0"))
    assert type(unfused.decoder) is TextDecoder


@pytest.mark.parametrize("cross_format", ["fp8", "int4"])
def test_plain_blocks_refuse_a_quantised_cross_cache(cross_format):
    loaded = load_model("tiny.en")
    cache = KVCache(loaded.dims, 1, cross_format=cross_format)
    with pytest.raises(ValueError, match=f"{cross_format} cross cache is written by the fused blocks"):
        loaded.model.decoder.write_cross_kv(torch.zeros(1, loaded.dims.n_audio_ctx, loaded.dims.n_text_state), cache, 0)
    with pytest.raises(ValueError, match="cross_format must be one of"):
        KVCache(loaded.dims, 1, cross_format="int8")


def test_cross_cache_scale_tile_is_the_kernels():
    from cuda_ops.attention import SCALE_TILE
    from streamer.model.whisper import CROSS_SCALE_TILE

    assert CROSS_SCALE_TILE == SCALE_TILE


def test_fp8_cross_cache_has_a_scale_per_tile():
    dims = load_model("tiny.en").model.dims
    cache = KVCache(dims, 3, cross_format="fp8")
    tiles = -(-dims.n_audio_ctx // 128)
    assert cache.layers[0].cross_k_scale.shape == cache.layers[-1].cross_v_scale.shape == (3, dims.n_text_head, tiles)
    k, v, ks, vs = cache.layers[0].cross(slice(1, 3))
    assert ks.shape == (2, dims.n_text_head, tiles) and k.dtype == v.dtype


def test_int4_cross_cache_layout_and_its_bytes():
    """The 4-bit cross cache: codes [slots, H, 1500, Dh/2], K scales per tile and channel, V scales
    per position (fp16), about 0.53x the bytes of the FP8 cache, as bytes_per_slot counts them."""
    dims = load_model("tiny.en").model.dims
    cache = KVCache(dims, 2, dtype=torch.float16, cross_format="int4")
    h, dh, t = dims.n_text_head, dims.head_dim, dims.n_audio_ctx
    layer = cache.layers[0]
    assert layer.cross_k.shape == layer.cross_v.shape == (2, h, t, dh // 2) and layer.cross_k.dtype == torch.uint8
    assert layer.cross_k_scale.shape == (2, h, -(-t // 128), dh) and layer.cross_v_scale.shape == (2, h, t)
    cross = lambda fmt: KVCache.bytes_per_slot(dims, 2, fmt, self_len=0)  # noqa: E731
    stored = sum(b.numel() * b.element_size() for b in cache.buffers() if b is not None) // 2
    selfs = 2 * len(cache.layers) * h * dims.n_text_ctx * dh * 2
    assert abs(cross("int4") - (stored - selfs)) <= 8 * len(cache.layers)
    assert 0.5 < cross("int4") / cross("fp8") < 0.56 and cross("fp8") / cross("fp16") < 0.51


def test_a_padded_vocabulary_gives_the_same_logits_and_stores_the_embedding_once():
    """with_padded_vocabulary (what apply_precision does): a multilingual vocabulary (51,865) is
    padded to 51,904 rows for the projection's GEMM; the token embedding is a view of that buffer,
    the logits are the plain decoder's, and an aligned vocabulary (tiny.en's 51,864) is left alone."""
    from streamer.model.fused import PaddedTiedProjection, with_padded_vocabulary
    from streamer.model.shapes import random_weights

    model = random_weights("tiny", "cpu", torch.float32)
    decoder = model.decoder
    assert decoder.dims.n_vocab % 8 != 0
    padded = with_padded_vocabulary(decoder)
    assert isinstance(padded.proj, PaddedTiedProjection) and padded.proj.padded.shape[0] % 64 == 0
    assert padded.token_embedding.weight.data_ptr() == padded.proj.padded.data_ptr()  # one copy
    assert decoder.proj is not padded.proj and decoder.token_embedding is not padded.token_embedding  # original kept
    hidden = torch.randn(3, 5, decoder.dims.n_text_state)
    assert torch.equal(padded.logits(hidden), decoder.logits(hidden))
    tokens = torch.randint(0, decoder.dims.n_vocab, (2, 7))
    assert torch.equal(padded.token_embedding(tokens), decoder.token_embedding(tokens))
    english = load_model("tiny.en").model.decoder
    assert with_padded_vocabulary(english) is english
    assert isinstance(apply_precision(model, get_preset("full_fp16")).decoder.proj, PaddedTiedProjection)


def test_absorbed_cross_cache_gives_the_fp16_caches_hidden_states_and_alignment_logits(clips):
    """An absorbed cross cache (the windows' encoder states once, W_k folded into the query, W_v into
    the output) against the fp16 K/V cache, same fused decoder, real audio: a prompt of 3 tokens (the
    folded kernel with a windows index), one token a row, and a prompt longer than a head (70 > Dh:
    K/V projected for the call); the word-alignment logits of two heads likewise. The cache stores X
    once (not 2 x layers K/V) and compaction moves it with the rows."""
    loaded = load_model("tiny.en")
    dims = loaded.dims
    model = apply_precision(loaded.model, get_preset("full_fp16"))
    mel = log_mel_spectrogram(list(clips[:2]), dims.n_mels)
    gen = torch.Generator().manual_seed(0)
    long_tokens = torch.randint(0, 50000, (2, 70), generator=gen)
    heads = [(1, 0), (3, 2)]
    outs = {}
    with torch.inference_mode():
        features = model.encoder(mel)
        for fmt in ("fp16", "absorbed"):
            cache = KVCache(dims, 3, cross_format=fmt)
            model.decoder.write_cross_kv(features, cache, 1)  # slots 1, 2: the batch is a view at start 1
            first, qk = model.decoder(long_tokens[:, :3], torch.arange(3).expand(2, 3), 1, cache, cross_qk_heads=heads)
            step = model.decoder(long_tokens[:, 3:4], torch.tensor([[3], [2]]), 1, cache)
            long, long_qk = model.decoder(long_tokens, torch.arange(70).expand(2, 70), 1, cache, cross_qk_heads=heads)
            outs[fmt] = (first, qk, step, long, long_qk)
    for name, ours, ref in zip(("prompt", "prompt qk", "step", "long", "long qk"), outs["absorbed"], outs["fp16"]):
        torch.testing.assert_close(ours, ref, rtol=1e-3, atol=1e-3, msg=name)
    absorbed = KVCache(dims, 2, cross_format="absorbed")
    assert absorbed.cross_x.shape == (2, dims.n_audio_ctx, dims.n_audio_state)
    assert all(layer.cross_k is None and layer.shared_x is absorbed.cross_x for layer in absorbed.layers)
    stored = lambda fmt: KVCache.bytes_per_slot(dims, 2, fmt, self_len=0)  # noqa: E731
    assert stored("absorbed") == dims.n_text_layer * dims.n_audio_ctx * dims.n_audio_state * 2  # read by every layer
    held = KVCache.bytes_per_slot(dims, 2, "absorbed") - KVCache.bytes_per_slot(dims, 2, "absorbed", self_len=dims.n_text_ctx)
    assert held == -(dims.n_text_layer - 1) * dims.n_audio_ctx * dims.n_audio_state * 2  # held once
    with pytest.raises(ValueError, match="absorbed cross cache is read by the fused blocks"):
        loaded.model.decoder(long_tokens[:, :1], torch.zeros(2, 1, dtype=torch.long), 0, absorbed)
    with pytest.raises(ValueError, match="cross_kv_proj='fp16'"):
        get_preset("mixed_fp8:cross_kv_cache=absorbed:cross_kv_proj=fp8")


def test_hybrid_cross_cache_reads_kv_below_its_pool_and_the_encoder_states_above(clips):
    """A hybrid cache (`kv_slots`=2 of 4): calls over slots below 2 read fp16 K/V, projected from X
    when first needed (`fill_cross_kv`), bit for bit the fp16 cache's; larger calls read X, as the
    absorbed cache does. Compaction carries K/V between pool slots and marks a pool slot filled from
    above the pool missing; a step whose bucket passes the pool projects nothing."""
    dims = load_model("tiny.en").dims
    model = apply_precision(load_model("tiny.en").model, get_preset("full_fp16"))
    mel = log_mel_spectrogram(list(clips[:3]), dims.n_mels)
    tokens = torch.tensor([[50257, 50362, 383], [50257, 50362, 314], [50257, 50362, 887]])
    positions = torch.arange(3).expand(3, 3)
    with torch.inference_mode():
        features = model.encoder(mel)
        caches = {fmt: KVCache(dims, 4, cross_format=fmt, kv_slots=2) for fmt in ("fp16", "absorbed", "hybrid")}
        for cache in caches.values():
            model.decoder.write_cross_kv(features, cache, 0)
        hybrid = caches["hybrid"]
        assert hybrid.missing == {0, 1} and hybrid.layers[0].cross_k.shape[0] == 2 and hybrid.cross_x.shape[0] == 4
        assert [hybrid.read_format(n) for n in (1, 2, 3)] == ["fp16", "fp16", "absorbed"]
        assert hybrid.missing_runs(slice(0, 1), stop=4) == [] and hybrid.missing_runs(slice(1, 2)) == [slice(1, 2)]
        model.decoder.fill_cross_kv(hybrid, slice(0, 2))
        assert not hybrid.missing
        for ours, ref in zip(hybrid.layers, caches["fp16"].layers):
            assert ours.cross_k.equal(ref.cross_k[:2]) and ours.cross_v.equal(ref.cross_v[:2])
        out = {fmt: (model.decoder(tokens[:2], positions[:2], 0, c), model.decoder(tokens, positions, 0, c))
               for fmt, c in caches.items()}
        assert out["hybrid"][0].equal(out["fp16"][0])  # two rows: the K/V path
        assert out["hybrid"][1].equal(out["absorbed"][1])  # three: X
        torch.testing.assert_close(out["hybrid"][1], out["fp16"][1], rtol=1e-3, atol=1e-3)
        # compaction: slot 1 -> 0 carries its K/V; slot 2 (above the pool) -> 1 leaves slot 1 missing
        k1 = hybrid.layers[0].cross_k[1].clone()
        hybrid.move_rows(torch.tensor([1, 2]), torch.tensor([0, 1]), 3, pairs=[(1, 0), (2, 1)])
        assert hybrid.layers[0].cross_k[0].equal(k1) and hybrid.missing == {1}
        assert hybrid.cross_x[1].equal(features[2])
        model.decoder.fill_cross_kv(hybrid, slice(0, 2))
        assert hybrid.layers[0].cross_k[1].equal(caches["fp16"].layers[0].cross_k[2]) and not hybrid.missing
        with pytest.raises(ValueError, match="needs the moves on the host"):
            hybrid.move_rows(torch.tensor([1]), torch.tensor([0]), 3)
    assert KVCache.bytes_per_slot(dims, 2, "hybrid") == KVCache.bytes_per_slot(dims, 2, "absorbed")
    assert KVCache.pool_bytes(dims, 2, "hybrid", 3) == 3 * KVCache.bytes_per_slot(dims, 2, "fp16", self_len=0)
    assert KVCache.pool_bytes(dims, 2, "absorbed", 3) == 0
    with pytest.raises(ValueError, match="hybrid cross_kv_cache needs cross_kv_proj='fp16'"):
        get_preset("full_fp16:cross_kv_cache=hybrid:cross_kv_proj=fp8")


def test_a_hybrid_engine_decodes_as_fp16_kv_through_both_paths(clips):
    """Four windows, two of them beam searches of width 3 (eight rows), through an engine whose hybrid
    cache has K/V for three slots: steps of more than three rows read X (beam groups straddle the pool's
    end), those of three or fewer (once windows end, rows moved into the pool) K/V projected then; the
    tokens are full_fp16's (fp16 K/V throughout)."""
    def pool_checked(slots):
        def check(engine):
            cache = engine.runner.cache
            assert cache.kv_slots == slots
            assert not cache.missing  # every pool slot was projected for a step of three rows or fewer
        return check

    tokens = {precision: [r.tokens for r in _run(precision, clips, pool_checked(slots), beams=(1, 3), max_slots=12)]
              for precision, slots in (("full_fp16", 0), ("full_fp16:cross_kv_cache=hybrid:hybrid_kv_slots=3", 3))}
    ref, ours = tokens.values()
    assert ours == ref


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (graphs, the mma kernel)")
def test_a_hybrid_engine_on_cuda_transcribes_as_fp16_kv(clips):
    """On CUDA (captured steps: a bucket of up to `hybrid_kv_slots` rows reads K/V filled before its
    replay, a larger one X through the tensor-core kernel): the hybrid engine's greedy transcripts of
    four windows are full_fp16's, up to fp16 rounding (at most two words a window), and every pool
    slot was projected."""
    loaded = load_model("tiny.en", "cuda", torch.float16)

    def check(engine):
        cache = engine.runner.cache
        assert cache.cross_format == ("fp16" if engine.precision == "full_fp16" else "hybrid") and not cache.missing

    texts = {precision: [r.text for r in _run(precision, clips, check, loaded=loaded)]
             for precision in ("full_fp16", "full_fp16:cross_kv_cache=hybrid:hybrid_kv_slots=2")}
    for ours, ref in zip(*texts.values()):  # word edits by difflib (jiwer is not on the GPU machine)
        ops = difflib.SequenceMatcher(a=ref.split(), b=ours.split(), autojunk=False).get_opcodes()
        edits = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")
        assert ours and edits <= 2, (ref, ours)


def test_auto_cross_cache_is_hybrid_only_where_the_tensor_core_kernel_runs():
    """An "auto" cross cache (full_fp16's) is the hybrid cache (absorbed with an fp16 K/V pool) where
    cuda_ops/cross_absorbed_mma.py runs (CUDA, fp16, widths a multiple of 128 up to 1280) on models at
    least `HYBRID_MIN_WIDTH` wide, fp16 K/V elsewhere (the CPU here); a format asked for by name is kept."""
    from streamer.model.fused import cross_cache_format

    auto = "full_fp16:cross_kv_cache=auto"
    dims = ModelDims(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=1,
                     n_vocab=51864, n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=1)
    cpu = Whisper(dims)
    assert get_preset("full_fp16").cross_kv_cache == "auto"
    assert cross_cache_format(cpu, get_preset(auto)) == "fp16"
    assert cross_cache_format(cpu, get_preset("full_fp16:cross_kv_cache=absorbed")) == "absorbed"
    assert cross_cache_format(cpu, get_preset("mixed_fp8")) == "int4"
    if not torch.cuda.is_available():
        return
    assert cross_cache_format(Whisper(dims).to("cuda", torch.float16), get_preset(auto)) == "fp16"  # tiny's width
    wide = dataclasses.replace(dims, n_audio_state=1280, n_text_state=1280, n_audio_head=20, n_text_head=20)
    half = Whisper(wide).to("cuda", torch.float16)
    assert cross_cache_format(half, get_preset(auto)) == "hybrid"
    assert cross_cache_format(half, get_preset("full_fp16:cross_kv_cache=fp16")) == "fp16"
    assert cross_cache_format(half, get_preset(auto + ":cross_kv_proj=fp8")) == "fp16"  # its weights fold per step
    assert cross_cache_format(half, get_preset(auto + ":use_fused_layernorm=0")) == "fp16"
    assert cross_cache_format(half.float(), get_preset(auto)) == "fp16"
    odd = dataclasses.replace(dims, n_audio_state=320, n_text_state=320, n_audio_head=5, n_text_head=5)
    assert cross_cache_format(Whisper(odd).to("cuda", torch.float16), get_preset(auto)) == "fp16"
