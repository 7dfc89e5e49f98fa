"""The native protocol (docs/protocol.md 1) as a state machine with no I/O.

`NativeProtocol` is one `/v1/stream` connection: a client message in (`receive_text`,
`receive_bytes`), a list out of messages for the client (`Send`), the connection's end (`Close`)
and commands for the transport (`Start`, `Resume`, `Audio` (a validated frame), `Flush`, `Stop`). The transport
carries the commands out (admission, the resume store, the bridges) and tells the protocol how
they went (`started`, `resumed`, `fail`); at the end it asks for the last messages (`close`).
`DataChannelProtocol` is the same protocol on WebRTC's `events` channel, whose stream the offer
started and whose audio is the RTP track.

A session's own events (the bridges' `StreamEvent`s) become wire messages through
`session_message`, the same on both transports; `/v1/stream` numbers them in its `SessionLog`,
which outlives a connection so that a resume can replay them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any, Union

import numpy as np

from streamer.audio.decode import pcm_dtype
from streamer.config import StreamingConfig
from streamer.protocols import validation as v
from streamer.protocols.outputs import Audio, Close, Send
from streamer.protocols.start import ModelInfo, ProtocolError, StartOptions, bad_field, parse_start
from streamer.protocols.validation import ValidationError
from streamer.streaming.live import Committed, Finalized, StreamEvent

MAX_FRAME_S = 5.0
"""Longest audio in one binary frame."""
TRACK_RATE = 48000
"""WebRTC's audio rate (Opus), which its `ready` reports."""
RESUME_FIELDS = {"token", "bytes_sent", "last_event_id"}


# --- what the protocol tells the transport --------------------------------------------------------

@dataclass(frozen=True)
class Start:
    """A valid `start`: admit the stream, build its session, then call `started` (or `fail`)."""

    options: StartOptions


@dataclass(frozen=True)
class Resume:
    """A `start` with `resume` of the right shape (`token`, `bytes_sent`, `last_event_id`, unchecked):
    find the session, check it with its `SessionLog`, then call `resumed`."""

    fields: dict


@dataclass(frozen=True)
class Flush:
    """End the open utterance now."""


@dataclass(frozen=True)
class Stop:
    """End of audio: finalise, then `close("stop")`."""


Output = Union[Send, Close, Start, Resume, Audio, Flush, Stop]


class State(Enum):
    OPEN = "open"
    """Connected, no stream yet: only `start` (or `stop`, `ping`)."""
    STREAMING = "streaming"
    ENDED = "ended"
    """Failed or closed: nothing more is taken."""


def parse_message(text: str) -> tuple[str, dict]:
    """A client text message -> (type, message); ProtocolError bad_json / unknown_type."""
    try:
        msg = v.parse_json(text)
    except ValidationError as e:
        raise ProtocolError("bad_json", e.message) from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_json", "a message must be a JSON object")
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("unknown_type", "a message needs a string `type`")
    return kind, msg


