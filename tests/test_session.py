"""The per-stream state machine on real audio and the real silero model.

Engine results are hand-made `engine.request.Result`s, judged as the engine judges them.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamer.audio.decode import decode_audio
from streamer.audio.vad import FRAME, SileroVAD, speech_segments
from streamer.config import StreamingConfig, VADConfig
from streamer import types
from streamer.engine import request
from streamer.model.decoding import DecodeOptions, judge
from streamer.streaming.events import Final, Partial, SpeechStarted, SpeechStopped, SubmitWindow, WindowId
from streamer.streaming.session import Session

SR = 16000
LONG = "long/asterisk_en_6min.ogg"


def decode(path) -> np.ndarray:
    return decode_audio(str(path))


def word(word: str, start: float, end: float, probability: float = 0.9) -> types.Word:
    return types.Word(start=start, end=end, word=word, probability=probability)


def segment(start: float, end: float, text: str, words: list[types.Word] | None = None,
            tokens: list[int] | None = None) -> types.Segment:
    return types.Segment(id=0, start=start, end=end, text=text, tokens=tokens or [], avg_logprob=-0.2,
                         no_speech_prob=0.01, compression_ratio=1.3, temperature=0.0, words=words)


def result_of(text: str, segments: list[types.Segment] | None = None, *, avg_logprob: float = -0.2,
           no_speech_prob: float = 0.01, compression_ratio: float = 1.3, temperature: float = 0.0,
           truncated: bool = False) -> request.Result:
    """A window's result with the verdict the engine would give it (`decoding.judge`)."""
    verdict = judge(text, avg_logprob, no_speech_prob, compression_ratio, truncated, DecodeOptions(), temperature)
    return request.Result(request_id="w", text=text, tokens=[], segments=segments or [], language="en",
                          avg_logprob=avg_logprob, no_speech_prob=no_speech_prob, compression_ratio=compression_ratio,
                          temperature=temperature, duration=1.0, truncated=truncated, verdict=verdict)


@pytest.fixture(scope="module")
def vad() -> SileroVAD:
    return SileroVAD()


@pytest.fixture(scope="module")
def jfk(jfk_path) -> np.ndarray:
    return decode(jfk_path)


@pytest.fixture(scope="module")
def long_audio(audio_dir) -> np.ndarray:
    return decode(audio_dir / LONG)


