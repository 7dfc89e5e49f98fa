"""`/v1/stream`: the native WebSocket protocol (docs/protocol.md, section 1).

JSON text messages and binary PCM (or G.711) in, JSON text events out. Receiving and sending
are two tasks: the receiver feeds audio into the stream's bridges (`ChannelStreams`: one, or one
per channel with `multichannel`); everything for the client goes through an outbox that the
sender drains, so events leave in the order they were made. `parse_start` and `parse_message`
are shared with the WebRTC data channel.

A session (`_Live`: its bridges, the events it sent, the audio bytes it took) outlives its
connection: when the connection drops, it is parked in `ServerState.resume` for `resume_s`, and a
`start` with `resume` on a new connection takes it over (docs/protocol.md, 1.4). A resume that
lands on another gateway worker than the one holding the session is relayed to that one
(`server/relay.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket

from streamer.config import StreamingConfig, VADConfig
from streamer.server.auth import presented_key
from streamer.server.bridge import Bridge, Committed, Finalized, StreamEvent
from streamer.server.channels import ChannelStreams
from streamer.server.relay import Peers, pipe, relayed
from streamer.server.resume import ResumeError
from streamer.server.socket_stream import FINISH_TIMEOUT_S, SHUTDOWN_FLUSH_S, SocketStream
from streamer.server import validation as v
from streamer.server.state import ServerState
from streamer.server.validation import ValidationError, show
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")

MAX_FRAME_S = 5.0
"""Longest audio in one binary frame."""

ENCODINGS = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}
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

    def __init__(self, code: str, message: str, field: str | None = None, retry_after_s: float | None = None):
        # Capped: a message may quote what the client sent (a 1-MB field name, say).
        message = message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
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
    multichannel: bool = False
    """Each channel transcribed on its own (its own VAD and utterances); events carry `channel`."""


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
    allowed = {"type", "sample_rate", "encoding", "channels", "multichannel", "language", "task", "partials",
               "partial_interval_ms", "condition_on_previous", "condition_on_previous_text", "prompt", "vad",
               "acoustic_context"}
    for name in msg:
        if name not in allowed:
            raise _bad(name, "unknown field")
    rate, encoding, channels, multichannel = 16000, "pcm_s16le", 1, False
    if audio_fields:
        if "multichannel" in msg:
            multichannel = _checked(v.boolean, msg["multichannel"], "multichannel")
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
    for name in ("condition_on_previous", "condition_on_previous_text"):  # the second is openai's name
        if name in msg:
            changes["condition_on_previous"] = _checked(v.boolean, msg[name], name)
    if "prompt" in msg:
        changes["prompt"] = parse_prompt(msg["prompt"], "prompt")
    if "acoustic_context" in msg:
        changes["acoustic_context"] = _checked(v.boolean, msg["acoustic_context"], "acoustic_context")
    if "vad" in msg:
        changes["vad"] = parse_vad(msg["vad"], defaults.vad)
    return StartOptions(rate, encoding, channels, dataclasses.replace(defaults, **changes), multichannel)


PROMPT_MAX_CHARS = 2000
"""Longest prompt accepted (Whisper keeps at most its last 223 tokens anyway)."""


def parse_prompt(value: Any, label: str) -> str | None:
    """A prompt field: a string of at most PROMPT_MAX_CHARS, or null."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(label, f"must be a string or null, not {v.show(value)}")
    if len(value) > PROMPT_MAX_CHARS:
        raise _bad(label, f"{len(value)} characters is over the {PROMPT_MAX_CHARS}-character limit")
    return value.strip() or None


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


RESUME_LOG_EVENTS = 4096
"""Session events kept for replay after a resume (a minute of speech makes a few hundred)."""


