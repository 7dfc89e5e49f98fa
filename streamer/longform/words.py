"""Word timestamps for decoded windows, aligned on the engine's model thread."""

from __future__ import annotations

import numpy as np

from streamer.engine.request import SAMPLE_RATE
from streamer.longform.transcript import Window
from streamer.model.timing import MAX_BATCH, AlignmentItem, words_in_segments


async def add_word_timestamps(engine, audio: np.ndarray, windows: list[Window], *, language: str | None,
                              task: str) -> None:
    """Fill `words` of every segment of `windows` in place.

    Windows go to the model thread MAX_BATCH at a time (`engine.align`): each call is one
    forward pass, and engine steps for other requests run between calls.
    """
    todo = [w for w in windows if w.segments]
    for k in range(0, len(todo), MAX_BATCH):
        batch = todo[k:k + MAX_BATCH]
        items = [AlignmentItem(audio[w.start:w.start + w.length], [t for s in w.segments for t in s.tokens])
                 for w in batch]
        timings = await engine.align(items, language, task)
        for window, window_timings in zip(batch, timings):
            spans = [(s.start, s.end, len(s.tokens)) for s in window.segments]
            per_segment = words_in_segments(window_timings, spans, offset=window.start / SAMPLE_RATE)
            for seg, words in zip(window.segments, per_segment):
                seg.words = words
                # Whisper's segment timestamps are coarser than the words inside them; but words
                # that span no time (aligned to one instant where the audio was cut off mid-word)
                # would make the segment zero-length: it keeps Whisper's times then.
                if words and words[-1].end > words[0].start:
                    seg.start, seg.end = words[0].start, words[-1].end


async def add_segment_words(engine, audio: np.ndarray, segments: list, *, language: str | None, task: str,
                            offset: float = 0.0) -> None:
    """Fill `words` of the segments of one decoded window in place; for live finals that carry
    word timings (Deepgram's `words`). Segment and word times are from the window's start, and
    `audio` (what the words are aligned in) begins `offset` seconds into it."""
    segments = [s for s in segments if s.tokens]
    if not segments:
        return
    item = AlignmentItem(audio, [t for s in segments for t in s.tokens])
    (timings,) = await engine.align([item], language, task)
    per_segment = words_in_segments(timings, [(s.start, s.end, len(s.tokens)) for s in segments], offset=offset)
    for seg, words in zip(segments, per_segment):
        seg.words = words
