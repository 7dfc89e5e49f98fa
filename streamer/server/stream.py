"""`/v1/stream`: the WebSocket transport of the native protocol (docs/protocol.md, section 1),
whose messages and states are `protocols/native.py`'s `NativeProtocol`.

JSON text messages and binary PCM (or G.711) in, JSON text events out. Receiving and sending
are two tasks: the receiver hands each message to the protocol and carries out its answer (audio
into the stream's bridges, `ChannelStreams`: one, or one per channel with `multichannel`);
everything for the client goes through an outbox that the sender drains, so events leave in the
order they were made.

A session (`_Live`: its bridges, its `SessionLog` of numbered events and audio bytes taken)
outlives its connection: when the connection drops, it is parked in `ServerState.resume` for
`resume_s`, and a `start` with `resume` on a new connection takes it over (docs/protocol.md,
1.4). A resume that lands on another gateway worker than the one holding the session is relayed
to that one (`server/relay.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import weakref

from starlette.websockets import WebSocket

from streamer.protocols.native import (DecodeFailed, Flush, NativeProtocol, Output, Resume, SessionLog, Start,
                                       Stop, session_message)
from streamer.protocols.outputs import Audio, Close, Send
from streamer.protocols.start import ModelInfo, ProtocolError, StartOptions
from streamer.server.auth import presented_key
from streamer.server.bridge import Bridge, StreamEvent
from streamer.server.channels import ChannelStreams
from streamer.server.relay import Peers, pipe, relayed
from streamer.server.resume import ResumeError
from streamer.server.socket_stream import SHUTDOWN_FLUSH_S, SocketStream, to_protocol
from streamer.server.state import ServerState
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")


class _Live:
    """A `/v1/stream` session apart from its connection: what a resume hands to the next one."""

    def __init__(self, start: StartOptions, state: ServerState, session_id: str, language: str | None):
        self.start = start
        self.state = state
        self.session_id = session_id
        self.language = language
        self.owner: NativeStream | None = None
        """The connection that serves the session now; None while it waits for a resume."""
        self.log = SessionLog(state.settings.server.resume_events)
        self.token: str | None = None
        self.failed = False

        me = weakref.ref(self)  # the bridges must not keep their session alive: a cycle only the GC frees, late

        def make_bridge(channel: int | None) -> Bridge:
            def emit(event: StreamEvent) -> None:
                if (live := me()) is not None:
                    live.emit(event, channel)

            return state.bridge(Session(start.streaming, state.vad), emit, session_id=session_id,
                                language=language, task=start.streaming.task)

        self.channels = ChannelStreams(rate=start.sample_rate, channels=start.channels, encoding=start.encoding,
                                       multichannel=start.multichannel, make_bridge=make_bridge)

    def emit(self, event: StreamEvent, channel: int | None) -> None:
        """A bridge event: numbered and kept for a resume, and sent if a connection serves the session."""
        message = session_message(event, channel)
        if isinstance(message, DecodeFailed):
            self.failed = True
            if self.owner is not None:
                self.owner.fail("internal", message.message, 1011)
            else:
                self.expire()
        elif message is not None:
            self.log.number(message)
            if self.owner is not None:
                self.owner.deliver(message)

    def expire(self) -> None:
        """Nobody resumed in time (or the stream failed while parked): stop its work."""
        self.state.resume.discard(self.token)
        self.channels.close()


class _RelayTo(Exception):
    """A resume of a session that another gateway worker holds: relay the connection there."""

    def __init__(self, worker: int, start: dict, refusal: dict):
        self.worker, self.start, self.refusal = worker, start, refusal


class NativeStream(SocketStream):
    """One `/v1/stream` connection."""

    transport = "stream"

    def __init__(self, ws: WebSocket, state: ServerState):
        super().__init__(ws, state, secrets.token_hex(8))
        self.protocol = NativeProtocol(state.settings.streaming, ModelInfo.of(state.engine),
                                       state.settings.server.max_message_bytes)
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
            self._carry_out(self.protocol.close("resumed"))
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
            await live.channels.finish(self._finish_within(reason))
            self.state.resume.discard(live.token)
            if self._failed:
                return
        self._carry_out(self.protocol.close(reason))

    def _send(self, message: dict) -> None:
        if message.get("type") == "error":
            self.state.metrics.errors.labels(message["code"]).inc()
        self._outbox.send(message)

    def deliver(self, message: dict) -> None:
        """A session event for the client."""
        self._send(message)

    def fail(self, code: str, message: str, close_code: int) -> None:
        """A fatal error of the session: tell the client, stop reading."""
        self._carry_out(self.protocol.fail(code, message, close_code))
        self._failed = True
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()

    def take_over(self) -> None:
        """Another connection resumed this session."""
        self._taken_over = True
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()

    def _refuse(self, kind: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        self._carry_out(self.protocol.fail(kind, message, close_code, retry_after_s))

    # --- receiving ----------------------------------------------------------------------------------

    async def _receive_loop(self) -> str:
        """Hand client messages to the protocol until the stream ends; returns why: stop,
        idle_timeout, no_audio, disconnect, relay or error (a fatal error has then been queued)."""
        while True:
            if self._live is not None:
                await self._live.channels.wait_for_room(self.state.settings.server.max_backlog_s)
            message = await self._next_message()
            if self._taken_over:
                # Python 3.11's wait_for may return a message that arrived as it was cancelled:
                # what the old connection still had buffered must not reach the session.
                return "resumed"
            if isinstance(message, str):
                return message
            try:
                end = self._carry_out(to_protocol(self.protocol, message))
            except _RelayTo as e:
                upstream = await Peers.of(self.state.settings.server).connect(
                    e.worker, "/v1/stream", presented_key(self.ws.scope))
                if upstream is not None:
                    self._relay = (upstream, e.start)
                    return "relay"
                self._send(e.refusal)
                continue
            except Exception as e:  # a bug: the message is refused, the stream goes on
                log.exception("session %s: internal error on a client message", self.session_id)
                self._send({"type": "error", "code": "internal", "message": f"internal error: {type(e).__name__}"})
                continue
            if end is not None:
                return end

    def _carry_out(self, outputs: list[Output]) -> str | None:
        """Do what the protocol answered; returns why the stream ends (`stop`, or `error` after a
        fatal error), else None."""
        for out in outputs:
            if isinstance(out, Send):
                self._send(out.message)
            elif isinstance(out, Close):
                self._outbox.close(out.code)
                return "error"
            elif isinstance(out, Audio):
                self.audio_seen = True
                self._live.log.bytes_received += len(out.data)
                self._live.channels.push(out.data)
            elif isinstance(out, Flush):
                self._live.channels.flush()
            elif isinstance(out, Stop):
                return "stop"
            elif isinstance(out, Start):
                end = self._carry_out(self._start(out.options))
                if end is not None:
                    return end
            elif isinstance(out, Resume):
                self._carry_out(self._resume(out.fields))
        return None

    def _start(self, start: StartOptions) -> list[Output]:
        if (refusal := self.state.engine_refusal()) is not None:
            return self.protocol.fail("overloaded", refusal.reason, 1013, refusal.retry_after_s)
        language = self.protocol.model.decoder_language(start.streaming.language)
        live = _Live(start, self.state, self.session_id, language)
        live.token = self.state.resume.register(live, presented_key(self.ws.scope),
                                                self.ws.client.host if self.ws.client else None)
        live.owner, self._live = self, live
        return self.protocol.started(live.session_id, start, language, live.token)

    def _resume(self, fields: dict) -> list[Output]:
        """`start` with `resume`: take over a session kept after a dropped connection."""
        try:
            live = self.state.resume.claim(fields.get("token"), presented_key(self.ws.scope))
        except ResumeError as e:
            error = ProtocolError("resume_failed", e.message, "resume.token").event()
            if e.worker is not None:
                error["worker"] = e.worker
                peers = Peers.of(self.state.settings.server)
                if peers is not None and peers.reachable(e.worker) and not relayed(self.ws):
                    raise _RelayTo(e.worker, {"type": "start", "resume": fields}, error)
            return [Send(error)]
        last = fields.get("last_event_id", 0)
        problem = live.log.check_resume(fields.get("bytes_sent"), last)
        if problem is not None:
            if live.owner is None:  # keep it resumable for a corrected attempt
                self.state.resume.park(live.token, live.expire)
            return [Send(problem.event())]
        try:
            replay = live.log.replay(last)
        except ProtocolError as e:
            if live.owner is None:  # parked again: it expires as any other (claimed and left, it never did)
                self.state.resume.park(live.token, live.expire)
            return [Send(e.event())]
        if live.owner is not None:
            live.owner.take_over()
        live.owner, self._live = self, live
        return self.protocol.resumed(live.session_id, live.start, live.language, live.token, live.log) + \
            [Send(message) for message in replay]


async def stream_endpoint(ws: WebSocket) -> None:
    await NativeStream(ws, ws.app.state.streamer).run()
