"""Word and segment timings: what the model's alignment, the engine and long-form all speak."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Word:
    """One word with its time span in seconds from the start of the audio."""

    start: float
    end: float
    word: str
    """The word as decoded, with its leading space."""
    probability: float
    """Mean probability of its tokens."""


@dataclass
class Segment:
    """A stretch of text between two timestamp tokens (the whole window without timestamps)."""

    id: int
    start: float
    """Seconds from the start of the audio."""
    end: float
    text: str
    tokens: list[int]
    """Text tokens, without special tokens."""
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float
    """Temperature of the attempt that produced it."""
    words: list[Word] | None = None
    """Present when word timestamps were asked for."""
