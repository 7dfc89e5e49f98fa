"""Bad input, limits, auth, health, metrics and graceful shutdown of the gateway, on a real server.

Every error code of docs/protocol.md section 1.2 is provoked here (except `internal`, which
needs a bug); after each non-fatal one the same stream must still transcribe.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import numpy as np
import pytest
import websockets

from streamer.audio.decode import decode_audio
from streamer.config import EngineConfig, load_settings
from streamer.engine.engine import Engine
from streamer.server.app import create_app, running
from streamer.server.loop_lag import LoopLag

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def jfk(jfk_path) -> bytes:
    return (np.clip(decode_audio(jfk_path), -1, 1) * 32767).astype("<i2").tobytes()


@contextlib.contextmanager
def server(engine, **server_settings):
    """A server with these `ServerConfig` fields; yields its ws:// base URL."""
    with running(create_app(load_settings({}, server=server_settings), engine)) as base:
        yield base.replace("http://", "ws://")


def http(url: str, headers: dict | None = None) -> tuple[int, bytes, Message]:
    request = urllib.request.Request(url.replace("ws://", "http://"), headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


async def recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 60))


async def until_closed(ws) -> list[dict]:
    """Every event until the server closes; the close code last, as {"type": "_close"}."""
    events = []
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            events.append(await recv(ws))
    return events + [{"type": "_close", "code": ws.close_code}]


async def refused(url: str, **connect) -> list[dict]:
    async with websockets.connect(url, **connect) as ws:
        return await until_closed(ws)


def test_bad_input_gets_errors_and_the_stream_goes_on(engine, jfk):
    bad_starts = [
        ({"sample_rate": 1_000_000}, "sample_rate"),
        ({"sample_rate": "fast"}, "sample_rate"),
        ({"encoding": "mp3"}, "encoding"),
        ({"channels": 9}, "channels"),
        ({"language": "de"}, "language"),  # tiny.en is English-only
        ({"task": "translate"}, "task"),
        ({"partials": "yes"}, "partials"),
        ({"partial_interval_ms": 50}, "partial_interval_ms"),
        ({"vad": {"threshold": 1.5}}, "vad.threshold"),
        ({"vad": {"threshold": 0.5, "neg_threshold": 0.6}}, "vad.neg_threshold"),
        ({"vad": {"loudness": 3}}, "vad.loudness"),
        ({"vad": []}, "vad"),
        ({"colour": "blue"}, "colour"),
    ]

    async def run(url):
        async with websockets.connect(url + "/v1/stream") as ws:
            expect = []

            async def send(message, code):
                await ws.send(message)
                expect.append(code)
                error = await recv(ws)
                assert error["type"] == "error" and error["code"] == code, (message, error)
                return error

            await send(b"\x00\x00", "not_started")
            await send(json.dumps({"type": "flush"}), "not_started")
            await send("{not json", "bad_json")
            await send("[1, 2]", "bad_json")
            await send(json.dumps({"kind": "start"}), "unknown_type")
            await send(json.dumps({"type": "dance"}), "unknown_type")
            for fields, name in bad_starts:
                error = await send(json.dumps({"type": "start", **fields}), "bad_field")
                assert error["field"] == name, (fields, error)
            await ws.send(json.dumps({"type": "start", "partials": False}))
            ready = await recv(ws)
            assert ready["type"] == "ready" and ready["model"] == "tiny.en" and ready["language"] == "en"
            await send(json.dumps({"type": "start"}), "already_started")
            await send(b"\x00\x00\x00", "bad_frame")  # half a sample
            await send(b"", "bad_frame")
            await send(b"\x00" * (2 * 16000 * 5 + 2), "bad_frame")  # over 5 s
            await ws.send(json.dumps({"type": "ping", "id": [7, "x"]}))
            assert await recv(ws) == {"type": "pong", "id": [7, "x"]}
            await ws.send(json.dumps({"type": "ping"}))
            assert await recv(ws) == {"type": "pong"}
            for i in range(0, len(jfk), 32000):
                await ws.send(jfk[i:i + 32000])
            await ws.send(json.dumps({"type": "stop"}))
            events = await until_closed(ws)
        assert [e["type"] for e in events[-2:]] == ["closed", "_close"] and events[-1]["code"] == 1000
        assert any(e["type"] == "final" and "country" in e["text"] for e in events)
        return expect, sum(e["type"] == "final" for e in events)

    with server(engine) as url:
        codes, n_finals = asyncio.run(run(url))
        status, body, _ = http(url + "/metrics")
    assert status == 200
    text = body.decode()
    for code in set(codes):
        assert f'streamer_errors_total{{code="{code}"}} {float(codes.count(code))}' in text, code
    assert f"streamer_finalisation_latency_seconds_count {float(n_finals)}" in text
    assert "streamer_engine_queue_depth" in text and 'streamer_sessions{transport="stream"} 0.0' in text


