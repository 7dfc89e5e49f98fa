"""accurate: openai/whisper's sequential seek, one window after another, each conditioned on the text
before it.

A window starts at `seek` and holds the next 30 s of audio, as in openai/whisper (ending it at the
last pause within 30 s instead, the model lost the context after it: 6-minute recording 2.96 % WER
against 2.73 %, 15-minute join 2.57 % against 2.01 %); it is decoded with segment timestamps and the
tokens so far as prompt. Segments closed by a timestamp pair are kept;
the last segment is kept too when the text ends on a single timestamp (the model says the speech
ended there), and then the whole window is consumed. Otherwise the text after the last complete
segment is dropped and `seek` moves to that segment's end, so a word cut by the window's edge is
decoded again whole at the start of the next window; likewise when the VAD hears speech after the
last segment (the model stopped early). Audio without speech is jumped over, never decoded. A
recording is one chain of windows; many recordings run as concurrent chains whose windows share the
engine's steps. Longer than one window, five transcripts are decoded side by side and voted on
(`vote.py`): the chain with its windows cut as openai/whisper cuts them (`by_speech=False`: the best
single transcript on English, with runaways elsewhere) is the backbone and keeps every phrase another
transcript confirms; the chain cut by the VAD, the chain without conditioning, and `fast` greedy and
with 5 beams vote where it stands alone or its length is off (`CONFIRM`). That undoes spellings a
prompt carried over whole paragraphs and the backbone's runaways; a long stretch of the backbone over
VAD speech that another transcript also writes is not dropped by the three that share a skip. docs/longform.md has the details and
measurements.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import string
from typing import TYPE_CHECKING, Callable

import numpy as np

from streamer.engine.request import MAX_WINDOW_SAMPLES, SAMPLE_RATE, DecodeOptions
from streamer.longform.decode import decode_window, detect_language
from streamer.longform.fast import MAX_IN_FLIGHT, transcribe_fast
from streamer.longform.speech import (UNHEARD_SPEECH_S, find_speech, heard, left_out, next_stretch, onset,
                                      open_after, release, speech_seconds)
from streamer.longform.transcript import Transcript, TranscriptSegment, Window, after, join, make_segments
from streamer.longform.vote import SegmentVote
from streamer.longform.words import add_word_timestamps
from streamer.model.tokenizer import TIME_PRECISION, Tokenizer

BEAM_SIZE = 5
"""openai/whisper's and faster-whisper's default for careful transcription. Conditioned greedy
decoding skipped or repeated sentences of repetitive speech (15-minute join of the shared prompts:
6.75 % WER greedy, 2.57 % with 5 beams; docs/longform.md). A caller's beam_size > 1 is kept."""
PROMPT_RESET_TEMPERATURE = 0.5
"""A window that needed a hotter retry than this is likely garbled: do not feed it as prompt."""
MAX_PROMPT_TOKENS = 223
"""Whisper's context holds half its 448 positions for the prompt: `<|startofprev|>` and 223 more."""
ECHO_MIN_WORDS = 4
"""A window whose text opens with the previous window's last segment word for word (this many
words or more) may be echoing its prompt: it is decoded again without one (`echoes`)."""
CONFIRM = (1.5, 0.6, 4)
"""The vote's rule (`vote.VoteStream.confirm`): the backbone, the chain cut as openai/whisper cuts
(`_sequential(by_speech=False)`), keeps a phrase another transcript confirms unless its word count
there is off the others' median (above 1.5 x or below 0.6 x, by 4 words or more); the rest is voted
by the other four (docs/notes/accuracy18.md: 11 files 390 -> 365 errors, 14 held out 400 -> 374)."""
PROMPTED_SILENCE_SPEECH_S = 2.0
"""A prompted window judged silent while the VAD hears this much speech in it is decoded again without
the prompt: a prompt can take the model off the audio (a settings table pasted as a prompt: tiny.en
wrote " 1" over 28 s of speech, no-speech 0.63, log-probability -1.5), and the backbone skips a silent
window whole (QA session 31)."""
MIN_WINDOW_S = 0.1
"""A shorter tail after the last seek holds no word; decoding it only invites a hallucination."""

if TYPE_CHECKING:
    from streamer.engine.engine import Engine