class _Live:
    """A `/v1/stream` session apart from its connection: what a resume hands to the next one."""

    def __init__(self, start: StartOptions, state: ServerState, session_id: str, language: str | None):
        self.start = start
        self.state = state
        self.session_id = session_id
        self.language = language
        self.owner: NativeStream | None = None
        """The connection that serves the session now; None while it waits for a resume."""
        self.log: deque[dict] = deque(maxlen=RESUME_LOG_EVENTS)
        self.next_id = 1
        self.bytes_received = 0
        """Audio bytes taken so far: a resuming client sends its audio on from here."""
        self.token: str | None = None
        self.failed = False

        def make_bridge(channel: int | None) -> Bridge:
            session = Session(start.streaming, state.vad)
            return Bridge(session, state.engine, state.metrics, lambda e: self.emit(e, channel),
                          session_id=session_id, language=language, task=start.streaming.task,
                          cadence=state.cadence)

        self.channels = ChannelStreams(rate=start.sample_rate, channels=start.channels, encoding=start.encoding,
                                       multichannel=start.multichannel, make_bridge=make_bridge)

    def emit(self, event: StreamEvent, channel: int | None) -> None:
        if isinstance(event, Finalized) and event.error_code == "engine_unavailable":
            # The engine core holding it stopped (and is being restarted): the stream goes on.
            event = {"type": "error", "code": "engine_unavailable", "utterance_id": event.utterance_id,
                     "message": f"utterance {event.utterance_id} was lost: {event.error}; the stream goes on"}
            self._log(event, channel)
            return
        if isinstance(event, Finalized) and event.error is not None:
            self.failed = True
            message = f"decoding utterance {event.utterance_id} failed: {event.error}"
            if self.owner is not None:
                self.owner.fail("internal", message, 1011)
            else:
                self.expire()
            return
        message = event_dict(event)
        if message is not None:
            self._log(message, channel)

    def _log(self, message: dict, channel: int | None) -> None:
        """Number the event, keep it for a resume, and send it to the client if connected."""
        if channel is not None:
            message["channel"] = channel
        message["event_id"] = self.next_id
        self.next_id += 1
        self.log.append(message)
        if self.owner is not None:
            self.owner.deliver(message)

    def expire(self) -> None:
        """Nobody resumed in time (or the stream failed while parked): stop its work."""
        self.state.resume.discard(self.token)
        self.channels.close()

    def replay(self, after: int) -> list[dict]:
        if self.log and self.log[0]["event_id"] > after + 1:
            raise ProtocolError("resume_failed", f"events after {after} are no longer kept")
        return [m for m in self.log if m["event_id"] > after]


class _RelayTo(Exception):
    """A resume of a session that another gateway worker holds: relay the connection there."""

    def __init__(self, worker: int, start: dict, refusal: dict):
        self.worker, self.start, self.refusal = worker, start, refusal