def test_too_large(engine):
    """Over the limit: `too_large` then close 1009; far over it the WebSocket layer closes 1009 alone."""
    async def run(url, size):
        async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
            await ws.send(json.dumps({"type": "start"}))
            await recv(ws)
            await ws.send(b"\x00" * size)
            return await until_closed(ws)

    with server(engine, max_message_bytes=65536) as url:
        events = asyncio.run(run(url, 70000))
        huge = asyncio.run(run(url, 1 << 20))
    assert events[0]["code"] == "too_large"
    assert events[1:] == [{"type": "closed", "reason": "error"}, {"type": "_close", "code": 1009}]
    assert huge[-1] == {"type": "_close", "code": 1009}


def test_max_sessions_across_transports(engine):
    async def run(url):
        async with websockets.connect(url + "/v1/stream") as a, websockets.connect(url + "/v1/realtime") as b:
            assert (await recv(b))["type"] == "session.created"
            full = await refused(url + "/v1/stream")
            assert [e.get("code") for e in full] == ["overloaded", None, 1013] and full[0]["retry_after_s"] == 5.0
            full = await refused(url + "/v1/realtime")
            assert full[0]["error"]["code"] == "overloaded" and full[-1]["code"] == 1013
            assert full[0]["error"]["retry_after_s"] == 5.0
            status, body, headers = await asyncio.to_thread(offer, url)
            assert status == 503 and json.loads(body)["error"]["code"] == "overloaded" and headers["Retry-After"] == "5"
            await a.send(json.dumps({"type": "start"}))
            assert (await recv(a))["type"] == "ready"
        await asyncio.sleep(0.2)  # the server notices the closes
        async with websockets.connect(url + "/v1/stream") as c:
            await c.send(json.dumps({"type": "start"}))
            assert (await recv(c))["type"] == "ready"

    def offer(url):
        request = urllib.request.Request(url.replace("ws://", "http://") + "/v1/webrtc/offer", method="POST",
                                         data=json.dumps({"type": "offer", "sdp": "v=0\r\nm=audio\r\nm=application\r\n"}).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read(), response.headers
        except urllib.error.HTTPError as e:
            return e.code, e.read(), e.headers

    with server(engine, max_sessions=2) as url:
        asyncio.run(run(url))


def test_engine_queue_full_refuses_start():
    """An engine whose queue refuses partials already (max_queue 1) takes no new stream."""
    settings = load_settings({})
    engine = Engine.load(settings.model, EngineConfig(max_queue=1))
    try:
        async def run(url):
            async with websockets.connect(url + "/v1/stream") as ws:
                await ws.send(json.dumps({"type": "start"}))
                return await until_closed(ws)

        with server(engine) as url:
            events = asyncio.run(run(url))
    finally:
        engine.close()
    assert [e.get("code") for e in events] == ["overloaded", None, 1013]
    assert "engine is at capacity" in events[0]["message"] and events[0]["retry_after_s"] == 5.0


def test_api_key(engine):
    async def run(url):
        for bad in ({}, {"additional_headers": {"Authorization": "Bearer wrong"}}):
            events = await refused(url + "/v1/stream", **bad)
            assert [e.get("code") for e in events] == ["unauthorized", None, 1008]
            assert events[1] == {"type": "closed", "reason": "error"}
        events = await refused(url + "/v1/realtime")
        assert events[0]["error"]["code"] == "invalid_api_key" and events[-1]["code"] == 1008
        for good in ({"additional_headers": {"Authorization": "Bearer s3cret"}}, {}):
            suffix = "" if good else "?api_key=s3cret"
            async with websockets.connect(url + "/v1/stream" + suffix, **good) as ws:
                await ws.send(json.dumps({"type": "start"}))
                assert (await recv(ws))["type"] == "ready"

    with server(engine, api_key="s3cret") as url:
        asyncio.run(run(url))
        assert http(url + "/health")[0] == 200
        status, body, _ = http(url + "/")
        assert status == 200 and b"<html" in body.lower()
        for path in ("/metrics", "/v1/webrtc/config"):
            status, body, headers = http(url + path)
            assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", path
            assert http(url + path, {"Authorization": "Bearer s3cret"})[0] == 200
        assert http(url + "/v1/webrtc/config?api_key=s3cret")[0] == 200
        status, body, _ = http(url + "/v1/models?api_key=s3cret")  # the file endpoints' routes are mounted
        assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny.en"
        assert http(url + "/v1/models")[0] == 401


def test_idle_timeout_and_stop_before_start(engine):
    async def run(url):
        async with websockets.connect(url + "/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start"}))
            await recv(ws)
            t0 = time.monotonic()
            events = await until_closed(ws)
            waited = time.monotonic() - t0
        assert events == [{"type": "closed", "reason": "idle_timeout"}, {"type": "_close", "code": 1000}]
        assert 0.9 < waited < 5
        async with websockets.connect(url + "/v1/stream") as ws:
            await ws.send(json.dumps({"type": "stop"}))
            assert await until_closed(ws) == [{"type": "closed", "reason": "stop"}, {"type": "_close", "code": 1000}]
        async with websockets.connect(url + "/v1/realtime") as ws:
            events = await until_closed(ws)
        # an idle Realtime session is told why before the close (as OpenAI's `session_expired`)
        assert [e["type"] for e in events] == ["session.created", "error", "_close"] and events[-1]["code"] == 1000
        assert events[1]["error"]["code"] in ("idle_timeout", "no_audio"), events

    with server(engine, idle_timeout_s=1.0) as url:
        asyncio.run(run(url))