def segment_pieces(tokens: list[int], tokenizer: Tokenizer, window_s: float) -> tuple[list[tuple[float, float, list[int], int]], float]:
    """(start, end, text tokens, end index into `tokens`) of the segments to keep from a window's
    sampled `tokens`, and how far (seconds) to advance the seek; see `complete_segments`."""
    tb = tokenizer.timestamp_begin
    is_ts = [t >= tb for t in tokens]
    single_ending = len(tokens) >= 2 and is_ts[-2:] == [False, True]
    pairs = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
    if pairs:
        cuts = pairs + ([len(tokens)] if single_ending else [])
        pieces, last = [], 0
        for cut in cuts:
            piece = tokens[last:cut]
            pieces.append((tokenizer.time_of(piece[0]) if is_ts[last] else 0.0, tokenizer.time_of(piece[-1]),
                           [t for t in piece if t < tokenizer.eot], cut))
            last = cut
        advance = window_s if single_ending else tokenizer.time_of(tokens[last - 1])
        return pieces, advance
    stamps = [t for t in tokens if t >= tb]
    end = tokenizer.time_of(stamps[-1]) if stamps and stamps[-1] != tb else window_s
    return [(tokenizer.time_of(stamps[0]) if stamps and is_ts[0] else 0.0, end, [t for t in tokens if t < tokenizer.eot],
             len(tokens))], window_s


def complete_segments(tokens: list[int], tokenizer: Tokenizer, window_s: float) -> tuple[list[tuple[float, float, list[int]]], float, int]:
    """(start, end, text tokens) of the segments to keep from a window's sampled `tokens`, how far
    (seconds) to advance the seek, and how many of `tokens` the kept segments span.

    Timestamp pairs `<|a|><|b|>` close one segment and open the next. If the tokens end with text
    (no closing timestamp: the window edge cut it, or the token limit), that text is dropped and
    the seek stops at the last complete segment. Without any pair, the whole text is one segment up
    to its last timestamp (or the window's end) and the whole window is consumed.
    """
    pieces, advance = segment_pieces(tokens, tokenizer, window_s)
    return [p[:3] for p in pieces], advance, pieces[-1][3] if pieces else 0


def cut_at_skipped_speech(pieces: list[tuple[float, float, list[int], int]], speech: list[tuple[int, int]], start: int,
                          tokenizer: Tokenizer) -> int | None:
    """How many of a window's `pieces` (window-relative seconds; the window starts at sample
    `start`) to keep when the model skipped speech between two of its segments: the index after
    the last segment before the first gap between text segments that holds `UNHEARD_SPEECH_S` of
    speech or more (by the VAD), or None when no gap does.

    Whisper skips a short utterance between long pauses now and then (more so once its timestamps
    have coarsened to whole seconds, as tiny.en's do after a few conditioned windows): on a messy
    join, "Comedian Mail. Mailbox?" in the 8-s gap between "Something is terribly wrong." and the
    next segment was lost. The seek then stops at the segment before the gap, so that the next
    window starts on the skipped speech."""
    def speech_in(a: float, b: float) -> float:
        return speech_seconds(speech, start + round(a * SAMPLE_RATE), start + round(b * SAMPLE_RATE))

    spoken = [i for i, (a, b, text, _) in enumerate(pieces) if b > a and tokenizer.decode(text).strip() and speech_in(a, b) > 0]
    for i, j in zip(spoken, spoken[1:]):
        if speech_in(pieces[i][1], pieces[j][0]) >= UNHEARD_SPEECH_S:
            return i + 1
    return None


def _words(text: str) -> list[str]:
    return [w for w in (w.strip(string.punctuation + "¿¡«»").lower() for w in text.split()) if w]


def echoes(previous: str, tokens: list[int], tokenizer: Tokenizer) -> bool:
    """The window's decoded `tokens` open with `previous` (the last kept segment's text) word for
    word, `ECHO_MIN_WORDS` words or more: conditioned on its own output, Whisper repeats the prompt's
    last sentence over the next speech now and then (base, messy Spanish join: "Por favor ingrese su
    contraseña de nuevo..." written again over "Por favor espere mientras enlazo su llamada", and
    three times over the next prompt after a 12-s pause)."""
    before = _words(previous)
    now = _words(tokenizer.decode([t for t in tokens if t < tokenizer.eot]))
    return len(before) >= ECHO_MIN_WORDS and now[:len(before)] == before


