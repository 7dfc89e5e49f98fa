"""What every live stream over one WebSocket shares: an ordered outbox, and the connection's life
(accept, check the key, admit under the session limit, serve, release, close).

`/v1/stream` (`stream.py`) and `/v1/realtime` (`realtime.py`) subclass `SocketStream`; each speaks
its own protocol in `_serve()` and says a refusal or a crash its own way in `_refuse()`.
"""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.websockets import WebSocket

from streamer.server.auth import authorized
from streamer.server.state import ServerState

log = logging.getLogger("streamer.server")

FINISH_TIMEOUT_S = 60.0
"""How long a stream that ends waits for the finals still in the engine."""


class Outbox:
    """Messages for one WebSocket, sent in order by one task, so that no caller awaits the
    socket; `close(code)` sends a close frame after what is queued and ends the task."""

    def __init__(self, ws: WebSocket):
        self.ws = ws
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run())

    def send(self, message: dict) -> None:
        self._queue.put_nowait(message)

    def close(self, code: int) -> None:
        self._queue.put_nowait(code)

    def abandon(self) -> None:
        """The client is gone: stop after what is queued, without a close frame."""
        self._queue.put_nowait(None)

    async def wait(self, timeout: float) -> None:
        """Until the close is sent (or the client is gone); cancels the sender after `timeout`."""
        try:
            await asyncio.wait_for(self._task, timeout)
        except asyncio.TimeoutError:
            pass

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if item is None:
                    return
                if isinstance(item, int):
                    await self.ws.close(item)
                    return
                await self.ws.send_text(json.dumps(item))
            except Exception:  # the client went away: nothing more can be sent
                return


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

    async def run(self) -> None:
        await self.ws.accept()
        self._outbox = Outbox(self.ws)
        try:
            if not self._authorized():
                self._refuse("unauthorized", "missing or wrong API key: send `Authorization: Bearer KEY` or "
                             "`?api_key=KEY`", 1008)
            elif (refusal := self.state.admit(self)) is not None:
                self._refuse("overloaded", refusal, 1013)
            else:
                try:
                    await self._serve()
                except Exception as e:  # a bug: tell the client, keep the server up
                    log.exception("%s %s: internal error", self.transport, self.session_id)
                    self._refuse("internal", f"internal error: {type(e).__name__}", 1011)
                finally:
                    self.state.release(self)
                    self._done.set()
        finally:
            await self._outbox.wait(FINISH_TIMEOUT_S)

    def _authorized(self) -> bool:
        """The key check on connect (a transport whose client cannot send one checks later)."""
        return authorized(self.ws.scope, self.state.settings.server.api_key)

    async def shutdown(self, grace_s: float) -> None:
        """Stop reading, deliver the finals of open utterances within `grace_s`, close."""
        self._grace = grace_s
        if self._receiver is not None and not self._receiver.done():
            self._receiver.cancel()
        await self._done.wait()

    async def _next_message(self) -> dict | str:
        """The client's next WebSocket message, or why none will come: `idle_timeout` (nothing
        for `IDLE_TIMEOUT_S`) or `disconnect`."""
        try:
            message = await asyncio.wait_for(self.ws.receive(), self.state.settings.server.idle_timeout_s)
        except asyncio.TimeoutError:
            return "idle_timeout"
        return "disconnect" if message["type"] == "websocket.disconnect" else message

    async def _serve(self) -> None:
        raise NotImplementedError

    def _refuse(self, kind: str, message: str, close_code: int) -> None:
        """Tell the client why the stream ends (`kind`: unauthorized, overloaded or internal) and close."""
        raise NotImplementedError
