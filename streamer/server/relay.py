"""Gateway workers reaching each other: a WebSocket that needs state held by another worker of the
same `streamer serve` is relayed to that worker (docs/protocol.md 1.4 and 7.2).

With several workers on one SO_REUSEPORT port the kernel picks the worker of each connection, so a
resume (`/v1/stream`) or a Twilio subscriber (`/v1/twilio/events`) may land on a worker that does
not hold the session or the call. Each worker therefore also serves the app on a private Unix
socket in the supervisor's run directory (`<peer_dir>/gw<N>.sock`, a 0700 directory); the worker a
connection landed on opens a WebSocket to the owner's socket and pumps frames both ways until
either side closes, passing on the close code, so the client sees one ordinary connection.

Only these two rare paths relay; every other connection is served where it lands and pays
nothing for this. A relayed connection carries `RELAY_HEADER`: its owner serves it itself and
never relays it again (one hop at most).

Who owns a Twilio call is found in `<peer_dir>/owners/`: one small file per `streamSid` /
`callSid` (named by a hash of it, holding the worker id), written when the stream starts and
removed with the call's feed (`FEED_KEEP_S` after it ends), so it holds no more names than the
workers hold feeds. A restarted worker removes the names it held before.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
import ssl
from dataclasses import dataclass

from starlette.websockets import WebSocket
from websockets.asyncio.client import ClientConnection, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from streamer.config import ServerConfig
from streamer.server.socket_stream import CLOSE_WAIT_S, abort_transport

log = logging.getLogger("streamer.server")

RELAY_HEADER = "x-streamer-relay"
"""Set on a relayed connection (the relaying worker's id): its owner serves it and never relays it."""
CONNECT_TIMEOUT_S = 5.0
"""How long a worker may take to accept a relayed connection (a busy loop on a loaded host)."""
SENDABLE = range(1000, 5000)
"""Close codes a close frame may carry, but for `UNSENDABLE`."""
UNSENDABLE = (1005, 1006, 1015)
"""Codes that only describe a connection that ended without one (no code, dropped, TLS failure)."""


def _name(kind: str, key: str) -> str:
    return f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:40]}"