async def transcribe_accurate(engine: Engine, audio: np.ndarray, options: DecodeOptions, *, word_timestamps: bool = False,
                              on_progress: Callable[[float], None] | None = None,
                              on_segments: Callable[[list[TranscriptSegment]], None] | None = None,
                              vote: bool = True) -> Transcript:
    """Transcribe `audio` (16 kHz float32) window after window; see the module's docstring.

    With `vote` (longer than one window), five transcripts of the recording are decoded at the
    same time: the conditioned chain with openai/whisper's window cuts (the backbone), the same
    chain with the VAD's cuts, the chain without previous-text conditioning, and `fast` greedy and
    with `BEAM_SIZE` beams. The backbone keeps a phrase that another of them confirms (`CONFIRM`);
    elsewhere the other four vote (`vote.py`): conditioned on its own output, Whisper keeps a
    spelling it chose once for whole paragraphs ("5-0-0" for "500"), or runs away. The vote runs as
    the transcripts are decoded (`SegmentVote`): a segment goes to `on_segments` as soon as no later
    window of any of them can change it (about a minute of audio behind the slowest), the same
    segments that voting on the whole transcripts at the end gives."""
    tok = engine.tokenizer
    n = len(audio)
    speech = await asyncio.to_thread(find_speech, audio)
    language = options.language if tok.multilingual else "en"
    if not vote or n <= MAX_WINDOW_SAMPLES or not speech:  # one window: every hypothesis decodes it alike
        windows, language = await _sequential(engine, audio, speech, options, language,
                                              on_progress=on_progress, on_segments=on_segments)
    else:
        if language is None:  # one language for every hypothesis, detected as `fast` does
            language = await detect_language(engine, audio[speech[0][0]:speech[0][0] + MAX_WINDOW_SAMPLES], options)
        options = dataclasses.replace(options, language=language)
        beams = options.beam_size if options.beam_size > 1 else BEAM_SIZE
        progress = None if on_progress is None else (lambda f: on_progress(min(f, 0.99)))
        # The VAD's speech, for the vote: a long stretch of the backbone's words over speech that
        # three transcripts sharing a window cut skip (and another writes) is not dropped.
        voter = SegmentVote(5, tok.encode, confirm=CONFIRM, speech=lambda a, b: speech_seconds(
            speech, round(a * SAMPLE_RATE), round(b * SAMPLE_RATE)))
        given: list[list] = [[] for _ in range(5)]  # segments of each hypothesis not given to the vote yet
        ends = [0.0] * 5

        def segments_of(h: int) -> Callable[[list[TranscriptSegment]], None]:
            def take(segments: list[TranscriptSegment]) -> None:
                if h == 0:
                    given[0] += segments
                    return
                for s in segments:  # `fast`'s times as its `join` makes them
                    start, ends[h] = (s.start, s.end) if h <= 2 else after(s.start, s.end, ends[h])
                    given[h].append((start, ends[h], s.text))
            return take

        def settled(h: int) -> Callable[[float], None]:
            def settle(until: float) -> None:
                pieces, given[h] = given[h], []
                final = [s for s in voter.add(h, pieces, until) if s.text.strip()]
                if on_segments is not None and final:
                    on_segments(final)
            return settle

        async def hypothesis(h: int, decode):
            result = await decode
            settled(h)(math.inf)
            return result

        # Three chains of one window each and two fast runs of at most 30 windows each: the
        # recording stays within MAX_IN_FLIGHT windows in the engine.
        in_flight = (MAX_IN_FLIGHT - 3) // 2
        tasks = [asyncio.ensure_future(hypothesis(h, c)) for h, c in enumerate((
            _sequential(engine, audio, speech, options, language, by_speech=False, on_progress=progress,
                        on_segments=segments_of(0), on_settled=settled(0)),
            _sequential(engine, audio, speech, options, language, on_segments=segments_of(1), on_settled=settled(1)),
            _sequential(engine, audio, speech, options, language, condition=False,
                        on_segments=segments_of(2), on_settled=settled(2)),
            transcribe_fast(engine, audio, dataclasses.replace(options, beam_size=1), speech=speech, max_in_flight=in_flight,
                            on_segments=segments_of(3), on_settled=settled(3)),
            transcribe_fast(engine, audio, dataclasses.replace(options, beam_size=beams), speech=speech,
                            max_in_flight=in_flight, on_segments=segments_of(4), on_settled=settled(4))))]
        try:
            (windows, language), *_ = await asyncio.gather(*tasks)
        finally:  # one failed (QueueFull, EngineClosed) or the caller went away: stop the others
            for task in tasks:
                task.cancel()
        for window in windows:
            window.segments = [s for s in window.segments if s.text.strip()]
        if on_progress is not None:
            on_progress(1.0)
    for window in windows:
        release(speech, window.segments)
    if word_timestamps:
        await add_word_timestamps(engine, audio, windows, language=language, task=options.task)
    return join(windows, language=language, duration=n / SAMPLE_RATE, task=options.task)


