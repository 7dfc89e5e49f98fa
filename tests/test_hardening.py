"""Hostile and greedy clients on a real server (tiny.en, CPU, 127.0.0.1): a seeded fuzz of both
WebSocket protocols, a client that never reads, origin and host checks, key redaction, per-address
and first-audio limits, stalled uploads, and the log noise of abrupt disconnects (issue #13).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import logging
import os
import random
import socket
import time
import urllib.error
import urllib.request

import jiwer
import numpy as np
import pytest
import websockets
from whisper_normalizer.english import EnglishTextNormalizer

from streamer.audio.decode import decode_audio
from streamer.config import load_settings
from streamer.server.app import create_app, running
from test_realtime import pcm24k

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
SEED = 13
normalize = EnglishTextNormalizer()


def wer(reference: str, hypothesis: str) -> float:
    return jiwer.wer(normalize(reference), normalize(hypothesis))


class LogLines(logging.Handler):
    """Every log line of the server (root, uvicorn and its access log), formatted with tracebacks."""

    LOGGERS = ("", "uvicorn", "uvicorn.access", "uvicorn.error", "asyncio")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record):
        self.lines.append(self.format(record))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@contextlib.contextmanager
def server(engine, **server_settings):
    """A server with these `ServerConfig` fields; yields (ws:// base URL, its log lines)."""
    logs = LogLines()
    loggers = [logging.getLogger(name) for name in LogLines.LOGGERS]
    level = logging.getLogger("streamer").level
    logging.getLogger("streamer").setLevel(logging.INFO)
    try:
        with running(create_app(load_settings({}, server=server_settings), engine)) as base:
            for lg in loggers:  # after uvicorn has configured its loggers (it replaces their handlers)
                lg.addHandler(logs)
            yield base.replace("http://", "ws://"), logs
    finally:
        for lg in loggers:
            lg.removeHandler(logs)
        logging.getLogger("streamer").setLevel(level)


@pytest.fixture(scope="module")
def jfk16k(jfk_path) -> np.ndarray:
    return decode_audio(jfk_path)


def s16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


async def recv(ws, timeout: float = 60) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


def http(url: str, method: str = "GET", headers: dict | None = None, data: bytes | None = None):
    request = urllib.request.Request(url.replace("ws://", "http://"), method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


# --- the fuzz -------------------------------------------------------------------------------------

BIG = 10**400
NASTY_NUMBERS = [BIG, -BIG, float("nan"), float("inf"), float("-inf"), "1e400"]
"""`"1e400"` stands for the literal 1e400 in the JSON text (see `dumps`)."""
WRONG_TYPES = [[], {}, "x", True, [1, 2], {"a": 1}]


def dumps(message) -> str:
    return json.dumps(message).replace('"1e400"', "1e400")


def deep(n: int, rng: random.Random) -> str:
    if rng.random() < 0.5:
        return "[" * n + "]" * n
    return '{"a":' * n + "1" + "}" * n


def bad_start(rng: random.Random) -> str:
    """A `start` message with at least one field that docs/protocol.md rules out."""
    bad = {
        "sample_rate": NASTY_NUMBERS + WRONG_TYPES + [16000.0, 7999, 192001, 0, -16000, "16000", None],
        "encoding": WRONG_TYPES + ["mp3", "", None, 1, "PCM_S16LE"],
        "channels": NASTY_NUMBERS + WRONG_TYPES + [0, 9, 1.5, 2.0, None],
        "language": [5, [], {}, "xx", "de", True, "e" * 5000],
        "task": WRONG_TYPES + ["summarize", None, 1],
        "partials": [1, 0, "true", None, [], {}],
        "partial_interval_ms": NASTY_NUMBERS + WRONG_TYPES + [99, 10001, -1, None],
        "condition_on_previous": [1, "false", None, [], {}],
        "vad": [1, [], "x", None, True],
        "vad.threshold": NASTY_NUMBERS + WRONG_TYPES + [0, 1, -0.1, 1.5, None],
        "vad.neg_threshold": NASTY_NUMBERS + [0, 1, 0.9, "0.3"],
        "vad.min_silence_ms": NASTY_NUMBERS + WRONG_TYPES + [-1, 10001, 500.5, 500.0],
        "vad.speech_pad_ms": NASTY_NUMBERS + [-1, 2001, 1.5],
        "vad.min_speech_ms": NASTY_NUMBERS + [-1, 10001],
        "vad.max_utterance_s": NASTY_NUMBERS + WRONG_TYPES + [0.5, 31, 0],
        "vad.unknown": [1],
        "unknown_field": [1, None, "x"],
    }
    good = {"sample_rate": 16000, "encoding": "pcm_s16le", "channels": 1, "partials": True,
            "partial_interval_ms": 500, "vad.threshold": 0.5, "vad.min_silence_ms": 300}
    msg: dict = {"type": "start"}
    for name in rng.sample(sorted(good), rng.randint(0, 3)):
        _put(msg, name, good[name])
    for name in rng.sample(sorted(bad), rng.randint(1, 3)):
        _put(msg, name, rng.choice(bad[name]))
    if rng.random() < 0.1:
        _put(msg, "vad.threshold", deep(rng.choice([40, 1000, 5000]), rng))
        return dumps(msg).replace(json.dumps(msg["vad"]["threshold"]), msg["vad"]["threshold"])
    return dumps(msg)


def _put(msg: dict, name: str, value) -> None:
    if name.startswith("vad."):
        if not isinstance(msg.get("vad"), dict):
            msg["vad"] = {}
        msg["vad"][name[4:]] = value
    else:
        msg[name] = value


def bad_native(rng: random.Random) -> str | bytes:
    """One hostile message for `/v1/stream` before `start` (each must get one error event)."""
    kind = rng.random()
    if kind < 0.55:
        return bad_start(rng)
    if kind < 0.65:
        return deep(rng.choice([33, 999, 1000, 5000, 50000]), rng)
    if kind < 0.75:
        return rng.choice(['{"type": "start"', "", "nul", "\x00", "[]", "1", '"start"', "null", "1e400", "NaN",
                           '{"type": 1}', '{"type": null}', '{"type": ["start"]}', '{"type": {"a": 1}}',
                           '{"type": "' + "s" * 10000 + '"}', '{"type": "pong"}', '{"type": "START"}'])
    if kind < 0.85:
        return rng.choice([b"", b"\x00", rng.randbytes(rng.randint(1, 3000))])  # audio before start
    if kind < 0.95:
        return json.dumps({"type": "flush"})  # before start
    return '{"type":"start","vad":{"' + "k" * 2000 + '":1}}'


def bad_realtime(rng: random.Random) -> str:
    """One hostile event for `/v1/realtime` (each must get one error event)."""
    nasty = NASTY_NUMBERS + WRONG_TYPES
    kind = rng.random()
    if kind < 0.45:
        turn = {"type": "server_vad"}
        field, values = rng.choice([
            ("threshold", nasty + [0, 1, -1, 2]),
            ("prefix_padding_ms", nasty + [-1, 2001, 300.5, 300.0]),
            ("silence_duration_ms", nasty + [-1, 10001, 0.5]),
            ("type", ["semantic_vad", 1, [], {}, ""]),
        ])
        turn[field] = rng.choice(values)
        if rng.random() < 0.5:
            session = {"type": "transcription", "audio": {"input": {"turn_detection": turn}}}
            return dumps({"type": "session.update", "session": session})
        return dumps({"type": "transcription_session.update", "session": {"turn_detection": turn}})
    if kind < 0.6:
        session = rng.choice([
            {"type": "realtime"}, {"type": []}, {"type": {}},
            {"audio": []}, {"audio": {"input": 5}}, {"audio": {"input": {"format": "pcm"}}},
            {"audio": {"input": {"format": {"type": "audio/pcmu", "rate": rng.choice([16000, 7999, 8000.5, []])}}}},  # G.711 is 8 kHz only
            {"audio": {"input": {"format": {"type": "audio/pcm", "rate": rng.choice(nasty + [24000.0, 7999, 48001])}}}},
            {"audio": {"input": {"transcription": rng.choice([1, [], "x"])}}},
            {"audio": {"input": {"transcription": {"language": rng.choice([1, [], {}, "de", "x" * 100])}}}},
            {"audio": {"input": {"transcription": {"prompt": rng.choice([1, [], {}, "p" * 5000])}}}},
            {"audio": {"input": {"turn_detection": rng.choice([1, "x", []])}}},
        ])
        return dumps({"type": "session.update", "session": session})
    if kind < 0.65:
        return dumps({"type": "session.update", "session": rng.choice([None, 1, [], "x"])})
    if kind < 0.8:
        audio = rng.choice([None, 1, [], {}, "not base64!", "AAA", base64.b64encode(b"\x00").decode(),
                            "\u00e9" * 10])
        return dumps({"type": "input_audio_buffer.append", "audio": audio, "event_id": rng.choice(["e1", 1, []])})
    if kind < 0.85:
        return deep(rng.choice([33, 999, 1000, 5000, 50000]), rng)
    if kind < 0.9:
        return dumps({"type": "input_audio_buffer.commit"})  # nothing to commit
    return rng.choice(['{"type": "session.update"', "", "[]", "1", "null", "NaN", '{"type": 1}', '{"type": []}',
                       '{"type": {}}', '{"type": "response.create"}', '{"type": "' + "t" * 10000 + '"}',
                       '{"no_type": true}', "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace")])


async def fuzz_native(url: str, audio: np.ndarray, n: int, rng: random.Random) -> tuple[list[dict], str]:
    async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
        for _ in range(n):
            await ws.send(bad_native(rng))
        errors = [await recv(ws) for _ in range(n)]
        await ws.send(json.dumps({"type": "start", "language": "en"}))
        assert (await recv(ws))["type"] == "ready"
        pcm = s16(audio)
        for i in range(0, len(pcm), 32000):
            await ws.send(pcm[i:i + 32000])
        await ws.send(json.dumps({"type": "stop"}))
        events = []
        with contextlib.suppress(websockets.ConnectionClosedOK):
            while True:
                events.append(await recv(ws, 120))
        assert ws.close_code == 1000, ws.close_code
        return errors, " ".join(e["text"] for e in events if e["type"] == "final")


async def fuzz_realtime(url: str, audio: np.ndarray, n: int, rng: random.Random) -> tuple[list[dict], str]:
    async with websockets.connect(url + "/v1/realtime?intent=transcription", max_size=None) as ws:
        assert (await recv(ws))["type"] == "session.created"
        for _ in range(n):
            await ws.send(bad_realtime(rng))
        errors = [await recv(ws) for _ in range(n)]
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"turn_detection": None}}}}))
        assert (await recv(ws))["type"] == "session.updated"
        pcm = pcm24k(audio)
        for i in range(0, len(pcm), 48000):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm[i:i + 48000]).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        while (event := await recv(ws, 120))["type"] != "conversation.item.input_audio_transcription.completed":
            assert event["type"] != "error", event
        return errors, event["transcript"]


