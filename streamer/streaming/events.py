"""What a `Session` emits: work for the engine (`SubmitWindow`) and messages for the client.

Times are seconds from the start of the stream. `to_dict()` gives the wire JSON of the
client-facing events (`docs/protocol.md`); floats are rounded to milliseconds there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, Union

import numpy as np

from streamer.audio.vad import SAMPLE_RATE


def _ms(t: float) -> float:
    return round(float(t), 3)


@dataclass(frozen=True)
class SpeechStarted:
    """The VAD heard speech that began at `t` (reported once it has lasted min_speech_ms)."""

    t: float
    utterance_id: int
    start: float | None = None
    """Where the utterance's audio begins, padding included (at most the padding before `t`, never
    before the end of the previous utterance); not on the native wire."""

    def to_dict(self) -> dict:
        return {"type": "speech_started", "t": _ms(self.t), "utterance_id": self.utterance_id}


@dataclass(frozen=True)
class SpeechStopped:
    """Speech stopped at `t` (reported once min_silence_ms of silence has followed)."""

    t: float
    utterance_id: int
    discarded: bool = False
    """The utterance (opened by a max-length cut) held too little speech: no final follows. Not on
    the native wire (a client pairs events by utterance_id)."""

    def to_dict(self) -> dict:
        return {"type": "speech_stopped", "t": _ms(self.t), "utterance_id": self.utterance_id}


class WindowId(NamedTuple):
    """Names a window within its session; the session reads its parts back from the fields, not
    by parsing a string."""

    utterance_id: int
    kind: Literal["partial", "final"]
    seq: int = 0
    """A partial's number within its utterance (1, 2, ...); 0 for the final."""


@dataclass(frozen=True, eq=False)
class SubmitWindow:
    """Audio for the engine; the caller transcribes it and hands the result to `Session.on_result`.

    Not sent to the client.
    """

    window_id: WindowId
    """Unique within the session; names the result that comes back."""
    audio: np.ndarray
    """float32 mono 16 kHz, at most 30 s; the utterance from its (padded) start, after
    `context_s` of preceding audio on a final with acoustic context."""
    start: float
    """Stream time of `audio[0]`: add it to the result's window-relative times."""
    prompt: str | None
    """Previous final text to condition on, or None."""
    speech_end: float | None = None
    """Finals only: stream time at which the speech of the utterance stopped (or was cut);
    finalisation latency is measured from the moment the stream reached it."""
    context_s: float = 0.0
    """Finals only: seconds of the stream's preceding audio that open `audio` before the utterance
    (acoustic context, `StreamingConfig.acoustic_context`); 0: the utterance alone."""
    context: tuple[tuple[float, float, tuple[int, ...]], ...] = ()
    """The previous finals' segments heard in that audio, for the decoder's forced prefix: (start,
    end) in seconds from `audio[0]` and their text tokens. Only what the decoder writes after them
    is this utterance's text."""

    @property
    def kind(self) -> Literal["partial", "final"]:
        return self.window_id.kind

    @property
    def utterance_id(self) -> int:
        return self.window_id.utterance_id

    @property
    def end(self) -> float:
        """Stream time just after the last sample."""
        return self.start + len(self.audio) / SAMPLE_RATE

    @property
    def utterance_start(self) -> float:
        """Stream time at which the utterance's own audio begins (after any context)."""
        return self.start + self.context_s


def window_context(spans: list[tuple[float, float, tuple[int, ...]]], origin: float,
                   limit: float) -> tuple[tuple[float, float, tuple[int, ...]], ...]:
    """`SubmitWindow.context` from segments (start, end in stream seconds, tokens): times from
    `origin`, in order, and none after `limit` (where the window's new speech begins, so that the
    decoder's next timestamp may fall there)."""
    last, out = 0.0, []
    for start, end, tokens in spans:
        a = min(max(start - origin, last), limit)
        b = min(max(end - origin, a), limit)
        out.append((a, b, tokens))
        last = b
    return tuple(out)


@dataclass(frozen=True)
class Partial:
    """Provisional text of an utterance in progress; `text == stable + unstable`.

    `stable` only ever grows within an utterance (a client may append it for good);
    `unstable` may change with the next partial; the `Final` replaces both.
    """

    utterance_id: int
    text: str
    stable: str
    unstable: str
    start: float
    end: float

    def to_dict(self) -> dict:
        return {
            "type": "partial",
            "utterance_id": self.utterance_id,
            "text": self.text,
            "stable": self.stable,
            "unstable": self.unstable,
            "start": _ms(self.start),
            "end": _ms(self.end),
        }


@dataclass(frozen=True)
class Final:
    """The transcript of one utterance, replacing its partials."""

    utterance_id: int
    text: str
    start: float
    end: float
    words: list[dict] | None
    """`{"word", "start", "end", "probability"}` per word, when word timestamps were decoded."""
    language: str | None
    no_speech_prob: float
    avg_logprob: float
    token_logprobs: tuple[tuple[int, float], ...] = ()
    """(token, log probability) of each text token, when the decode kept them (not after beam
    search); Realtime's `logprobs`. Not in the native `final`."""

    def to_dict(self) -> dict:
        words = None
        if self.words is not None:
            words = [{**w, "start": _ms(w["start"]), "end": _ms(w["end"])} for w in self.words]
        return {
            "type": "final",
            "utterance_id": self.utterance_id,
            "text": self.text,
            "start": _ms(self.start),
            "end": _ms(self.end),
            "words": words,
            "language": self.language,
            "no_speech_prob": round(float(self.no_speech_prob), 4),
            "avg_logprob": round(float(self.avg_logprob), 4),
        }


Event = Union[SpeechStarted, SpeechStopped, SubmitWindow, Partial, Final]