def test_health(engine):
    app = create_app(load_settings({}), engine)
    with running(app) as url:
        status, body, _ = http(url + "/health")
        health = json.loads(body)
        assert status == 200 and health["status"] == "ok" and health["model"] == "tiny.en"
        assert health["device"] == "cpu" and health["sessions"] == 0 and health["queue"] == 0
        app.state.streamer.shutting_down = True  # as during a drain
        status, body, _ = http(url + "/health")
        assert status == 503 and json.loads(body)["status"] == "shutting_down"
        events = asyncio.run(refused(url.replace("http://", "ws://") + "/v1/stream"))
        assert [e.get("code") for e in events] == ["shutting_down", None, 1013]  # go to another server
        assert events[0]["retry_after_s"] == 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_delivers_open_finals(jfk):
    """SIGTERM with speech open on a native stream and a Realtime session: both get their finals
    before `closed`/close 1001, and the process exits without an error."""
    port = _free_port()
    code = ("from streamer.config import load_settings; from streamer.server.supervisor import serve; "
            f"serve(load_settings(server={{'port': {port}, 'shutdown_grace_s': 60.0}}))")  # a loaded 2-core box
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"ws://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(OSError):
                if http(url + "/health")[0] == 200:
                    break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        seven_s = jfk[: 7 * 32000]  # ends inside "what your country can do for you"

        async def native(started: asyncio.Event):
            async with websockets.connect(url + "/v1/stream") as ws:
                await ws.send(json.dumps({"type": "start", "partials": False}))
                await recv(ws)
                for i in range(0, len(seven_s), 32000):
                    await ws.send(seven_s[i:i + 32000])
                events = []
                while not any(e["type"] == "speech_started" and e["t"] > 5 for e in events):
                    events.append(await recv(ws))
                started.set()
                return events + await until_closed(ws)

        async def realtime(started: asyncio.Event):
            async with websockets.connect(url + "/v1/realtime?intent=transcription") as ws:
                await recv(ws)
                # 16 kHz PCM: say so, and append the same seven seconds.
                await ws.send(json.dumps({"type": "session.update", "session": {
                    "type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}}))
                await recv(ws)
                for i in range(0, len(seven_s), 64000):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(seven_s[i:i + 64000]).decode()}))
                events = []
                while not any(e["type"] == "input_audio_buffer.speech_started" and e["audio_start_ms"] > 5000
                              for e in events):
                    events.append(await recv(ws))
                started.set()
                return events + await until_closed(ws)

        async def run():
            a, b = asyncio.Event(), asyncio.Event()
            tasks = [asyncio.ensure_future(native(a)), asyncio.ensure_future(realtime(b))]
            await asyncio.wait_for(asyncio.gather(a.wait(), b.wait()), 120)
            proc.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks)

        native_events, realtime_events = asyncio.run(run())
        # uvicorn re-raises the signal once its shutdown is complete.
        assert proc.wait(60) in (0, -signal.SIGTERM)
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    kinds = [e["type"] for e in native_events]
    assert kinds[-2:] == ["closed", "_close"] and native_events[-1]["code"] == 1001
    assert native_events[-2]["reason"] == "shutdown"
    last_final = [e for e in native_events if e["type"] == "final"][-1]
    assert "country" in last_final["text"].lower() and last_final["end"] > 5.0
    committed = [e["item_id"] for e in realtime_events if e["type"] == "input_audio_buffer.committed"]
    completed = [e for e in realtime_events if e["type"].endswith("transcription.completed")]
    assert len(committed) >= 2 and [e["item_id"] for e in completed] == committed
    assert "country" in completed[-1]["transcript"].lower()
    assert realtime_events[-1]["code"] == 1001


