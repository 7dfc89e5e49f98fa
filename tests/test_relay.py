"""Sessions and calls across gateway workers (`server/relay.py`), with real processes: `streamer
serve` with WORKERS=2 and one engine core on the CPU, real recordings.

Where a connection lands is forced, not left to the kernel: on the public port by opening
connections until one lands on the wanted worker (the refusal of a token of a worker that does
not exist names the worker that got the connection), or by connecting to a worker's own Unix
socket in the supervisor's run directory (found under the server's TMPDIR). So the relay runs on
every test that needs it, not on half of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets
from websockets.asyncio.client import unix_connect

import streamer.client
from streamer.audio import g711
from streamer.audio.decode import decode_audio
from streamer.loadtest.client import stop_server
from streamer.client import StreamClient
from test_callcenter import JFK, finals_text, s16, to_8k, twilio_messages, wer
from test_processes import STARTUP_S, _free_port

ROOT = Path(__file__).resolve().parents[1]
RATE = 16000
SEND_TIMEOUT_S = 5
"""The servers' `send_timeout_s`: a client that takes nothing this long is cut off."""


def _worker_health(sock: str, tls: bool) -> dict:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock, verify=not tls), timeout=10) as client:
            return client.get(f"{'https' if tls else 'http'}://localhost/health").json()
    except (httpx.HTTPError, ValueError):
        return {}


