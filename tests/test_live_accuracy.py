"""Streaming equals offline on a long recording: the shared 6-minute file streamed through a
`Session` and its `Bridge` against the real engine (tiny.en, real silero-vad; no sockets: the
transports add nothing to the text) gives finals whose WER is within a point of offline `fast`
transcription of the same file, with no runaway final.

About two minutes of CPU: the audio is fed as fast as the session takes it, without partials.
"""

from __future__ import annotations

import asyncio
import dataclasses

import jiwer
import numpy as np
import pytest
from whisper_normalizer.english import EnglishTextNormalizer

from streamer.audio.decode import decode_audio
from streamer.audio.vad import SileroVAD
from streamer.config import StreamingConfig, VADConfig
from streamer.engine.request import DecodeOptions
from streamer.longform import transcribe_long
from streamer.server.bridge import Bridge, Finalized
from streamer.server.metrics import Metrics
from streamer.streaming.session import Session

SR = 16000
CHUNK = SR // 10
normalize = EnglishTextNormalizer()


def wer(reference: str, hypothesis: str) -> float:
    return jiwer.wer(normalize(reference), normalize(hypothesis))


async def stream(engine, audio, config: StreamingConfig, word_timestamps: bool = False) -> list[Finalized]:
    finals: list[Finalized] = []
    bridge = Bridge(Session(config, SileroVAD()), engine, Metrics(lambda: None),
                    lambda e: finals.append(e) if isinstance(e, Finalized) else None,
                    session_id="live-test", language="en", task="transcribe", word_timestamps=word_timestamps)
    for i in range(0, len(audio), CHUNK):
        bridge.feed(audio[i:i + CHUNK])
        await asyncio.sleep(0)  # let results in, as a socket's reads would
    await bridge.finish(timeout=600)
    return finals


def drive(engine, policy, audio, alter) -> tuple[list, list]:
    """Feed `audio` to a `LivePolicy` and carry out its actions with the real engine, one at a time:
    (its Submits, its Finalized). `alter(submits, result)` gives the result handed back for the last
    Submit (a test's way to have a decode come back as a faulty one would)."""
    from streamer.longform.words import add_segment_words
    from streamer.streaming.live import Align, Finalized as Done, Submit

    submits, done = [], []

    async def run(actions) -> None:
        for a in actions:
            if isinstance(a, Submit):
                submits.append(a)
                result = alter(submits, await engine.transcribe(a.window.audio, a.options))
                await run(policy.on_result(a.job, result, 0.0))
            elif isinstance(a, Align):
                await add_segment_words(engine, a.audio, a.segments, language="en", task="transcribe", offset=a.window.context_s)
                await run(policy.on_aligned(a.job, 0.0))
            elif isinstance(a, Done):
                done.append(a)

    async def feed() -> None:
        for i in range(0, len(audio), CHUNK):
            await run(policy.feed(audio[i:i + CHUNK], 0.0))
        await run(policy.close(0.0))

    asyncio.run(feed())
    return submits, done


@pytest.fixture(scope="module")
def long_row(manifest):
    return next(r for r in manifest if r["audio"].endswith("long/asterisk_en_6min.ogg"))


def test_live_finals_of_a_six_minute_recording_match_offline(engine, long_row):
    audio = decode_audio(long_row["audio"])
    assert len(audio) >= 5 * 60 * SR
    reference = long_row["text"]
    offline = asyncio.run(transcribe_long(engine, audio, mode="fast", options=DecodeOptions(language="en"))).text
    config = StreamingConfig(partials=False)  # the default: no previous-text conditioning
    finals = asyncio.run(stream(engine, audio, config))
    assert all(f.error is None for f in finals)
    texts = [f.final.text for f in finals if f.final is not None]
    live, batch = wer(reference, " ".join(texts)), wer(reference, offline)
    print(f"live WER {live:.2%} over {len(texts)} finals, offline fast {batch:.2%}")
    assert live <= batch + 0.01
    rate = len(normalize(reference).split()) / (len(audio) / SR)  # words per second (0.5-s pauses only)
    for f in finals:
        if f.final is not None:
            assert len(normalize(f.final.text).split()) <= 2 * rate * f.duration + 4, f.final.text  # no runaway


