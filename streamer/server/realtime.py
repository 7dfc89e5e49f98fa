"""`/v1/realtime`: the WebSocket transport of OpenAI's Realtime API in transcription mode
(docs/protocol.md, section 2), whose events, items and their order are `protocols/realtime.py`'s
`RealtimeProtocol`.

The receiver hands each client event to the protocol and carries out its answer: each
segmentation of the session is a `Session` with its `Bridge`, whose events go back to the
protocol; everything for the client goes through the outbox in the order it was made. A
segmentation that the protocol finishes delivers its last finals in a task of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging

from starlette.websockets import WebSocket

from streamer.protocols.outputs import Close, Send
from streamer.protocols.realtime import (Begin, DropOpen, Feed, Finish, Flush, Output, RealtimeProtocol, Reconfigure,
                                         Settle, new_id)
from streamer.protocols.realtime_session import InvalidValue, RealtimeConfig
from streamer.protocols.start import ModelInfo
from streamer.protocols.validation import ValidationError
from streamer.server import client_secrets
from streamer.server.auth import presented_key
from streamer.server.bridge import Bridge, StreamEvent
from streamer.server.socket_stream import SocketStream
from streamer.server.state import ServerState
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")


class RealtimeStream(SocketStream):
    """One `/v1/realtime` connection."""

    transport = "realtime"

    def __init__(self, ws: WebSocket, state: ServerState):
        super().__init__(ws, state, new_id("sess_"))
        model, streaming = ModelInfo.of(state.engine), state.settings.streaming
        # A client secret (`ek_` key) opens the session in the settings it was minted with;
        # `_secret_error` says why a presented one opens nothing.
        config, self._secret_error = None, None
        try:
            session = client_secrets.verify(state.settings.server.api_key, presented_key(ws.scope))
            if session is not None:
                config = client_secrets.initial_config(session, RealtimeConfig.default(streaming), streaming, model)
        except client_secrets.SecretError as e:
            self._secret_error = str(e)
        except (InvalidValue, ValidationError) as e:  # minted under other settings (another model)
            self._secret_error = f"the client secret's session no longer applies: {e}"
        self._secret = config is not None
        self.protocol = RealtimeProtocol(self.session_id, model, streaming,
                                         beta="realtime=v1" in ws.headers.get("openai-beta", ""),
                                         max_message_bytes=state.settings.server.max_message_bytes, config=config)
        self._bridges: dict[int, Bridge] = {}
        """The bridge of every segmentation with work left, by number."""
        self._current: Bridge | None = None
        """The bridge that takes new audio."""
        self._retiring: set[asyncio.Task] = set()

    # --- the connection -----------------------------------------------------------------------------

    async def _serve(self) -> None:
        if (refusal := self.state.engine_refusal()) is not None:  # (`/v1/stream` asks at its start message)
            self._refuse(refusal.code, refusal.reason, 1013, refusal.retry_after_s)
            return
        self._carry_out(self.protocol.created())
        self._receiver = asyncio.ensure_future(self._receive_loop())
        await asyncio.wait([self._receiver])
        if self._receiver.cancelled():
            reason = "error" if self.stuck else "shutdown"
        else:
            reason = self._receiver.result()
        if reason in ("disconnect", "error"):
            self.protocol.abort()
            for bridge in self._bridges.values():
                bridge.close()
            for task in self._retiring:
                task.cancel()
            if reason == "disconnect":
                self._outbox.abandon()
            return
        timeout = self._finish_within(reason)
        self._carry_out(self.protocol.end(), finish_timeout=timeout)
        if self._retiring:
            await asyncio.wait(self._retiring, timeout=timeout)
        idle_s, first_audio_s = self._timeouts()
        after_s = {"idle_timeout": idle_s, "no_audio": first_audio_s}.get(reason)
        self._carry_out(self.protocol.closed(reason, after_s))

    def _timeouts(self) -> tuple[float, float]:
        # Push-to-talk (`turn_detection: null`): the client sends nothing while its user thinks,
        # and has no keepalive event to send (OpenAI's API has none; WebSocket pings never reach
        # the app), so the session is held by `MANUAL_IDLE_TIMEOUT_S` instead.
        if self.protocol.config.manual:
            manual_s = self.state.settings.server.manual_idle_timeout_s
            return manual_s, manual_s
        return super()._timeouts()

    def _authorized(self) -> bool:
        # A client secret opens Realtime sessions in place of the API key.
        return self._secret_error is None and (self._secret or super()._authorized())

    def _refusal_message(self) -> str:
        return self._secret_error or super()._refusal_message()

    def _subprotocol(self) -> str | None:
        # OpenAI's browser-style clients offer `realtime` (and the key as a second subprotocol):
        # the handshake fails unless the server selects one of them.
        return "realtime" if "realtime" in self.ws.scope.get("subprotocols", ()) else None

    def _refuse(self, kind: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        self._carry_out(self.protocol.refuse(kind, message, close_code, retry_after_s))

    # --- receiving ----------------------------------------------------------------------------------

    async def _receive_loop(self) -> str:
        """Client events until the connection ends; returns why: idle_timeout, no_audio,
        disconnect or error."""
        while True:
            if self._current is not None:
                await self._current.wait_for_room(self.state.settings.server.max_backlog_s)
            message = await self._next_message()
            if isinstance(message, str):
                return message
            text = message.get("text")
            if text is None:
                text = (message.get("bytes") or b"").decode("utf-8", "replace")
            try:
                if self._carry_out(self.protocol.receive(text)):
                    return "error"
            except Exception as e:  # a bug: the event is refused, the session goes on
                log.exception("realtime %s: internal error on a client event", self.session_id)
                self._carry_out([self.protocol.error("server_error", "internal_error",
                                                     f"internal error: {type(e).__name__}")])

    def _carry_out(self, outputs: list[Output], finish_timeout: float | None = None) -> bool:
        """Do what the protocol answered; True when it closed the connection."""
        for out in outputs:
            if isinstance(out, Send):
                if out.message["type"] == "error":
                    self.state.metrics.errors.labels(out.message["error"]["code"]).inc()
                self._outbox.send(out.message)
            elif isinstance(out, Close):
                self._outbox.close(out.code)
                return True
            elif isinstance(out, Feed):
                self.audio_seen = True
                self._bridges[out.number].feed(out.pcm)
            elif isinstance(out, Begin):
                self._begin(out)
            elif isinstance(out, Flush):
                opened = self._bridges[out.number].flush()
                if out.report:
                    self._carry_out(self.protocol.flushed(opened))
            elif isinstance(out, DropOpen):
                self._bridges[out.number].drop_open()
            elif isinstance(out, Reconfigure):
                bridge = self._bridges[out.number]
                bridge.language = out.language
                bridge.session.config = dataclasses.replace(bridge.session.config, prompt=out.prompt,
                                                            condition_on_previous=out.condition_on_previous)
            elif isinstance(out, Finish):
                self._finish(out.number, self._finish_timeout_s if finish_timeout is None else finish_timeout)
            elif isinstance(out, Settle):
                self._bridges[out.number].settle()
                if self._carry_out(self.protocol.settled(), finish_timeout):
                    return True
        return False

    # --- segmentations ------------------------------------------------------------------------------

    def _begin(self, begin: Begin) -> None:
        bridge = self.state.bridge(Session(begin.streaming, self.state.vad), functools.partial(self._on_event, begin.number),
                                   session_id=self.session_id, language=begin.language, task="transcribe")
        self._bridges[begin.number] = self._current = bridge

    def _finish(self, number: int, timeout: float) -> None:
        """Deliver a segmentation's last finals in the background."""
        bridge = self._bridges[number]
        if bridge is self._current:
            self._current = None

        def done(_) -> None:
            self._bridges.pop(number, None)
            self._carry_out(self.protocol.finished(number, timeout))

        task = asyncio.ensure_future(bridge.finish(timeout))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        task.add_done_callback(done)

    def _on_event(self, number: int, event: StreamEvent) -> None:
        self._carry_out(self.protocol.on_event(number, event))


async def realtime_endpoint(ws: WebSocket) -> None:
    await RealtimeStream(ws, ws.app.state.streamer).run()
