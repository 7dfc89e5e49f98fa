"""Long-form transcription: the cutting and seeking rules on their own, then both modes through a
real tiny.en engine on real recordings joined into a minute of speech."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path

import jiwer
import numpy as np
import pytest
from whisper_normalizer.english import EnglishTextNormalizer

from streamer.audio.decode import decode_audio
from streamer.config import EngineConfig
from streamer.engine.engine import Engine
from streamer.engine.request import SAMPLE_RATE
from streamer.longform import Transcript, TranscriptSegment, transcribe_long
from streamer.longform.accurate import complete_segments, cut_at_skipped_speech, echoes, segment_pieces
from streamer.longform.fast import plan_windows
from streamer.longform.formats import render, to_srt, to_verbose_json, to_vtt
from streamer.longform.speech import PADDING_SAMPLES, TAIL_S, left_out, next_stretch, open_after, speech_seconds
from streamer.longform.transcript import Window
from streamer.model.weights import load_model
from streamer.types import Word

normalize = EnglishTextNormalizer()
GAP_S = 0.5
"""Pause between joined prompts, as in the shared 6-minute recording."""


def wer(reference: str, hypothesis: str) -> float:
    return jiwer.wer(normalize(reference), normalize(hypothesis))


# --- accurate: which segments a window keeps, and where the seek goes -----------------------------------

@pytest.fixture(scope="module")
def tok():
    return load_model("tiny.en").tokenizer


def ts(tok, seconds: float) -> int:
    return tok.timestamp_begin + round(seconds / 0.02)


def test_complete_segments_drop_text_cut_by_the_window_edge(tok):
    a, b = tok.encode(" Hello there."), tok.encode(" And then")
    tokens = [ts(tok, 0), *a, ts(tok, 2.5), ts(tok, 2.5), *b]  # the second segment never closes
    spans, advance, consumed = complete_segments(tokens, tok, 30.0)
    assert spans == [(0.0, 2.5, a)]
    assert advance == pytest.approx(2.5)
    assert consumed == len(a) + 2  # the next window's prompt gets the kept segment, timestamps included


def test_complete_segments_keep_a_single_timestamp_ending_and_consume_the_window(tok):
    a, b = tok.encode(" One."), tok.encode(" Two.")
    tokens = [ts(tok, 0.4), *a, ts(tok, 1.0), ts(tok, 1.2), *b, ts(tok, 3.0)]
    spans, advance, consumed = complete_segments(tokens, tok, 12.0)
    assert spans == [(0.4, 1.0, a), (1.2, 3.0, b)]
    assert advance == 12.0 and consumed == len(tokens)


def test_complete_segments_without_pairs_take_the_whole_window(tok):
    a = tok.encode(" Only text.")
    assert complete_segments([ts(tok, 0.0), *a, ts(tok, 4.0)], tok, 9.0) == ([(0.0, 4.0, a)], 9.0, len(a) + 2)
    assert complete_segments([ts(tok, 0.0), *a], tok, 9.0) == ([(0.0, 9.0, a)], 9.0, len(a) + 1)


def test_a_window_is_cut_where_the_model_skipped_speech_between_segments(tok):
    """"Comedian Mail. Mailbox?" (7-9.5 s into the window) was skipped between two segments on a
    messy join: the seek stops before the gap so that the next window starts on it."""
    s = SAMPLE_RATE
    a, b = tok.encode(" Something is terribly wrong."), tok.encode(" After the tone, say your message.")
    tokens = [ts(tok, 0.0), *a, ts(tok, 6.0), ts(tok, 14.0), *b, ts(tok, 26.0)]
    pieces, advance = segment_pieces(tokens, tok, 30.0)
    assert [p[:3] for p in pieces] == [(0.0, 6.0, a), (14.0, 26.0, b)] and advance == 30.0
    start = 400 * s
    skipped = [(start, start + 3 * s), (start + 7 * s, start + 9 * s + s // 2), (start + 20 * s, start + 26 * s)]
    keep = cut_at_skipped_speech(pieces, skipped, start, tok)
    assert keep == 1 and pieces[keep - 1][1] == 6.0 and pieces[keep - 1][3] == len(a) + 2  # prompt: the kept segment
    heard_all = [(start, start + 3 * s), (start + 20 * s, start + 26 * s)]
    assert cut_at_skipped_speech(pieces, heard_all, start, tok) is None  # a pause between segments
    padding = [(start, start + 6 * s + s // 4), (start + 14 * s - s // 4, start + 26 * s)]
    assert cut_at_skipped_speech(pieces, padding, start, tok) is None  # VAD padding is not skipped speech
    # A segment over audio the VAD hears nothing in (invented text in a noise gap) does not count as
    # the far side of a gap.
    assert cut_at_skipped_speech(pieces, [(start, start + 3 * s), (start + 7 * s, start + 9 * s)], start, tok) is None


def test_a_window_that_opens_with_the_previous_segment_echoes_its_prompt(tok):
    """base on a messy Spanish join wrote the prompt's last sentence again over the next speech."""
    previous = " Por favor ingrese su contraseña de nuevo y presione la tecla de número."
    again = [ts(tok, 0.0), *tok.encode(" por favor, ingrese su contraseña de nuevo y presione la tecla de número"), ts(tok, 4.0)]
    other = [ts(tok, 0.0), *tok.encode(" Por favor espere mientras enlazo su llamada."), ts(tok, 3.0)]
    assert echoes(previous, again, tok)
    assert not echoes(previous, other, tok)
    assert not echoes(" Press 1.", [ts(tok, 0.0), *tok.encode(" Press 1. Press 2."), ts(tok, 2.0)], tok)  # too short to tell
    assert not echoes("", other, tok)