def test_acoustic_context_decodes_finals_inside_the_preceding_audio(engine, manifest):
    """The Kennedy recording twice, 1.5 s apart, with acoustic context: the later finals go out
    inside the stream's preceding audio with the earlier finals as the forced prefix, and their
    text, times and word times are those of their own utterance (not of the context)."""
    row = next(r for r in manifest if r["audio"].endswith("en/jfk.ogg"))
    jfk = decode_audio(row["audio"])
    audio = np.concatenate([jfk, np.zeros(int(1.5 * SR), np.float32), jfk, np.zeros(SR, np.float32)])
    seen = []
    submit = engine.submit

    def spy(audio, options=None, **kw):
        seen.append(options)
        return submit(audio, options, **kw)

    engine.submit = spy
    try:
        finals = asyncio.run(stream(engine, audio, StreamingConfig(partials=False, acoustic_context=True),
                                    word_timestamps=True))
    finally:
        del engine.submit
    assert sum(1 for o in seen if o.prefix_tokens) >= 2
    texts = [f.final.text for f in finals if f.final is not None]
    assert wer(row["text"] + " " + row["text"], " ".join(texts)) <= 0.05, texts
    second = len(jfk) / SR + 1.5
    starts = [f.final.start for f in finals if f.final is not None]
    assert starts == sorted(starts) and any(t >= second for t in starts)
    later = [f.final for f in finals if f.final is not None and f.final.start >= second]
    assert wer(row["text"], " ".join(f.text for f in later)) <= 0.05  # the second pass alone, not the first again
    for f in (f.final for f in finals if f.final is not None):  # aligned in the utterance's own audio
        assert f.words and all(f.start - 0.05 <= w["start"] <= w["end"] <= f.end + 0.05 for w in f.words), f
        starts = [w["start"] for w in f.words]  # spread over the speech, not piled at a segment's edge
        assert starts == sorted(starts) and len(set(starts)) > len(starts) // 2, f


def telephone(audio: np.ndarray) -> np.ndarray:
    """16-kHz audio as the server hears a call-center client: band-limited to 8 kHz (libswresample),
    G.711 μ-law, and back to 16 kHz through `/v1/stream`'s own resampler (`encoding: "mulaw"`)."""
    from test_callcenter import to_8k

    from streamer.audio import g711
    from streamer.audio.decode import StreamResampler

    up = StreamResampler(8000, 1, "mulaw")
    return np.concatenate([up.push(g711.encode(to_8k(audio), "mulaw")), up.flush()])


def test_an_unstyled_telephone_final_does_not_set_the_style_of_the_later_ones(engine, manifest):
    """Kennedy's recording three times, 1.5 s apart, as 8-kHz μ-law, with acoustic context (the
    default). tiny.en writes the first sentence lower case and unpunctuated ("and so am i fell
    america"); as the forced prefix of the next finals that register carried on to all eleven
    later finals. It no longer does: the later finals are written in the usual style."""
    from streamer.model.decoding import unstyled

    row = next(r for r in manifest if r["audio"].endswith("en/jfk.ogg"))
    jfk = decode_audio(row["audio"])
    gap = np.zeros(int(1.5 * SR), np.float32)
    audio = telephone(np.concatenate([jfk, gap, jfk, gap, jfk, np.zeros(SR, np.float32)]))
    finals = asyncio.run(stream(engine, audio, StreamingConfig(partials=False)))
    texts = [f.final.text for f in finals if f.final is not None]
    assert len(texts) == 12 and unstyled(texts[0]), texts  # the model's own slip, at 8 kHz
    assert sum(unstyled(t) for t in texts[1:]) <= 1, texts  # all eleven before
    assert wer(" ".join([row["text"]] * 3), " ".join(texts)) <= 0.12, texts


@pytest.mark.parametrize("context", [True, False])
def test_a_final_that_stopped_early_is_continued_by_the_engine(engine, manifest, context):
    """Kennedy's sentence as one utterance; tiny.en writes it as two segments (0-8 s, 8-11 s). Its
    decode is handed to the policy without the second, as a decode that stopped early would come
    back: the policy decodes the rest with the real engine (after the first segment as the forced
    prefix with acoustic context, alone without) and one final goes out with the whole sentence
    and word timings in order over all of it."""
    from streamer.streaming.live import LiveOptions, LivePolicy

    row = next(r for r in manifest if r["audio"].endswith("en/jfk.ogg"))
    audio = np.concatenate([decode_audio(row["audio"]), np.zeros(3 * SR, np.float32)])
    config = StreamingConfig(partials=False, acoustic_context=context, vad=VADConfig(min_silence_ms=1500))
    tok = engine.tokenizer
    policy = LivePolicy(Session(config, SileroVAD()), LiveOptions("en", word_timestamps=True), encode=tok.encode,
                        max_new_tokens=engine.config.max_new_tokens, timestamp_token=tok.timestamp_token)

    def stopped_early(submits, result):
        if len(submits) == 1:  # the first decode: as if it had ended after its first segment
            assert len(result.segments) >= 2 and result.segments[0].end < 9.0, result.segments
            first = result.segments[0]
            result = dataclasses.replace(result, segments=[first], text=first.text)
        return result

    submits, done = drive(engine, policy, audio, stopped_early)
    assert len(submits) == 2 and submits[1].window.window_id.seq == 1
    assert bool(submits[1].options.prefix_tokens) == context
    (final,) = [d.final for d in done]
    assert wer(row["text"], final.text) <= 0.05, final.text
    starts = [w["start"] for w in final.words]
    assert starts == sorted(starts) and final.words[-1]["end"] > final.start + 9.0, final.words


