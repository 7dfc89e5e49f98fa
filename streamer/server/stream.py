"""`/v1/stream`: the native WebSocket protocol (docs/protocol.md, section 1).

JSON text messages and binary PCM in, JSON text events out. Receiving and sending are two
tasks: the receiver feeds audio into the stream's `Bridge`; everything for the client goes
through an outbox that the sender drains, so events leave in the order they were made.
`parse_start` and `parse_message` are shared with the WebRTC data channel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket

from streamer.audio.decode import StreamResampler
from streamer.config import StreamingConfig, VADConfig
from streamer.server.bridge import Bridge, Committed, Finalized, StreamEvent
from streamer.server.socket_stream import FINISH_TIMEOUT_S, SocketStream
from streamer.server.state import ServerState
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")

MAX_FRAME_S = 5.0
"""Longest audio in one binary frame."""

ENCODINGS = {"pcm_s16le": 2, "pcm_f32le": 4}
"""Encoding -> bytes per sample."""

# `vad` keys of the start message: (low, high, the low bound is exclusive).
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
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

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


def _number(msg: dict, name: str, low: float, high: float, *, integer: bool = False, open_low: bool = False,
            label: str | None = None) -> float:
    label = label or name
    value = msg[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(label, f"must be a number, not {json.dumps(value)}")
    if integer and value != int(value):
        raise _bad(label, f"must be a whole number, not {value}")
    if value < low or value > high or (open_low and value == low):
        raise _bad(label, f"{value} is outside {low}..{high}" + (" (exclusive)" if open_low else ""))
    return int(value) if integer else float(value)


def _boolean(msg: dict, name: str) -> bool:
    if not isinstance(msg[name], bool):
        raise _bad(name, f"must be true or false, not {json.dumps(msg[name])}")
    return msg[name]


def parse_language(value: Any, multilingual: bool, known: set[str], label: str = "language") -> str | None:
    """`null`/`"auto"` -> None (detect); English-only models take only `en` (or nothing)."""
    if value is None or value == "auto":
        return None
    if not isinstance(value, str):
        raise _bad(label, f"must be a language code or null, not {json.dumps(value)}")
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
               "partial_interval_ms", "condition_on_previous", "condition_on_previous_text", "prompt", "vad"}
    for name in msg:
        if name not in allowed:
            raise _bad(name, "unknown field")
    rate, encoding, channels = 16000, "pcm_s16le", 1
    if audio_fields:
        if "sample_rate" in msg:
            rate = _number(msg, "sample_rate", 8000, 192000, integer=True)
        if "encoding" in msg:
            encoding = msg["encoding"]
            if encoding not in ENCODINGS:
                raise _bad("encoding", f"must be one of {', '.join(ENCODINGS)}, not {json.dumps(encoding)}")
        if "channels" in msg:
            channels = _number(msg, "channels", 1, 8, integer=True)
    changes: dict[str, Any] = {}
    if "language" in msg:
        changes["language"] = parse_language(msg["language"], multilingual, known_languages)
    if "task" in msg:
        if msg["task"] not in ("transcribe", "translate"):
            raise _bad("task", f"must be transcribe or translate, not {json.dumps(msg['task'])}")
        if msg["task"] == "translate" and not multilingual:
            raise _bad("task", "translate needs a multilingual model; the served model is English-only")
        changes["task"] = msg["task"]
    if "partials" in msg:
        changes["partials"] = _boolean(msg, "partials")
    if "partial_interval_ms" in msg:
        changes["partial_interval_s"] = _number(msg, "partial_interval_ms", 100, 10000) / 1000.0
    for name in ("condition_on_previous", "condition_on_previous_text"):  # the second is openai's name
        if name in msg:
            changes["condition_on_previous"] = _boolean(msg, name)
    if "prompt" in msg:
        changes["prompt"] = parse_prompt(msg["prompt"], "prompt")
    if "vad" in msg:
        changes["vad"] = parse_vad(msg["vad"], defaults.vad)
    return StartOptions(rate, encoding, channels, dataclasses.replace(defaults, **changes))


PROMPT_MAX_CHARS = 2000
"""Longest prompt accepted (Whisper keeps at most its last 223 tokens anyway)."""


def parse_prompt(value: Any, label: str) -> str | None:
    """A prompt field: a string of at most PROMPT_MAX_CHARS, or null."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(label, f"must be a string or null, not {json.dumps(value)}")
    if len(value) > PROMPT_MAX_CHARS:
        raise _bad(label, f"{len(value)} characters is over the {PROMPT_MAX_CHARS}-character limit")
    return value.strip() or None


def parse_vad(vad: Any, defaults: VADConfig) -> VADConfig:
    if not isinstance(vad, dict):
        raise _bad("vad", f"must be an object, not {json.dumps(vad)}")
    values: dict[str, Any] = {}
    for name in vad:
        if name not in _VAD_RANGES:
            raise _bad(f"vad.{name}", "unknown field")
        low, high, open_low = _VAD_RANGES[name]
        values[name] = _number(vad, name, low, high, integer=name.endswith("_ms"), open_low=open_low,
                               label=f"vad.{name}")
    config = dataclasses.replace(defaults, **values)
    if config.neg_threshold is not None and config.neg_threshold >= config.threshold:
        raise _bad("vad.neg_threshold", f"{config.neg_threshold} must be below threshold {config.threshold}")
    return config


def parse_message(text: str) -> tuple[str, dict]:
    """A client text message -> (type, message); ProtocolError bad_json / unknown_type."""
    try:
        msg = json.loads(text)
    except ValueError as e:
        raise ProtocolError("bad_json", f"not valid JSON: {e}") from None
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
            reason = "shutdown" if self._grace is not None and not self._failed else "error"
        else:
            reason = self._receiver.result()
        if reason == "disconnect" or reason == "error":
            if self._bridge is not None:
                self._bridge.close()
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
            except Exception as e:  # a bug: tell the client, keep the server up
                log.exception("session %s: internal error", self.session_id)
                self._fatal("internal", f"internal error: {type(e).__name__}", 1011)
                return "error"

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
        self._bridge.feed(self._resampler.push(data))

    def _emit(self, event: StreamEvent) -> None:
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
