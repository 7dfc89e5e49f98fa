"""Per-client limits: how many live streams one client address may hold at once.

One address (a browser, a script, a NAT) must not be able to take every slot of `max_sessions`:
`ClientLimits.acquire(address)` refuses past `max_connections_per_client`. Counted per process
(each gateway worker holds its own count; the limit is per worker).
"""

from __future__ import annotations

from collections import Counter


class ClientLimits:
    """Live streams by client address."""

    def __init__(self) -> None:
        self._live: Counter[str] = Counter()

    def acquire(self, address: str | None, limit: int) -> str | None:
        """Count one more stream of `address`; or why not, as a message for the client.
        `limit` 0 (or an unknown address) counts without limit."""
        key = address or "?"
        if limit and address is not None and self._live[key] >= limit:
            return f"this address holds {self._live[key]} live streams already, the limit per client; retry later"
        self._live[key] += 1
        return None

    def release(self, address: str | None) -> None:
        key = address or "?"
        self._live[key] -= 1
        if self._live[key] <= 0:
            del self._live[key]

    def count(self, address: str | None) -> int:
        return self._live.get(address or "?", 0)
