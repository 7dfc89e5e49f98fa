"""The live policy (`streaming/live.py`) and the partial cadence, without sockets or an engine.

Real audio and the real silero VAD cut the utterances; the engine's answers are real
`engine.request.Result` values built here (text and verdict as the engine would judge them), so
that each rule can be driven into the order that tests it: results out of order, refusals,
failures, a client faster than real time.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamer.audio.decode import decode_audio
from streamer.audio.vad import SileroVAD
from streamer.config import StreamingConfig, VADConfig
from streamer.engine.request import Priority, Result
from streamer.model.decoding import DecodeOptions, judge
from streamer.streaming.cadence import CadenceConfig, PartialCadence
from streamer.streaming.events import Partial, SpeechStarted
from streamer.streaming.live import (FINAL_PATIENCE_S, Align, Cancel, Committed, Finalized, LiveOptions, LivePolicy,
                                     Observe, Retry, Submit)
from streamer.streaming.session import Session
from streamer.types import Segment, Word

SR = 16000
CHUNK = 320  # 20 ms


@pytest.fixture(scope="module")
def vad() -> SileroVAD:
    return SileroVAD()


@pytest.fixture(scope="module")
def speech(jfk_path) -> np.ndarray:
    """Two passes of the JFK recording with 2 s of silence between: several utterances."""
    jfk = decode_audio(jfk_path)
    return np.concatenate([jfk, np.zeros(2 * SR, np.float32), jfk, np.zeros(SR, np.float32)])


def result(text: str, duration: float = 3.0, start: float = 0.0) -> Result:
    seg = Segment(id=0, start=start, end=duration, text=" " + text, tokens=[1, 2, 3], avg_logprob=-0.2,
                  no_speech_prob=0.01, compression_ratio=1.3, temperature=0.0)
    verdict = judge(text, -0.2, 0.01, 1.3, False, DecodeOptions(), 0.0)
    return Result(request_id="w", text=text, tokens=[1, 2, 3], segments=[seg], language="en", avg_logprob=-0.2,
                  no_speech_prob=0.01, compression_ratio=1.3, temperature=0.0, duration=duration, verdict=verdict)


def policy(silero, cadence=None, **streaming) -> LivePolicy:
    # Acoustic context (on by default) makes a stream's finals wait for each other; the rules for
    # finals in the engine side by side are tested without it, context has its own test.
    streaming.setdefault("acoustic_context", False)
    session = Session(StreamingConfig(**streaming), silero)
    return LivePolicy(session, LiveOptions("en"), encode=lambda text: list(range(len(text.split()))),
                      max_new_tokens=224, cadence=cadence, timestamp_token=timestamp_token)


def timestamp_token(t: float) -> int:
    return TIMESTAMP_BEGIN + round(t / 0.02)


TIMESTAMP_BEGIN = 50364


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def drive(p: LivePolicy, audio: np.ndarray, *, pace: float = 1.0, answer=None, t0: float = 100.0):
    """Feed `audio` in 20-ms chunks at `pace` x real time; `answer(submit, now)` returns the
    actions of answering a Submit at once (or None to leave it in the engine). All actions."""
    out, now = [], t0
    for i in range(0, len(audio), CHUNK):
        now += CHUNK / SR / pace
        acts = p.feed(audio[i:i + CHUNK], now)
        out += acts
        while answer is not None and (subs := [a for a in acts if isinstance(a, Submit)]):
            acts = []
            for s in subs:
                acts += answer(s, now) or []
            out += acts
    return out, now


def test_one_partial_in_flight_and_none_beside_a_final(vad, speech):
    p = policy(vad)
    acts, now = drive(p, speech)  # nothing is answered: every window stays in the engine
    subs = of(acts, Submit)
    partials = [s for s in subs if s.priority is Priority.PARTIAL]
    finals = [s for s in subs if s.priority is Priority.FINAL]
    assert len(partials) == 1, "a second partial went in while the first was in the engine"
    assert len(finals) >= 2 and all(s.options.timestamps for s in finals)
    assert partials[0].options.temperatures == (0.0,) and partials[0].options.max_new_tokens < 224
    # Committed for every final, in order, and the partial of the first utterance was cancelled.
    assert [c.utterance_id for c in of(acts, Committed)] == [s.window.utterance_id for s in finals]
    assert Cancel(partials[0].job) in acts
    # Answer the newest final first: nothing is delivered until the oldest is in.
    assert of(p.on_result(finals[-1].job, result("second"), now), Finalized) == []
    done = []
    for s in finals[:-1]:
        done += of(p.on_result(s.job, result(f"u{s.window.utterance_id}"), now), Finalized)
    assert [f.utterance_id for f in done] == [s.window.utterance_id for s in finals]
    assert done[-1].final.text == "second" and p.pending_finals == 0


def test_newer_partial_replaces_the_waiting_one(vad, speech):
    p = policy(vad)
    first = None

    def answer(s, now):
        nonlocal first
        if s.priority is Priority.PARTIAL and first is None:
            first = s  # keep the first partial in the engine for a while
            return None
        return p.on_result(s.job, result("hello"), now) if s.priority is Priority.PARTIAL else None

    acts, now = drive(p, speech[int(7.9 * SR):int(10.6 * SR)], answer=answer)  # one utterance, still open
    assert first is not None and len(of(acts, Submit)) == 1 and not of(acts, Committed)
    # Its result releases the newest waiting window, not one of the older ones.
    nxt = of(p.on_result(first.job, result("hello"), now), Submit)
    assert len(nxt) == 1 and nxt[0].window.kind == "partial"
    assert len(nxt[0].window.audio) > len(first.window.audio) + SR  # the newest, not the next one
    assert any(isinstance(a, Partial) for a in p.on_result(nxt[0].job, result("hello there"), now))


def test_partials_follow_the_shared_cadence_in_wall_time(vad, speech):
    cadence = PartialCadence(CadenceConfig(min_interval_s=0.5, max_interval_s=4.0, final_budget_s=0.3))
    answered = lambda s, now: p.on_result(s.job, result("so far"), now) if s.priority is Priority.PARTIAL else None
    p = policy(vad, cadence)
    acts, _ = drive(p, speech[: 11 * SR], answer=answered)
    gaps = [o.value for o in of(acts, Observe) if o.metric == "partial_interval"]
    assert gaps and min(gaps) >= 0.5 - 1e-6
    # Finals far over budget widen the cadence; partials then come that far apart.
    for k in range(8):
        cadence.observe_final(1.0, 150.0 + 0.6 * k)
    assert cadence.interval(155.0) == 4.0
    # (A long period, so that it stays wide while no final is answered below.)
    cadence = PartialCadence(CadenceConfig(max_interval_s=4.0, widen=8.0, period_s=100.0))
    cadence.observe_final(1.0, 55.0)
    cadence.observe_final(1.0, 155.0)
    assert cadence.interval(155.0) == 4.0
    p = policy(vad, cadence)
    acts, _ = drive(p, speech[: 11 * SR], answer=answered, t0=155.0)
    gaps = [o.value for o in of(acts, Observe) if o.metric == "partial_interval"]
    assert len(of(acts, Submit)) >= 2 and all(g >= 4.0 - 1e-6 for g in gaps)


def test_a_fast_sender_gets_future_deadlines_and_no_more_partials(vad, speech):
    cadence = PartialCadence(CadenceConfig(min_interval_s=0.5))
    answered = lambda s, now: p.on_result(s.job, result("x"), now) if s.priority is Priority.PARTIAL else None
    p = policy(vad, cadence)
    acts, end = drive(p, speech, pace=10.0, answer=answered)
    subs = of(acts, Submit)
    wall = end - 100.0
    # At 10x its audio time runs ahead of the wall clock: its windows are due later than now.
    finals = [s for s in subs if s.priority is Priority.FINAL]
    assert finals and finals[-1].deadline > end + 5.0
    partials = [s for s in subs if s.priority is Priority.PARTIAL]
    assert len(partials) <= wall / 0.5 + 1, "a fast sender got more partials per second than the cadence"


def test_refused_final_is_retried_then_fails_and_later_ones_go_on(vad, speech):
    p = policy(vad, partials=False)
    at = {}
    acts, now = drive(p, speech, answer=lambda s, now: at.setdefault(s.job, now) and None)
    finals = of(acts, Submit)
    assert len(finals) >= 2
    first = finals[0]
    now = at[first.job]
    retry = p.on_refused(first.job, now)
    assert retry == [Retry(first.job, pytest.approx(now + 0.05))]
    again = p.retry(first.job, now + 0.05)
    assert len(again) == 1 and isinstance(again[0], Submit) and again[0].job == first.job
    # Refused until its patience runs out: it fails with `overloaded`, and the next is delivered.
    p.on_result(finals[1].job, result("next"), now)
    late = p.on_refused(first.job, now + FINAL_PATIENCE_S + 1)
    done = of(late, Finalized)
    assert [d.error_code for d in done[:2]] == ["overloaded", None] and done[1].final.text == "next"


def test_failure_of_a_final_is_reported_in_order(vad, speech):
    p = policy(vad, partials=False)
    acts, now = drive(p, speech)
    a, b = of(acts, Submit)[:2]
    assert of(p.on_result(b.job, result("b"), now), Finalized) == []
    done = of(p.on_failure(a.job, "engine_unavailable", "core 0 stopped", now), Finalized)
    assert [(d.error_code, d.final is None) for d in done] == [("engine_unavailable", True), (None, False)]


def test_conditioning_submits_a_final_after_the_previous_is_in(vad, speech):
    p = policy(vad, partials=False, condition_on_previous=True)
    acts, now = drive(p, speech)
    commits = of(acts, Committed)
    subs = of(acts, Submit)
    assert len(commits) >= 2 and len(subs) == 1, "a conditioned final went in before the previous one was in"
    nxt = of(p.on_result(subs[0].job, result("And so my fellow Americans"), now), Submit)
    assert len(nxt) == 1 and nxt[0].window.prompt.endswith("And so my fellow Americans")
    assert nxt[0].options.prompt_tokens


def test_acoustic_context_forces_the_previous_finals_as_the_prefix(vad, speech):
    p = policy(vad, partials=False, acoustic_context=True)
    acts, now = drive(p, speech)
    commits, subs = of(acts, Committed), of(acts, Submit)
    assert len(commits) >= 2 and len(subs) == 1, "a final with context went in before the previous one was in"
    first = subs[0]
    assert first.window.context_s == 0 and first.options.prefix_tokens is None
    out = p.on_result(first.job, result("And so my fellow Americans", 1.5, 0.5), now)
    (second,) = of(out, Submit)
    w = second.window
    assert w.start == first.window.start and w.context_s > 0
    assert commits[1].start == pytest.approx(w.utterance_start)  # the utterance's own audio, not its context
    # The first final as Whisper writes a segment: <|0.50|> text <|1.50|>, in the window's frame.
    assert second.options.prefix_tokens == (timestamp_token(0.5), 1, 2, 3, timestamp_token(1.5))
    assert second.options.timestamps and second.options.prompt_tokens is None
    # Only what follows the prefix is the final; its duration is the utterance's own audio.
    done = of(p.on_result(second.job, result("ask not", w.context_s + 2.0, w.context_s + 0.2), now), Finalized)
    assert done[0].final.text == "ask not" and done[0].final.start == pytest.approx(w.utterance_start + 0.2)
    assert done[0].duration == pytest.approx(w.end - w.utterance_start)
    with pytest.raises(ValueError, match="timestamp_token"):
        LivePolicy(Session(StreamingConfig(acoustic_context=True), vad), LiveOptions("en"), encode=len, max_new_tokens=224)


def test_a_final_that_stops_early_is_continued_before_it_goes_out(vad, jfk_path):
    """Kennedy's sentence as one utterance: a decode that ends 4 s before the window does, with
    speech there, is continued (its own segment as the prefix), and one final goes out joined;
    word timings cover the whole; a lost continuation leaves the final as it was."""
    jfk = decode_audio(jfk_path)
    audio = np.concatenate([jfk, np.zeros(3 * SR, np.float32)])
    for words, lost in [(False, False), (True, False), (False, True)]:
        p = policy(vad, partials=False, acoustic_context=True, vad=VADConfig(min_silence_ms=1500))
        p.options.word_timestamps = words
        acts, now = drive(p, audio)
        (first,) = of(acts, Submit)
        w = first.window
        assert w.end - w.start > 10
        out = p.on_result(first.job, result("And so my fellow Americans, ask not", 6.0, 0.3), now)
        (rest,) = of(out, Submit)
        assert rest.job != first.job and rest.priority is Priority.FINAL and rest.window.window_id.seq == 1
        assert rest.window.start == pytest.approx(w.start + 0.3) and rest.window.end == pytest.approx(w.end)
        assert rest.options.prefix_tokens == (timestamp_token(0.0), 1, 2, 3, timestamp_token(5.7))
        assert rest.options.timestamps and not of(out, Finalized)
        if lost:
            (done,) = of(p.on_failure(rest.job, "engine_unavailable", "core gone", now), Finalized)
            assert done.error is None and done.final.text == "And so my fellow Americans, ask not"
            continue
        tail = rest.window.end - rest.window.start
        out = p.on_result(rest.job, result("what your country can do for you.", tail - 0.3, 5.7), now)
        if words:
            (align,) = of(out, Align)
            assert align.window is w and [s.end for s in align.segments] == pytest.approx([6.0, w.end - w.start - 0.3])
            for s in align.segments:
                s.words = [Word(start=s.start, end=s.end, word=s.text, probability=0.9)]
            out = p.on_aligned(align.job, now)
        (done,) = of(out, Finalized)
        assert done.final.text == "And so my fellow Americans, ask not what your country can do for you."
        assert done.final.end == pytest.approx(w.end - 0.3) and p.pending_finals == 0
        assert not words or [x["start"] for x in done.final.words] == pytest.approx([w.start + 0.3, w.start + 6.0])


def test_drop_open_abandons_the_utterance(vad, speech):
    p = policy(vad)
    acts, now = drive(p, speech[: int(2.5 * SR)])
    assert of(acts, SpeechStarted)
    dropped = p.drop_open(now)
    assert not of(dropped, Committed) and not of(dropped, Submit) and p.pending_finals == 0


def test_abort_cancels_everything_in_the_engine(vad, speech):
    p = policy(vad)
    acts, now = drive(p, speech)
    # Nothing was answered: every submitted job is still in the engine (a cancelled partial until
    # its `Cancelled` comes back), and abort withdraws each.
    assert {c.job for c in p.abort()} == {s.job for s in of(acts, Submit)} and p.pending_finals == 0


def test_cadence_widens_under_load_and_narrows_when_quiet():
    c = PartialCadence(CadenceConfig(min_interval_s=0.5, max_interval_s=4.0, final_budget_s=0.3, period_s=0.5))
    assert c.interval(0.0) == 0.5
    t = 0.0
    for _ in range(10):  # p90 over budget every period
        for k in range(10):
            c.observe_final(0.2 if k < 5 else 0.5, t)
        t += 0.5
    assert c.interval(t) == 4.0 and c.widened >= 5
    # Periods without a final hold the interval (a few streams leave most periods empty)...
    for _ in range(3):
        t += 0.5
        assert c.interval(t) == 4.0
    # ... until `quiet_periods` of them in a row; fast finals narrow it at once.
    t += 0.5
    assert c.interval(t) < 4.0
    for _ in range(40):  # quiet: back to the minimum, never under it
        c.observe_final(0.05, t)
        t += 0.5
    assert c.interval(t) == 0.5
    # Between half the budget and the budget nothing changes.
    c = PartialCadence(CadenceConfig(final_budget_s=0.3))
    c.observe_final(1.0, 0.0)
    c.observe_final(1.0, 0.6)
    c.interval(1.2)
    held = c.interval(1.2)
    for k in range(6):
        c.observe_final(0.25, 1.3 + 0.5 * k)
    assert c.interval(5.0) == held
    with pytest.raises(ValueError, match="min_interval_s"):
        CadenceConfig(min_interval_s=2.0, max_interval_s=1.0)