@pytest.mark.parametrize("emptied, rungs", [(4, 1), (1, 2)])
def test_a_final_with_nothing_new_after_its_context_is_decoded_again_without_the_prefix(engine, manifest, emptied,
                                                                                       rungs):
    """Kennedy's recording twice, 1.5 s apart, with acoustic context (8 utterances). The `emptied`-th
    decode with a forced prefix is handed to the policy with nothing after the prefix, as a decode
    that stopped at once comes back: the policy decodes the same audio again without the prefix,
    with the real engine. Utterance 5 ("And so my fellow Americans", after a 1.5-s pause) comes out
    as its own segment: the final, one decode more (`rungs` 1). Utterance 2 ("ask not", after a
    short pause): tiny.en writes "And so my fellow Americans asked not" as one segment over the
    boundary, which is not taken (the context's words again), and the utterance is decoded alone
    (`rungs` 2). Either way the finals are the recording's words, none twice."""
    from streamer.streaming.live import LiveOptions, LivePolicy

    row = next(r for r in manifest if r["audio"].endswith("en/jfk.ogg"))
    jfk = decode_audio(row["audio"])
    audio = np.concatenate([jfk, np.zeros(int(1.5 * SR), np.float32), jfk, np.zeros(SR, np.float32)])
    tok = engine.tokenizer
    policy = LivePolicy(Session(StreamingConfig(partials=False, acoustic_context=True), SileroVAD()), LiveOptions("en"),
                        encode=tok.encode, max_new_tokens=engine.config.max_new_tokens,
                        timestamp_token=tok.timestamp_token)

    def stopped_after_the_prefix(submits, result):
        if submits[-1].options.prefix_tokens and sum(1 for s in submits if s.options.prefix_tokens) == emptied:
            result = dataclasses.replace(result, segments=[], text="")
        return result

    submits, done = drive(engine, policy, audio, stopped_after_the_prefix)
    k = [i for i, s in enumerate(submits) if s.options.prefix_tokens][emptied - 1]
    prefixed, free = submits[k], submits[k + 1]
    assert free.options.prefix_tokens is None and free.window.window_id == prefixed.window.window_id
    assert free.window.context_s == prefixed.window.context_s > 0
    assert np.array_equal(free.window.audio, prefixed.window.audio)
    assert len(done) == 8 and len(submits) == len(done) + rungs
    if rungs == 2:
        alone = submits[k + 2].window
        assert alone.window_id == free.window.window_id and alone.context_s == 0
    texts = [d.final.text for d in done if d.final is not None]
    assert wer(row["text"] + " " + row["text"], " ".join(texts)) <= 0.05, texts  # no context written twice


def test_start_takes_conditioning_and_a_prompt_and_names_a_bad_field():
    from streamer.protocols.start import ProtocolError, parse_start

    defaults = StreamingConfig()
    start = parse_start({"type": "start", "condition_on_previous_text": False, "prompt": " Kennedy. "}, defaults, False, {"en"})
    assert start.streaming.condition_on_previous is False and start.streaming.prompt == "Kennedy."
    assert parse_start({"type": "start", "condition_on_previous": True}, defaults, False, {"en"}).streaming.condition_on_previous
    assert parse_start({"type": "start", "acoustic_context": True}, defaults, False, {"en"}).streaming.acoustic_context
    for fields, name in [({"condition_on_previous_text": "yes"}, "condition_on_previous_text"),
                         ({"condition_on_previous": 1}, "condition_on_previous"), ({"acoustic_context": "on"}, "acoustic_context"),
                         ({"prompt": 5}, "prompt"), ({"prompt": "x" * 2001}, "prompt")]:
        with pytest.raises(ProtocolError) as info:
            parse_start({"type": "start", **fields}, defaults, False, {"en"})
        assert info.value.code == "bad_field" and info.value.field == name
