"""A window of audio to transcribe, how to decode it, and what comes back.

No torch here (nor in `model/decoding.py`, where `DecodeOptions` and `Verdict` live and whence
they are re-exported): the scheduler and the sessions use these types on the CPU alone; the audio
payload is an opaque object that only the runner opens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from streamer.audio import SAMPLE_RATE
from streamer.model.decoding import TASKS, DecodeOptions, InitialTokens, Verdict
from streamer.types import Segment

__all__ = ["DecodeOptions", "Verdict", "TASKS", "Priority", "RequestState", "Request", "Result"]

WINDOW_SECONDS = 30
"""Whisper's encoder sees exactly one 30-s window; longer audio is split by `longform`."""
MAX_WINDOW_SAMPLES = SAMPLE_RATE * WINDOW_SECONDS

class Priority(IntEnum):
    """Admission class; lower runs first."""

    FINAL = 0
    """A live utterance has ended: its text is what the user keeps."""
    PARTIAL = 1
    """A live utterance in progress: provisional text, superseded by the next one."""
    FILE = 2
    """A chunk of an uploaded file: throughput matters, not latency."""


class RequestState(Enum):
    """Lifecycle: QUEUED -> ENCODING -> DECODING -> FINISHED, or CANCELLED / FAILED on the way."""

    QUEUED = "queued"
    ENCODING = "encoding"
    DECODING = "decoding"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        """The request has left the scheduler for good."""
        return self in (RequestState.FINISHED, RequestState.CANCELLED, RequestState.FAILED)


@dataclass(kw_only=True)
class Request:
    """One window (live utterance or file chunk, at most 30 s) waiting for or holding decoder slots.

    `deadline` and `arrival` are seconds on the caller's monotonic clock, the same clock that is
    passed to `Scheduler.schedule(now)`.
    """

    id: str
    """Unique among the requests the scheduler holds."""
    audio: Any
    """float32 mono samples at 16 kHz (np.ndarray), at most 30 s."""
    options: DecodeOptions = field(default_factory=DecodeOptions)
    """How to decode it."""
    initial: InitialTokens | None = None
    """Prompt, SOT sequence and prefix, built from `options` at submit time
    (`decoding.initial_tokens`); the runner needs them, the scheduler does not."""
    priority: Priority
    """Admission class: finals, then partials, then file chunks."""
    session_id: str | None = None
    """The live stream it belongs to; a newer queued partial of it replaces an older one."""
    deadline: float
    """When the caller wants it admitted; the earliest goes first within a class."""
    arrival: float
    """When it was submitted; breaks ties between equal deadlines."""
    n_slots: int | None = None
    """Decoder slots it occupies while live; None means `options.beam_size`."""
    state: RequestState = RequestState.QUEUED
    """Where it is in its lifecycle; only the scheduler changes it."""
    temperature: float | None = None
    """Sampling temperature of this attempt; None means `options.temperatures[0]`."""
    attempt: int = 0
    """Index of this attempt in the temperature fallback."""
    error: str | None = None
    """Why it FAILED, as the runner reported it."""

    def __post_init__(self) -> None:
        if len(self.audio) > MAX_WINDOW_SAMPLES:
            raise ValueError(
                f"request {self.id}: {len(self.audio)} samples is longer than one "
                f"{WINDOW_SECONDS}-s window ({MAX_WINDOW_SAMPLES} samples at {SAMPLE_RATE} Hz)"
            )
        self.priority = Priority(self.priority)
        if self.n_slots is None:
            self.n_slots = self.options.beam_size
        if self.n_slots < 1:
            raise ValueError(f"request {self.id}: n_slots must be at least 1, not {self.n_slots}")
        if self.temperature is None:
            self.temperature = self.options.temperatures[0]


@dataclass
class Result:
    """What a request produced."""

    request_id: str
    text: str
    tokens: list[int]
    segments: list[Segment]
    language: str | None
    """Language code, given or detected."""
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float
    """Temperature of the accepted attempt."""
    duration: float
    """Seconds of audio in the window."""
    truncated: bool = False
    """The decode stopped at its token limit instead of ending with end-of-text (a loop does)."""
    first_token_s: float | None = None
    """Seconds from the engine taking the window to its first sampled token (queue wait plus the
    encoder pass and prefill), measured by the engine."""
    token_logprobs: list[float] = field(default_factory=list)
    """Log probability of each of `tokens` as sampled; empty after beam search."""
    verdict: Verdict = field(default_factory=Verdict)
    """Silence, loop, poor decode, judged once with the request's thresholds (`decoding.judge`)."""

    def logprobs_of(self, spans: list[list[int]]) -> list[list[float]]:
        """Per span (text tokens taken from `tokens` in order, as segments are), the log
        probabilities of its tokens; all empty when the decode kept none (beam search)."""
        if len(self.token_logprobs) != len(self.tokens):
            return [[] for _ in spans]
        out, i = [], 0
        for tokens in spans:
            picked = []
            for token in tokens:
                while i < len(self.tokens) and self.tokens[i] != token:
                    i += 1
                if i == len(self.tokens):
                    return [[] for _ in spans]
                picked.append(self.token_logprobs[i])
                i += 1
            out.append(picked)
        return out


def check_options(options: DecodeOptions, tokenizer) -> None:
    """Raise ValueError for options this model cannot take (a language it does not know, too
    many beams, prompt ids it cannot feed): at submit time, in the caller's thread or process."""
    from streamer.engine.beam import MAX_BEAM

    if options.language is not None and tokenizer.multilingual:
        tokenizer.language_token(options.language)
    if options.beam_size > MAX_BEAM:
        raise ValueError(f"beam_size {options.beam_size}: at most {MAX_BEAM}")
    if options.prompt_tokens:
        tokenizer.prompt_from_tokens(options.prompt_tokens, 2)
    if options.prefix_tokens:
        try:
            tokenizer.prompt_from_tokens(options.prefix_tokens, 2)  # a prefix takes the same ids
        except ValueError:
            raise ValueError("prefix_tokens must be text or timestamp tokens of this model") from None
        if not options.timestamps and any(t >= tokenizer.timestamp_begin for t in options.prefix_tokens):
            raise ValueError("prefix_tokens hold timestamps: decode with timestamps=True")