class NativeProtocol:
    """One `/v1/stream` connection's protocol state."""

    def __init__(self, defaults: StreamingConfig, model: ModelInfo, max_message_bytes: int | None = None):
        self.defaults = defaults
        self.model = model
        self.max_message_bytes = max_message_bytes
        self.state = State.OPEN
        self.start: StartOptions | None = None
        """The stream's options once it has started (or resumed)."""

    # --- client messages ------------------------------------------------------------------------

    def receive_text(self, text: str) -> list[Output]:
        if self.state is State.ENDED:
            return []
        too_large = self._too_large(len(text.encode()))
        if too_large:
            return too_large
        try:
            kind, msg = parse_message(text)
            return self._on_message(kind, msg)
        except ProtocolError as e:
            return [Send(e.event())]

    def receive_bytes(self, data: bytes) -> list[Output]:
        if self.state is State.ENDED:
            return []
        too_large = self._too_large(len(data))
        if too_large:
            return too_large
        try:
            return self._on_audio(data)
        except ProtocolError as e:
            return [Send(e.event())]

    def _too_large(self, size: int) -> list[Output]:
        limit = self.max_message_bytes
        if limit is None or size <= limit:
            return []
        return self.fail("too_large", f"a {size}-byte message is over the {limit}-byte limit", 1009)

    def _on_message(self, kind: str, msg: dict) -> list[Output]:
        if kind == "stop":
            return [Stop()]
        if kind == "start":
            return self._on_start(msg)
        if kind == "flush":
            if self.state is not State.STREAMING:
                raise ProtocolError("not_started", "flush before start")
            return [Flush()]
        if kind == "ping":
            return [Send({"type": "pong", **({"id": msg["id"]} if "id" in msg else {})})]
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}")

    def _on_start(self, msg: dict) -> list[Output]:
        if self.state is State.STREAMING:
            raise ProtocolError("already_started", "the stream has started already")
        if "resume" in msg:
            resume = msg["resume"]
            if not isinstance(resume, dict) or set(resume) - RESUME_FIELDS:
                raise bad_field("resume", "must be {token, bytes_sent, last_event_id}")
            return [Resume(resume)]
        return [Start(parse_start(msg, self.defaults, self.model.multilingual, self.model.languages))]

    def _on_audio(self, data: bytes) -> list[Output]:
        if self.state is not State.STREAMING:
            raise ProtocolError("not_started", "audio before start")
        start = self.start
        frame_bytes = pcm_dtype(start.encoding).itemsize * start.channels
        if not data or len(data) % frame_bytes:
            raise ProtocolError("bad_frame", f"a frame must be a non-empty whole number of {frame_bytes}-byte "
                                             f"sample frames, not {len(data)} bytes")
        if len(data) // frame_bytes > MAX_FRAME_S * start.sample_rate:
            raise ProtocolError("bad_frame", f"a frame may hold at most {MAX_FRAME_S:g} s of audio")
        if start.encoding == "pcm_f32le" and not np.isfinite(np.frombuffer(data, "<f4")).all():
            # NaN would reach the model: a final of "!!!..." decoded again and again.
            raise ProtocolError("bad_frame", "pcm_f32le samples must be finite (no NaN or infinity)")
        return [Audio(data)]

    # --- what the transport reports -------------------------------------------------------------

    def started(self, session_id: str, start: StartOptions, language: str | None,
                resume_token: str | None) -> list[Output]:
        """The stream was admitted: `ready`."""
        self.state, self.start = State.STREAMING, start
        return [Send(self._ready(session_id, start, language, resume_token))]

    def resumed(self, session_id: str, start: StartOptions, language: str | None, resume_token: str,
                log: "SessionLog") -> list[Output]:
        """A kept session was taken over: `ready` with what the server has, then the events after
        the client's `last_event_id` (checked with `log.check_resume`)."""
        self.state, self.start = State.STREAMING, start
        ready = {**self._ready(session_id, start, language, resume_token), "resumed": True,
                 "bytes_received": log.bytes_received, "last_event_id": log.next_id - 1}
        return [Send(ready)]

    def _ready(self, session_id: str, start: StartOptions, language: str | None, resume_token: str | None) -> dict:
        ready = {"type": "ready", "session_id": session_id, "model": self.model.name,
                 "sample_rate": start.sample_rate, "language": language, "task": start.streaming.task,
                 "resume_token": resume_token}
        if start.multichannel and start.channels > 1:
            ready["channels"] = start.channels
            ready["multichannel"] = True
        return ready

    def fail(self, code: str, message: str, close_code: int, retry_after_s: float | None = None) -> list[Output]:
        """A fatal error (a refusal, a failed decode, a bug): `error`, `closed` (error), close."""
        self.state = State.ENDED
        error = {"type": "error", "code": code, "message": message}
        if retry_after_s is not None:
            error["retry_after_s"] = retry_after_s
        return [Send(error), Send({"type": "closed", "reason": "error"}), Close(close_code)]

    def close(self, reason: str) -> list[Output]:
        """The stream ends without error (`stop`, `shutdown`, `idle_timeout`, `no_audio`, `resumed`)."""
        self.state = State.ENDED
        return [Send({"type": "closed", "reason": reason}), Close(1001 if reason == "shutdown" else 1000)]


