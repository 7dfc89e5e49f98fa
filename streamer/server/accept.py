"""Accepting from the listening socket that every gateway worker shares, one connection per pass of
this worker's event loop.

uvloop (libuv) accepts every queued connection when the socket becomes readable, so a burst of
connections went to whichever gateway woke first: 32 WebSockets opened at once over four warm
gateways landed 0 / 8 / 9 / 15 (and all 32 on one while the others were still starting, which
`Peers.all_serving` now keeps `/health` from hiding: with keep-alive HTTP clients that pinned 32
uploads to one gateway of eight on the H200, 953 audio s/s against 2,182, session 17). Here each
gateway takes one connection, then lets its loop run before it takes the next: every gateway is
woken by a new connection, an idle one comes back for the next at once, a busy one later, so a
burst spreads over the free gateways (7 / 7 / 8 / 10) and the load still follows their capacity
(what the shared socket is for, `server/supervisor.py`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Callable

log = logging.getLogger("streamer.server")

ACCEPT_PAUSE_S = 0.001
"""After taking a connection a gateway waits this long before it takes the next, when others share
the socket (one gateway then takes at most 1,000 a second; eight, 8,000)."""


class SharedAcceptor:
    """Accepts connections from `listener` (already listening, shared with other processes) one at
    a time and hands each to `protocol_factory` as the loop's own server would."""

    def __init__(self, listener: socket.socket, protocol_factory: Callable[[], asyncio.Protocol],
                 ssl_context: ssl.SSLContext | None = None, sharing: int = 1):
        """`sharing`: the gateway processes that accept from `listener`, this one included."""
        self.listener = listener
        self.protocol_factory = protocol_factory
        self.ssl_context = ssl_context
        # alone on the socket, a gateway has no one to leave the next connection to
        self.pause_s = ACCEPT_PAUSE_S if sharing > 1 else 0.0
        self._task: asyncio.Task | None = None
        self._handshakes: set[asyncio.Task] = set()

    def start(self) -> None:
        self.listener.setblocking(False)  # the other processes' view of it too: they all want this
        self._task = asyncio.ensure_future(self._run())

    def close(self) -> None:
        """Stop accepting (connections already taken go on)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self.listener)
            except OSError as e:  # e.g. EMFILE: wait, as the loop's own server does, instead of spinning
                log.warning("accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            # The TLS handshake (if any) runs beside the next accepts, not before them.
            task = asyncio.ensure_future(self._serve(loop, conn))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)
            await asyncio.sleep(self.pause_s)  # the other gateways get the next ones

    async def _serve(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        try:
            await loop.connect_accepted_socket(self.protocol_factory, conn, ssl=self.ssl_context)
        except (OSError, ssl.SSLError) as e:  # a client gone or a failed handshake: that connection only
            log.debug("connection dropped before it was served: %s", e)
            conn.close()