def test_fuzz_both_protocols(engine, jfk16k):
    """2,400 hostile messages (seeded): each gets an error event, none ends the stream, nothing
    logs a traceback; then a real recording is transcribed correctly on the same connection."""
    rng = random.Random(SEED)
    with server(engine) as (url, logs):
        errors, text = asyncio.run(fuzz_native(url, jfk16k, 1200, rng))
        assert all(e["type"] == "error" for e in errors), [e for e in errors if e["type"] != "error"][:3]
        codes = {e["code"] for e in errors}
        assert codes <= {"bad_field", "bad_json", "unknown_type", "not_started"}, codes
        assert wer(JFK, text) < 0.15, text
        errors, text = asyncio.run(fuzz_realtime(url, jfk16k, 1200, rng))
        assert all(e["type"] == "error" for e in errors), [e for e in errors if e["type"] != "error"][:3]
        codes = {e["error"]["code"] for e in errors}
        assert "internal_error" not in codes, codes
        assert wer(JFK, text) < 0.15, text
    assert "Traceback" not in logs.text and "internal error" not in logs.text, logs.text[-3000:]


# --- a client that never reads ------------------------------------------------------------------------

def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def never_read(url: str, path: str, message: str, seconds: float, logs: LogLines) -> tuple[float, int, str]:
    """Sends `message` without reading (the client's queue holds one message, so its socket
    fills) until the server gives up on it (its log says so) or `seconds` pass, then reads until
    the server closes; (peak RSS growth in MB, close code, reason)."""
    base = rss_mb()
    peak = base
    async with websockets.connect(url + path, max_size=None, max_queue=1) as ws:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and "not reading" not in logs.text:
            try:
                await asyncio.wait_for(ws.send(message), 1.0)
            except (asyncio.TimeoutError, websockets.ConnectionClosed):
                break  # the server stopped reading us
            peak = max(peak, rss_mb())
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), 15)
        return peak - base, ws.close_code, ws.close_reason or ""


