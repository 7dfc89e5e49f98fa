"""`/v1/stream`: the native WebSocket protocol (docs/protocol.md, section 1).

JSON text messages and binary PCM in, JSON text events out. Receiving and sending are two
tasks: the receiver feeds audio into the stream's `Bridge`; everything for the client goes
through an outbox that the sender drains, so events leave in the order they were made.
`parse_start` and `parse_message` are shared with the WebRTC data channel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket

from streamer.audio.decode import StreamResampler
from streamer.config import StreamingConfig, VADConfig
from streamer.server.bridge import Bridge, Committed, Finalized, StreamEvent
from streamer.server.socket_stream import FINISH_TIMEOUT_S, SocketStream
from streamer.server import validation as v
from streamer.server.state import ServerState
from streamer.server.validation import ValidationError, show
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")

MAX_FRAME_S = 5.0
"""Longest audio in one binary frame."""

ENCODINGS = {"pcm_s16le": 2, "pcm_f32le": 4}
"""Encoding -> bytes per sample."""

MAX_ERROR_CHARS = 300
"""Longest `message` (and `field`) of an error event."""
MAX_LANGUAGE_CHARS = 32
"""Longer than any language code or name."""

# `vad` keys of the start message: (low, high, both bounds exclusive).
_VAD_RANGES = {
    "threshold": (0.0, 1.0, True),
    "neg_threshold": (0.0, 1.0, True),
    "min_silence_ms": (0, 10000, False),
    "speech_pad_ms": (0, 2000, False),
    "min_speech_ms": (0, 10000, False),
    "max_utterance_s": (1, 30, False),
}


class ProtocolError(Exception):
    """A client message the protocol rejects; `code` is the wire error code."""

    def __init__(self, code: str, message: str, field: str | None = None):
        # Capped: a message may quote what the client sent (a 1-MB field name, say).
        message = message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field if field is None or len(field) <= MAX_ERROR_CHARS else field[:MAX_ERROR_CHARS] + "..."

    def event(self) -> dict:
        e = {"type": "error", "code": self.code, "message": self.message}
        if self.field is not None:
            e["field"] = self.field
        return e


@dataclass(frozen=True)
class StartOptions:
    """A validated `start` message."""

    sample_rate: int
    encoding: str
    channels: int
    streaming: StreamingConfig
    """Per-stream behaviour: the server's defaults with the client's fields applied."""


def _bad(name: str, message: str) -> ProtocolError:
    return ProtocolError("bad_field", f"{name}: {message}", name)


def _checked(check, *args, **kwargs):
    """A `validation` helper's result, its ValidationError as ProtocolError(bad_field)."""
    try:
        return check(*args, **kwargs)
    except ValidationError as e:
        raise _bad(e.field, e.message) from None


def parse_language(value: Any, multilingual: bool, known: set[str], label: str = "language") -> str | None:
    """`null`/`"auto"` -> None (detect); English-only models take only `en` (or nothing)."""
    if value is None or value == "auto":
        return None
    if not isinstance(value, str) or len(value) > MAX_LANGUAGE_CHARS:
        raise _bad(label, f"must be a language code or null, not {show(value)}")
    code = value.strip().lower()
    if not multilingual and code != "en":
        raise _bad(label, f"the served model is English-only: {value!r} is not available (use null, auto or en)")
    if multilingual and code not in known:
        raise _bad(label, f"unknown language {value!r}")
    return code


