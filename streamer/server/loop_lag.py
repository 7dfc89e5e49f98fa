"""How late the gateway's event loop runs: its own saturation signal.

One process serves every live stream's socket, VAD and events on one event loop. Past what that
loop can do (about 100 streams on the H200 host: docs/benchmarks.md) every callback runs late,
partials and finals with it, and new clients' opening handshakes time out. The engine's queue does
not show it (the engine was busy half the time when that happened). `LoopLag` measures the
lateness directly, so that the server refuses new streams before the ones it serves suffer, and
exports it (`streamer_event_loop_lag_seconds`).
"""

from __future__ import annotations

import asyncio

INTERVAL_S = 0.05
"""How often the monitor wakes up; a wake-up that comes late by x seconds measures a lag of x."""
HALF_LIFE_S = 1.0
"""The reported lag holds its peaks and halves in this time, so that admission does not flap."""


class LoopLag:
    """Peak-holding lag of the event loop that runs `run()`."""

    def __init__(self, interval: float = INTERVAL_S, half_life: float = HALF_LIFE_S):
        self.interval = interval
        self.decay = 0.5 ** (interval / half_life)
        self.lag = 0.0
        """Seconds: the latest wake-up's lateness, or the decayed peak of earlier ones if larger."""
        self.loop: asyncio.AbstractEventLoop | None = None

    def observe(self, late: float) -> None:
        """One wake-up came `late` seconds after it was due."""
        self.lag = max(max(late, 0.0), self.lag * self.decay)

    async def run(self) -> None:
        """Measure until cancelled (the server's lifespan runs it as a task)."""
        self.loop = asyncio.get_running_loop()
        while True:
            due = self.loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.observe(self.loop.time() - due)
