"""`streamer serve` as it runs in production: gateway worker processes in front of engine core
processes (ZeroMQ), on the CPU with the embedded tiny.en: two gateways and two cores serve
streams and uploads at once; an engine core killed mid-stream gives a clear error, is restarted,
and the same stream goes on; SIGTERM with streams open on both gateways delivers every final.

One server for the module (starting four processes that load the model is the slow part); the
SIGTERM test ends it and runs last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets

from streamer.audio.decode import decode_audio, write_wav
from streamer.loadtest.client import server_samples, server_side, stop_server

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 240
"""Four processes loading tiny.en on a loaded 2-core CI machine."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(base: str) -> dict:
    try:
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())
    except OSError:
        return {}


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float = STARTUP_S) -> dict:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        assert proc.poll() is None, "the server exited: " + proc.stderr.read().decode()[-3000:]
        body = _health(base)
        if body.get("status") == "ok":
            return body
        time.sleep(0.25)
    raise AssertionError(f"not healthy within {timeout} s: {_health(base)}")


@pytest.fixture(scope="module")
def jfk(jfk_path) -> bytes:
    return (np.clip(decode_audio(jfk_path), -1, 1) * 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def served():
    """`streamer serve` with WORKERS=2 and two engine cores on the CPU; yields (base URL, process)."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKERS": "2", "DEVICE": "cpu,cpu", "PORT": str(port),
           "SHUTDOWN_GRACE_S": "60", "IDLE_TIMEOUT_S": "600", "LOG_LEVEL": "INFO"}
    proc = subprocess.Popen([sys.executable, "-m", "streamer.cli", "serve"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc)
        yield base, proc
    finally:
        stop_server(proc, 90)


async def _recv(ws, timeout: float = 120) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def _stream(url: str, pcm: bytes, *, pace: float = 0.0, until=None) -> list[dict]:
    """Stream `pcm` (16 kHz) in 0.5-s messages, `stop`, and collect every event until close.
    `until(events)` (optional) is awaited after each message; the stream stops sending once it
    returns True."""
    events = []
    async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "partials": False}))
        events.append(await _recv(ws))

        async def receive():
            with contextlib.suppress(websockets.ConnectionClosed):
                async for message in ws:
                    events.append(json.loads(message))

        receiver = asyncio.ensure_future(receive())
        for i in range(0, len(pcm), 16000):
            await ws.send(pcm[i:i + 16000])
            if pace:
                await asyncio.sleep(0.5 / pace)
            if until is not None and await until(events):
                break
        await ws.send(json.dumps({"type": "stop"}))
        await asyncio.wait_for(receiver, 180)
    return events


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z' ]", " ", text.lower()).split())


def _finals(events: list[dict]) -> str:
    return _words(" ".join(e["text"] for e in events if e["type"] == "final"))


def test_a_burst_of_connections_as_soon_as_the_server_is_healthy_spreads_over_the_gateways(served):
    """First in this file: right after `/health` says ok. It says so only once every gateway
    serves (before, the first one up took every connection, and HTTP clients keep theirs open),
    and each gateway takes one connection from the shared socket at a time (uvloop took all the
    queued ones at once: a burst of 32 uploads all went to one gateway of eight)."""
    base, _ = served
    url = base.replace("http://", "ws://")
    N = 16

    async def burst() -> list[float]:
        sockets = await asyncio.gather(*(websockets.connect(url + "/v1/stream") for _ in range(N)))
        try:
            for ws in sockets:
                await ws.send(json.dumps({"type": "start", "partials": False}))
            await asyncio.gather(*(_recv(ws) for ws in sockets))  # `ready`: every session is held
            with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
                body = r.read().decode()
            return [float(v) for v in re.findall(r"^streamer_gateway_sessions\{[^}]*\} ([0-9.]+)", body, re.M)]
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))

    held = sorted(asyncio.run(burst()))
    assert len(held) == 2 and sum(held) == N, held
    assert held[0] >= N // 4, held  # 8 / 8 here; every one on one gateway before


def test_each_gateway_starts_its_upload_decoders_before_the_first_upload(served):
    """A served gateway starts its forkserver and every decoder child at its start: the first
    uploads of each gateway waited for them (`DecoderPool.start`). Runs before this module's first upload."""
    from streamer.server.decoder import default_processes

    base, proc = served
    gateways = _gateway_pids(proc.pid, [c["pid"] for c in _health(base)["engine_cores"]])
    assert len(gateways) == 2, gateways
    give_up = time.monotonic() + 15
    while any(len(_group(g)) < 2 + default_processes() for g in gateways):  # itself, the forkserver, the children
        assert time.monotonic() < give_up, [_group(g) for g in gateways]
        time.sleep(0.2)


def test_two_gateways_and_two_cores_serve_streams_and_uploads(served, jfk, jfk_path):
    base, _ = served
    health = _health(base)
    assert [c["up"] for c in health["engine_cores"]] == [True, True]
    url = base.replace("http://", "ws://")

    async def upload():
        import httpx

        async with httpx.AsyncClient(timeout=180) as client:
            with open(jfk_path, "rb") as f:
                r = await client.post(base + "/v1/audio/transcriptions", files={"file": ("jfk.ogg", f)},
                                      data={"model": "whisper-1"})
        r.raise_for_status()
        return r.json()["text"].lower()

    async def run():
        return await asyncio.gather(*(_stream(url, jfk) for _ in range(4)), upload())

    *streams, uploaded = asyncio.run(run())
    for events in streams:
        assert "ask not what your country can do for you" in _finals(events), events
        assert events[-1]["type"] == "closed"
    assert "ask not what your country can do for you" in _words(uploaded)
    # The work was spread: both cores decoded windows.
    metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    assert "streamer_engine_cores_up 2.0" in metrics
    samples = server_samples(base)  # as the load test reads them (issue 19's routing check)
    busy = {k.rpartition(":")[2]: v for k, v in samples.items() if k.startswith("streamer_engine_core_busy_seconds_total:")}
    assert set(busy) == {"0", "1"} and all(v > 0 for v in busy.values()), busy
    side = server_side({}, samples, wall_s=1.0)  # one snapshot: a core still stepping cannot move it
    assert [float(v) for v in side["core_busy"].split("/")] == pytest.approx([busy["0"], busy["1"]], abs=0.006)
    # A gateway holds sockets, VAD and sessions, never torch (its memory and start-up are the
    # engine cores' business): after serving streams and an upload, the
    # process that answered has not mapped libtorch.
    gateway = _health(base)["gateway_pid"]
    with open(f"/proc/{gateway}/maps") as f:
        assert "libtorch" not in f.read()
    cores = [c["pid"] for c in _health(base)["engine_cores"]]
    with open(f"/proc/{cores[0]}/maps") as f:
        assert "libtorch" in f.read()  # (the check can tell)


def test_a_killed_engine_core_fails_its_windows_clearly_and_comes_back(served, jfk):
    """Kill both cores while an utterance is spoken: its final gets `engine_unavailable` (not a
    hang, not a close), the supervisor restarts the cores, and later speech on the same stream
    is transcribed again."""
    base, _ = served
    url = base.replace("http://", "ws://")
    pids = [c["pid"] for c in _health(base)["engine_cores"]]
    phase = "speaking"

    async def kill_then_wait(events):
        nonlocal phase
        if phase == "speaking" and any(e["type"] == "speech_started" for e in events):
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            phase = "killed"
        elif phase == "killed" and any(e["type"] == "error" for e in events):
            give_up = time.monotonic() + STARTUP_S  # the stream stays open, sending nothing
            while time.monotonic() < give_up and _health(base).get("status") != "ok":
                await asyncio.sleep(0.25)
            phase = "restarted"
        return False

    silence = bytes(64000)  # 2 s: the VAD ends the utterance
    pcm = jfk[:4 * 32000] + silence * 3 + jfk + silence
    events = asyncio.run(_stream(url, pcm, pace=2.0, until=kill_then_wait))
    assert phase == "restarted", events
    errors = [e for e in events if e["type"] == "error"]
    assert errors and all(e["code"] == "engine_unavailable" for e in errors), errors
    assert "country" in _finals(events), events  # after the restart, the rest was transcribed
    assert events[-1]["type"] == "closed"
    assert [c["pid"] for c in _health(base)["engine_cores"]] != pids


def _gateway_pids(supervisor: int, cores: list[int]) -> list[int]:
    """The supervisor's gateway processes: its spawned children that are not engine cores."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            if ppid == supervisor and b"spawn_main" in cmdline and int(entry) not in cores:
                pids.append(int(entry))
    return pids


def test_a_gateway_that_cannot_accept_is_given_no_connections(served):
    """GATEWAY_ACCEPT=shared (the default): one listening socket for every gateway, so while a
    gateway cannot take connections (stopped here; in production, an event loop running late)
    the others take them all; with a socket each (`reuseport`) the kernel would still hand it
    about half, left waiting."""
    base, proc = served
    gateways = _gateway_pids(proc.pid, [c["pid"] for c in _health(base)["engine_cores"]])
    assert len(gateways) == 2, gateways
    stopped, other = gateways
    os.kill(stopped, signal.SIGSTOP)
    try:
        answered = [_health(base).get("gateway_pid") for _ in range(12)]
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert answered == [other] * 12, answered
    assert _health(base).get("status") == "ok"


def _group(pgid: int) -> list[str]:
    """Live processes of session `pgid` (a gateway calls setsid: its children are in its session),
    as "pid state". Zombies do not count: they are dead, waiting for a parent to reap them (orphans
    go to this container's init, which may take its time)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as f:
                    state, _, _, session = f.read().rpartition(")")[2].split()[:4]
                if int(session) == pgid and state not in ("Z", "X"):
                    members.append(f"{entry} {state}")
    return members


def test_a_killed_gateway_takes_its_decoders_along_and_the_cores_drop_its_windows(served, jfk_path, manifest,
                                                                                 tmp_path):
    """kill -9 the gateways while one serves a long upload: their upload decoder processes go with them
    (they stayed as orphans), and the cores cancel the dead gateway's windows, which nobody will collect
    (a later 11-s upload waited 27-32 s behind them, session 27's QA). Both are killed: after the
    module's earlier uploads each has decoders, so which one holds this upload cannot be told apart."""
    base, proc = served
    row = next(r for r in manifest if r["audio"].endswith("long/asterisk_en_6min.ogg"))
    long = np.tile(decode_audio(row["audio"]), 3)  # 18 minutes: ~36 windows of engine work
    write_wav(tmp_path / "long.wav", long)
    body = (tmp_path / "long.wav").read_bytes()
    cores = [c["pid"] for c in _health(base)["engine_cores"]]
    gateways = _gateway_pids(proc.pid, cores)
    assert len(gateways) == 2, gateways

    def upload():
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(base + "/v1/audio/transcriptions", files={"file": ("long.wav", body)},
                       data={"model": "whisper-1"}, timeout=300)

    threading.Thread(target=upload, daemon=True).start()
    give_up = time.monotonic() + 90
    while _health(base).get("queue", 0) < 8:  # decoded, its windows in the cores
        assert time.monotonic() < give_up, "the upload's windows never reached the cores"
        time.sleep(0.2)
    assert any(len(_group(g)) > 1 for g in gateways), "no gateway started upload decoders"
    for g in gateways:
        os.kill(g, signal.SIGKILL)
    time.sleep(2.0)  # the supervisor notices within 0.2 s, kills the groups, tells the cores
    assert [_group(g) for g in gateways] == [[], []]
    _wait_healthy(base, proc)
    assert _health(base).get("queue") == 0
    with open(jfk_path, "rb") as f:
        start = time.monotonic()
        r = httpx.post(base + "/v1/audio/transcriptions", files={"file": ("jfk.ogg", f.read())},
                       data={"model": "whisper-1"}, timeout=300)
    took = time.monotonic() - start
    assert r.status_code == 200 and "country" in r.json()["text"].lower()
    assert took < 8.0, f"an 11-s upload took {took:.1f} s behind a dead gateway's windows"


def test_sigterm_with_streams_on_both_gateways_delivers_every_final(served, jfk):
    base, proc = served
    url = base.replace("http://", "ws://")
    seven_s = jfk[: 7 * 32000]
    STREAMS = 10
    gateways = _gateway_pids(proc.pid, [c["pid"] for c in _health(base)["engine_cores"]])
    assert len(gateways) == 2, gateways

    async def one(accepted: asyncio.Event, started: asyncio.Event, counter: list):
        async with websockets.connect(url + "/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start", "partials": False}))
            await _recv(ws)
            accepted.set()
            for i in range(0, len(seven_s), 32000):
                await ws.send(seven_s[i:i + 32000])
            events = []
            while not any(e["type"] == "speech_started" and e["t"] > 5 for e in events):
                events.append(await _recv(ws))
            counter.append(1)
            if len(counter) == STREAMS:
                started.set()
            with contextlib.suppress(websockets.ConnectionClosed):
                async for message in ws:
                    events.append(json.loads(message))
            return events

    async def run():
        started, counter, tasks = asyncio.Event(), [], []
        # Half the streams on each gateway: each half is opened while the other gateway is
        # stopped, so that only this one can accept them (the shared listening socket).
        for held in gateways:
            os.kill(held, signal.SIGSTOP)
            try:
                accepted = [asyncio.Event() for _ in range(STREAMS // 2)]
                tasks += [asyncio.ensure_future(one(a, started, counter)) for a in accepted]
                await asyncio.wait_for(asyncio.gather(*(a.wait() for a in accepted)), 120)
            finally:
                os.kill(held, signal.SIGCONT)
        await asyncio.wait_for(started.wait(), 240)
        proc.send_signal(signal.SIGTERM)
        return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    assert proc.wait(120) == 0
    assert b"Traceback" not in proc.stderr.read()
    for events in results:
        assert events[-1] == {"type": "closed", "reason": "shutdown"}, events[-3:]
        last_final = [e for e in events if e["type"] == "final"][-1]
        assert "country" in last_final["text"].lower() and last_final["end"] > 5.0

