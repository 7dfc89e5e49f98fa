"""What every live stream over one WebSocket shares: an ordered outbox, and the connection's life
(accept, check the key, admit under the session limit, serve, release, close).

`/v1/stream` (`stream.py`) and `/v1/realtime` (`realtime.py`) subclass `SocketStream`; each speaks
its own protocol in `_serve()` and says a refusal or a crash its own way in `_refuse()`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from starlette.websockets import WebSocket

from streamer.server.auth import authorized
from streamer.server.state import ServerState

log = logging.getLogger("streamer.server")

SHUTDOWN_FLUSH_S = 1.0
"""At shutdown, how long a stream's last events and close frame may take to leave."""
CLOSE_WAIT_S = 5.0
"""How long a client that does not read has, after the server gives up on it, to take the close
frame (and answer it) before the TCP connection is aborted."""


def abort_transport(scope: dict) -> bool:
    """Drop the connection at once (TCP reset), for a client that takes nothing any more; False
    where the server gives no access to its transport (then it closes when the client goes)."""
    abort = scope.get("streamer.abort")
    if abort is None:
        return False
    abort()
    return True


class TransportTap:
    """ASGI middleware: notes how to abort a WebSocket's TCP connection in its scope
    (`streamer.abort`). uvicorn's WebSocket protocol object is the `send` it hands the app;
    another server simply gets no tap."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if transport is not None and hasattr(transport, "abort"):
                scope["streamer.abort"] = transport.abort
        await self.app(scope, receive, send)


class Outbox:
    """Messages for one WebSocket, sent in order by one task, so that no caller awaits the
    socket; `close(code)` sends a close frame after what is queued and ends the task.

    Bounded: a client that stops reading (its socket stays full) gets no more than `max_bytes`
    of queued events, and no new event once one has waited `send_timeout_s`; past either the outbox is
    `stuck`, drops what it holds, calls `on_stuck`, closes with 1008 and the reason (if the
    client takes the frame within `CLOSE_WAIT_S`), else aborts the connection.
    """

    def __init__(self, ws: WebSocket, *, max_bytes: int = 4 << 20, send_timeout_s: float = 20.0,
                 on_stuck=None):
        self.ws = ws
        self.max_bytes = max_bytes
        self.send_timeout_s = send_timeout_s
        self.on_stuck = on_stuck
        """Called once, with the reason, when the client is found not to read."""
        self.stuck: str | None = None
        self.queued_bytes = 0
        self._sending_since: float | None = None
        """When the message being sent was handed to the socket (None: not sending)."""
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run())

    def send(self, message: dict) -> None:
        if self.stuck is not None:
            return
        text = json.dumps(message)
        self.queued_bytes += len(text)
        if self.queued_bytes > self.max_bytes:
            self._give_up(f"the client is not reading: {self.queued_bytes} bytes of events are waiting")
            return
        # The time bound is checked here, as events come, rather than with a timer per send (a
        # task or timer per event costs the event loop at hundreds of streams); a stuck socket
        # with nothing more to send holds no more memory.
        if self._sending_since is not None and time.monotonic() - self._sending_since > self.send_timeout_s:
            self._give_up(f"the client is not reading: no event taken for {self.send_timeout_s:g} s")
            return
        self._queue.put_nowait(text)

    def close(self, code: int) -> None:
        if self.stuck is None:
            self._queue.put_nowait(code)

    def abandon(self) -> None:
        """The client is gone: stop after what is queued, without a close frame."""
        self._queue.put_nowait(None)

    async def flushed(self, timeout: float) -> None:
        """Until the sender has sent what was queued up to its close (or `timeout`), without
        cancelling it."""
        await asyncio.wait([self._task], timeout=timeout)

    async def wait(self, timeout: float) -> None:
        """Until the close is sent (or the client is gone); cancels the sender after `timeout`."""
        try:
            await asyncio.wait_for(self._task, timeout)
        except asyncio.TimeoutError:
            pass

    def _give_up(self, reason: str) -> None:
        if self.stuck is not None:
            return
        self.stuck = reason
        log.warning("closing a WebSocket: %s", reason)
        while not self._queue.empty():  # free the backlog now
            self._queue.get_nowait()
        self.queued_bytes = 0
        self._task.cancel()  # blocked waiting for the socket to drain: no frame is half-written
        self._task = asyncio.ensure_future(self._close_stuck(reason))
        if self.on_stuck is not None:
            self.on_stuck(reason)

    async def _close_stuck(self, reason: str) -> None:
        """The close frame with the reason, then, `CLOSE_WAIT_S` after giving up, a TCP abort:
        once its close frame is out uvicorn reads and discards whatever the client still sends
        until the client answers the close, which a client that does not read never does."""
        give_up = asyncio.get_running_loop().time() + CLOSE_WAIT_S
        try:
            await asyncio.wait_for(self.ws.close(1008, reason[:120]), CLOSE_WAIT_S)
        except Exception:  # not sent in time, or the client is gone already
            pass
        await asyncio.sleep(max(0.0, give_up - asyncio.get_running_loop().time()))
        abort_transport(self.ws.scope)

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if item is None:
                    return
                if isinstance(item, int):
                    await self.ws.close(item)
                    return
                self.queued_bytes -= len(item)
                self._sending_since = time.monotonic()
                await self.ws.send_text(item)
                self._sending_since = None
            except Exception:  # the client went away: nothing more can be sent
                return


def to_protocol(protocol, message: dict) -> list:
    """A WebSocket message handed to a sans-I/O protocol (`streamer/protocols/`): binary to its
    `receive_bytes`, text to its `receive_text`; returns its answer."""
    data = message.get("bytes")
    return protocol.receive_bytes(data) if data is not None else protocol.receive_text(message.get("text") or "")


class SocketStream:
    """One live stream on one WebSocket; registered with the server state while it is served."""

    transport = "socket"
    """The metrics label: `stream` or `realtime`."""

    def __init__(self, ws: WebSocket, state: ServerState, session_id: str):
        self.ws = ws
        self.state = state
        self.session_id = session_id
        self._outbox: Outbox | None = None
        self._receiver: asyncio.Task | None = None
        """The task reading client messages; shutdown cancels it."""
        self._grace: float | None = None
        """Set by shutdown(): how long open utterances may still take."""
        self._done = asyncio.Event()
        self.stuck = False
        """The client stopped reading and is being closed (the receiver was cancelled for it)."""
        self.audio_seen = False
        """The client has sent audio (the subclass sets it); until then `first_audio_timeout_s` runs."""
        self._opened = time.monotonic()

    async def run(self) -> None:
        await self.ws.accept(subprotocol=self._subprotocol())
        server = self.state.settings.server
        self._outbox = Outbox(self.ws, max_bytes=server.max_outbox_bytes, send_timeout_s=server.send_timeout_s,
                              on_stuck=self._on_stuck)
        address = self.ws.client.host if self.ws.client else None
        try:
            if not self._authorized():
                self._refuse("unauthorized", self._refusal_message(), 1008)
            elif (refusal := self.state.clients.acquire(address, server.max_connections_per_client)) is not None:
                self._refuse("overloaded", refusal, 1013, retry_after_s=5.0)
            else:
                try:
                    await self._admitted()
                finally:
                    self.state.clients.release(address)
        finally:
            await self._outbox.wait(server.finish_timeout_s)

    async def _admitted(self) -> None:
        if (refusal := self.state.admit(self)) is not None:
            self._refuse(refusal.code, refusal.reason, 1013, retry_after_s=refusal.retry_after_s)
            return
        try:
            await self._serve()
        except Exception as e:  # a bug: tell the client, keep the server up
            log.exception("%s %s: internal error", self.transport, self.session_id)
            self._refuse("internal", f"internal error: {type(e).__name__}", 1011)
        finally:
            self.state.release(self)
            self._done.set()

    def _subprotocol(self) -> str | None:
        """The WebSocket subprotocol to select (Realtime: `realtime`, as OpenAI's server does)."""
        return None

    def _on_stuck(self, reason: str) -> None:
        """The client does not read: stop serving it (the outbox closes the connection)."""
        self.stuck = True
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()

    @property
    def _finish_timeout_s(self) -> float:
        """How long an ending stream waits for its finals still in the engine (`FINISH_TIMEOUT_S`)."""
        return self.state.settings.server.finish_timeout_s

    def _finish_within(self, reason: str) -> float:
        """How long a stream ending for `reason` waits for its finals: the shutdown's grace, else
        `FINISH_TIMEOUT_S`."""
        return self._grace if reason == "shutdown" else self._finish_timeout_s

    def _authorized(self) -> bool:
        """The key check on connect (a transport whose client cannot send one checks later)."""
        return authorized(self.ws.scope, self.state.settings.server.api_key)

    def _refusal_message(self) -> str:
        """Why `_authorized` said no."""
        return "missing or wrong API key: send `Authorization: Bearer KEY` or `?api_key=KEY`"

    async def shutdown(self, grace_s: float) -> None:
        """Stop reading, deliver the finals of open utterances within `grace_s`, close."""
        self._grace = grace_s
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()
        await self._done.wait()
        # `closed` and the 1001 close frame must leave before uvicorn closes what is left (1012).
        if self._outbox is not None:
            await self._outbox.flushed(SHUTDOWN_FLUSH_S)

    def _timeouts(self) -> tuple[float, float]:
        """(idle, first audio): how long the stream may send nothing, and how long after it opened
        it may send no audio (`IDLE_TIMEOUT_S`, `FIRST_AUDIO_TIMEOUT_S`)."""
        server = self.state.settings.server
        return server.idle_timeout_s, server.first_audio_timeout_s

    async def _next_message(self) -> dict | str:
        """The client's next WebSocket message, or why none will come: `idle_timeout` (nothing
        for the idle timeout of `_timeouts`), `no_audio` (no audio within its first-audio timeout
        of the connection opening; other messages do not count) or `disconnect`."""
        idle_s, first_audio_s = self._timeouts()
        timeout, why = idle_s, "idle_timeout"
        if not self.audio_seen and first_audio_s:
            left = self._opened + first_audio_s - time.monotonic()
            if left < timeout:
                timeout, why = max(0.0, left), "no_audio"
        # Not `asyncio.wait_for`: before Python 3.12 it swallows a cancellation that comes while a
        # message is ready (it returns the message), and shutdown's cancel of the receiver was lost
        # under a client that kept sending (the stream never ended; QA session 31b).
        receiving = asyncio.ensure_future(self.ws.receive())
        try:
            done, _ = await asyncio.wait([receiving], timeout=timeout)
        finally:
            if not receiving.done():
                receiving.cancel()
        if not done:
            return why
        message = receiving.result()
        return "disconnect" if message["type"] == "websocket.disconnect" else message

    async def _serve(self) -> None:
        raise NotImplementedError

    def _refuse(self, kind: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        """Tell the client why the stream ends (`kind`: unauthorized, overloaded, shutting_down or
        internal) and, when it may come back, after how long; then close."""
        raise NotImplementedError
