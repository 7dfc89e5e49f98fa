"""Graceful shutdown of live streams whose clients keep sending while the server drains (QA
session 31b): a real client does not stop talking because the server is going away.

The server runs in-process on tiny.en (`running`, whose exit drains as SIGTERM does); the clients
run in a thread of their own with real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import numpy as np
import pytest
import websockets

from streamer.audio.decode import decode_audio
from streamer.config import load_settings
from streamer.server.app import create_app, running

GRACE_S = 10.0
STREAMS = 4
RATE = 16000


@pytest.fixture(scope="module")
def jfk(jfk_path) -> bytes:
    return (np.clip(decode_audio(jfk_path), -1, 1) * 32767).astype("<i2").tobytes()


async def _stream(url: str, speech: bytes, flooding: threading.Event, counter: list) -> list[dict]:
    """A `/v1/stream` client with speech open that keeps talking to the server (pings, as fast as
    the socket takes them) until the server closes; its events, the close code last."""
    events: list[dict] = []
    async with websockets.connect(url + "/v1/stream", ping_interval=None) as ws:
        await ws.send(json.dumps({"type": "start", "partials": False}))
        assert json.loads(await ws.recv())["type"] == "ready"
        await ws.send(speech)

        async def read() -> None:
            with contextlib.suppress(websockets.ConnectionClosed):
                async for message in ws:
                    event = json.loads(message)
                    if event["type"] != "pong":
                        events.append(event)

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(1.0)  # the VAD has heard the speech start
        counter.append(1)
        if len(counter) == STREAMS:
            flooding.set()
        with contextlib.suppress(websockets.ConnectionClosed):
            while not reader.done():
                await ws.send('{"type": "ping"}')
                await asyncio.sleep(0)
        await asyncio.wait_for(reader, 60)
    return events + [{"type": "_close", "code": ws.close_code}]


def test_shutdown_ends_streams_whose_clients_keep_sending(engine, jfk):
    """Shutdown with speech open on streams whose clients are still sending: each gets the final of
    its open utterance, `closed` (`shutdown`) and close 1001 within `shutdown_grace_s`. The drain
    cancels each stream's receiver; a cancellation that came while a client message was ready was
    swallowed by `asyncio.wait_for` (Python < 3.12), so the receiver read on, the stream never ended,
    the drain gave up after the grace, and uvicorn cut the stream with 1012 and no final (the
    gateway was then killed by the supervisor, 25 s later)."""
    speech = jfk[: int(1.6 * RATE) * 2]  # "And so my fellow" and no pause: the utterance is open
    app = create_app(load_settings({}, server={"shutdown_grace_s": GRACE_S}), engine)
    flooding = threading.Event()
    results: list = []

    def clients(url: str) -> None:
        async def run():
            counter: list = []
            return await asyncio.gather(*(_stream(url, speech, flooding, counter) for _ in range(STREAMS)),
                                        return_exceptions=True)

        results.extend(asyncio.run(run()))

    with running(app) as base:
        thread = threading.Thread(target=clients, args=(base.replace("http://", "ws://"),), daemon=True)
        thread.start()
        assert flooding.wait(60)
        time.sleep(0.5)
        began = time.monotonic()
    took = time.monotonic() - began
    thread.join(60)
    assert len(results) == STREAMS
    for events in results:
        assert not isinstance(events, BaseException), repr(events)
        kinds = [e["type"] for e in events]
        assert kinds[-2:] == ["closed", "_close"] and events[-1]["code"] == 1001, events[-4:]
        assert events[-2]["reason"] == "shutdown"
        finals = [e for e in events if e["type"] == "final"]
        assert finals and "fellow" in finals[-1]["text"].lower(), events
    assert took < GRACE_S + 1.0, took