@contextlib.contextmanager
def _serve(tmp: Path, **env_vars: str):
    """`streamer serve` (2 gateway workers, 1 engine core); yields (ws base URL, {worker: socket
    path}, process) once both workers answer on their sockets."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKERS": "2", "DEVICE": "cpu", "PORT": str(port),
           "TMPDIR": str(tmp), "IDLE_TIMEOUT_S": "600", "RESUME_S": "30", "SHUTDOWN_GRACE_S": "60",
           "SEND_TIMEOUT_S": str(SEND_TIMEOUT_S), "LOG_LEVEL": "INFO", **env_vars}
    tls = "SSL_CERTFILE" in env_vars
    proc = subprocess.Popen([sys.executable, "-m", "streamer.cli", "serve"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        give_up = time.monotonic() + STARTUP_S
        sockets: dict[int, str] = {}
        while len(sockets) < 2:
            assert proc.poll() is None, "the server exited: " + proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < give_up, f"not up within {STARTUP_S} s"
            for path in glob.glob(str(tmp / "streamer-*" / "gw*.sock")):
                if _worker_health(path, tls).get("status") == "ok":
                    sockets[int(Path(path).stem[2:])] = path
            time.sleep(0.5)
        yield f"{'wss' if tls else 'ws'}://127.0.0.1:{port}", sockets, proc
    finally:
        stop_server(proc, 90)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with _serve(tmp_path_factory.mktemp("relay")) as server:
        yield server


@pytest.fixture(scope="module")
def prompts(manifest) -> tuple[np.ndarray, str]:
    """Two asterisk prompts with a 1.2-s pause (~10 s, two utterances)."""
    names = ("agent-pass.ogg", "agent-incorrect.ogg")
    rows = [next(r for r in manifest if r["audio"].endswith("/" + n)) for n in names]
    gap = np.zeros(int(1.2 * RATE), np.float32)
    return np.concatenate([decode_audio(rows[0]["audio"]), gap, decode_audio(rows[1]["audio"])]), \
        " ".join(r["text"] for r in rows)


def _worker_of(token: str) -> int:
    return int(token.split(".")[0])


def test_resume_on_the_other_worker_gets_the_same_finals(served, prompts, monkeypatch):
    """A session on the public port is cut mid-utterance and between utterances; each reconnect,
    on the public port too, lands on the other worker (connections are opened until the kernel
    gives one to it), which relays it to the owner: the finals are those of an uninterrupted run
    beside it, event ids 1..n, none twice."""
    base, _, _ = served
    audio, _ = prompts
    data = s16(audio)
    cuts = [int(1.5 * RATE) * 2, int(4.0 * RATE) * 2]
    landed: list[int] = []
    real_connect = streamer.client.connect
    probe = json.dumps({"type": "start", "resume": {"token": "9.probe", "bytes_sent": 0, "last_event_id": 0}})

    async def connect(uri, **kwargs):
        """The first connection: where the kernel puts it; a reconnect: one that the kernel gave
        to a worker other than the owner. A token of a worker that does not exist is refused by
        the worker that got the connection, and the refusal names it; the connection then takes
        another `start`."""
        ws = await real_connect(uri, **kwargs)
        if cut_client.ready is None or cut_client.url != uri:
            return ws
        owner = _worker_of(cut_client.ready["resume_token"])
        for _ in range(50):  # all on the owner: p = 2 ** -50
            await ws.send(probe)
            refusal = json.loads(await ws.recv())
            worker = int(re.fullmatch(r"the session is held by gateway worker 9, not (\d+)", refusal["message"])[1])
            if worker != owner:
                landed.append(worker)
                return ws
            await ws.close()
            ws = await real_connect(uri, **kwargs)
        raise AssertionError("every connection landed on the owner")

    monkeypatch.setattr(streamer.client, "connect", connect)
    cut_client = StreamClient(base, partials=False)
    plain_client = StreamClient(base + "/v1/stream?plain=1", partials=False)

    async def run(s: StreamClient, cuts: list[int]) -> list[dict]:
        events = []
        async with s:
            pending = list(cuts)
            for i in range(0, len(data), 1600):
                if pending and i >= pending[0]:
                    pending.pop(0)
                    s.drop()
                await s.send(data[i:i + 1600])
            await s.stop()
            async for event in s:
                events.append(event)
        return events

    async def both():
        return await asyncio.gather(run(plain_client, []), run(cut_client, cuts))

    plain, cut = asyncio.run(both())
    assert cut_client.resumes == 2
    assert landed == [1 - _worker_of(cut_client.ready["resume_token"])] * 2
    assert [e["text"] for e in cut if e["type"] == "final"] == [e["text"] for e in plain if e["type"] == "final"]
    assert len([e for e in plain if e["type"] == "final"]) == 2
    ids = [e["event_id"] for e in cut if "event_id" in e]
    assert ids == list(range(1, len(ids) + 1))
    assert cut[-1] == {"type": "closed", "reason": "stop"}


def test_a_relayed_resume_keeps_the_key_binding_and_close_codes(served):
    """Through the relay the owner still checks the key that opened the session (the relay
    presents the client's key), a refused resume leaves the connection usable, and the owner's
    close code reaches the client (1009 for an oversized message)."""
    base, sockets, _ = served

    async def run():
        async with StreamClient(base, key="key-a", resume=False) as s:
            token = s.ready["resume_token"]
            s.drop()
        await asyncio.sleep(0.5)  # the owner sees the drop and parks the session
        other = sockets[1 - _worker_of(token)]
        resume = {"type": "start", "resume": {"token": token, "bytes_sent": 0, "last_event_id": 0}}
        async with unix_connect(other, "ws://localhost/v1/stream",
                                additional_headers={"Authorization": "Bearer key-b"}) as ws:
            await ws.send(json.dumps(resume))
            refused = json.loads(await ws.recv())
            assert refused["code"] == "resume_failed" and "another API key" in refused["message"], refused
            await ws.send(json.dumps({"type": "ping", "id": 1}))
            assert json.loads(await ws.recv()) == {"type": "pong", "id": 1}
        async with unix_connect(other, "ws://localhost/v1/stream",
                                additional_headers={"Authorization": "Bearer key-a"}, max_size=None) as ws:
            await ws.send(json.dumps(resume))
            ready = json.loads(await ws.recv())
            assert ready["type"] == "ready" and ready["resumed"] and ready["resume_token"] == token, ready
            await ws.send(bytes((1 << 20) + 2))  # over max_message_bytes, under the WebSocket limit
            error = json.loads(await ws.recv())
            assert error["code"] == "too_large", error
            assert json.loads(await ws.recv()) == {"type": "closed", "reason": "error"}
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1009
        # The session ended with its error: its token is dead on every worker.
        for path in sockets.values():
            async with unix_connect(path, "ws://localhost/v1/stream",
                                    additional_headers={"Authorization": "Bearer key-a"}) as ws:
                await ws.send(json.dumps(resume))
                assert json.loads(await ws.recv())["code"] == "resume_failed"

    asyncio.run(run())


def test_a_relayed_client_that_does_not_read_is_cut_off(served):
    """The relaying worker reads the owner's events for the client, so the owner cannot see a
    client that stops reading; the relay does: past `send_timeout_s` without a message taken it
    drops the connection (no close frame: the client does not read one)."""
    base, sockets, _ = served

    async def run() -> tuple[int, int | None]:
        async with StreamClient(base, resume=False) as s:
            token = s.ready["resume_token"]
            s.drop()
        await asyncio.sleep(0.5)
        async with unix_connect(sockets[1 - _worker_of(token)], "ws://localhost/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start", "resume": {"token": token, "bytes_sent": 0,
                                                                   "last_event_id": 0}}))
            assert json.loads(await ws.recv())["resumed"]
            await ws.send(bytes(3200))
            # 2 MB of pongs: more than the sockets between hold, less than the owner's outbox
            # bound (`max_outbox_bytes`), so only the relay can tell that nobody reads them.
            for i in range(200):
                await ws.send(json.dumps({"type": "ping", "id": f"{i:05d}" + "x" * 10000}))
            await asyncio.sleep(SEND_TIMEOUT_S + 4)
            pongs = 0

            async def read() -> None:
                nonlocal pongs
                async for _ in ws:
                    pongs += 1

            with contextlib.suppress(websockets.ConnectionClosed, asyncio.TimeoutError):
                await asyncio.wait_for(read(), 30)
            return pongs, ws.close_code

    pongs, code = asyncio.run(run())
    assert pongs < 200 and code == 1006, (pongs, code)


def test_twilio_stream_and_subscribers_on_different_workers(served, prompts, jfk_path):
    """Twilio's socket on one worker, two subscribers on the other: one by callSid before the call
    starts (it waits, then follows the call there), one by streamSid once the call is on (relayed
    at once, with the history). Both get each track's transcript."""
    _, sockets, _ = served
    jfk = decode_audio(jfk_path)
    other_audio, other_text = prompts
    inbound, outbound = g711.encode(to_8k(jfk), "mulaw"), g711.encode(to_8k(other_audio), "mulaw")
    sid, call = "MZ" + "3" * 32, "CA" + "4" * 32
    messages = twilio_messages(inbound, outbound, sid, call)
    for m in messages:  # the server has no API key
        if m["event"] == "start":
            m["start"]["customParameters"] = {"agent": "7"}

    async def subscribe(query: str) -> list[dict]:
        async with unix_connect(sockets[1], f"ws://localhost/v1/twilio/events?{query}") as sub:
            events = [json.loads(m) async for m in sub]
            assert sub.close_code == 1000
            return events

    async def run():
        early = asyncio.ensure_future(subscribe(f"callSid={call}"))
        await asyncio.sleep(1.0)  # subscribed and waiting on worker 1
        late = None
        async with unix_connect(sockets[0], "ws://localhost/v1/twilio") as twilio:
            for i, m in enumerate(messages):
                await twilio.send(json.dumps(m))
                if i == 200:  # four seconds of audio in
                    late = asyncio.ensure_future(subscribe(f"streamSid={sid}"))
                    await asyncio.sleep(0.5)
            return await asyncio.wait_for(asyncio.gather(early, late), 240)

    for events in asyncio.run(run()):
        assert events[0]["type"] == "subscribed" and [e["type"] for e in events].count("subscribed") == 1
        assert events[1]["type"] == "start" and events[1]["streamSid"] == sid
        assert events[-1] == {"type": "closed", "reason": "stop"}
        assert any(e["type"] == "dtmf" and e["digit"] == "5" for e in events)
        assert wer(JFK, finals_text(events, 0)) < 0.2, finals_text(events, 0)
        assert wer(other_text, finals_text(events, 1)) < 0.2, finals_text(events, 1)


def test_owner_names_are_bounded_and_cleaned_up(tmp_path):
    """Sans-I/O: `Peers` names a call's owner, another worker reads it, only the owner releases
    it, and a restarted worker drops what it held before."""
    from streamer.server.relay import Peers

    a, b = Peers(str(tmp_path), 0), Peers(str(tmp_path), 1)
    a.claim("twilio", "MZ1")
    a.claim("twilio", "../../etc/passwd")  # names are hashed: any key stays in the directory
    assert b.owner("twilio", "MZ1") == 0 and b.owner("twilio", "../../etc/passwd") == 0
    assert b.owner("twilio", "MZ2") is None
    b.release("twilio", "MZ1")
    assert a.owner("twilio", "MZ1") == 0
    b.claim("twilio", "MZ1")  # a newer stream of the same name on worker 1
    a.release("twilio", "MZ1")
    assert a.owner("twilio", "MZ1") == 1
    a.release_all()
    assert len(os.listdir(tmp_path / "owners")) == 1 and a.owner("twilio", "MZ1") == 1
    b.release("twilio", "MZ1")
    assert os.listdir(tmp_path / "owners") == []


def test_sigterm_drains_a_relayed_session(served, jfk_path):
    """Runs last on this server: a session resumed on the other worker is open mid-utterance when
    the supervisor gets SIGTERM; the owner's drain reaches the client through the relay (the last
    final, `closed: shutdown`, close 1001), the supervisor exits 0 with no traceback, and its
    sockets are gone."""
    base, sockets, proc = served
    seven_s = s16(decode_audio(jfk_path))[: 7 * 32000]

    async def run() -> tuple[list[dict], int]:
        async with StreamClient(base, partials=False, resume=False) as s:
            token = s.ready["resume_token"]
            s.drop()
        await asyncio.sleep(0.5)
        other = sockets[1 - _worker_of(token)]
        async with unix_connect(other, "ws://localhost/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start", "resume": {"token": token, "bytes_sent": 0,
                                                                   "last_event_id": 0}}))
            assert json.loads(await ws.recv())["resumed"]
            for i in range(0, len(seven_s), 32000):
                await ws.send(seven_s[i:i + 32000])
            events = []
            while not any(e["type"] == "speech_started" and e["t"] > 5 for e in events):
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 120)))
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(websockets.ConnectionClosed):
                async for message in ws:
                    events.append(json.loads(message))
            return events, ws.close_code

    events, code = asyncio.run(run())
    assert events[-1] == {"type": "closed", "reason": "shutdown"} and code == 1001, (events[-3:], code)
    finals = [e for e in events if e["type"] == "final"]
    assert finals and "country" in finals[-1]["text"].lower() and finals[-1]["end"] > 5.0, events
    assert proc.wait(120) == 0
    log = proc.stderr.read().decode()
    assert "Traceback" not in log, log[-3000:]
    assert not any(os.path.exists(p) for p in sockets.values())


