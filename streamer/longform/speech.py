"""Where the speech is: silero-vad over the whole recording.

Both modes skip audio the VAD finds no speech in, so that silence never reaches the model (Whisper
invents "Thank you." on silence, confidently). Inside speech the window's own verdict decides
(`Result.verdict.silence`, judged once in `model/decoding.py`): silent when the no-speech
probability is above the threshold and the text is improbable, or when it is near certain and the
text a word or two. A near-certain probability alone is not silence: tiny.en gives 0.77-0.91 on
clear prompts of the 6-minute recording, and dropping those windows lost a minute of speech.
"""

from __future__ import annotations

import numpy as np

from streamer.audio.vad import SileroVAD, speech_segments
from streamer.config import VADConfig
from streamer.engine.request import SAMPLE_RATE
from streamer.longform.transcript import Window
from streamer.model.tokenizer import MAX_INITIAL_TIMESTAMP  # torch-free: gateways import this module

CUT_VAD = VADConfig(min_silence_ms=300, speech_pad_ms=200, max_utterance_s=28.0)
"""Pauses of 300 ms separate stretches of speech (cut points for `fast`); stretches are padded by
200 ms so that no word loses its edges, and longer speech is cut at its quietest point by 28 s."""
UNHEARD_SPEECH_S = 0.8
"""Speech (by the VAD, its padding included) after a window's last segment that means the model
stopped early and left words out (it does, at the end of long windows): that rest is decoded
again. Padding alone is at most 0.4 s."""


PADDING_SAMPLES = CUT_VAD.speech_pad_ms * SAMPLE_RATE // 1000
"""The padding at a stretch's end holds no speech (the VAD added it after the last word)."""
TAIL_S = 1.5
"""Under a long prompt Whisper's timestamps coarsen to whole seconds (tiny.en and base, ours and
faster-whisper's alike), so a segment's end can fall a second or more before the end of the speech
it transcribes: the timestamp's second, the VAD's end padding (0.2 s) and its frames' slack. Less
than this much of a stretch after a segment's end is that segment's own tail (`open_after`)."""


def next_stretch(speech: list[tuple[int, int]], index: int, seek: int) -> int:
    """The index (from `index` on) of the first stretch of `speech` that still holds speech after
    sample `seek`: a stretch that `seek` has passed, or of which only its end padding is left, is
    over. A window opened on a stretch's last few milliseconds holds the long pause after it; the
    first timestamp may not come later than 1 s (`MAX_INITIAL_TIMESTAMP`), so the model then writes
    the next speech at 0 s, seconds early, and the seek walks back into text already written (base,
    messy Spanish join: a window opened 8 ms before a stretch's end and 11 s before the next
    speech, and its text came out twice). A stretch that the next one begins right at (a
    max-length cut inside speech) has no end padding: its last samples are speech (skipping them
    moved a window of the 6-minute recording 32 ms on, and its WER went from 2.73 % to 3.19 %)."""
    while index < len(speech):
        cut = index + 1 < len(speech) and speech[index + 1][0] <= speech[index][1]
        if speech[index][1] - (0 if cut else PADDING_SAMPLES) > seek:
            break
        index += 1
    return index


def open_after(speech: list[tuple[int, int]], sample: int) -> int:
    """Where the next window may open after a segment that ends at `sample`: past the end of the
    stretch `sample` lies in when less than `TAIL_S` of it is left (the segment's own tail) and a
    pause longer than the first-timestamp limit (`MAX_INITIAL_TIMESTAMP`, 1 s) follows it; else
    `sample`.

    A window opened on that tail holds the pause after it, and since its first timestamp may not
    come after 1 s, the model writes the next utterance at 0 s, seconds early, and the next window
    writes it again where it was spoken (base, messy Spanish join: a coarse end 0.5 s before its
    stretch's end and 9.3 s before the next speech; "La conferencia está ahora en modo mudo."
    twice). A stretch cut inside speech (the next begins where it ends) is never skipped."""
    for i, (start, end) in enumerate(speech):
        if start <= sample < end:
            # After the last stretch nothing follows: as long a pause as any.
            long_pause = i + 1 == len(speech) or speech[i + 1][0] - end > MAX_INITIAL_TIMESTAMP * SAMPLE_RATE
            return end if long_pause and end - sample < TAIL_S * SAMPLE_RATE else sample
        if start > sample:
            break
    return sample