def parse_start(msg: dict, defaults: StreamingConfig, multilingual: bool, known_languages: set[str], *,
                audio_fields: bool = True) -> StartOptions:
    """Validate a start message's fields against docs/protocol.md; raises ProtocolError(bad_field).

    With `audio_fields=False` (WebRTC) the audio format fields are ignored: the track decides.
    """
    allowed = {"type", "sample_rate", "encoding", "channels", "language", "task", "partials",
               "partial_interval_ms", "condition_on_previous", "vad"}
    for name in msg:
        if name not in allowed:
            raise _bad(name, "unknown field")
    rate, encoding, channels = 16000, "pcm_s16le", 1
    if audio_fields:
        if "sample_rate" in msg:
            rate = _checked(v.integer, msg["sample_rate"], "sample_rate", 8000, 192000)
        if "encoding" in msg:
            encoding = _checked(v.choice, msg["encoding"], "encoding", ENCODINGS)
        if "channels" in msg:
            channels = _checked(v.integer, msg["channels"], "channels", 1, 8)
    changes: dict[str, Any] = {}
    if "language" in msg:
        changes["language"] = parse_language(msg["language"], multilingual, known_languages)
    if "task" in msg:
        _checked(v.choice, msg["task"], "task", ("transcribe", "translate"))
        if msg["task"] == "translate" and not multilingual:
            raise _bad("task", "translate needs a multilingual model; the served model is English-only")
        changes["task"] = msg["task"]
    if "partials" in msg:
        changes["partials"] = _checked(v.boolean, msg["partials"], "partials")
    if "partial_interval_ms" in msg:
        changes["partial_interval_s"] = _checked(v.number, msg["partial_interval_ms"], "partial_interval_ms",
                                                 100, 10000) / 1000.0
    if "condition_on_previous" in msg:
        changes["condition_on_previous"] = _checked(v.boolean, msg["condition_on_previous"], "condition_on_previous")
    if "vad" in msg:
        changes["vad"] = parse_vad(msg["vad"], defaults.vad)
    return StartOptions(rate, encoding, channels, dataclasses.replace(defaults, **changes))


def parse_vad(vad: Any, defaults: VADConfig) -> VADConfig:
    vad = _checked(v.obj, vad, "vad")
    values: dict[str, Any] = {}
    for name in vad:
        if name not in _VAD_RANGES:
            raise _bad(f"vad.{name}", "unknown field")
        low, high, open_ends = _VAD_RANGES[name]
        values[name] = _checked(v.number, vad[name], f"vad.{name}", low, high, open_low=open_ends,
                                open_high=open_ends, integer=name.endswith("_ms"))
    config = dataclasses.replace(defaults, **values)
    if config.neg_threshold is not None and config.neg_threshold >= config.threshold:
        raise _bad("vad.neg_threshold", f"{config.neg_threshold} must be below threshold {config.threshold}")
    return config


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


def model_info(state: ServerState) -> tuple[bool, set[str]]:
    """Whether the served model is multilingual, and the language codes it knows."""
    tokenizer = state.engine.tokenizer
    return tokenizer.multilingual, set(tokenizer.language_tokens)


def event_dict(event: StreamEvent) -> dict | None:
    """The wire JSON of a bridge event on `/v1/stream` (and the WebRTC data channel); None if
    the event has no message of its own there."""
    if isinstance(event, Committed):
        return None
    if isinstance(event, Finalized):
        if event.final is None:
            return None
        return {**event.final.to_dict(), "latency_ms": round(event.latency_ms, 1)}
    return event.to_dict()


