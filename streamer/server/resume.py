"""Session resume for `/v1/stream`: a stream whose connection drops is kept for `resume_s`, so
that the client can reconnect with its token and go on where it was (docs/protocol.md, 1.4).

A token is `"<worker id>.<random>"` (`ServerConfig.worker_id`). The sessions live in the memory
of the gateway process that served them; with several gateway workers on one port a reconnect
may land on another worker, whose store raises `ResumeError` with `worker` naming the owner:
under `streamer serve` that worker relays the connection to the owner (`server/relay.py`), and
the owner's store decides; a gateway alone (or an owner that is gone) answers `resume_failed`
with `worker`. A token is bound to the API key that opened the session (compared by SHA-256
digest; a relay presents the client's key) and dies `resume_s` after the connection dropped, or
when the stream ends. Parked streams are bounded (each keeps up to 30 s of audio for its next final):
past `max_parked` in all, or `max_per_client` of one client address, the longest parked one expires
early, so a client that drops connections on purpose cannot hold the gateway's memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable


class ResumeError(Exception):
    """Why a token does not resume a session (`resume_failed`); `worker` when another owns it."""

    def __init__(self, message: str, worker: int | None = None):
        super().__init__(message)
        self.message = message
        self.worker = worker


def _digest(key: str | None) -> bytes:
    return hashlib.sha256((key or "").encode()).digest()


@dataclass
class _Entry:
    live: Any
    """The transport's resumable state (`stream._Live`)."""
    key: bytes
    client: str | None = None
    """The client's address (`max_per_client`)."""
    expires: float | None = None
    """Monotonic deadline while parked (no connection); None while attached."""
    timer: asyncio.TimerHandle | None = None
    on_expiry: Callable[[], None] | None = None


@dataclass
class ResumeStore:
    """The resumable streams of this gateway process, by token."""

    worker: int = 0
    resume_s: float = 30.0
    max_parked: int = 256
    """Parked streams kept at most (the gateway's `max_sessions`)."""
    max_per_client: int = 64
    """Parked streams of one client address kept at most (`max_connections_per_client`; 0: no limit)."""
    _entries: dict[str, _Entry] = field(default_factory=dict)

    def register(self, live: Any, key: str | None, client: str | None = None) -> str:
        token = f"{self.worker}.{secrets.token_urlsafe(18)}"
        self._entries[token] = _Entry(live, _digest(key), client)
        return token

    def park(self, token: str, on_expiry: Callable[[], None]) -> None:
        """The connection dropped: keep the stream `resume_s` (less if the bounds are reached), then
        call `on_expiry`."""
        entry = self._entries.get(token)
        if entry is None:
            return
        parked = sorted((e.expires, t) for t, e in self._entries.items() if e.expires is not None and t != token)
        mine = [t for _, t in parked if self._entries[t].client == entry.client]
        if self.max_per_client and len(mine) >= self.max_per_client:
            self._expire(mine[0])
            parked = [p for p in parked if p[1] != mine[0]]
        if self.max_parked and len(parked) >= self.max_parked:
            self._expire(parked[0][1])
        entry.expires = time.monotonic() + self.resume_s
        entry.on_expiry = on_expiry
        entry.timer = asyncio.get_running_loop().call_later(self.resume_s, self._expire, token, entry)

    def parked(self) -> int:
        """Streams waiting for a resume now."""
        return sum(e.expires is not None for e in self._entries.values())

    def _expire(self, token: str, entry: _Entry | None = None) -> None:
        current = self._entries.get(token)
        if current is None or current.expires is None or (entry is not None and current is not entry):
            return
        del self._entries[token]
        if current.timer is not None:
            current.timer.cancel()
        current.on_expiry()

    def claim(self, token: Any, key: str | None) -> Any:
        """The stream of `token` for a new connection; raises ResumeError. An attached stream is
        taken over (the old connection is half-open: the client has given up on it)."""
        if not isinstance(token, str) or "." not in token:
            raise ResumeError("resume.token must be the string that `ready` gave")
        worker, _, _ = token.partition(".")
        if worker != str(self.worker):
            raise ResumeError(f"the session is held by gateway worker {worker}, not {self.worker}",
                              worker=int(worker) if worker.isdigit() else None)
        entry = self._entries.get(token)
        if entry is None or (entry.expires is not None and time.monotonic() > entry.expires):
            raise ResumeError("unknown or expired resume token")
        if not hmac.compare_digest(entry.key, _digest(key)):
            raise ResumeError("the resume token belongs to another API key")
        if entry.timer is not None:
            entry.timer.cancel()
        entry.expires = entry.timer = None
        return entry.live

    def discard(self, token: str | None) -> None:
        """The stream ended: its token dies."""
        entry = self._entries.pop(token, None) if token else None
        if entry is not None and entry.timer is not None:
            entry.timer.cancel()

    def __len__(self) -> int:
        return len(self._entries)
