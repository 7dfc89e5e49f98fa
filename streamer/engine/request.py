"""A window of audio to transcribe, how to decode it, and what comes back.

No torch here: the scheduler and the sessions use these types on the CPU alone; the audio or
log-mel payload is an opaque object that only the runner opens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from streamer.types import Segment

SAMPLE_RATE = 16000
"""Whisper's input rate; the gateway resamples everything to it."""
WINDOW_SECONDS = 30
"""Whisper's encoder sees exactly one 30-s window; longer audio is split by `longform`."""
MAX_WINDOW_SAMPLES = SAMPLE_RATE * WINDOW_SECONDS

TASKS = ("transcribe", "translate")


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


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode one window; the defaults are openai/whisper's `transcribe()` defaults."""

    task: str = "transcribe"
    """`transcribe` in the spoken language, or `translate` to English."""
    language: str | None = None
    """Language code such as `en`; None detects it from the audio."""
    prompt: str | None = None
    """Previous text to condition on (Whisper's `<|startofprev|>` context)."""
    prompt_tokens: tuple[int, ...] | None = None
    """Previous tokens fed verbatim after `<|startofprev|>` instead of `prompt` (the last 223 are
    kept), timestamp tokens included, as openai/whisper's long-form loop feeds its own output back."""
    prefix: str | None = None
    """Text forced at the start of this window's output."""
    timestamps: bool = False
    """Predict segment timestamp tokens instead of `<|notimestamps|>`."""
    word_timestamps: bool = False
    """Align each word to the audio through the cross-attention heads."""
    beam_size: int = 1
    """1 is greedy; more keeps that many hypotheses, each in its own decoder slot."""
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    """Tried in order: the next one is used when a result fails the checks below."""
    max_new_tokens: int | None = None
    """Token limit for the window; None uses the engine's limit."""
    compression_ratio_threshold: float | None = 2.4
    """A gzip compression ratio above this means a repetition loop: retry hotter."""
    logprob_threshold: float | None = -1.0
    """An average log-probability below this means a poor decode: retry hotter."""
    no_speech_threshold: float | None = 0.6
    """A no-speech probability above this (with a low log-probability) means silence: no text."""
    suppress_blank: bool = True
    """Forbid a blank or end-of-text as the first sampled token."""
    suppress_tokens: str = "-1"
    """Comma-separated token ids never sampled; `-1` stands for the model's non-speech symbols."""
    length_penalty: float | None = None
    """Beam ranking: None divides log-probability by length, alpha uses Google NMT's penalty."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, not {self.task!r}")
        if self.prompt_tokens is not None:
            if self.prompt:
                raise ValueError("give prompt or prompt_tokens, not both")
            # Which ids a model takes is the tokenizer's to say (Engine.submit checks).
            object.__setattr__(self, "prompt_tokens", tuple(int(t) for t in self.prompt_tokens))
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, not {self.beam_size}")
        # A list would make the options unhashable; take any sequence and keep a tuple.
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        if not self.temperatures:
            raise ValueError("temperatures must not be empty")
        if any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0, not {self.temperatures}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {self.max_new_tokens}")


@dataclass(kw_only=True)
class Request:
    """One window (live utterance or file chunk, at most 30 s) waiting for or holding decoder slots.

    `deadline` and `arrival` are seconds on the caller's monotonic clock, the same clock that is
    passed to `Scheduler.schedule(now)`.
    """

    id: str
    """Unique among the requests the scheduler holds."""
    audio: Any = None
    """float32 mono samples at 16 kHz (np.ndarray), at most 30 s; or None when `features` is set."""
    features: Any = None
    """Precomputed log-mel of the window; or None when `audio` is set."""
    options: DecodeOptions = field(default_factory=DecodeOptions)
    """How to decode it."""
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
        if (self.audio is None) == (self.features is None):
            raise ValueError(f"request {self.id}: give exactly one of audio and features")
        if self.audio is not None and len(self.audio) > MAX_WINDOW_SAMPLES:
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

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts and lists, ready for `json.dumps`."""
        return dataclasses.asdict(self)


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
