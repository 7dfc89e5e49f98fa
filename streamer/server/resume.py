"""Session resume for `/v1/stream`: a stream whose connection drops is kept for `resume_s`, so
that the client can reconnect with its token and go on where it was (docs/protocol.md, 1.4).

A token is `"<worker id>.<random>"` (`ServerConfig.worker_id`). The sessions live in the memory
of the gateway process that served them; with several gateway workers on one port a reconnect
may land on another worker, whose store raises `ResumeError` with `worker` naming the owner:
under `streamer serve` that worker relays the connection to the owner (`server/relay.py`), and
the owner's store decides; a gateway alone (or an owner that is gone) answers `resume_failed`
with `worker`. A token is bound to the API key that opened the session (compared by SHA-256
digest; a relay presents the client's key) and dies `resume_s` after the connection dropped, or
when the stream ends.
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
    expires: float | None = None
    """Monotonic deadline while parked (no connection); None while attached."""
    timer: asyncio.TimerHandle | None = None


@dataclass
class ResumeStore:
    """The resumable streams of this gateway process, by token."""

    worker: int = 0
    resume_s: float = 30.0
    _entries: dict[str, _Entry] = field(default_factory=dict)

    def register(self, live: Any, key: str | None) -> str:
        token = f"{self.worker}.{secrets.token_urlsafe(18)}"
        self._entries[token] = _Entry(live, _digest(key))
        return token

    def park(self, token: str, on_expiry: Callable[[], None]) -> None:
        """The connection dropped: keep the stream `resume_s`, then call `on_expiry`."""
        entry = self._entries.get(token)
        if entry is None:
            return
        entry.expires = time.monotonic() + self.resume_s

        def expire() -> None:
            if self._entries.get(token) is entry and entry.expires is not None:
                del self._entries[token]
                on_expiry()

        entry.timer = asyncio.get_running_loop().call_later(self.resume_s, expire)

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