def test_relay_over_tls(tmp_path_factory, jfk_path, monkeypatch):
    """With TLS (`SSL_CERTFILE`) uvicorn serves it on the Unix sockets too, and the relay speaks
    it: a session opened on one worker and resumed on the other is transcribed whole."""
    from test_sdk_tls import make_certificate

    tmp = tmp_path_factory.mktemp("relay-tls")
    cert, key = make_certificate(tmp)
    client_tls = ssl.create_default_context(cafile=str(cert))
    client_tls.check_hostname = False  # the certificate names 127.0.0.1, the socket has no name
    data = s16(decode_audio(jfk_path))
    with _serve(tmp, SSL_CERTFILE=str(cert), SSL_KEYFILE=str(key)) as (base, sockets, proc):
        def connect(uri, **kwargs):  # worker 0 first, then worker 1: the resume is relayed
            return unix_connect(sockets[0 if client.ready is None else 1], uri, ssl=client_tls, **kwargs)

        monkeypatch.setattr(streamer.client, "connect", connect)
        client = StreamClient(base, partials=False)

        async def run() -> list[dict]:
            async with client:
                for i in range(0, len(data), 3200):
                    if i == 5 * 32000:
                        client.drop()
                    await client.send(data[i:i + 3200])
                await client.stop()
                return [e async for e in client]

        events = asyncio.run(run())
        assert client.resumes == 1 and client.ready["resume_token"].startswith("0.")
        assert wer(JFK, finals_text(events)) < 0.2, events
        assert events[-1] == {"type": "closed", "reason": "stop"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        assert "Traceback" not in proc.stderr.read().decode()