@pytest.mark.parametrize("transport", ["stream", "realtime"])
def test_a_client_that_never_reads_is_closed_and_memory_stays_bounded(engine, transport):
    if transport == "stream":
        path, message = "/v1/stream", json.dumps({"type": "ping", "id": "x" * 500_000})
    else:  # every session.update is echoed with the whole session (a long prompt here)
        path = "/v1/realtime?intent=transcription"
        message = json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"transcription": {"prompt": "p" * 4000}}}}})
    with server(engine, max_outbox_bytes=1 << 20, send_timeout_s=2.0) as (url, logs):
        growth, code, reason = asyncio.run(never_read(url, path, message, 10.0, logs))
    assert code == 1008 and "not reading" in reason, (code, reason)
    # Unbounded, the replies alone would be hundreds of MB (the issue: 300 MB in 8 s).
    assert growth < 80, f"RSS grew {growth:.0f} MB"
    assert "not reading" in logs.text


# --- origin and host -------------------------------------------------------------------------------------

def handshake(url: str, path: str, **headers) -> int:
    """The HTTP status of a WebSocket handshake (101: opened), sent by hand so that `Host` and
    `Origin` are exactly these."""
    port = int(url.rsplit(":", 1)[1])
    lines = [f"GET {path} HTTP/1.1", f"Host: {headers.pop('Host', f'127.0.0.1:{port}')}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13",
             *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(s.recv(4096).split(b" ", 2)[1])


def test_origin_and_host_checks(engine):
    with server(engine) as (url, _):
        port = url.rsplit(":", 1)[1]
        own = f"http://127.0.0.1:{port}"
        for path in ("/v1/stream", "/v1/realtime"):
            assert handshake(url, path) == 101  # no Origin: SDKs, pipelines
            assert handshake(url, path, Origin=own) == 101  # the demo page
            assert handshake(url, path, Origin="http://evil.example") == 403
            assert handshake(url, path, Origin="null") == 403
            assert handshake(url, path, Host=f"evil.example:{port}") == 403  # DNS rebinding
        status, body, _ = http(url + "/v1/audio/transcriptions", "POST", {"Origin": "http://evil.example",
                               "Content-Type": "multipart/form-data; boundary=x"}, b"--x--\r\n")
        assert status == 403 and json.loads(body)["error"]["code"] == "origin_not_allowed"
        status, _, headers = http(url + "/v1/models", "OPTIONS", {"Origin": "http://evil.example",
                                                                  "Access-Control-Request-Method": "GET"})
        assert status == 403 and "access-control-allow-origin" not in {k.lower() for k in headers}
        status, body, _ = http(url + "/health", headers={"Host": "evil.example"})
        assert status == 403 and json.loads(body)["error"]["code"] == "invalid_host"
        assert http(url + "/health", headers={"Host": f"localhost:{port}"})[0] == 200
        assert http(url + "/v1/models", headers={"Origin": own})[0] == 200
    with server(engine, allowed_origins="https://app.example") as (url, _):
        assert handshake(url, "/v1/stream", Origin="https://app.example") == 101
        assert handshake(url, "/v1/stream", Origin="https://other.example") == 403
        status, _, headers = http(url + "/v1/models", "OPTIONS", {"Origin": "https://app.example",
                                                                  "Access-Control-Request-Method": "GET",
                                                                  "Access-Control-Request-Headers": "authorization"})
        assert status == 204 and headers["Access-Control-Allow-Origin"] == "https://app.example"
        status, _, headers = http(url + "/v1/models", headers={"Origin": "https://app.example"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    with server(engine, allowed_origins="*") as (url, _):
        assert handshake(url, "/v1/stream", Origin="https://any.example") == 101
        port = url.rsplit(":", 1)[1]
        assert handshake(url, "/v1/stream", Host=f"evil.example:{port}") == 403  # still


# --- keys out of the logs --------------------------------------------------------------------------------

def test_the_api_key_never_reaches_the_log(engine):
    key = "sk-hardening-" + "7" * 20

    async def clients(url):
        async with websockets.connect(f"{url}/v1/stream?api_key={key}") as ws:
            await ws.send(json.dumps({"type": "start"}))
            assert (await recv(ws))["type"] == "ready"
        async with websockets.connect(f"{url}/v1/stream?api_key=wrong-{key}") as ws:
            assert (await recv(ws))["code"] == "unauthorized"
        async with websockets.connect(f"{url}/v1/realtime", subprotocols=["realtime", f"openai-insecure-api-key.{key}"]) as ws:
            assert ws.subprotocol == "realtime"
            assert (await recv(ws))["type"] == "session.created"

    with server(engine, api_key=key) as (url, logs):
        asyncio.run(clients(url))
        for query in (f"?api_key={key}", f"?x=1&api_key={key}&y=2", f"?api_key=bad{key}"):
            http(url + "/v1/models" + query)
        http(url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert logs.text.count("[redacted]") >= 5, logs.text
    assert key not in logs.text


# --- per-address and first-audio limits ----------------------------------------------------------------

def test_connections_per_address_and_time_to_first_audio(engine):
    async def run(url):
        held = []
        opened = time.monotonic()
        for _ in range(3):
            ws = await websockets.connect(url + "/v1/stream")
            await ws.send(json.dumps({"type": "start"}))
            assert (await recv(ws))["type"] == "ready"
            held.append(ws)
        async with websockets.connect(url + "/v1/realtime") as ws:  # the limit spans transports
            event = await recv(ws)
            assert event["type"] == "error" and "per client" in event["error"]["message"]
        async with websockets.connect(url + "/v1/stream") as ws:
            event = await recv(ws)
            assert event["code"] == "overloaded" and "per client" in event["message"]
            assert (await recv(ws)) == {"type": "closed", "reason": "error"}
            with contextlib.suppress(websockets.ConnectionClosed):
                await recv(ws, 10)
            assert ws.close_code == 1013
        # Pings do not keep a stream that sends no audio: it goes after first_audio_timeout_s.
        events = []
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                await held[0].send(json.dumps({"type": "ping"}))
                with contextlib.suppress(asyncio.TimeoutError):
                    events.append(await recv(held[0], 0.3))
        with contextlib.suppress(websockets.ConnectionClosed):  # what came before the close
            while True:
                events.append(await recv(held[0], 5))
        assert events[-1] == {"type": "closed", "reason": "no_audio"} and held[0].close_code == 1000
        assert 1.9 <= time.monotonic() - opened < 6
        for ws in held[1:]:  # the others went the same way
            await asyncio.sleep(0)
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    await recv(ws, 5)
        async with websockets.connect(url + "/v1/stream") as ws:  # slots free again
            await ws.send(json.dumps({"type": "start"}))
            assert (await recv(ws))["type"] == "ready"
            await ws.send(b"\x00\x00" * 1600)  # audio: the stream stays past the first-audio limit
            await asyncio.sleep(2.5)
            await ws.send(json.dumps({"type": "ping", "id": 1}))
            assert (await recv(ws)) == {"type": "pong", "id": 1}

    with server(engine, max_connections_per_client=3, first_audio_timeout_s=2.0) as (url, _):
        asyncio.run(run(url))


# --- uploads that stall or go away -----------------------------------------------------------------------

def deleted_files() -> int:
    """Open file descriptors of this process on removed files (spooled uploads)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}").endswith("(deleted)")
    return n


def start_upload(port: int, body_bytes: int) -> socket.socket:
    """An upload that declares `body_bytes` and sends a bit over half, then stalls."""
    head = (b"--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ntiny.en\r\n"
            b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            b"Content-Type: audio/wav\r\n\r\n")
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Type: multipart/form-data; boundary=x\r\n"
              + f"Content-Length: {body_bytes}\r\n\r\n".encode() + head + b"\x00" * (body_bytes * 5 // 8))
    return s


def test_stalled_and_abandoned_uploads(engine):
    with server(engine, upload_idle_timeout_s=1.5) as (url, logs):
        port = int(url.rsplit(":", 1)[1])
        before = deleted_files()
        stalled = [start_upload(port, 4_000_000) for _ in range(8)]
        time.sleep(0.8)
        assert deleted_files() > before  # spooled to disk (past 1 MB)
        answers = []
        for s in stalled:
            s.settimeout(10)
            answers.append(s.recv(4096).split(b"\r\n", 1)[0])
            s.close()
        assert answers == [b"HTTP/1.1 408 Request Timeout"] * 8, answers
        time.sleep(0.3)
        assert deleted_files() == before
        gone = [start_upload(port, 4_000_000) for _ in range(4)]
        time.sleep(0.5)
        for s in gone:
            s.close()  # the client leaves mid-body
        time.sleep(0.5)
        assert deleted_files() == before
    assert "ClientDisconnect" not in logs.text and "Exception in ASGI application" not in logs.text, logs.text


def test_stalled_and_abandoned_deepgram_uploads(engine):
    """`POST /v1/listen` as the file endpoints: a body that stalls gets 408 after
    `UPLOAD_IDLE_TIMEOUT_S` (it was held open, its bytes in memory, for as long as the client
    wished), a client that leaves mid-body is one info line (it was an "Exception in ASGI
    application" traceback, `ClientDisconnect`), and a declared body over the limit is 413 at once
    (QA session 31)."""
    def start(port: int, declared: int) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/listen HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: audio/wav\r\n"
                  + f"Content-Length: {declared}\r\n\r\n".encode() + b"RIFF" + b"\x00" * 60_000)
        return s

    with server(engine, upload_idle_timeout_s=1.5, max_upload_mb=1) as (url, logs):
        port = int(url.rsplit(":", 1)[1])
        stalled = [start(port, 500_000) for _ in range(3)]
        for s in stalled:
            s.settimeout(10)
            answer = s.recv(4096)
            s.close()
            assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 408 Request Timeout", answer
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["err_code"] == "SLOW_UPLOAD", answer
        big = start(port, 2 * 2**20)
        big.settimeout(10)
        assert big.recv(4096).split(b"\r\n", 1)[0] == b"HTTP/1.1 413 Request Entity Too Large"
        big.close()
        gone = [start(port, 500_000) for _ in range(3)]
        time.sleep(0.5)
        for s in gone:
            s.close()  # the client leaves mid-body
        time.sleep(0.5)
    assert "ClientDisconnect" not in logs.text and "Exception in ASGI application" not in logs.text, logs.text


def test_an_undeclared_body_is_counted_against_the_limit_on_both_endpoints(engine):
    """A chunked body declares no length: the file endpoints and `/v1/listen` count it as it
    arrives (`server/body.py`, the one reader of both) and answer 413 once it passes the limit,
    without waiting for its end (it never comes here)."""
    head = (b"--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ntiny.en\r\n"
            b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n")
    chunk = b"\x00" * 65536
    with server(engine, max_upload_mb=1) as (url, logs):
        port = int(url.rsplit(":", 1)[1])
        for path, content_type, first in (("/v1/audio/transcriptions", "multipart/form-data; boundary=x", head),
                                          ("/v1/listen", "audio/wav", b"RIFF")):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n".encode() + b"%x\r\n%s\r\n" % (len(first), first))
            with contextlib.suppress(OSError):  # the server answers and closes mid-body
                for _ in range(40):  # 2.5 MB, past the 1 MB limit (and the form's text allowance)
                    s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            s.settimeout(10)
            answer = s.recv(4096)
            s.close()
            assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 413 Request Entity Too Large", (path, answer)


# --- log noise -----------------------------------------------------------------------------------------------

def test_abrupt_disconnects_leave_no_noise_and_no_threads(engine, jfk16k):
    """Clients that vanish mid-utterance (TCP reset) log no unretrieved future, and Realtime
    sessions free their resampler threads when they end, without waiting for the collector."""
    async def vanish_native(url):
        ws = await websockets.connect(url + "/v1/stream")
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "vad": {"min_silence_ms": 200}}))
        await recv(ws)
        pcm = s16(jfk16k)
        for i in range(0, len(pcm) * 2 // 3, 16000):
            await ws.send(pcm[i:i + 16000])
        await asyncio.sleep(0.3)  # windows in the engine
        ws.transport.abort()

    async def realtime_session(url, abort: bool):
        ws = await websockets.connect(url + "/v1/realtime?intent=transcription")
        await recv(ws)
        pcm = pcm24k(jfk16k[:48000])
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 48000}}}}}))  # a second segmentation
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
        await asyncio.sleep(0.1)
        if abort:
            ws.transport.abort()
        else:
            await ws.close()

    with server(engine) as (url, logs):
        for _ in range(4):
            asyncio.run(vanish_native(url))
        baseline = len(os.listdir("/proc/self/task"))
        gc_was = gc.isenabled()
        gc.disable()  # the threads must go without the cyclic collector
        try:
            for i in range(12):
                asyncio.run(realtime_session(url, abort=i % 2 == 0))
            time.sleep(2.0)
            after = len(os.listdir("/proc/self/task"))
        finally:
            if gc_was:
                gc.enable()
        assert after <= baseline + 4, (baseline, after)
        time.sleep(1.0)
        gc.collect()  # unretrieved futures are reported when collected
        time.sleep(0.2)
    assert "never retrieved" not in logs.text, logs.text[-3000:]
    assert "Traceback" not in logs.text, logs.text[-3000:]


def test_a_file_that_kills_its_decoder_kills_a_child_not_the_gateway(jfk_path):
    """Uploads decode in child processes (`server/decoder.py`). A child that dies (here: SIGABRT, as a
    libav crash would; 8-channel files segfaulted the gateway before session 27) fails that file alone:
    a decode in flight beside it is run again, and the pool serves the next upload."""
    from streamer.audio.decode import AudioDecodeError
    from streamer.server.decoder import DecoderPool

    pool = DecoderPool(2)
    with open(jfk_path, "rb") as f:
        data = f.read()

    async def main():
        beside = asyncio.ensure_future(pool.decode(data, name="jfk.ogg"))
        await asyncio.sleep(0)
        with pytest.raises(AudioDecodeError, match="bad.wav: the decoder crashed on this file"):
            await pool.run(os.abort, name="bad.wav")
        return await beside, await pool.decode(data, name="again.ogg")

    try:
        first, again = asyncio.run(main())
    finally:
        pool.close()
    assert pool.crashes == 2  # the shared pool, and the bad file's child of its own
    np.testing.assert_array_equal(first, decode_audio(jfk_path))
    np.testing.assert_array_equal(again, first)


def test_decoder_processes_that_cannot_start_fall_back_to_threads(jfk_path):
    """Where children cannot start (a parent reading its program from stdin: multiprocessing re-imports
    `__main__` in them), uploads still decode, in threads, with a warning: not "crashed" for every file."""
    import subprocess
    import sys

    script = f"""
import asyncio
from streamer.server.decoder import DecoderPool
pool = DecoderPool(1)
audio = asyncio.run(pool.decode(open({jfk_path!r}, "rb").read(), name="jfk.ogg"))
pool.close()
print("decoded", len(audio), "inline", pool.inline)
"""
    out = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"decoded {len(decode_audio(jfk_path))} inline True"
    assert "uploads decode in the gateway's threads" in out.stderr