class NativeStream(SocketStream):
    """One `/v1/stream` connection."""

    transport = "stream"

    def __init__(self, ws: WebSocket, state: ServerState):
        super().__init__(ws, state, secrets.token_hex(8))
        self._start: StartOptions | None = None
        self._resampler: StreamResampler | None = None
        self._bridge: Bridge | None = None
        self._failed = False
        """A fatal error was queued for the client (the receiver was stopped for it)."""

    # --- the connection -----------------------------------------------------------------------------

    async def _serve(self) -> None:
        self._receiver = asyncio.ensure_future(self._receive_loop())
        await asyncio.wait([self._receiver])
        if self._receiver.cancelled():
            reason = "shutdown" if self._grace is not None and not self._failed and not self.stuck else "error"
        else:
            reason = self._receiver.result()
        if reason == "disconnect" or reason == "error":
            if self._bridge is not None:
                self._bridge.close()
                self._resampler.close()
            if reason == "disconnect":
                self._outbox.abandon()
            return
        if self._bridge is not None:
            self._bridge.feed(self._resampler.flush())
            await self._bridge.finish(self._grace if reason == "shutdown" else FINISH_TIMEOUT_S)
            if self._failed:
                return
        self._send({"type": "closed", "reason": reason})
        self._outbox.close(1001 if reason == "shutdown" else 1000)

    def _send(self, message: dict) -> None:
        if message.get("type") == "error":
            self.state.metrics.errors.labels(message["code"]).inc()
        self._outbox.send(message)

    def _refuse(self, kind: str, message: str, close_code: int) -> None:
        self._fatal(kind, message, close_code)

    def _fatal(self, code: str, message: str, close_code: int) -> None:
        self._send({"type": "error", "code": code, "message": message})
        self._send({"type": "closed", "reason": "error"})
        self._outbox.close(close_code)

    # --- receiving ----------------------------------------------------------------------------------

    async def _receive_loop(self) -> str:
        """Handle client messages until the stream ends; returns why: stop, idle_timeout,
        disconnect or error (a fatal error has then been queued)."""
        limit = self.state.settings.server.max_message_bytes
        while True:
            if self._bridge is not None:
                await self._bridge.wait_for_room(self.state.settings.server.max_backlog_s)
            message = await self._next_message()
            if isinstance(message, str):
                return message
            text, data = message.get("text"), message.get("bytes")
            size = len(data) if data is not None else len((text or "").encode())
            if size > limit:
                self._fatal("too_large", f"a {size}-byte message is over the {limit}-byte limit", 1009)
                return "error"
            try:
                if data is not None:
                    self._on_audio(data)
                elif self._on_text(text or ""):
                    return "stop"
            except ProtocolError as e:
                if e.code == "overloaded":
                    self._fatal(e.code, e.message, 1013)
                    return "error"
                self._send(e.event())
            except Exception as e:  # a bug: the message is refused, the stream goes on
                log.exception("session %s: internal error on a client message", self.session_id)
                self._send({"type": "error", "code": "internal", "message": f"internal error: {type(e).__name__}"})

    def _on_text(self, text: str) -> bool:
        """Handle one text message; True when it was `stop`."""
        kind, msg = parse_message(text)
        if kind == "stop":
            return True
        if kind == "start":
            self._on_start(msg)
        elif kind == "flush":
            if self._bridge is None:
                raise ProtocolError("not_started", "flush before start")
            self._bridge.flush()
        elif kind == "ping":
            self._send({"type": "pong", **({"id": msg["id"]} if "id" in msg else {})})
        else:
            raise ProtocolError("unknown_type", f"unknown message type {kind!r}")
        return False

    def _on_start(self, msg: dict) -> None:
        if self._bridge is not None:
            raise ProtocolError("already_started", "the stream has started already")
        multilingual, languages = model_info(self.state)
        start = parse_start(msg, self.state.settings.streaming, multilingual, languages)
        if self.state.engine_saturated():
            raise ProtocolError("overloaded", "the engine queue is full; retry later")
        language = start.streaming.language if multilingual else "en"
        self._start = start
        self._resampler = StreamResampler(start.sample_rate, start.channels, start.encoding)
        session = Session(start.streaming, self.state.vad)
        self._bridge = Bridge(session, self.state.engine, self.state.metrics, self._emit, session_id=self.session_id,
                              language=language, task=start.streaming.task)
        self._send({"type": "ready", "session_id": self.session_id, "model": self.state.engine.model_name,
                    "sample_rate": start.sample_rate, "language": language, "task": start.streaming.task})

    def _on_audio(self, data: bytes) -> None:
        if self._bridge is None:
            raise ProtocolError("not_started", "audio before start")
        start = self._start
        frame_bytes = ENCODINGS[start.encoding] * start.channels
        if not data or len(data) % frame_bytes:
            raise ProtocolError("bad_frame", f"a frame must be a non-empty whole number of {frame_bytes}-byte "
                                             f"sample frames, not {len(data)} bytes")
        if len(data) // frame_bytes > MAX_FRAME_S * start.sample_rate:
            raise ProtocolError("bad_frame", f"a frame may hold at most {MAX_FRAME_S:g} s of audio")
        self.audio_seen = True
        self._bridge.feed(self._resampler.push(data))

    def _emit(self, event: StreamEvent) -> None:
        if isinstance(event, Finalized) and event.error_code == "engine_unavailable":
            self._send({"type": "error", "code": "engine_unavailable", "utterance_id": event.utterance_id,
                        "message": f"utterance {event.utterance_id} was lost: {event.error}; the stream goes on"})
            return
        if isinstance(event, Finalized) and event.error is not None:
            self._fatal("internal", f"decoding utterance {event.utterance_id} failed: {event.error}", 1011)
            self._failed = True
            if self._receiver is not None and not self._receiver.done():
                self._receiver.cancel()
            return
        message = event_dict(event)
        if message is not None:
            self._send(message)


async def stream_endpoint(ws: WebSocket) -> None:
    await NativeStream(ws, ws.app.state.streamer).run()