def test_loop_lag_holds_peaks_and_decays():
    lag = LoopLag(interval=0.05, half_life=1.0)
    lag.observe(0.8)
    lag.observe(0.0)
    assert 0.77 < lag.lag < 0.8  # held, decaying
    for _ in range(20):
        lag.observe(0.01)
    assert lag.lag == pytest.approx(0.8 * 0.5 ** 1.05)  # 21 wake-ups since the peak
    lag.observe(-0.001)  # early wake-ups count as on time
    assert lag.lag > 0


def test_a_late_event_loop_refuses_new_streams(engine):
    """While the gateway's event loop runs `max_loop_lag_s` late, new streams are refused
    (`overloaded`, 1013), /metrics shows the lag, and streams are taken again once it is on time."""
    app = create_app(load_settings({}, server={"max_loop_lag_s": 0.3}), engine)
    lag = app.state.streamer.loop_lag

    async def start(url) -> str:
        async with websockets.connect(url + "/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start"}))
            return (await recv(ws))["type"]

    with running(app) as base:
        url = base.replace("http://", "ws://")
        assert asyncio.run(start(url)) == "ready"
        for _ in range(100):
            if lag.loop is not None:
                break
            time.sleep(0.05)
        lag.loop.call_soon_threadsafe(time.sleep, 0.8)  # the loop stalls, as under too many streams
        time.sleep(1.0)
        assert lag.lag >= 0.3
        events = asyncio.run(refused(url + "/v1/stream"))
        assert "event loop" in events[0]["message"], events
        assert [e.get("code") for e in events] == ["overloaded", None, 1013]
        status, body, _ = http(url + "/metrics")
        value = next(line for line in body.decode().splitlines() if line.startswith("streamer_event_loop_lag_seconds "))
        assert float(value.split()[1]) > 0
        for _ in range(100):  # the peak decays (half-life 1 s)
            if lag.lag < 0.3:
                break
            time.sleep(0.1)
        assert asyncio.run(start(url)) == "ready"