def find_speech(audio: np.ndarray) -> list[tuple[int, int]]:
    """Sample ranges [start, end) of speech in a whole recording, each at most 28 s plus padding."""
    if len(audio) == 0:
        return []
    return speech_segments(audio, CUT_VAD, SileroVAD.shared())


def speech_seconds(speech: list[tuple[int, int]], start: int, end: int) -> float:
    """Seconds of `speech` (sample ranges) that fall within samples [start, end)."""
    return sum(max(0, min(e, end) - max(s, start)) for s, e in speech) / SAMPLE_RATE


def left_out(speech: list[tuple[int, int]], window: Window) -> int | None:
    """Where the speech that `window`'s segments left out begins (a sample), or None when the
    segments reach its end or only padding follows them."""
    if not window.segments:
        return None
    covered = round(window.segments[-1].end * SAMPLE_RATE)
    end = window.start + window.length
    return covered if speech_seconds(speech, covered, end) >= UNHEARD_SPEECH_S else None


def heard(speech: list[tuple[int, int]], segments: list) -> list:
    """The `segments` (times in seconds from the recording's start) that overlap speech at all:
    text the model wrote over audio where the VAD hears none (a noise gap, a long pause) is
    invented, as Whisper's "Thank you." on silence is."""
    return [s for s in segments if speech_seconds(speech, round(s.start * SAMPLE_RATE), round(s.end * SAMPLE_RATE)) > 0]


MAX_TRAILING_S = 1.0
"""How far a segment may end after the last speech it holds (the VAD's edges are less sure than that)."""


def release(speech: list[tuple[int, int]], segments: list) -> list:
    """`segments` (times in seconds from the recording's start), each that ends more than
    `MAX_TRAILING_S` after the last speech it holds (by the VAD) moved to end there; `onset`'s
    counterpart. Whisper's closing timestamp over a pause or noise after the speech can land
    anywhere in it: `accurate`'s backbone window, opened at 0 s over noise, closed " for your
    country." (the last second of Kennedy's 11 s) at 40.5 s, a 26-s subtitle for three words (QA session 31)."""
    for s in segments:
        start, end = round(s.start * SAMPLE_RATE), round(s.end * SAMPLE_RATE)
        last = max((min(b, end) for a, b in speech if a < end and b > start), default=None)
        if last is not None and end - last > MAX_TRAILING_S * SAMPLE_RATE and last > start:
            s.end = round(last / SAMPLE_RATE, 3)
    return segments


def onset(speech: list[tuple[int, int]], segments: list) -> list:
    """`segments` (times in seconds from the recording's start), each that starts more than
    `MAX_INITIAL_TIMESTAMP` before the first speech it holds (by the VAD) moved to start there.

    Whisper's first timestamp in a window may not come later than 1 s, so a window opened on a long
    pause writes the speech after it from 0 s: a prompt spoken 15 s into a 25-s recording (`fast`:
    one window from 0 s) or after the pause at the start of a window that `accurate`'s backbone cut
    as openai/whisper does came out as 0.0-18.2 s, its subtitle 15 s early. Within 1 s the
    segment's own time stands (the VAD's edges are less sure than that)."""
    for s in segments:
        start, end = round(s.start * SAMPLE_RATE), round(s.end * SAMPLE_RATE)
        first = next((max(a, start) for a, b in speech if b > start and a < end), None)
        if first is not None and first - start > MAX_INITIAL_TIMESTAMP * SAMPLE_RATE:
            s.start = round(first / SAMPLE_RATE, 3)
    return segments
