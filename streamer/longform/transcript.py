"""The transcript of a whole recording, joined from the windows it was decoded in."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from streamer.audio import HOP_LENGTH
from streamer.engine.request import SAMPLE_RATE, Result
from streamer.types import Word


@dataclass
class TranscriptSegment:
    """A stretch of text between two of Whisper's timestamps, in seconds from the recording's start."""

    id: int
    seek: int
    """Start of the window it was decoded in, in 10-ms mel frames (OpenAI's `seek`)."""
    start: float
    end: float
    text: str
    """As decoded, with its leading space."""
    tokens: list[int]
    """Text tokens, without special or timestamp tokens."""
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float
    """Of the accepted attempt of its window (after temperature fallback)."""
    words: list[Word] | None = None
    """Present when word timestamps were asked for."""
    token_logprobs: list[float] = field(default_factory=list)
    """Log probability of each of `tokens` (empty when the decode kept none: beam search)."""
    channel: int | None = None
    """The channel it was heard on, in a transcript of a multichannel recording (`merge_channels`)."""


@dataclass
class Window:
    """A decoded stretch of the recording and the segments kept from it."""

    start: int
    """First sample of the window in the recording."""
    length: int
    """Samples in the window (at most 30 s)."""
    segments: list[TranscriptSegment] = field(default_factory=list)


@dataclass
class Transcript:
    """What `transcribe_long` returns."""

    text: str
    language: str | None
    """Language code, given or detected on the first window."""
    duration: float
    """Seconds of audio in the recording."""
    segments: list[TranscriptSegment]
    task: str = "transcribe"
    channel_texts: list[str] | None = None
    """The text of each channel, when the transcript merges the channels of one recording."""

    @property
    def words(self) -> list[Word]:
        """Every word in order; empty unless word timestamps were asked for."""
        return [w for s in self.segments for w in (s.words or [])]


def make_segments(spans: list[tuple[float, float, list[int]]], result: Result, tokenizer, window: Window) -> list[TranscriptSegment]:
    """Segments of `window` from (start, end, text tokens) spans in seconds from the window's start.

    Times are clamped to the window (the model may place a timestamp in the padding after short
    audio); spans without text or without duration are dropped, as openai/whisper does.
    """
    offset = window.start / SAMPLE_RATE
    limit = window.length / SAMPLE_RATE
    out = []
    logprobs = result.logprobs_of([tokens for _, _, tokens in spans])
    for (start, end, tokens), span_logprobs in zip(spans, logprobs):
        start, end = min(start, limit), min(end, limit)
        text = tokenizer.decode(tokens)
        if not text.strip() or end <= start:
            continue
        out.append(TranscriptSegment(
            id=0, seek=window.start // HOP_LENGTH, start=round(offset + start, 3), end=round(offset + end, 3),
            text=text, tokens=list(tokens), avg_logprob=result.avg_logprob,
            compression_ratio=result.compression_ratio, no_speech_prob=result.no_speech_prob,
            temperature=result.temperature, token_logprobs=span_logprobs))
    return out


def after(start: float, end: float, previous_end: float) -> tuple[float, float]:
    """A segment's (start, end) as `join` sets them: not before the previous segment's end."""
    start = max(start, previous_end)
    return start, max(end, start)


def join(windows: list[Window], *, language: str | None, duration: float, task: str) -> Transcript:
    """One transcript from windows in recording order: ids renumbered, times made non-decreasing."""
    segments: list[TranscriptSegment] = []
    previous_end = 0.0
    for window in windows:
        for seg in window.segments:
            seg.id = len(segments)
            seg.start, seg.end = after(seg.start, seg.end, previous_end)
            previous_end = seg.end
            segments.append(seg)
    text = "".join(s.text for s in segments).strip()
    return Transcript(text=text, language=language, duration=round(duration, 3), segments=segments, task=task)


def merge_channels(transcripts: list[Transcript]) -> Transcript:
    """One transcript per channel of a recording -> one, its segments (tagged with their channel)
    in order of time; `text` joins them in that order."""
    segments = []
    for channel, t in enumerate(transcripts):
        for s in t.segments:
            segments.append(dataclasses.replace(s, channel=channel))
    segments.sort(key=lambda s: (s.start, s.channel))
    for i, s in enumerate(segments):
        s.id = i
    return Transcript(text="".join(s.text for s in segments).strip(), language=transcripts[0].language,
                      duration=max(t.duration for t in transcripts), segments=segments, task=transcripts[0].task,
                      channel_texts=[t.text for t in transcripts])