# --- fast: where the windows go --------------------------------------------------------------------------

def test_windows_pack_speech_up_to_30_s_and_cut_only_in_pauses():
    s = SAMPLE_RATE
    speech = [(1 * s, 10 * s), (11 * s, 25 * s), (26 * s, 40 * s), (41 * s, 69 * s), (70 * s, 71 * s)]
    windows = plan_windows(speech, 80 * s)
    assert windows == [(1 * s, 25 * s), (26 * s, 40 * s), (41 * s, 71 * s)]
    assert plan_windows([(2 * s, 3 * s)], 20 * s) == [(0, 20 * s)]  # up to 30 s: one window, whole
    assert plan_windows([], 20 * s) == [] and plan_windows([], 90 * s) == []


def test_left_out_speech_is_found_after_the_last_segment():
    s = SAMPLE_RATE
    window = Window(start=10 * s, length=20 * s)
    window.segments = [TranscriptSegment(0, 1000, 11.0, 24.0, " text", [1], -0.1, 1.0, 0.0, 0.0)]
    assert speech_seconds([(9 * s, 12 * s), (20 * s, 26 * s), (29 * s, 40 * s)], 10 * s, 30 * s) == 2 + 6 + 1
    assert left_out([(11 * s, 24 * s + s // 4)], window) is None  # padding after the last words
    assert left_out([(11 * s, 24 * s), (25 * s, 29 * s)], window) == 24 * s  # a sentence the model skipped
    assert left_out([(11 * s, 29 * s)], Window(start=10 * s, length=20 * s)) is None  # nothing decoded


def test_the_next_window_opens_on_speech_not_on_a_stretch_end_padding():
    s = SAMPLE_RATE
    speech = [(0, 13 * s), (24 * s, 30 * s)]
    assert next_stretch(speech, 0, 5 * s) == 0  # inside the first stretch's speech
    assert next_stretch(speech, 0, 13 * s - PADDING_SAMPLES - 1) == 0
    # 8 ms before its end only padding is left (the 11-s pause would open the window): the next one
    assert next_stretch(speech, 0, 13 * s - s // 125) == 1
    assert next_stretch(speech, 0, 30 * s) == 2


def test_a_stretch_cut_inside_speech_keeps_its_last_samples(audio_dir):
    """The VAD cuts speech longer than 28 s at its quietest point: the next stretch begins where
    the cut one ends, and no padding was added there. In the 6-minute recording one such cut falls
    at 167.872 s; a seek 32 ms before it stays in the cut stretch (the padding rule had moved the
    window on into the next one)."""
    from streamer.longform.speech import find_speech

    speech = find_speech(decode_audio(str(audio_dir / "long" / "asterisk_en_6min.ogg")))
    cuts = [i for i in range(len(speech) - 1) if speech[i + 1][0] == speech[i][1]]
    assert cuts, speech
    for i in cuts:
        assert next_stretch(speech, i, speech[i][1] - SAMPLE_RATE * 32 // 1000) == i
        assert next_stretch(speech, i, speech[i][1]) == i + 1
    # A stretch that ends on a pause still gives up its padding.
    ended = next(i for i in range(len(speech) - 1) if speech[i + 1][0] > speech[i][1])
    assert next_stretch(speech, ended, speech[ended][1] - PADDING_SAMPLES // 2) == ended + 1



def test_a_window_does_not_open_on_a_segments_tail_before_a_long_pause():
    s = SAMPLE_RATE
    speech = [(0, 13 * s), (24 * s, 30 * s)]
    assert open_after(speech, 12 * s) == 13 * s  # 1 s of tail, then 11 s of pause: past the stretch
    assert open_after(speech, 13 * s - round(TAIL_S * s) - 1) == 13 * s - round(TAIL_S * s) - 1  # speech left
    assert open_after(speech, 18 * s) == 18 * s  # in a pause already: next_stretch moves on
    assert open_after(speech, 29 * s) == 30 * s  # the last stretch: nothing follows
    assert open_after([(0, 13 * s), (13 * s + s // 2, 20 * s)], 12 * s) == 12 * s  # a short pause: the model copes
    assert open_after([(0, 13 * s), (13 * s, 20 * s)], 12 * s) == 12 * s  # a cut inside speech: its end is speech


def test_a_window_opened_on_a_tail_writes_the_next_speech_early_and_open_after_avoids_it(manifest, engine):
    """Two real prompts 9.6 s apart under a low noise floor, real VAD, real tiny.en. A window opened
    on the first prompt's last half second writes the second prompt from 0 s, over the pause (the
    first timestamp may not come after 1 s): on the messy Spanish join the next window then wrote
    it again where it was spoken. `open_after` opens the window on the second prompt instead."""
    from streamer.engine.request import DecodeOptions
    from streamer.longform.decode import decode_window
    from streamer.longform.speech import find_speech

    rows = {Path(r["audio"]).name: r for r in manifest if "/en/asterisk/" in r["audio"]}
    first = decode_audio(rows["agent-alreadyon.ogg"]["audio"])
    second = decode_audio(rows["conf-noempty.ogg"]["audio"])
    s = SAMPLE_RATE
    audio = np.concatenate([np.zeros(s // 2, np.float32), first, np.zeros(int(9.6 * s), np.float32), second,
                            np.zeros(s, np.float32)])
    audio += (np.random.default_rng(0).standard_normal(len(audio)) * 0.002).astype(np.float32)
    speech = find_speech(audio)
    assert len(speech) == 2 and speech[1][0] - speech[0][1] > 9 * s, speech
    tail = speech[0][1] - s // 2
    opened = open_after(speech, tail)
    assert opened == speech[0][1] and next_stretch(speech, 0, opened) == 1

    async def first_segment(start: int):
        options = DecodeOptions(language="en", timestamps=True, beam_size=5)
        result = await decode_window(engine, audio[start:start + 30 * s], options, started=False)
        return start / s + result.segments[0].start, result.segments[0].text

    early, text = asyncio.run(first_segment(tail))
    assert "conferences" in text and early < speech[1][0] / s - 5  # seconds before it is spoken
    on_time, text = asyncio.run(first_segment(speech[1][0]))
    assert "conferences" in text and abs(on_time - speech[1][0] / s) < 1.0

# --- formats ---------------------------------------------------------------------------------------------

def transcript() -> Transcript:
    words = [Word(0.5, 0.9, " Hello", 0.9), Word(0.9, 1.4, " world.", 0.8)]
    segments = [TranscriptSegment(0, 0, 0.5, 1.4, " Hello world.", [1, 2], -0.2, 1.1, 0.01, 0.0, words),
                TranscriptSegment(1, 140, 3661.25, 3663.0, " Second --> cue.", [3], -0.3, 1.2, 0.02, 0.2, [])]
    return Transcript(text="Hello world. Second --> cue.", language="en", duration=3663.5, segments=segments)


def test_subtitles_have_numbered_cues_with_exact_clock_times():
    assert to_srt(transcript()) == ("1\n00:00:00,500 --> 00:00:01,400\nHello world.\n\n"
                                    "2\n01:01:01,250 --> 01:01:03,000\nSecond -> cue.\n")
    assert to_vtt(transcript()) == ("WEBVTT\n\n00:00:00.500 --> 00:00:01.400\nHello world.\n\n"
                                    "01:01:01.250 --> 01:01:03.000\nSecond --&gt; cue.\n")


MARKUP = [TranscriptSegment(0, 0, 0.0, 1.0, " Tom & Jerry <i>live</i>", [1], -0.2, 1.1, 0.01, 0.0, []),
          TranscriptSegment(1, 0, 1.0, 2.5, "  two\n\nlines --> one ", [2], -0.2, 1.1, 0.01, 0.0, []),
          TranscriptSegment(2, 0, 2.5, 3.0, "   ", [3], -0.2, 1.1, 0.01, 0.0, [])]


def test_vtt_escapes_cue_markup_and_a_cue_stays_one_line():
    """WebVTT cue text is markup: a transcript's &, < and > must not open entities or tags; a blank
    line would end a cue early; an empty segment is no cue."""
    t = Transcript(text="", language="en", duration=3.0, segments=MARKUP)
    assert to_vtt(t) == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nTom &amp; Jerry &lt;i&gt;live&lt;/i&gt;\n\n"
                         "00:00:01.000 --> 00:00:02.500\ntwo lines --&gt; one\n")
    assert to_srt(t).split("\n\n")[1] == "2\n00:00:01,000 --> 00:00:02,500\ntwo lines -> one\n"


def test_the_web_page_writes_the_same_subtitles():
    """streamer/web/subtitles.js renders verbose_json segments as formats.py renders the transcript."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (make node)")
    module = Path(__file__).resolve().parents[1] / "streamer" / "web" / "subtitles.js"
    segments = [{"start": s.start, "end": s.end, "text": s.text} for s in MARKUP]
    script = (f"import {{ toSrt, toVtt }} from {json.dumps(module.as_uri())};"
              f"const s = {json.dumps(segments)}; process.stdout.write(JSON.stringify([toSrt(s), toVtt(s)]));")
    out = subprocess.run([node, "--input-type=module", "-e", script], check=True, capture_output=True, text=True)
    t = Transcript(text="", language="en", duration=3.0, segments=MARKUP)
    assert json.loads(out.stdout) == [to_srt(t), to_vtt(t)]


def test_verbose_json_has_openai_fields():
    body = to_verbose_json(transcript(), words=True)
    assert body["language"] == "english" and body["task"] == "transcribe" and body["duration"] == 3663.5
    assert set(body["segments"][0]) == {"id", "seek", "start", "end", "text", "tokens", "temperature",
                                        "avg_logprob", "compression_ratio", "no_speech_prob"}
    assert body["words"] == [{"word": "Hello", "start": 0.5, "end": 0.9}, {"word": "world.", "start": 0.9, "end": 1.4}]
    assert "segments" not in to_verbose_json(transcript(), segments=False, words=True)
    assert render(transcript(), "json") == {"text": "Hello world. Second --> cue."}
    with pytest.raises(ValueError, match="response_format must be one of json, text, srt, verbose_json, vtt, not 'docx'"):
        render(transcript(), "docx")


# --- both modes on real speech ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def minute(manifest):
    """Six English prompts of 8-14 s joined with 0.5-s pauses: about a minute, so several windows."""
    rows = [r for r in manifest if r["language"] == "en" and "/asterisk/" in r["audio"] and 8 <= r["duration"] <= 14]
    rows = sorted(rows, key=lambda r: r["audio"])[:6]
    gap = np.zeros(int(GAP_S * SAMPLE_RATE), np.float32)
    parts = []
    for r in rows:
        parts += [decode_audio(r["audio"]), gap]
    return np.concatenate(parts), " ".join(r["text"] for r in rows)


@pytest.fixture(scope="module")
def engine():
    engine = Engine(load_model("tiny.en"))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def both(engine, minute):
    """Both modes on the minute at once (the accurate chain and the fast windows share engine
    steps), with what each reported on the way: {mode: (transcript, progress, streamed segments)}."""
    audio, _ = minute
    out = {}

    async def one(mode):
        progress, streamed = [], []
        t = await transcribe_long(engine, audio, mode=mode, on_progress=progress.append,
                                  on_segments=lambda segs: streamed.extend(segs))
        out[mode] = (t, progress, streamed)

    async def run():
        await asyncio.gather(one("fast"), one("accurate"))

    asyncio.run(run())
    return out


@pytest.mark.parametrize("mode", ["fast", "accurate"])
def test_a_minute_of_speech_is_transcribed_in_order_with_progress(both, minute, mode):
    audio, reference = minute
    t, progress, streamed = both[mode]
    for prev, cur in zip(t.segments, t.segments[1:]):
        assert prev.end <= cur.start
    assert all(0 <= s.start < s.end <= t.duration for s in t.segments)
    assert [s.id for s in t.segments] == list(range(len(t.segments)))
    assert t.text == "".join(s.text for s in t.segments).strip()
    assert t.language == "en" and t.duration == pytest.approx(len(audio) / SAMPLE_RATE, abs=1e-3)
    assert wer(reference, t.text) < 0.12, t.text
    assert progress == sorted(progress) and progress[-1] == 1.0 and len(progress) >= 3
    assert streamed == t.segments  # streamed in order, each segment once


def test_accurate_is_not_worse_than_fast_here(both, minute):
    _, reference = minute
    assert wer(reference, both["accurate"][0].text) <= wer(reference, both["fast"][0].text) + 0.02


@pytest.mark.parametrize("mode", ["fast", "accurate"])
def test_word_timestamps_cover_every_word_in_order(engine, minute, mode):
    audio, _ = minute
    t = asyncio.run(transcribe_long(engine, audio[: 40 * SAMPLE_RATE], mode=mode, word_timestamps=True))
    words = t.words
    assert [w.word.strip() for w in words] == re.findall(r"\S+", t.text)
    for prev, cur in zip(words, words[1:]):
        assert prev.end <= cur.start + 1e-9
    for seg in t.segments:
        assert all(seg.start <= w.start <= w.end <= seg.end for w in seg.words)


@pytest.mark.parametrize("mode", ["fast", "accurate"])
def test_silence_gives_an_empty_transcript(engine, mode):
    for seconds in (5, 45):
        t = asyncio.run(transcribe_long(engine, np.zeros(seconds * SAMPLE_RATE, np.float32), mode=mode))
        assert t.text == "" and t.segments == []


def test_a_recording_waits_for_queue_room_instead_of_failing(minute):
    """More windows than the queue holds: the recording under way waits, and completes."""
    audio, reference = minute
    small = Engine(load_model("tiny.en"), EngineConfig(max_queue=2))
    try:
        t = asyncio.run(transcribe_long(small, audio, mode="fast"))
    finally:
        small.close()
    assert wer(reference, t.text) < 0.12


def test_the_plain_chain_cuts_its_windows_as_openai_does(engine, minute, monkeypatch):
    """`_sequential(by_speech=False)` (session 16; the backbone of accurate's vote since session 18):
    the first window opens at 0 s, not on the first speech, and each next one where openai/whisper
    seeks, at the end of the window's last complete segment (or 30 s on), never moved to the VAD's
    speech onsets; its text is as good as the chain cut by the VAD."""
    from streamer.engine.request import DecodeOptions
    from streamer.longform import accurate
    from streamer.longform.speech import find_speech

    audio, reference = minute
    audio = np.concatenate([np.zeros(2 * SAMPLE_RATE, np.float32), audio])  # the speech starts at 2 s
    speech = find_speech(audio)
    decoded: dict[int, tuple[float, list[int], bool]] = {}  # window start -> (seconds, tokens, silent): the last decode
    original = accurate.decode_window

    async def recorded(engine_, window, options, *, started):
        result = await original(engine_, window, options, started=started)
        start = (window.__array_interface__["data"][0] - audio.__array_interface__["data"][0]) // audio.itemsize
        decoded[start] = (len(window) / SAMPLE_RATE, list(result.tokens), result.verdict.silence)
        return result

    monkeypatch.setattr(accurate, "decode_window", recorded)
    options = DecodeOptions(language="en")
    windows, _ = asyncio.run(accurate._sequential(engine, audio, speech, options, "en", by_speech=False))
    plain = " ".join(s.text for w in windows for s in w.segments)
    starts = list(decoded)
    assert starts == [w.start for w in windows] and starts[0] == 0 < speech[0][0] and len(windows) >= 3
    for start, following in zip(starts, starts[1:]):
        seconds, tokens, silence = decoded[start]
        advance = seconds if silence else segment_pieces(tokens, engine.tokenizer, seconds)[1]
        assert following == start + round(advance * SAMPLE_RATE)
    monkeypatch.setattr(accurate, "decode_window", original)
    by_speech, _ = asyncio.run(accurate._sequential(engine, audio, speech, options, "en"))
    assert [w.start for w in by_speech][0] == speech[0][0] != 0
    assert wer(reference, plain) <= wer(reference, " ".join(s.text for w in by_speech for s in w.segments)) + 0.02


def test_accurate_votes_over_its_hypotheses_deterministically(engine, minute):
    """Over a minute (several windows) `accurate` votes with the conditioned chain, the unconditioned
    one and both fast runs on the chain cut as openai cuts (the backbone): the same input gives the
    same output, every segment keeps the backbone's times and tokens that decode to its text, and
    the text is no worse than the conditioned chain's alone."""
    from streamer.engine.request import SAMPLE_RATE, DecodeOptions
    from streamer.longform import accurate
    from streamer.longform.accurate import transcribe_accurate
    from streamer.longform.speech import find_speech
    from streamer.longform.transcript import join

    audio, reference = minute
    voted = [asyncio.run(transcribe_long(engine, audio, mode="accurate")) for _ in range(2)]
    assert [(s.start, s.end, s.text) for s in voted[0].segments] == [(s.start, s.end, s.text) for s in voted[1].segments]
    chain = asyncio.run(transcribe_accurate(engine, audio, DecodeOptions(), vote=False))
    windows, _ = asyncio.run(accurate._sequential(engine, audio, find_speech(audio), DecodeOptions(language="en"), "en",
                                                  by_speech=False))
    plain = join(windows, language="en", duration=len(audio) / SAMPLE_RATE, task="transcribe")
    assert {(s.start, s.end) for s in voted[0].segments} <= {(s.start, s.end) for s in plain.segments}
    for s in voted[0].segments:
        assert s.text.strip() and engine.tokenizer.decode(s.tokens) == s.text
    assert wer(reference, voted[0].text) <= wer(reference, chain.text) + 0.02, (voted[0].text, chain.text)


@pytest.fixture(scope="module")
def long_minutes(manifest):
    """English prompts of 8-31 s joined with 0.5-s pauses up to 2.5 minutes: six windows and more of
    each transcript, so that the vote can hand segments on well before the end."""
    rows = [r for r in manifest if r["language"] == "en" and "/asterisk/" in r["audio"] and 8 <= r["duration"] <= 31]
    parts, gap = [], np.zeros(int(GAP_S * SAMPLE_RATE), np.float32)
    for r in sorted(rows, key=lambda r: r["audio"]):
        if sum(len(p) for p in parts) >= 150 * SAMPLE_RATE:
            break
        parts += [decode_audio(r["audio"]), gap]
    return np.concatenate(parts)


def test_accurate_hands_voted_segments_on_as_they_become_final(engine, long_minutes, monkeypatch):
    """The vote runs while the five transcripts are decoded: segments reach `on_segments` before
    the backbone chain's last window, in order, and they are exactly those of the vote on the
    five whole transcripts at the end (`revise` with `CONFIRM`)."""
    from streamer.longform import accurate
    from streamer.longform.vote import SegmentVote, revise

    given: list[tuple[int, list, float]] = []

    class Recorded(SegmentVote):
        def add(self, h, segments, until=float("inf")):
            given.append((h, [dataclasses.replace(s) for s in segments] if h == 0 else list(segments), until))
            return super().add(h, segments, until)

    monkeypatch.setattr(accurate, "SegmentVote", Recorded)
    events: list = []
    t = asyncio.run(transcribe_long(engine, long_minutes, mode="accurate", on_progress=lambda f: events.append(f),
                                    on_segments=lambda segs: events.append([(s.start, s.end, s.text) for s in segs])))
    streamed = [s for e in events if isinstance(e, list) for s in e]
    first = next(i for i, e in enumerate(events) if isinstance(e, list))
    last_window = next(i for i, e in enumerate(events) if isinstance(e, float) and e >= 0.99)
    assert first < last_window, "no segment before the chain's last window"
    assert sum(isinstance(e, list) for e in events) >= 2

    backbone = [s for h, segments, _ in given if h == 0 for s in segments]
    others = [[s for h, segments, _ in given if h == k for s in segments] for k in (1, 2, 3, 4)]
    revise(backbone, others, engine.tokenizer.encode, accurate.CONFIRM)
    assert streamed == [(s.start, s.end, s.text) for s in backbone if s.text.strip()]
    assert [(s.start, s.end, s.text) for s in t.segments] == streamed  # `join` had nothing to reorder
    for prev, cur in zip(streamed, streamed[1:]):
        assert prev[0] <= prev[1] <= cur[0]
    assert all(u <= v for (h, _, u), (k, _, v) in itertools.combinations(given, 2) if h == k)  # each settles forward


# --- accurate's vote: a skip that three transcripts share ------------------------------------------------

def test_accurate_keeps_speech_that_three_transcripts_sharing_a_cut_skip(manifest):
    """base, French: a 22.6-s menu prompt 2.9 s into the recording. The two chains cut at the VAD's
    onset and `fast` with 5 beams open their first window at 2.9 s, and 5 beams there skip the first
    three sentences (17 s of speech); the backbone (its window from 0 s) and `fast` greedy write
    them. The three empty phrases outvoted the two, and `accurate` lost the 17 s
    (docs/notes/accuracy31.md); the VAD hears speech there and `fast` has the words, so they stay."""
    rows = {Path(r["audio"]).name: r for r in manifest if "/fr/asterisk/" in r["audio"]}
    menu = decode_audio(rows["conf-adminmenu-menu8.ogg"]["audio"])
    after = decode_audio(rows["confbridge-rest-list-vol-out.ogg"]["audio"])
    s = SAMPLE_RATE
    audio = np.concatenate([np.zeros(int(2.9 * s), np.float32), menu, np.zeros(int(11.2 * s), np.float32), after])
    audio += (np.random.default_rng(0).standard_normal(len(audio)) * 0.002).astype(np.float32)
    engine = Engine(load_model("base"))
    try:
        text = asyncio.run(transcribe_long(engine, audio, mode="accurate")).text.lower()
    finally:
        engine.close()
    assert all(w in text for w in ("énumérer", "éjecter", "désactiver le mode", "enregistrer", "quitter")), text
