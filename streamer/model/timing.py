"""What word alignment takes and gives, without torch: the gateways build `AlignmentItem`s and
share `WordTiming`s among segments (`words_in_segments`); the pass itself is `model/alignment.py`,
on the model's thread."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamer.types import Word

MAX_BATCH = 8
"""Windows per forward pass: bounds the [B, heads, tokens, 1500] weights (~90 MB in float32)."""
MAX_WORD_S = 0.7
"""Cap on the median word duration used to trim words stretched over pauses."""


@dataclass
class AlignmentItem:
    """One window to align: its audio and the text tokens decoded from it."""

    audio: np.ndarray
    """float32 samples at 16 kHz, at most 30 s: the same window the text came from."""
    tokens: list[int]
    """Text tokens of the window in order (all its segments), without special or timestamp tokens."""


@dataclass
class WordTiming:
    """A word and its span in seconds from the start of its window."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def words_in_segments(timings: list[WordTiming], segments: list[tuple[float, float, int]],
                      offset: float = 0.0) -> list[list[Word]]:
    """Share one window's word timings among its segments and make them absolute.

    `segments` are (start, end, number of text tokens) in seconds from the start of the recording;
    `offset` is where the window starts. A word goes to the segment that holds its first token;
    each word is clamped into its segment, after the previous word, and a first or last word
    stretched over the pause at the segment's edge is cut to twice the median word length.
    """
    durations = [t.end - t.start for t in timings if t.end > t.start]
    longest = 2 * min(MAX_WORD_S, float(np.median(durations))) if durations else MAX_WORD_S
    out: list[list[Word]] = []
    index, consumed = 0, 0
    previous_end = 0.0
    for seg_start, seg_end, n_tokens in segments:
        words: list[Word] = []
        consumed_target = consumed + n_tokens
        while index < len(timings) and consumed < consumed_target:
            t = timings[index]
            start = min(max(offset + t.start, seg_start, previous_end), seg_end)
            end = min(max(offset + t.end, start), seg_end)
            words.append(Word(start=round(start, 3), end=round(end, 3), word=t.word, probability=t.probability))
            previous_end = end
            consumed += len(t.tokens)
            index += 1
        if words:
            first, last = words[0], words[-1]
            if first.end - first.start > longest:
                first.start = round(first.end - longest, 3)
            if len(words) > 1 and last.end - last.start > longest:
                last.end = round(last.start + longest, 3)
                previous_end = last.end
        out.append(words)
    return out

