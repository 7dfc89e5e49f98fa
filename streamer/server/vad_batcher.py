"""The VAD of a gateway's live streams, scored in shared calls.

A live client sends a frame or two of audio at a time (20-32 ms). Scored one stream at a time,
silero-vad was 53 % of a gateway's samples at 800 tiny.en streams on the H200 (py-spy, session
9), at 0.10 ms per call of one frame. `SileroVAD.probabilities_many` scores many streams in one
call at 0.044-0.05 ms a frame-stream, bit-identical, so the bridges hand their audio here: it
waits at most `delay_s` (or until `max_streams` streams have audio), then every stream's chunk
is scored in one go and fed to its policy with the probabilities, in arrival order per stream.

Anything else a bridge does (a client's flush or commit, the end of the stream) first drains
what is waiting here, so that it sees all the audio that came before it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import numpy as np

from streamer.audio.vad import SileroVAD
from streamer.audio import SAMPLE_RATE

if TYPE_CHECKING:
    from streamer.server.bridge import Bridge

log = logging.getLogger("streamer.server")


class VADBatcher:
    """Audio of many bridges, scored together; event loop only."""

    def __init__(self, vad: SileroVAD, delay_s: float, max_streams: int = 64):
        if delay_s <= 0:
            raise ValueError(f"delay_s must be positive, not {delay_s} (no batcher: score inline)")
        self.vad = vad
        self.delay_s = delay_s
        self.max_streams = max_streams
        self._pending: dict[Bridge, list[tuple[np.ndarray, float]]] = {}
        """Chunks (16-kHz float32, arrival time) per bridge, in arrival order."""
        self._samples: dict[Bridge, int] = {}
        """Samples waiting per bridge (`pending_s`)."""
        self._timer: asyncio.TimerHandle | None = None
        self.calls = 0
        """Shared scoring calls made (one per drain with audio), for tests and metrics."""

    def add(self, bridge: Bridge, pcm: np.ndarray, now: float) -> None:
        """A chunk of `bridge`'s stream, to be scored with the others' and fed to its policy."""
        self._pending.setdefault(bridge, []).append((pcm, now))
        self._samples[bridge] = self._samples.get(bridge, 0) + len(pcm)
        if len(self._pending) >= self.max_streams:
            self.drain()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self.drain)

    def holds(self, bridge: Bridge) -> bool:
        return bridge in self._pending

    def pending_s(self, bridge: Bridge) -> float:
        """Seconds of `bridge`'s audio waiting here: part of its backlog (a client sending faster than
        real time fills the socket's buffer, whose reads do not yield to the timer that drains this)."""
        return self._samples.get(bridge, 0) / SAMPLE_RATE

    def forget(self, bridge: Bridge) -> None:
        """Drop what `bridge` has waiting (it is closing at once)."""
        self._pending.pop(bridge, None)
        self._samples.pop(bridge, None)

    def drain(self) -> None:
        """Score everything waiting now and feed it to the bridges."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, {}
        self._samples = {}
        if not pending:
            return
        bridges = list(pending)
        joined = [np.concatenate([pcm for pcm, _ in pending[b]]) for b in bridges]
        probs = self.vad.probabilities_many([(b.session.vad_state, pcm) for b, pcm in zip(bridges, joined)])
        self.calls += 1
        for bridge, pcm, p in zip(bridges, joined, probs):
            try:  # one stream's failure is its own: the others' audio must still reach them
                bridge.feed_scored(pcm, p, pending[bridge][-1][1])
            except Exception:
                log.exception("session %s: internal error on its audio", bridge.session_id)