class DataChannelProtocol(NativeProtocol):
    """The native protocol on WebRTC's data channel `events`: the offer's `start` started the
    stream, audio is the RTP track (a binary message is `bad_frame`), messages have no size limit
    of their own (SCTP bounds them)."""

    def __init__(self, defaults: StreamingConfig, model: ModelInfo, start: StartOptions):
        super().__init__(defaults, model)
        self.state, self.start = State.STREAMING, start

    def _on_start(self, msg: dict) -> list[Output]:
        raise ProtocolError("already_started", "the offer's `start` started the stream")

    def _on_audio(self, data: bytes) -> list[Output]:
        raise ProtocolError("bad_frame", "send audio as the RTP track; the data channel takes JSON text only")

    def _ready(self, session_id: str, start: StartOptions, language: str | None, resume_token: str | None) -> dict:
        # No resume on WebRTC; the rate is the track's.
        return {"type": "ready", "session_id": session_id, "model": self.model.name, "sample_rate": TRACK_RATE,
                "language": language, "task": start.streaming.task}


# --- a session's events -----------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeFailed:
    """A final's decode failed: the stream ends with `fail("internal", message, 1011)`."""

    message: str


def event_dict(event: StreamEvent) -> dict | None:
    """The wire JSON of a bridge event (section 1.2); None if it has no message of its own."""
    if isinstance(event, Committed):
        return None
    if isinstance(event, Finalized):
        if event.final is None:
            return None
        return {**event.final.to_dict(), "latency_ms": round(event.latency_ms, 1)}
    return event.to_dict()


def session_message(event: StreamEvent, channel: int | None) -> dict | DecodeFailed | None:
    """What a bridge event of the channel `channel` (None: a mixed stream) says to the client: a
    message, the end of the stream, or nothing. An utterance lost with an engine core is a
    non-fatal `engine_unavailable` error: the core is being restarted and the stream goes on."""
    if isinstance(event, Finalized) and event.error_code == "engine_unavailable":
        message = {"type": "error", "code": "engine_unavailable", "utterance_id": event.utterance_id,
                   "message": f"utterance {event.utterance_id} was lost: {event.error}; the stream goes on"}
    elif isinstance(event, Finalized) and event.error is not None:
        return DecodeFailed(f"decoding utterance {event.utterance_id} failed: {event.error}")
    else:
        message = event_dict(event)
    if message is not None and channel is not None:
        message["channel"] = channel
    return message


class SessionLog:
    """What a resume of a `/v1/stream` session needs (docs/protocol.md 1.4): its messages numbered
    (`event_id` 1, 2, ... over the whole session) and the last `keep` of them kept, and the audio
    bytes taken so far."""

    def __init__(self, keep: int):
        self.events: deque[dict] = deque(maxlen=keep)
        self.next_id = 1
        self.bytes_received = 0

    def number(self, message: dict) -> dict:
        """`message` with its `event_id`, kept for a replay."""
        message["event_id"] = self.next_id
        self.next_id += 1
        self.events.append(message)
        return message

    def check_resume(self, bytes_sent: Any, last_event_id: Any) -> ProtocolError | None:
        """Why a resume with these `resume` fields cannot continue this session, or None."""
        problem = None
        if not isinstance(bytes_sent, int) or isinstance(bytes_sent, bool) or bytes_sent < self.bytes_received:
            problem = (f"bytes_sent must be a whole number of at least {self.bytes_received} "
                       "(the bytes the server took)")
        elif not isinstance(last_event_id, int) or isinstance(last_event_id, bool) \
                or not 0 <= last_event_id < self.next_id:
            problem = f"last_event_id must be a whole number from 0 to {self.next_id - 1}"
        return None if problem is None else ProtocolError("resume_failed", problem, "resume")

    def replay(self, after: int) -> list[dict]:
        """The kept messages after `event_id` `after`; ProtocolError when some are no longer kept."""
        if self.events and self.events[0]["event_id"] > after + 1:
            raise ProtocolError("resume_failed", f"events after {after} are no longer kept")
        return [m for m in self.events if m["event_id"] > after]