@dataclass(frozen=True)
class Peers:
    """This gateway worker among the others of one supervisor (`ServerConfig.peer_dir`)."""

    directory: str
    worker: int
    tls: bool = False
    """The app is served with TLS, on the Unix sockets too (uvicorn applies it to every socket)."""
    workers: int = 1
    """Gateway workers of the supervisor, this one included."""

    @classmethod
    def of(cls, server: ServerConfig) -> "Peers | None":
        """None for a gateway that runs alone (WORKERS=0, tests that build the app)."""
        if not server.peer_dir:
            return None
        return cls(server.peer_dir, server.worker_id, tls=bool(server.ssl_certfile), workers=server.workers or 1)

    # --- readiness -----------------------------------------------------------------------------------

    def _serving(self) -> str:
        return os.path.join(self.directory, "serving")

    def mark_serving(self) -> None:
        """This worker accepts connections (kept across its restarts: the server was whole once)."""
        os.makedirs(self._serving(), exist_ok=True)
        open(self._mark(), "w").close()

    def marked_serving(self) -> bool:
        """This worker has served once (`mark_serving`): what the supervisor calls ready."""
        return os.path.exists(self._mark())

    def _mark(self) -> str:
        return os.path.join(self._serving(), f"gw{self.worker}")

    def all_serving(self) -> bool:
        """Every worker has accepted connections. Until then the first ones up take every
        connection: HTTP clients keep them open and reuse them (keep-alive), so a burst of uploads
        right after start stayed on one gateway of eight (`health` says `starting` meanwhile)."""
        try:
            return len(os.listdir(self._serving())) >= self.workers
        except FileNotFoundError:
            return False

    def socket_path(self, worker: int) -> str:
        return os.path.join(self.directory, f"gw{worker}.sock")

    def reachable(self, worker: int) -> bool:
        """Another worker of this supervisor, with its socket up."""
        return worker != self.worker and os.path.exists(self.socket_path(worker))

    def listen(self) -> socket.socket:
        """This worker's Unix socket (a stale one of a previous process of this worker replaced)."""
        path = self.socket_path(self.worker)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(2048)
        return sock

    # --- names owned by workers (Twilio calls) ------------------------------------------------------

    def _owners(self) -> str:
        return os.path.join(self.directory, "owners")

    def claim(self, kind: str, key: str) -> None:
        """This worker holds `key` now (written whole: a reader never sees half a file)."""
        os.makedirs(self._owners(), exist_ok=True)
        path = os.path.join(self._owners(), _name(kind, key))
        temporary = f"{path}.{self.worker}.tmp"
        with open(temporary, "w") as f:
            f.write(str(self.worker))
        os.replace(temporary, path)

    def owner(self, kind: str, key: str) -> int | None:
        try:
            with open(os.path.join(self._owners(), _name(kind, key))) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def release(self, kind: str, key: str) -> None:
        """Drop the name if this worker still holds it (another may have taken it since)."""
        if self.owner(kind, key) == self.worker:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._owners(), _name(kind, key)))

    def release_all(self) -> None:
        """A worker (re)starting holds nothing: drop what a previous process of it held."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self._owners()):
                with contextlib.suppress(OSError, ValueError):
                    with open(entry.path) as f:
                        held = int(f.read())
                    if held == self.worker:
                        os.unlink(entry.path)

    # --- relaying ------------------------------------------------------------------------------------

    async def connect(self, worker: int, target: str, key: str | None) -> ClientConnection | None:
        """A WebSocket to `target` (path and query) on `worker`, presenting the client's key; None
        when that worker does not answer (it is restarting: what it held is gone with it)."""
        headers = {RELAY_HEADER: str(self.worker)}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        context = None
        if self.tls:
            # The peer is known by the path of its socket in a directory only this user can
            # enter; its certificate names the public host, not the socket.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        try:
            return await unix_connect(self.socket_path(worker), f"{'wss' if self.tls else 'ws'}://localhost{target}",
                                      additional_headers=headers, ssl=context, compression=None, max_size=None,
                                      ping_interval=None, open_timeout=CONNECT_TIMEOUT_S, proxy=None)
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as e:
            log.warning("gateway worker %d does not answer on its socket: %s", worker, e)
            return None


def relayed(ws: WebSocket) -> bool:
    """The connection came from another worker: serve it here, whatever it asks for."""
    return RELAY_HEADER in ws.headers


async def _client_to_owner(ws: WebSocket, upstream: ClientConnection) -> dict | None:
    """The client's messages to the owner; the client's disconnect message when the client ends,
    None when the owner has closed."""
    while True:
        try:
            message = await ws.receive()
        except Exception:  # the connection is gone without a disconnect message
            return {"type": "websocket.disconnect", "code": 1006}
        if message["type"] == "websocket.disconnect":
            return message
        data = message.get("bytes")
        try:
            await upstream.send(data if data is not None else message.get("text") or "")
        except ConnectionClosed:
            return None


async def _owner_to_client(ws: WebSocket, upstream: ClientConnection, drop_first: str | None,
                           send_timeout_s: float) -> bool:
    """The owner's messages to the client until the owner closes; False when the client is gone
    or takes no message for `send_timeout_s` (the owner cannot see that the client does not read:
    this worker reads for it). `drop_first`: a message type the client has had from this worker
    already (a subscriber's `subscribed`): the owner's first message of that type is not passed on."""
    try:
        async for data in upstream:
            if drop_first is not None:
                skip = isinstance(data, str) and _type_of(data) == drop_first
                drop_first = None
                if skip:
                    continue
            await asyncio.wait_for(ws.send_text(data) if isinstance(data, str) else ws.send_bytes(data),
                                   send_timeout_s)
    except ConnectionClosed:  # the owner dropped without a close frame
        pass
    except Exception:  # the client is gone, or does not read
        return False
    return True


def _type_of(text: str) -> str | None:
    try:
        message = json.loads(text)
    except ValueError:
        return None
    return message.get("type") if isinstance(message, dict) else None


async def _close_client(ws: WebSocket, code: int | None, reason: str) -> None:
    """Close the client's connection as the owner closed its own: the same code and reason, or a
    TCP abort when the owner's connection dropped without a close frame."""
    if code is None or code in UNSENDABLE:
        if abort_transport(ws.scope):
            return
        code, reason = 1011, "the gateway worker holding this stream is gone"
    try:
        await asyncio.wait_for(ws.close(code, reason), CLOSE_WAIT_S)
    except Exception:  # not taken in time, or the client is gone already
        abort_transport(ws.scope)


async def _close_owner(upstream: ClientConnection, disconnect: dict) -> None:
    """Close the owner's connection as the client closed its own: a dropped client (1006) drops
    it too, so that the owner sees what it would have seen (a resumable session is parked)."""
    code = disconnect.get("code") or 1005
    if code in UNSENDABLE or code not in SENDABLE:
        upstream.transport.abort()
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(upstream.close(code, disconnect.get("reason") or ""), CLOSE_WAIT_S)


async def pipe(ws: WebSocket, upstream: ClientConnection, *, first: str | None = None,
               drop_first: str | None = None, send_timeout_s: float = 20.0) -> None:
    """Relay the accepted client WebSocket `ws` to the owner's `upstream` until either ends,
    then close the other the same way. `first`: a client message this worker read already,
    sent on first. `send_timeout_s` (`ServerConfig.send_timeout_s`): a client that takes no
    message for this long, or has not taken what the owner sent before closing, is cut off."""
    if first is not None:
        with contextlib.suppress(ConnectionClosed):
            await upstream.send(first)
    up = asyncio.ensure_future(_client_to_owner(ws, upstream))
    down = asyncio.ensure_future(_owner_to_client(ws, upstream, drop_first, send_timeout_s))
    owner_closed = asyncio.ensure_future(upstream.wait_closed())
    try:
        await asyncio.wait([up, down, owner_closed], return_when=asyncio.FIRST_COMPLETED)
        if up.done() and up.result() is not None:  # the client ended first
            down.cancel()
            await _close_owner(upstream, up.result())
            return
        if down.done() and not down.result():  # the client is gone or does not read
            up.cancel()
            upstream.transport.abort()
            abort_transport(ws.scope)
            return
        # The owner has closed: what it sent before goes out, then the same close.
        done, _ = await asyncio.wait([down], timeout=send_timeout_s)
        up.cancel()
        if not done or not down.result():
            down.cancel()
            abort_transport(ws.scope)
            return
        received = upstream.protocol.close_rcvd
        await _close_client(ws, received.code if received is not None else None,
                            received.reason if received is not None else "")
    finally:
        for task in (up, down, owner_closed):
            task.cancel()
        if upstream.state.name != "CLOSED":
            upstream.transport.abort()