def sizes(kind: str, total: int, seed: int = 0):
    if kind == "random":
        rng = np.random.default_rng(seed)
        return rng.integers(1, 4000, size=total // 1000 + 1)
    return [{"20ms": 320, "100ms": 1600}[kind]]


def stream(session: Session, audio: np.ndarray, chunking: str = "20ms", close: bool = True) -> list:
    events, i, steps = [], 0, sizes(chunking, len(audio))
    for k in range(len(audio)):
        if i >= len(audio):
            break
        n = int(steps[k % len(steps)])
        events += session.feed(audio[i : i + n])
        i += n
    return events + (session.close() if close else [])


def windows(events, kind=None) -> list[SubmitWindow]:
    return [e for e in events if isinstance(e, SubmitWindow) and (kind is None or e.kind == kind)]


def signature(ws: list[SubmitWindow]) -> list[tuple]:
    return [(w.window_id, w.kind, w.start, len(w.audio), hash(w.audio.tobytes())) for w in ws]


def test_windows_do_not_depend_on_chunking(vad, jfk):
    runs = {c: stream(Session(StreamingConfig(), vad), jfk, c) for c in ("20ms", "100ms", "random")}
    reference = signature(windows(runs["20ms"]))
    assert len(windows(runs["20ms"], "final")) >= 1 and len(windows(runs["20ms"], "partial")) >= 5
    for events in runs.values():
        assert signature(windows(events)) == reference


def test_long_stream_finals_match_offline_cutting(vad, long_audio):
    """Live finals of the 6-minute file: chunking-independent, equal to the offline utterances
    (speech_segments), each at most max_utterance_s, and cut where prompts run past it."""
    config = StreamingConfig(partials=False)
    events = {c: stream(Session(config, vad), long_audio, c) for c in ("100ms", "random")}
    finals = {c: windows(e, "final") for c, e in events.items()}
    assert signature(finals["100ms"]) == signature(finals["random"])
    # A cut final has no speech_stopped, and the utterance that goes on no speech_started.
    started = {e.utterance_id for e in events["100ms"] if isinstance(e, SpeechStarted)}
    stopped = {e.utterance_id for e in events["100ms"] if isinstance(e, SpeechStopped)}
    cut = {w.utterance_id for w in finals["100ms"] if round(w.speech_end * SR) == round(w.start * SR) + len(w.audio)}
    assert len(cut) >= 4
    assert stopped == {w.utterance_id for w in finals["100ms"]} - cut
    assert started == {w.utterance_id for w in finals["100ms"]} - {i + 1 for i in cut}
    got = [(round(w.start * SR), round(w.start * SR) + len(w.audio)) for w in finals["100ms"]]
    assert got == speech_segments(long_audio, config.vad, vad)
    assert len(got) > 15  # 15 prompts, some longer than 28 s
    assert max(len(w.audio) for w in finals["100ms"]) <= config.vad.max_utterance_s * SR
    for w in finals["100ms"]:
        np.testing.assert_array_equal(w.audio, long_audio[round(w.start * SR) : round(w.start * SR) + len(w.audio)])


def test_partial_cadence(vad, jfk):
    for interval in (0.5, 1.0):
        events = stream(Session(StreamingConfig(partial_interval_s=interval), vad), jfk)
        step = -(-round(interval * SR) // FRAME) * FRAME  # the interval, rounded up to VAD frames
        for final in windows(events, "final"):
            partials = [w for w in windows(events, "partial") if w.utterance_id == final.utterance_id]
            assert partials, f"utterance {final.utterance_id} had no partial"
            assert all(p.start == final.start and p.prompt == final.prompt for p in partials)
            lengths = [len(p.audio) for p in partials]
            assert interval * SR <= lengths[0] < interval * SR + FRAME  # ends on a VAD frame
            assert all(b - a == step for a, b in zip(lengths, lengths[1:]))
            # Partials are the utterance so far: a prefix of it, up to the end of speech + silence.
            n = min(len(final.audio), lengths[-1])
            np.testing.assert_array_equal(partials[-1].audio[:n], final.audio[:n])
    assert windows(stream(Session(StreamingConfig(partials=False), vad), jfk), "partial") == []


@pytest.mark.parametrize("kind", ["zeros", "noise"])
def test_silence_and_noise_submit_nothing(vad, kind):
    rng = np.random.default_rng(1)
    n = SR * 20
    audio = np.zeros(n, np.float32) if kind == "zeros" else (0.1 * rng.standard_normal(n)).astype(np.float32)
    assert stream(Session(StreamingConfig(), vad), audio, "random") == []


def test_speech_events_bracket_each_final(vad, jfk):
    events = stream(Session(StreamingConfig(), vad), jfk, "100ms")
    kinds = [e.kind if isinstance(e, SubmitWindow) else type(e).__name__ for e in events]
    kinds = [k for k in kinds if k != "partial"]
    n = len(windows(events, "final"))
    # The last utterance runs to the end of the clip and is closed by close().
    assert kinds == ["SpeechStarted", "SpeechStopped", "final"] * n
    ids = [e.utterance_id for e in events if not (isinstance(e, SubmitWindow) and e.kind == "partial")]
    assert ids == [i for i in range(1, n + 1) for _ in range(3)]
    for e in events:
        if isinstance(e, SpeechStopped):
            (final,) = [w for w in windows(events, "final") if w.utterance_id == e.utterance_id]
            assert final.speech_end == e.t and final.start < e.t <= final.end  # before the end padding


def test_stale_partials_are_dropped_and_final_replaces_them(vad, jfk):
    session = Session(StreamingConfig(), vad)
    first_end = speech_segments(jfk, VADConfig(), vad)[0][1]
    events = stream(session, jfk[: first_end - SR // 2], close=False)  # mid-utterance
    partials = windows(events, "partial")
    assert len(partials) >= 3 and windows(events, "final") == []
    p1, p2, p3 = partials[-3:]
    (got,) = session.on_result(p2.window_id, result_of(" And so my fellow"))
    assert isinstance(got, Partial) and got.utterance_id == p2.utterance_id
    assert (got.text, got.stable, got.unstable) == ("And so my fellow", "", "And so my fellow")
    assert (got.start, got.end) == (pytest.approx(p2.start), pytest.approx(p2.end))
    assert session.on_result(p1.window_id, result_of(" And so")) == []  # older than one shown
    got = session.on_result(p3.window_id, result_of(" And so my fellow Americans"))
    assert [(e.stable, e.unstable) for e in got] == [("And so my fellow", " Americans")]
    assert session.on_result(p3.window_id, result_of(" And so my")) == []  # delivered already

    rest = stream(session, jfk[first_end - SR // 2 : first_end + SR], close=False)
    late = [w for w in windows(rest, "partial") if w.utterance_id == p1.utterance_id][-1]
    final = windows(rest, "final")[0]
    assert final.utterance_id == late.utterance_id == p1.utterance_id
    assert session.on_result(late.window_id, result_of(" And so my fellow Americans")) == []  # final submitted
    result = result_of(
        " And so, my fellow Americans,",
        segments=[segment(0.3, 2.0, " And so, my fellow Americans,", words=[word(" And", 0.3, 0.5), word(" Americans,", 1.4, 2.0)])],
    )
    (out,) = session.on_result(final.window_id, result)
    assert isinstance(out, Final) and out.text == "And so, my fellow Americans,"
    assert out.start == pytest.approx(final.start + 0.3) and out.end == pytest.approx(final.start + 2.0)
    expected = {"word": " Americans,", "start": pytest.approx(final.start + 1.4), "end": pytest.approx(final.start + 2.0), "probability": 0.9}
    assert out.words[1] == expected
    with pytest.raises(KeyError, match="no final window .* in flight"):
        session.on_result(final.window_id, result)  # delivered once


def utterance(session: Session, audio: np.ndarray) -> tuple[SubmitWindow, list[SubmitWindow]]:
    """Stream one utterance and a second of silence: its final window and its partial windows."""
    ws = windows(stream(session, np.concatenate([audio, np.zeros(SR, np.float32)]), close=False))
    (final,) = [w for w in ws if w.kind == "final"]
    return final, [w for w in ws if w.kind == "partial"]


def test_prompt_follows_finals_and_resets_after_hallucination(vad, jfk):
    clip = jfk[: speech_segments(jfk, VADConfig(), vad)[0][1]]  # "And so my fellow Americans"
    # Without acoustic context: with it, the finals inside a window's audio are its prefix, not prompt.
    session = Session(StreamingConfig(condition_on_previous=True, acoustic_context=False), vad)
    w1, _ = utterance(session, clip)
    assert w1.prompt is None
    assert len(session.on_result(w1.window_id, result_of(" And so my fellow Americans."))) == 1

    w2, partials = utterance(session, clip)
    assert w2.prompt == "And so my fellow Americans." and partials
    assert all(p.prompt == w2.prompt for p in partials)
    assert session.on_result(w2.window_id, result_of(" Americans.")) != []
    w3, _ = utterance(session, clip)
    assert w3.prompt == "And so my fellow Americans. Americans."

    # A loop (token limit, compressible) is shown (it has text and speech) but resets the prompt,
    # and the prompted window is to be decoded again without its prompt.
    loop = result_of(" Americans Americans Americans Americans", compression_ratio=3.1, truncated=True)
    assert session.retry_final(w3, loop).prompt is None
    assert [e.text for e in session.on_result(w3.window_id, loop)] == [loop.text.strip()]
    w4, _ = utterance(session, clip)
    assert w4.prompt is None
    assert session.retry_final(w4, loop) is None  # nothing to take away
    session.on_result(w4.window_id, result_of(" Good."))
    w5, _ = utterance(session, clip)
    assert w5.prompt == "Good."
    # A poor decode (low log-probability) is shown too, and also resets the prompt.
    assert session.on_result(w5.window_id, result_of(" Good.", avg_logprob=-1.2)) != []
    w6, _ = utterance(session, clip)
    assert w6.prompt is None
    # A phrase repeated back to back, short and ended by itself (gzip misses it): the same.
    session.on_result(w6.window_id, result_of(" Good."))
    w7, _ = utterance(session, clip)
    repeated = result_of(" Montreal forced a liner." * 3, compression_ratio=1.9)
    assert repeated.verdict.repetition and session.retry_final(w7, repeated) is not None
    session.on_result(w7.window_id, repeated)
    w8, _ = utterance(session, clip)
    assert w8.prompt is None
    # openai's rule: text from a retry hotter than 0.5 is shown but does not prompt.
    session.on_result(w8.window_id, result_of(" Good."))
    w9, _ = utterance(session, clip)
    assert session.on_result(w9.window_id, result_of(" Fine.", temperature=0.6)) != []
    w10, _ = utterance(session, clip)
    assert w10.prompt is None

    # Whisper's no-speech verdict: no Final at all; the text before it still prompts.
    session.on_result(w10.window_id, result_of(" Good."))
    w11, _ = utterance(session, clip)
    assert session.on_result(w11.window_id, result_of(" Thank you.", no_speech_prob=0.9, avg_logprob=-1.4)) == []
    w12, _ = utterance(session, clip)
    assert w12.prompt == "Good."
    assert session.on_result(w12.window_id, result_of("  ")) == []  # empty text: no Final either

    off = Session(StreamingConfig(condition_on_previous=False), vad)
    v1, _ = utterance(off, clip)
    off.on_result(v1.window_id, result_of(" And so my fellow Americans."))
    assert utterance(off, clip)[0].prompt is None


def test_prompt_is_bounded_opened_by_the_configured_prompt_and_dropped_after_a_pause(vad, jfk):
    clip = jfk[: speech_segments(jfk, VADConfig(), vad)[0][1]]
    config = StreamingConfig(condition_on_previous=True, prompt="Kennedy.", prompt_max_tokens=4,
                             prompt_reset_pause_s=5.0, acoustic_context=False)
    session = Session(config, vad)
    w1, _ = utterance(session, clip)
    assert w1.prompt == "Kennedy."  # the configured prompt opens the first one
    session.on_result(w1.window_id, result_of(" And so my fellow Americans."))
    w2, _ = utterance(session, clip)
    session.on_result(w2.window_id, result_of(" Ask not."))
    w3, _ = utterance(session, clip)
    assert w3.prompt == "Kennedy. Ask not."  # at most 4 x 6 characters of previous text
    session.on_result(w3.window_id, result_of(" Ask."))
    stream(session, np.zeros(6 * SR, np.float32), close=False)  # a 6-s pause
    w4, _ = utterance(session, clip)
    assert w4.prompt == "Kennedy."
    # A final submitted before the previous one's result came back gets its text on `reprompt`.
    w5, _ = utterance(session, clip)
    assert w5.prompt == "Kennedy."
    session.on_result(w4.window_id, result_of(" Ask."))
    assert session.reprompt(w5).prompt == "Kennedy. Ask."
    off = Session(StreamingConfig(condition_on_previous=False, prompt="Kennedy."), vad)
    v1, _ = utterance(off, clip)
    off.on_result(v1.window_id, result_of(" And so my fellow Americans."))
    assert utterance(off, clip)[0].prompt == "Kennedy."


def spoken(text: str, start: float, end: float, tokens: list[int], **kw) -> request.Result:
    return result_of(text, [segment(start, end, text, tokens=tokens)], **kw)


def test_acoustic_context_opens_a_final_with_the_previous_finals_and_keeps_only_its_own_text(vad, jfk):
    clip = jfk[: speech_segments(jfk, VADConfig(), vad)[0][1]]  # "And so my fellow Americans"
    session = Session(StreamingConfig(acoustic_context=True, partials=False), vad)
    assert session.serial  # a final waits for the previous one: its context holds it
    w1, _ = utterance(session, clip)
    assert w1.context_s == 0 and w1.context == () and w1.utterance_start == w1.start
    session.on_result(w1.window_id, spoken(" And so my fellow Americans.", 0.3, 2.0, [1, 2, 3]))

    w2, _ = utterance(session, clip)
    # The stream's audio from w1's start (w1, the silence after it), then the utterance's own.
    assert w2.start == w1.start and w2.context_s == pytest.approx(w2.utterance_start - w1.start)
    plain = Session(StreamingConfig(partials=False), vad)
    utterance(plain, clip)
    p2, _ = utterance(plain, clip)
    own = round(w2.context_s * SR)
    assert np.array_equal(w2.audio[:len(w1.audio)], w1.audio) and np.array_equal(w2.audio[own:], p2.audio)
    assert w2.utterance_start == pytest.approx(p2.start)
    assert len(w2.context) == 1 and w2.context[0][:2] == pytest.approx((0.3, 2.0))
    assert w2.context[0][2] == (1, 2, 3)
    # A segment that ends before the utterance's own audio transcribes the context: dropped.
    ctx = w2.context_s
    r2 = result_of(" Hmm. Ask not.", [segment(ctx - 1.0, ctx - 0.5, " Hmm.", tokens=[9]),
                                      segment(ctx + 0.2, ctx + 1.8, " Ask not.", tokens=[4, 5])])
    (f2,) = session.on_result(w2.window_id, r2)
    assert f2.text == "Ask not." and f2.start == pytest.approx(w2.utterance_start + 0.2)
    assert f2.end == pytest.approx(w2.utterance_start + 1.8)

    # Both finals, timestamps from the window's start, none after the utterance's own audio begins.
    w3, _ = utterance(session, clip)
    assert w3.start == w1.start and [c[2] for c in w3.context] == [(1, 2, 3), (4, 5)]
    assert w3.context[1][0] == pytest.approx(w2.utterance_start + 0.2 - w1.start)
    assert all(a <= b <= w3.context_s for a, b, _ in w3.context)
    # No new text under a forced prefix: decoded again in the same audio without the prefix, then
    # alone, where the silence rules judge it.
    nothing = result_of(" Hmm.", [segment(0.1, 0.4, " Hmm.", tokens=[9])])
    free = session.retry_final(w3, nothing)
    assert free.context == () and free.context_s == w3.context_s and np.array_equal(free.audio, w3.audio)
    assert free.start == w3.start and free.prompt == w3.prompt
    # Decoded freely, a segment that starts before the utterance's audio (past the slack) holds
    # the context's words: not the utterance's.
    c = free.context_s
    both = result_of(" Americans ask not. Ask not.", [segment(c - 1.5, c + 1.0, " Americans ask not.", tokens=[6]),
                                                     segment(c - 0.3, c + 1.8, " Ask not.", tokens=[4, 5])])
    assert [s.text for s in session.new_segments(free, both)] == [" Ask not."]
    alone = session.retry_final(free, nothing)
    assert alone.context_s == 0 and alone.context == () and alone.prompt is None
    assert alone.start == pytest.approx(w3.utterance_start) and len(alone.audio) == len(w3.audio) - round(w3.context_s * SR)
    assert session.retry_final(alone, nothing) is None  # nothing left to take away
    (f3,) = session.on_result(w3.window_id, spoken(" Americans.", 0.3, 1.5, [6]))
    assert f3.start == pytest.approx(alone.start + 0.3)  # times of the window decoded last

    # A final committed before the previous one's result came back gets it on `reprompt`.
    w4, _ = utterance(session, clip)
    w5, _ = utterance(session, clip)
    assert len(w5.context) == 3
    session.on_result(w4.window_id, spoken(" Fine.", w4.context_s + 0.3, w4.context_s + 1.0, [7]))
    w5 = session.reprompt(w5)
    assert len(w5.context) == 4 and w5.start == w1.start and w5.end - w5.start <= 24.0
    # A spoiled decode (a loop) is decoded alone, and no later final takes the context before it.
    loop = result_of(" Americans Americans Americans Americans", [segment(w5.context_s, w5.context_s + 2, " A", tokens=[8])],
                     compression_ratio=3.1, truncated=True)
    assert session.retry_final(w5, loop).context_s == 0
    session.on_result(w5.window_id, loop)
    w6, _ = utterance(session, clip)
    assert w6.context_s == 0
    session.on_result(w6.window_id, spoken(" Good.", w6.context_s + 0.3, w6.context_s + 1.0, [10]))
    w7, _ = utterance(session, clip)
    assert w7.start == w6.start and w7.context_s > 0
    session.forget(w7.window_id)  # failed: what it held is unknown
    assert utterance(session, clip)[0].context_s == 0

    # A pause of acoustic_context_pause_s ends the context; the window is bounded to 24 s.
    paused = Session(StreamingConfig(acoustic_context=True, acoustic_context_pause_s=3.0, partials=False), vad)
    v1, _ = utterance(paused, clip)
    paused.on_result(v1.window_id, spoken(" Americans.", 0.3, 1.5, [1]))
    stream(paused, np.zeros(3 * SR, np.float32), close=False)
    assert utterance(paused, clip)[0].context_s == 0
    # With conditioning too, each earlier final is either in the window (prefix) or in the prompt.
    bounded = Session(StreamingConfig(acoustic_context=True, condition_on_previous=True, partials=False), vad)
    for k in range(12):
        w, _ = utterance(bounded, clip)
        assert w.end - w.start <= 24.0
        assert len(w.context) + len((w.prompt or "").split()) == k
        bounded.on_result(w.window_id, spoken(" Americans.", w.context_s + 0.3, w.context_s + 1.5, [1]))
    assert w.context_s > 15 and w.prompt


def test_unstyled_text_is_judged_in_cased_scripts_only():
    from streamer.model.decoding import unstyled

    assert unstyled("and so am i fell america") and unstyled("ask not") and unstyled("привет мир")
    assert not unstyled("And so my fellow Americans.") and not unstyled("ask not.") and not unstyled("ask not, what")
    assert not unstyled("ask Not") and not unstyled("¿qué pasa")  # one mark of style is enough
    assert not unstyled("你好世界") and not unstyled("iphoneを買った")  # scripts without case, even mixed
    assert not unstyled("") and not unstyled("42")


def test_an_unstyled_final_is_neither_context_nor_prompt(vad, jfk):
    """tiny.en writes some 8-kHz finals lower case and unpunctuated; as a forced prefix or a prompt
    that register would carry on to every later final. Such a final goes out, but the next final
    has no acoustic context over its audio and no prompt of its text; the styled finals before it
    still prompt, and the chain of context starts again after it."""
    clip = jfk[: speech_segments(jfk, VADConfig(), vad)[0][1]]
    session = Session(StreamingConfig(acoustic_context=True, condition_on_previous=True, partials=False), vad)
    w1, _ = utterance(session, clip)
    session.on_result(w1.window_id, spoken(" And so my fellow Americans.", 0.3, 2.0, [1, 2]))
    w2, _ = utterance(session, clip)
    assert w2.context_s > 0 and len(w2.context) == 1
    (f2,) = session.on_result(w2.window_id, spoken(" ask not", w2.context_s + 0.2, w2.context_s + 1.0, [3]))
    assert f2.text == "ask not"  # shown as decoded
    w3, _ = utterance(session, clip)
    assert w3.context_s == 0 and w3.context == () and w3.prompt == "And so my fellow Americans."
    session.on_result(w3.window_id, spoken(" What your country can do.", 0.2, 1.5, [4]))
    w4, _ = utterance(session, clip)
    assert w4.start == w3.start and [c[2] for c in w4.context] == [(4,)]
    # Text without case is never judged by its style; a short styled final is context as any other.
    for text in (" 你好世界", " Okay."):
        session.on_result(w4.window_id, spoken(text, w4.context_s + 0.2, w4.context_s + 1.0, [5]))
        w5, _ = utterance(session, clip)
        assert w5.start == w3.start and [c[2] for c in w5.context][-1] == (5,)
        w4 = w5


def test_a_final_that_stops_early_is_continued_and_joined(vad, jfk):
    """Kennedy's whole sentence as one utterance (a long silence rule): a decode that stops after
    "... can do for you," leaves VAD speech out, so the rest is decoded as a continuation of the
    same final and joined to it."""
    long_pauses = VADConfig(min_silence_ms=1500)

    def utterance(session: Session, audio: np.ndarray) -> SubmitWindow:
        (final,) = windows(stream(session, np.concatenate([audio, np.zeros(2 * SR, np.float32)]), close=False))
        return final

    session = Session(StreamingConfig(partials=False, vad=long_pauses, acoustic_context=True), vad)
    w = utterance(session, jfk)
    assert w.context_s == 0 and w.end - w.start > 10
    first = result_of(" And so my fellow Americans, ask not what your country can do for you,",
                      [segment(0.3, 2.0, " And so my fellow Americans,", tokens=[1, 2, 3]),
                       segment(3.0, 7.5, " ask not what your country can do for you,", tokens=[4, 5, 6])])
    rest = session.continuation(w, first, 0)
    # With acoustic context: the final's own segments open the window as its forced prefix, and
    # the window ends where the final's does.
    assert rest.window_id == WindowId(w.utterance_id, "final", 1) and rest.kind == "final"
    assert rest.start == pytest.approx(w.start + 0.3) and rest.end == pytest.approx(w.end)
    assert np.array_equal(rest.audio, w.audio[round(0.3 * SR):])
    assert rest.utterance_start == pytest.approx(w.start + 7.5)
    assert [c[2] for c in rest.context] == [(1, 2, 3), (4, 5, 6)]
    assert rest.context[0][:2] == pytest.approx((0.0, 1.7)) and rest.context[1][:2] == pytest.approx((2.7, 7.2))
    # What follows the prefix is joined on: one result in the final's frame.
    ctx, tail = rest.context_s, w.end - rest.start
    more = result_of(" ask what you can do for your country.",
                     [segment(ctx + 0.3, tail - 0.4, " ask what you can do for your country.", tokens=[7, 8])])
    joined = session.join(w, first, rest, more)
    assert [s.id for s in joined.segments] == [0, 1, 2]
    assert joined.segments[2].start == pytest.approx(0.3 + ctx + 0.3)
    assert session.continuation(w, joined, 1) is None  # it reaches the end now
    assert session.continuation(w, first, 2) is None  # at most two continuations
    (final,) = session.on_result(w.window_id, joined)
    assert final.text == "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
    assert final.end == pytest.approx(w.end - 0.4) and final.start == pytest.approx(w.start + 0.3)

    # A continuation with no new text, or spoiled, is dropped.
    w2 = utterance(session, jfk)
    assert w2.context_s == 0  # two of them do not fit in a 24-s window
    rest2 = session.continuation(w2, first, 0)
    assert session.join(w2, first, rest2, result_of("", [])) is None
    loop = result_of(" country country country country", [segment(rest2.context_s, rest2.context_s + 2, " country", tokens=[8])],
                     compression_ratio=3.1, truncated=True)
    assert session.join(w2, first, rest2, loop) is None

    # Without acoustic context the rest is decoded alone.
    alone = Session(StreamingConfig(partials=False, vad=long_pauses, acoustic_context=False), vad)
    v = utterance(alone, jfk)
    rest = alone.continuation(v, first, 0)
    assert rest.context == () and rest.context_s == 0 and rest.start == pytest.approx(v.start + 7.5)
    assert np.array_equal(rest.audio, v.audio[round(7.5 * SR):])
    # Not continued: segments that reach the end; continuation turned off.
    whole = result_of(" And so ...", [segment(0.3, v.end - v.start - 0.5, " And so ...", tokens=[1])])
    assert alone.continuation(v, whole, 0) is None
    off = Session(StreamingConfig(partials=False, vad=long_pauses, continue_after_s=0), vad)
    assert off.continuation(utterance(off, jfk), first, 0) is None

    # Silence after the last segment is not words left out: a client's commit 3 s after speech.
    clip = jfk[: speech_segments(jfk, VADConfig(), vad)[0][1]]  # "And so my fellow Americans"
    manual = Session(StreamingConfig(partials=False, manual_commit=True), vad)
    stream(manual, np.concatenate([clip, np.zeros(3 * SR, np.float32)]), close=False)
    (m,) = windows(manual.flush())
    spoken_part = result_of(" And so my fellow Americans.", [segment(0.3, len(clip) / SR, " And so my fellow Americans.", tokens=[1])])
    assert m.end - (m.start + len(clip) / SR) > 2.5 and manual.continuation(m, spoken_part, 0) is None


def test_flush_and_close(vad, jfk):
    session = Session(StreamingConfig(), vad)
    half = 6 * SR  # inside "what your country can do for you" (5.2-7.8 s)
    events = stream(session, jfk[:half], close=False)
    assert windows(events, "final")  # the first half holds whole utterances too
    flushed = session.flush()
    assert isinstance(flushed[0], SpeechStopped) and flushed[0].t == pytest.approx(half / SR)
    (final,) = windows(flushed, "final")
    assert final.end == pytest.approx(half / SR) and final.speech_end == pytest.approx(half / SR)
    assert session.flush() == []  # nothing open now
    later = stream(session, jfk[half:], close=False)
    starts = [e for e in later if isinstance(e, SpeechStarted)]
    assert starts and starts[0].t * SR >= half  # what follows is a new utterance
    assert all(w.start * SR >= half for w in windows(later))
    assert windows(session.close(), "final")
    assert session.closed and session.close() == [] and session.flush() == []
    with pytest.raises(RuntimeError, match="session is closed"):
        session.feed(jfk[:320])
    assert session.stream_time == pytest.approx(len(jfk) / SR)


def test_window_limit_is_checked():
    with pytest.raises(ValueError, match="max_utterance_s=31.0 does not fit in a 30-s window"):
        Session(StreamingConfig(vad=VADConfig(max_utterance_s=31.0)), vad=None)


def test_wire_format():
    assert SpeechStarted(1.23456, 1).to_dict() == {"type": "speech_started", "t": 1.235, "utterance_id": 1}
    assert SpeechStopped(2.0, 1).to_dict() == {"type": "speech_stopped", "t": 2.0, "utterance_id": 1}
    p = Partial(3, "a b", "a", " b", 1.0, 2.0).to_dict()
    assert p == {"type": "partial", "utterance_id": 3, "text": "a b", "stable": "a", "unstable": " b", "start": 1.0, "end": 2.0}
    words = [{"word": " a", "start": 1.00049, "end": 1.5, "probability": 0.9}]
    f = Final(3, "a b", 1.0, 2.0, words, "en", 0.01, -0.2).to_dict()
    assert f["type"] == "final" and f["words"][0]["start"] == 1.0 and f["language"] == "en"
    assert set(f) == {"type", "utterance_id", "text", "start", "end", "words", "language", "no_speech_prob", "avg_logprob"}
    w = SubmitWindow(WindowId(1, "final"), np.zeros(SR, np.float32), 2.0, None)
    assert w.end == 3.0 and (w.kind, w.utterance_id) == ("final", 1) and not hasattr(w, "to_dict")