async def _sequential(engine: Engine, audio: np.ndarray, speech: list[tuple[int, int]], options: DecodeOptions,
                      language: str | None, *, condition: bool = True, by_speech: bool = True,
                      on_progress: Callable[[float], None] | None = None,
                      on_segments: Callable[[list[TranscriptSegment]], None] | None = None,
                      on_settled: Callable[[float], None] | None = None) -> tuple[list[Window], str | None]:
    """The windows of the sequential seek and the language; without `condition`, no window is
    prompted with the text before it (the caller's prompt still opens every window).
    Without `by_speech`, the windows are cut as openai/whisper and faster-whisper cut them (`plain`
    seek): the first opens at 0 s, each next one at the end of the last complete segment (the
    whole window after a single closing timestamp or a silent window), pauses and noise decoded
    like speech; the VAD only drops segments over audio without speech (`heard`). A passage then
    sits elsewhere in its window, after other audio, than in the chain cut by the VAD.
    `on_settled(t)`: every segment that starts before `t` seconds has gone to `on_segments`."""
    tok = engine.tokenizer
    n = len(audio)
    # Tokens kept since the last reset, timestamps included, fed back verbatim as openai/whisper
    # does: a prompt with timestamps keeps the model writing sentence-sized segments, one without
    # them drifts to long segments that now and then skip a repeated sentence. The caller's prompt
    # opens it.
    initial = tok.encode(" " + options.prompt.strip()) if options.prompt and options.prompt.strip() else []
    prompt = list(initial)
    beam_size = options.beam_size if options.beam_size > 1 else BEAM_SIZE
    windows: list[Window] = []
    seek, next_speech = 0, 0
    previous = ""  # the text of the last kept segment
    while True:
        # Jump over audio without speech (a stretch's end padding included): it is never decoded
        # (no hallucinations on silence), and a window opens on speech.
        next_speech = next_stretch(speech, next_speech, seek)
        if next_speech == len(speech):
            break
        if by_speech:
            seek = max(seek, speech[next_speech][0])
        if n - seek < MIN_WINDOW_S * SAMPLE_RATE:
            break
        window = Window(start=seek, length=min(n, seek + MAX_WINDOW_SAMPLES) - seek)
        opts = dataclasses.replace(options, timestamps=True, language=language, prompt=None, beam_size=beam_size,
                                   prompt_tokens=tuple(prompt[-MAX_PROMPT_TOKENS:]) or None)
        result = await decode_window(engine, audio[seek:seek + window.length], opts, started=bool(windows))
        v = result.verdict
        if opts.prompt_tokens and (v.loop or v.repetition or echoes(previous, result.tokens, tok) if not v.silence else
                                   speech_seconds(speech, seek, seek + window.length) >= PROMPTED_SILENCE_SPEECH_S):
            # Decoded with a prompt, the text loops, repeats itself or echoes the prompt, or the window
            # is "silent" over speech the VAD hears: decode the window again without it (the live rule
            # for finals too) and start the context afresh. A repetition that the unprompted decode
            # keeps is speech.
            result = await decode_window(engine, audio[seek:seek + window.length],
                                         dataclasses.replace(opts, prompt_tokens=None), started=True)
            prompt = [] if condition else list(initial)
        language = language or result.language
        window_s = window.length / SAMPLE_RATE
        # Silence: skip the stretch of speech the window starts in, not the whole window (openai
        # skips 30 s: with pauses and noise between stretches, speech after them was lost).
        advance = max(TIME_PRECISION, (speech[next_speech][1] - seek) / SAMPLE_RATE) if by_speech else window_s
        if not result.verdict.silence:
            pieces, advance = segment_pieces(result.tokens, tok, window_s)
            keep = cut_at_skipped_speech(pieces, speech, seek, tok) if by_speech else None
            if keep is not None:  # the model skipped speech: the next window starts on it
                pieces, advance = pieces[:keep], pieces[keep - 1][1]
            spans, consumed = [p[:3] for p in pieces], pieces[-1][3] if pieces else 0
            window.segments = onset(speech, heard(speech, make_segments(spans, result, tok, window)))
            resume = left_out(speech, window) if by_speech else None
            if resume is not None:  # the model stopped early: go on from its last segment, not the window's end
                advance = min(advance, (resume - seek) / SAMPLE_RATE)
            if window.segments:
                previous = window.segments[-1].text
            if by_speech and advance < window_s:  # the seek stops at a segment's end: not on its tail before a long pause
                advance = (open_after(speech, seek + round(advance * SAMPLE_RATE)) - seek) / SAMPLE_RATE
            if condition and result.temperature > PROMPT_RESET_TEMPERATURE:
                prompt = []
            elif condition and window.segments:
                prompt = (prompt + [t for t in result.tokens[:consumed] if t < tok.eot or t >= tok.timestamp_begin])
                prompt = prompt[-MAX_PROMPT_TOKENS:]
        # The seek always moves on, so a window that ends on its first timestamp cannot loop.
        seek += max(round(advance * SAMPLE_RATE), round(TIME_PRECISION * SAMPLE_RATE))
        windows.append(window)
        if on_segments is not None and window.segments:
            on_segments(window.segments)
        if on_settled is not None:  # the next window starts at `seek` or later
            on_settled(seek / SAMPLE_RATE)
        if on_progress is not None:
            on_progress(min(1.0, seek / n))

    if on_progress is not None and seek < n:  # the rest holds no speech
        on_progress(1.0)
    return windows, language
