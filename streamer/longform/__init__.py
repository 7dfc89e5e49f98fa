"""Long-form transcription of completed recordings: `transcribe_long(engine, audio, mode=...)`.

`fast` decodes all windows of a recording at once (`fast.py`); `accurate` walks through it window
after window with the previous text as prompt (`accurate.py`). docs/longform.md compares them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from streamer.config import LONG_FORM_MODES
from streamer.engine.request import MAX_WINDOW_SAMPLES, DecodeOptions
from streamer.longform.accurate import transcribe_accurate
from streamer.longform.decode import detect_language
from streamer.longform.fast import transcribe_fast
from streamer.longform.transcript import Transcript, TranscriptSegment

MODES = LONG_FORM_MODES

__all__ = ["MODES", "Transcript", "TranscriptSegment", "transcribe_long"]

if TYPE_CHECKING:
    from streamer.engine.engine import Engine



async def transcribe_long(engine: Engine, audio: np.ndarray, *, mode: str = "fast",
                          options: DecodeOptions = DecodeOptions(), word_timestamps: bool = False,
                          on_progress: Callable[[float], None] | None = None,
                          on_segments: Callable[[list[TranscriptSegment]], None] | None = None) -> Transcript:
    """Transcribe a whole recording (float32 mono, 16 kHz, any length) through `engine`.

    `options` apply to every window (`timestamps` is always on; `prompt` is the initial prompt).
    `on_progress(fraction)` is called after each window; `on_segments(segments)` with each
    window's segments as soon as they are final and in order (for streaming). Raises `QueueFull`
    when the engine cannot take the first window, `EngineClosed` when it is shutting down.
    Audio of 30 s or less is one window in either mode.
    """
    if mode == "fast":
        transcript = await transcribe_fast(engine, audio, options, word_timestamps=word_timestamps,
                                           on_progress=on_progress, on_segments=on_segments)
    elif mode == "accurate":
        transcript = await transcribe_accurate(engine, audio, options, word_timestamps=word_timestamps,
                                               on_progress=on_progress, on_segments=on_segments)
    else:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if transcript.language is None:
        # No window was decoded (no speech: the VAD skips silence): the language is detected on the
        # first 30 s as openai/whisper does on any recording (English on silence), so that a
        # response always names one (`verbose_json` had `"language": ""`).
        first = audio[:MAX_WINDOW_SAMPLES]
        transcript.language = await detect_language(engine, first, options) if len(first) else "en"
    return transcript
