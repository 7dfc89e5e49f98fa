"""An async client of `/v1/stream` for pipelines and tests, with session resume built in.

    async with StreamClient("ws://127.0.0.1:8000", key=KEY, sample_rate=8000, encoding="mulaw") as s:
        await s.send(chunk)            # bytes in the start message's encoding, any size
        ...
        await s.stop()                 # end of audio: the last finals follow
        async for event in s:          # speech_started, partial, speech_stopped, final, ..., closed
            ...

Events are dicts as in docs/protocol.md, section 1.2; iteration ends after `closed`. When the
connection drops (no `closed` came), the client reconnects within `resume_s` with the session's
resume token, the bytes it sent and the last event id it got; the server replays the events the
client missed and says how many audio bytes it holds, and the client sends the rest again from
its buffer (the last `buffer_s` seconds of audio). Events are delivered once each, in order.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any, AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import websockets
from websockets.asyncio.client import ClientConnection, connect

BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}
RECONNECT_DELAYS_S = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)
"""Back-off between reconnect attempts (the last one repeats until `resume_s` is spent)."""


class StreamError(Exception):
    """The server refused the stream or a resume; `event` is its `error` event."""

    def __init__(self, event: dict):
        super().__init__(f"{event.get('code')}: {event.get('message')}")
        self.event = event


class StreamClient:
    """One `/v1/stream` session. `start` fields (`language`, `partials`, `vad`, ...) go as keyword
    arguments; `url` is the server (`ws://host:port`) or the endpoint itself."""

    def __init__(self, url: str, *, key: str | None = None, sample_rate: int = 16000, encoding: str = "pcm_s16le",
                 channels: int = 1, resume: bool = True, resume_s: float = 30.0, buffer_s: float = 60.0,
                 **start: Any):
        parts = urlsplit(url)
        self.url = urlunsplit(parts._replace(path=parts.path if parts.path not in ("", "/") else "/v1/stream"))
        self.key = key
        self.start_message = {"type": "start", "sample_rate": sample_rate, "encoding": encoding, "channels": channels,
                              **start}
        self.resume = resume
        self.resume_s = resume_s
        self._buffer_bytes = int(buffer_s * sample_rate * channels * BYTES_PER_SAMPLE[encoding])
        self.ready: dict | None = None
        self.resumes = 0
        """How many times the session was resumed."""
        self._ws: ClientConnection | None = None
        self._sent = 0
        """Audio bytes handed to the socket in all."""
        self._buffer: deque[tuple[int, bytes]] = deque()
        """(offset, chunk) of the audio sent recently, for a resume."""
        self._buffered = 0
        self._last_event_id = 0
        self._events: asyncio.Queue = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._generation = 0
        """Counts connections; a failure of an old one does not reconnect twice."""
        self._closed = False
        self._stopping = False

    # --- the session ----------------------------------------------------------------------------

    async def __aenter__(self) -> "StreamClient":
        await self._connect(first=True)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def send(self, audio: bytes) -> None:
        """Send audio (any length; split in frames of at most a tenth of a second)."""
        frame = max(1, self.start_message["sample_rate"] // 10) * self._frame_bytes()
        for i in range(0, len(audio), frame):
            await self._send_raw(bytes(audio[i:i + frame]))

    async def flush(self) -> None:
        await self._send_raw(json.dumps({"type": "flush"}))

    async def stop(self) -> None:
        """End of audio; iterate to receive the last finals and `closed`."""
        self._stopping = True
        await self._send_raw(json.dumps({"type": "stop"}))

    async def close(self) -> None:
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()

    def __aiter__(self) -> AsyncIterator[dict]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict]:
        while True:
            event = await self._events.get()
            if isinstance(event, Exception):
                raise event
            yield event
            if event.get("type") == "closed":
                return

    def drop(self) -> None:
        """Cut the TCP connection at once, without a close handshake (tests of resume)."""
        if self._ws is not None:
            self._ws.transport.abort()

    # --- connection and resume ------------------------------------------------------------------

    def _frame_bytes(self) -> int:
        return BYTES_PER_SAMPLE[self.start_message["encoding"]] * self.start_message["channels"]

    def _remember(self, chunk: bytes) -> None:
        self._buffer.append((self._sent, chunk))
        self._sent += len(chunk)
        self._buffered += len(chunk)
        while self._buffer and self._buffered - len(self._buffer[0][1]) >= self._buffer_bytes:
            self._buffered -= len(self._buffer.popleft()[1])

    async def _send_raw(self, message: bytes | str) -> None:
        """Send on the current connection; audio is buffered in the same step, under the lock a
        resume holds while it sends the buffer again, so no chunk goes twice or out of order."""
        remembered = False
        while True:
            async with self._lock:
                if isinstance(message, bytes) and not remembered:
                    self._remember(message)
                    remembered = True
                generation, ws = self._generation, self._ws
                try:
                    await ws.send(message)
                    return
                except websockets.ConnectionClosed:
                    pass
            await self._reconnect(generation)
            if remembered:
                return  # the resume sent it again, from the audio buffer

    async def _connect(self, first: bool) -> None:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        # No permessage-deflate: PCM barely compresses, and deflating costs the client's loop.
        # No keepalive pings: past MAX_BACKLOG_S the server stops reading the socket (TCP slows the sender),
        # so a ping waits behind audio and its timeout would close a healthy stream (the server sends none either).
        ws = await connect(self.url, additional_headers=headers, max_size=None, compression=None, ping_interval=None)
        if first:
            await ws.send(json.dumps(self.start_message))
        else:
            await ws.send(json.dumps({"type": "start", "resume": {"token": self.ready["resume_token"],
                                                                   "bytes_sent": self._sent,
                                                                   "last_event_id": self._last_event_id}}))
        ready = json.loads(await ws.recv())
        if ready.get("type") != "ready":
            await ws.close()
            raise StreamError(ready)
        self._ws, self.ready = ws, ready if first else {**self.ready, **ready}
        self._generation += 1
        if not first:
            self.resumes += 1
            await self._resend(ready["bytes_received"], ws)
            if self._stopping:
                await ws.send(json.dumps({"type": "stop"}))
        self._reader = asyncio.ensure_future(self._read(ws, self._generation))

    async def _resend(self, held: int, ws: ClientConnection) -> None:
        """Send again what the server did not get (it holds `held` bytes)."""
        if held < self._sent and (not self._buffer or self._buffer[0][0] > held):
            raise StreamError({"code": "resume_failed", "message": f"audio from byte {held} is no longer buffered"})
        for offset, chunk in self._buffer:
            if offset + len(chunk) > held:
                await ws.send(chunk[max(0, held - offset):])

    async def _read(self, ws: ClientConnection, generation: int) -> None:
        try:
            async for message in ws:
                event = json.loads(message)
                event_id = event.get("event_id")
                if event_id is not None:
                    if event_id <= self._last_event_id:
                        continue  # replayed, already delivered
                    self._last_event_id = event_id
                self._events.put_nowait(event)
                if event.get("type") == "closed" and event.get("reason") != "resumed":
                    self._closed = True
                    return
        except websockets.ConnectionClosed:
            pass
        if not self._closed:
            try:
                await self._reconnect(generation)
            except Exception as e:
                self._events.put_nowait(e)

    async def _reconnect(self, generation: int) -> None:
        """The connection of `generation` failed: resume the session on a new one."""
        async with self._lock:
            if self._generation != generation:
                return  # another task has resumed already
            if not self.resume or self.ready is None or self._closed:
                raise ConnectionError("the connection to the server was lost")
            give_up = time.monotonic() + self.resume_s
            for attempt in range(10**6):
                await asyncio.sleep(RECONNECT_DELAYS_S[min(attempt, len(RECONNECT_DELAYS_S) - 1)])
                try:
                    await self._connect(first=False)
                    return
                except (OSError, websockets.InvalidHandshake, websockets.ConnectionClosed):
                    if time.monotonic() > give_up:
                        raise