class NativeStream(SocketStream):
    """One `/v1/stream` connection."""

    transport = "stream"

    def __init__(self, ws: WebSocket, state: ServerState):
        super().__init__(ws, state, secrets.token_hex(8))
        self._live: _Live | None = None
        self._failed = False
        """A fatal error was queued for the client (the receiver was stopped for it)."""
        self._taken_over = False
        """A resume on another connection took the session from this one."""
        self._relay: tuple | None = None
        """(connection to the owner, the `start` to send it) once this connection is relayed."""

    # --- the connection -----------------------------------------------------------------------------

    async def _serve(self) -> None:
        self._receiver = asyncio.ensure_future(self._receive_loop())
        await asyncio.wait([self._receiver])
        live = self._live
        if self._taken_over:
            self._send({"type": "closed", "reason": "resumed"})
            self._outbox.close(1000)
            return
        if self._receiver.cancelled():
            reason = "shutdown" if self._grace is not None and not self._failed and not self.stuck else "error"
        else:
            reason = self._receiver.result()
        if reason == "relay":
            # Nothing more goes through the outbox: the owner speaks to the client from now on.
            self._outbox.abandon()
            await self._outbox.flushed(SHUTDOWN_FLUSH_S)
            upstream, start = self._relay
            await pipe(self.ws, upstream, first=json.dumps(start),
                       send_timeout_s=self.state.settings.server.send_timeout_s)
            return
        if reason == "disconnect" and live is not None and live.token is not None and not live.failed:
            live.owner = None  # kept for a resume
            self.state.resume.park(live.token, live.expire)
            self._outbox.abandon()
            return
        if reason == "disconnect" or reason == "error":
            if live is not None:
                live.expire()
            if reason == "disconnect":
                self._outbox.abandon()
            return
        if live is not None:
            await live.channels.finish(self._grace if reason == "shutdown" else FINISH_TIMEOUT_S)
            self.state.resume.discard(live.token)
            if self._failed:
                return
        self._send({"type": "closed", "reason": reason})
        self._outbox.close(1001 if reason == "shutdown" else 1000)

    def _send(self, message: dict) -> None:
        if message.get("type") == "error":
            self.state.metrics.errors.labels(message["code"]).inc()
        self._outbox.send(message)

    def deliver(self, message: dict) -> None:
        """A session event for the client."""
        self._send(message)

    def fail(self, code: str, message: str, close_code: int) -> None:
        """A fatal error of the session: tell the client, stop reading."""
        self._fatal(code, message, close_code)
        self._failed = True
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()

    def take_over(self) -> None:
        """Another connection resumed this session."""
        self._taken_over = True
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()

    def _refuse(self, kind: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        self._fatal(kind, message, close_code, retry_after_s)

    def _fatal(self, code: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        error = {"type": "error", "code": code, "message": message}
        if retry_after_s is not None:
            error["retry_after_s"] = retry_after_s
        self._send(error)
        self._send({"type": "closed", "reason": "error"})
        self._outbox.close(close_code)

    # --- receiving ----------------------------------------------------------------------------------

    async def _receive_loop(self) -> str:
        """Handle client messages until the stream ends; returns why: stop, idle_timeout,
        disconnect or error (a fatal error has then been queued)."""
        limit = self.state.settings.server.max_message_bytes
        while True:
            if self._live is not None:
                for bridge in self._live.channels.bridges:
                    await bridge.wait_for_room(self.state.settings.server.max_backlog_s)
            message = await self._next_message()
            if self._taken_over:
                # Python 3.11's wait_for may return a message that arrived as it was cancelled:
                # what the old connection still had buffered must not reach the session.
                return "resumed"
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
                    self._fatal(e.code, e.message, 1013, e.retry_after_s)
                    return "error"
                self._send(e.event())
            except _RelayTo as e:
                upstream = await Peers.of(self.state.settings.server).connect(
                    e.worker, "/v1/stream", presented_key(self.ws.scope))
                if upstream is not None:
                    self._relay = (upstream, e.start)
                    return "relay"
                self._send(e.refusal)
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
            if self._live is None:
                raise ProtocolError("not_started", "flush before start")
            self._live.channels.flush()
        elif kind == "ping":
            self._send({"type": "pong", **({"id": msg["id"]} if "id" in msg else {})})
        else:
            raise ProtocolError("unknown_type", f"unknown message type {kind!r}")
        return False

    def _on_start(self, msg: dict) -> None:
        if self._live is not None:
            raise ProtocolError("already_started", "the stream has started already")
        if "resume" in msg:
            self._on_resume(msg["resume"])
            return
        multilingual, languages = model_info(self.state)
        start = parse_start(msg, self.state.settings.streaming, multilingual, languages)
        if (refusal := self.state.engine_refusal()) is not None:
            raise ProtocolError("overloaded", refusal.reason, retry_after_s=refusal.retry_after_s)
        language = start.streaming.language if multilingual else "en"
        live = _Live(start, self.state, self.session_id, language)
        live.token = self.state.resume.register(live, presented_key(self.ws.scope))
        live.owner, self._live = self, live
        self._send(self._ready(live))

    def _ready(self, live: _Live) -> dict:
        start = live.start
        ready = {"type": "ready", "session_id": live.session_id, "model": self.state.engine.model_name,
                 "sample_rate": start.sample_rate, "language": live.language, "task": start.streaming.task,
                 "resume_token": live.token}
        if start.multichannel and start.channels > 1:
            ready["channels"] = start.channels
            ready["multichannel"] = True
        return ready

    def _on_resume(self, resume: Any) -> None:
        """`start` with `resume`: take over a session kept after a dropped connection."""
        if not isinstance(resume, dict) or set(resume) - {"token", "bytes_sent", "last_event_id"}:
            raise _bad("resume", "must be {token, bytes_sent, last_event_id}")
        try:
            live = self.state.resume.claim(resume.get("token"), presented_key(self.ws.scope))
        except ResumeError as e:
            error = ProtocolError("resume_failed", e.message, "resume.token").event()
            if e.worker is not None:
                error["worker"] = e.worker
                peers = Peers.of(self.state.settings.server)
                if peers is not None and peers.reachable(e.worker) and not relayed(self.ws):
                    raise _RelayTo(e.worker, {"type": "start", "resume": resume}, error)
            self._send(error)
            return
        sent, last = resume.get("bytes_sent"), resume.get("last_event_id", 0)
        problem = None
        if not isinstance(sent, int) or isinstance(sent, bool) or sent < live.bytes_received:
            problem = f"bytes_sent must be a whole number of at least {live.bytes_received} (the bytes the server took)"
        elif not isinstance(last, int) or isinstance(last, bool) or not 0 <= last < live.next_id:
            problem = f"last_event_id must be a whole number from 0 to {live.next_id - 1}"
        if problem is not None:
            if live.owner is None:  # keep it resumable for a corrected attempt
                self.state.resume.park(live.token, live.expire)
            raise ProtocolError("resume_failed", problem, "resume")
        replay = live.replay(last)
        if live.owner is not None:
            live.owner.take_over()
        live.owner, self._live = self, live
        self._send({**self._ready(live), "resumed": True, "bytes_received": live.bytes_received,
                    "last_event_id": live.next_id - 1})
        for message in replay:
            self._send(message)

    def _on_audio(self, data: bytes) -> None:
        if self._live is None:
            raise ProtocolError("not_started", "audio before start")
        live, start = self._live, self._live.start
        frame_bytes = ENCODINGS[start.encoding] * start.channels
        if not data or len(data) % frame_bytes:
            raise ProtocolError("bad_frame", f"a frame must be a non-empty whole number of {frame_bytes}-byte "
                                             f"sample frames, not {len(data)} bytes")
        if len(data) // frame_bytes > MAX_FRAME_S * start.sample_rate:
            raise ProtocolError("bad_frame", f"a frame may hold at most {MAX_FRAME_S:g} s of audio")
        self.audio_seen = True
        live.bytes_received += len(data)
        live.channels.push(data)


async def stream_endpoint(ws: WebSocket) -> None:
    await NativeStream(ws, ws.app.state.streamer).run()
