"""The audio of one live stream into its bridges: mixed to one `Bridge`, or one `Bridge` per
channel (`multichannel`: agent and caller of a call each get their own VAD, utterances, prompt
and finals), each channel with its own resampler to 16 kHz.

Every transport that takes raw audio uses it: `/v1/stream`, `/v1/listen` (Deepgram) and
`/v1/twilio` (a Twilio track is a channel). The bridges share the engine, so the windows of all
channels are batched in the same engine steps.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import numpy as np

from streamer.audio.decode import StreamResampler, pcm_dtype
from streamer.server.bridge import Bridge

MakeBridge = Callable[[int | None], Bridge]
"""Builds the bridge of one channel (None: the one bridge of a mixed stream)."""


class ChannelStreams:
    """One stream's resamplers and bridges; used from the event loop only."""

    def __init__(self, *, rate: int, channels: int, encoding: str, multichannel: bool, make_bridge: MakeBridge):
        self.rate = rate
        self.channels = channels
        self.encoding = encoding
        self.multichannel = multichannel and channels > 1
        self.sample_bytes = pcm_dtype(encoding).itemsize
        if self.multichannel:
            self._resamplers = [StreamResampler(rate, 1, encoding) for _ in range(channels)]
            self.bridges = [make_bridge(c) for c in range(channels)]
        else:
            self._resamplers = [StreamResampler(rate, channels, encoding)]
            self.bridges = [make_bridge(None)]

    @property
    def frame_bytes(self) -> int:
        """Bytes of one interleaved sample frame."""
        return self.sample_bytes * self.channels

    def push(self, data: bytes) -> None:
        """Interleaved audio, a whole number of sample frames."""
        if not self.multichannel:
            self.bridges[0].feed(self._resamplers[0].push(data))
            return
        frames = np.frombuffer(data, dtype=np.uint8).reshape(-1, self.channels, self.sample_bytes)
        for c in range(self.channels):
            self.push_channel(c, frames[:, c, :].tobytes())

    def push_channel(self, channel: int, data: bytes) -> None:
        """Audio of one channel alone (multichannel streams)."""
        self.bridges[channel].feed(self._resamplers[channel].push(data))

    async def wait_for_room(self, max_backlog_s: float) -> None:
        """Until every channel's backlog is under `max_backlog_s` (read no faster than served)."""
        for bridge in self.bridges:
            await bridge.wait_for_room(max_backlog_s)

    def flush(self, channel: int | None = None) -> bool:
        """End the open utterance of `channel` (None: of every channel) now; False when none was open."""
        bridges = self.bridges if channel is None or not self.multichannel else [self.bridges[channel]]
        return any([bridge.flush() for bridge in bridges])

    async def finish(self, timeout: float) -> None:
        """End of audio: the resamplers' last samples, then every channel's last finals."""
        for resampler, bridge in zip(self._resamplers, self.bridges):
            bridge.feed(resampler.flush())
            resampler.close()
        await asyncio.gather(*(bridge.finish(timeout) for bridge in self.bridges))

    def close(self) -> None:
        """Stop at once: the bridges' work, and the resamplers (PyAV's hold threads until freed)."""
        for resampler, bridge in zip(self._resamplers, self.bridges):
            bridge.close()
            resampler.close()

    @property
    def stream_time(self) -> float:
        return max(bridge.session.stream_time for bridge in self.bridges)
