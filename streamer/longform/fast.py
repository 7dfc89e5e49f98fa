"""fast: cut the recording at pauses into windows of at most 30 s and decode them all at once.

silero-vad finds the speech; consecutive stretches of speech are packed into windows of at most
30 s (a stretch longer than that was already cut by the VAD at the quietest point of its last
seconds), so every cut lies in a pause and no word straddles two windows: the windows need no
overlap and the texts join without deduplication. Audio between windows holds no speech and is not
decoded. All windows are in the engine at once (up to MAX_IN_FLIGHT per recording), so they share
encoder batches and decoder steps; each is decoded without the previous text as prompt, the price
of the parallelism (see `accurate`). Whisper sometimes stops a long window early and leaves its
last sentences out: when the VAD hears speech after a window's last segment, that rest is decoded
as one more window, in parallel with the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np

from streamer.engine.request import MAX_WINDOW_SAMPLES, SAMPLE_RATE, DecodeOptions, Result
from streamer.longform.decode import decode_window, detect_language
from streamer.longform.speech import find_speech, left_out, onset, release
from streamer.longform.transcript import Transcript, TranscriptSegment, Window, join, make_segments
from streamer.longform.words import add_word_timestamps
from streamer.model.decoding import split_segments

MAX_IN_FLIGHT = 64
"""Windows of one recording in the engine at once: enough to fill a GPU's batch, while many
recordings together stay under the engine's queue bound, so live finals are never refused."""

if TYPE_CHECKING:
    from streamer.engine.engine import Engine



def plan_windows(speech: list[tuple[int, int]], n_samples: int) -> list[tuple[int, int]]:
    """Sample ranges [start, end) of the windows to decode, from the recording's `speech` ranges:
    consecutive stretches packed into windows of at most 30 s, so that every cut lies in a pause.

    A recording of 30 s or less is one window, or none when it holds no speech.
    """
    if not speech:
        return []
    if n_samples <= MAX_WINDOW_SAMPLES:
        return [(0, n_samples)]
    windows: list[tuple[int, int]] = []
    for start, end in speech:
        if windows and end - windows[-1][0] <= MAX_WINDOW_SAMPLES:
            windows[-1] = (windows[-1][0], end)
        else:
            # The VAD caps stretches at 28 s plus padding; split anything longer to be safe.
            for s in range(start, end, MAX_WINDOW_SAMPLES):
                windows.append((s, min(end, s + MAX_WINDOW_SAMPLES)))
    return windows


async def transcribe_fast(engine: Engine, audio: np.ndarray, options: DecodeOptions, *, word_timestamps: bool = False,
                          on_progress: Callable[[float], None] | None = None,
                          on_segments: Callable[[list[TranscriptSegment]], None] | None = None,
                          max_in_flight: int = MAX_IN_FLIGHT, speech: list[tuple[int, int]] | None = None,
                          on_settled: Callable[[float], None] | None = None) -> Transcript:
    """Transcribe `audio` (16 kHz float32) in parallel windows; see the module's docstring.
    `speech`: the recording's VAD stretches when the caller has them already. `on_settled(t)`:
    every segment that starts before `t` seconds has gone to `on_segments`."""
    if speech is None:
        speech = await asyncio.to_thread(find_speech, audio)
    windows = [Window(start=s, length=e - s) for s, e in plan_windows(speech, len(audio))]
    options = dataclasses.replace(options, timestamps=True)
    language = options.language if engine.tokenizer.multilingual else "en"
    if language is None and len(windows) > 1:  # one language for the whole recording, as openai's transcribe
        first = windows[0]
        language = await detect_language(engine, audio[first.start:first.start + first.length], options)
        options = dataclasses.replace(options, language=language)

    slots = asyncio.Semaphore(max_in_flight)

    async def decode(window: Window, started: bool) -> Result:
        async with slots:
            return await decode_window(engine, audio[window.start:window.start + window.length], options, started=started)

    planned = {id(w) for w in windows}
    order = list(windows)  # emission order; a repair window goes right after the window it repairs
    tasks = {asyncio.ensure_future(decode(w, i > 0)): w for i, w in enumerate(windows)}
    results: dict[int, Result] = {}  # by id(window)
    next_emit, reported = 0, 0.0
    try:
        pending = set(tasks)
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                window = tasks[task]
                result = results[id(window)] = task.result()
                if not result.verdict.silence:
                    spans = split_segments(result.tokens, engine.tokenizer, window.length / SAMPLE_RATE)
                    window.segments = onset(speech, make_segments(spans, result, engine.tokenizer, window))
                resume = left_out(speech, window) if id(window) in planned else None  # repairs are not repaired
                if resume is not None:
                    repair = Window(start=resume, length=window.start + window.length - resume)
                    order.insert(order.index(window) + 1, repair)
                    task = asyncio.ensure_future(decode(repair, True))
                    tasks[task] = repair
                    pending.add(task)
            while next_emit < len(order) and id(order[next_emit]) in results:  # in order, as soon as known
                if on_segments is not None and order[next_emit].segments:
                    on_segments(order[next_emit].segments)
                next_emit += 1
            if on_settled is not None:
                on_settled(order[next_emit].start / SAMPLE_RATE if next_emit < len(order) else len(audio) / SAMPLE_RATE)
            reported = max(reported, len(results) / len(order))
            if on_progress is not None:
                on_progress(reported)
    finally:
        for task in tasks:  # failed or cancelled: stop the other windows and free their slots
            task.cancel()
    windows = order

    if language is None:
        language = next((r.language for r in results.values() if r.language), None)
    if on_progress is not None and not windows:
        on_progress(1.0)
    for window in windows:
        release(speech, window.segments)
    if word_timestamps:
        await add_word_timestamps(engine, audio, windows, language=language, task=options.task)
    return join(windows, language=language, duration=len(audio) / SAMPLE_RATE, task=options.task)
