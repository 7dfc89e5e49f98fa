"""Live finals that stop early, and their continuation.

Whisper sometimes ends a long window with end-of-text while speech goes on to near its end: on a
27-s menu (base, Spanish) it wrote segments to 21.3 s and stopped, leaving out the last ten words
(the VAD's end was 0.15 s after the last word; the same audio with 0.65 s more after it decoded
in full). Offline `fast` decodes such a rest as one more window (`longform/speech.left_out`); a
live final does the same before it goes out: when its segments end more than
`StreamingConfig.continue_after_s` before its window's audio does and the VAD heard speech after
them, the rest [last segment end, window end) is decoded as a continuation of the same final, and
the segments are joined into one final.

With acoustic context on, the continuation window opens at the start of the final's own last
segments that fit (the window at most `CONTEXT_WINDOW_S`, the prefix at most `CONTEXT_MAX_TOKENS`),
and those segments are its forced prefix, as acoustic context forces the previous finals: the
decoder goes on from where it stopped, and the rest is short enough that its speech is no longer
at the end of a 30-s window. With it off, the rest is decoded alone (as `fast` does).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from streamer.audio.vad import SAMPLE_RATE
from streamer.streaming.events import SubmitWindow, WindowId, window_context

MAX_CONTINUATIONS = 2
"""Continuation decodes of one final, at most: each costs a decode, and a rest that stops early
twice is not speech Whisper will write."""
CONTINUE_MIN_SPEECH_S = 0.5
"""VAD speech (frames at the speech threshold) after a final's last segment that counts as words
left out, not the edge of the last word: a short word is about 0.3 s."""


def rest_start(window: SubmitWindow, segments: list, after_s: float) -> float | None:
    """Stream time at which the speech that a final's `segments` (times from `window.start`) left
    out begins, or None when they reach to within `after_s` of the window's end."""
    if not segments or after_s <= 0:
        return None
    covered = min(window.start + segments[-1].end, window.end)
    return covered if window.end - covered > after_s else None


def continuation_window(window: SubmitWindow, segments: list, rest: float, number: int, *, prefix: bool,
                        max_s: float, max_tokens: int) -> SubmitWindow:
    """The window that decodes a final's rest from stream time `rest`: with `prefix`, the final's
    last segments that fit in `max_s` and `max_tokens` open it as its context (forced prefix);
    else the rest alone. `number` (1, 2, ...) names it apart from the final's first window."""
    own = [(window.start + s.start, window.start + s.end, tuple(s.tokens)) for s in segments if s.tokens]
    begin, kept, n = rest, [], 0
    if prefix:
        for start, end, tokens in reversed(own):
            start = max(start, window.utterance_start)
            if window.end - start > max_s or n + len(tokens) + 2 > max_tokens or start >= begin:
                break
            kept.insert(0, (start, end, tokens))
            begin, n = start, n + len(tokens) + 2
    skip = round((begin - window.start) * SAMPLE_RATE)
    return dataclasses.replace(window, window_id=WindowId(window.utterance_id, "final", number),
                               audio=window.audio[skip:], start=window.start + skip / SAMPLE_RATE,
                               context_s=rest - begin, context=window_context(kept, begin, rest - begin))


def joined(window: SubmitWindow, result: Any, segments: list, rest: list, rest_result: Any,
           continuation: SubmitWindow) -> Any:
    """The final's `result` with the `rest` segments of a continuation's result appended: one
    result in `window`'s frame (times from its start, in order), text and tokens joined, the
    average log-probability weighted by tokens. `segments`: the final's own segments so far."""
    shift = continuation.start - window.start
    last = segments[-1].end if segments else 0.0
    added = []
    for s in rest:
        start = max(s.start + shift, last)
        end = min(max(s.end + shift, start), window.end - window.start)
        added.append(dataclasses.replace(s, start=start, end=end))
        last = end
    # A result with context keeps the segments of its context: the final takes its text from the
    # segments after it (`Session.new_segments`), so the rest goes at the end.
    out = list(result.segments or []) + added
    for i, s in enumerate(out):
        out[i] = dataclasses.replace(s, id=i)
    n0, n1 = len(result.tokens), len(rest_result.tokens)
    logprob = (result.avg_logprob * n0 + rest_result.avg_logprob * n1) / max(n0 + n1, 1)
    logprobs = list(result.token_logprobs) + list(rest_result.token_logprobs)
    return dataclasses.replace(
        result, text=result.text + "".join(s.text for s in added), tokens=list(result.tokens) + list(rest_result.tokens),
        segments=out, avg_logprob=logprob, temperature=max(result.temperature, rest_result.temperature),
        token_logprobs=logprobs if len(logprobs) == n0 + n1 else [],  # empty after beam search
        truncated=result.truncated or rest_result.truncated)
