"""The gateway's `EngineClient` against a real engine core process (tiny.en on the CPU, ZeroMQ over
ipc sockets in a temporary directory): a gateway whose event loop falls behind must not count a
live core as down."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

import numpy as np
import pytest

from streamer.audio.decode import decode_audio
from streamer.config import EngineConfig, ModelConfig
from streamer.engine import protocol as p
from streamer.engine.client import EngineClient
from streamer.engine.core import CoreSpec, run_core
from streamer.engine.request import DecodeOptions, Priority


def test_a_gateway_that_fell_behind_keeps_its_live_core(tmp_path, jfk_path):
    """The loop blocked for longer than `STATS_TIMEOUT_S` while the core went on publishing: the
    core is still up, and the window in flight gets its result (it was failed with
    `engine_unavailable`, and `submit` refused, as if the core had died)."""
    spec = CoreSpec(index=0, model=ModelConfig(model="tiny.en", device="cpu"), engine=EngineConfig(max_slots=4),
                    input_address=f"ipc://{tmp_path}/in", output_address=f"ipc://{tmp_path}/out", cpu_threads=1)
    core = multiprocessing.get_context("spawn").Process(target=run_core, args=(spec,))
    core.start()
    audio = decode_audio(jfk_path)

    async def run():
        client = await EngineClient([(spec.input_address, spec.output_address)]).start(timeout=120)
        try:
            handle = client.submit(audio, DecodeOptions(temperatures=(0.0,)), priority=Priority.FINAL)
            time.sleep(p.STATS_TIMEOUT_S + 2.0)  # the gateway's loop runs late; the core does not
            assert client.cores[0].up
            result = await asyncio.wait_for(handle.result(), 120)
            assert "country" in result.text
            assert client.ready  # (a core that really stops is noticed: test_processes kills one)
        finally:
            await client.close()

    try:
        asyncio.run(run())
    finally:
        core.terminate()
        core.join(60)
        assert core.exitcode is not None


def test_a_long_upload_completes_under_a_small_queue_through_an_engine_core(tmp_path, manifest):
    """MAX_QUEUE=2 (uploads may hold 1): the gateway's figures of the core's queue are a stats period
    old, so it sends a recording's windows that the core then refuses; a recording under way queues
    them again and completes on an idle server (every window after the first was a 429 before)."""
    from streamer.longform import transcribe_long

    spec = CoreSpec(index=0, model=ModelConfig(model="tiny.en", device="cpu"),
                    engine=EngineConfig(max_slots=4, max_queue=2),
                    input_address=f"ipc://{tmp_path}/in", output_address=f"ipc://{tmp_path}/out", cpu_threads=1)
    core = multiprocessing.get_context("spawn").Process(target=run_core, args=(spec,))
    core.start()
    clips = [r for r in manifest if r["language"] == "en" and 8 < r["duration"] < 20][:5]
    pause = np.zeros(16000, np.float32)
    audio = np.concatenate([x for r in clips for x in (decode_audio(r["audio"]), pause)])
    assert len(audio) > 60 * 16000  # three windows at least

    async def run():
        client = await EngineClient([(spec.input_address, spec.output_address)]).start(timeout=120)
        try:
            transcript = await asyncio.wait_for(transcribe_long(client, audio, mode="fast"), 240)
        finally:
            await client.close()
        return transcript

    try:
        transcript = asyncio.run(run())
    finally:
        core.terminate()
        core.join(60)
    words = transcript.text.lower().split()
    assert len(words) > 100
    assert len({round(s.start // 30) for s in transcript.segments}) >= 3  # every window has text


def test_a_core_drops_what_a_gateway_sends_after_its_bye(tmp_path, jfk_path):
    """The supervisor says Bye for a killed gateway over its own connection; the dead gateway's last
    Submits may still be on their way over the gateway's: they are dropped, not decoded for nobody.
    A live gateway beside it is served as before."""
    import zmq

    spec = CoreSpec(index=0, model=ModelConfig(model="tiny.en", device="cpu"), engine=EngineConfig(max_slots=4),
                    input_address=f"ipc://{tmp_path}/in", output_address=f"ipc://{tmp_path}/out", cpu_threads=1)
    core = multiprocessing.get_context("spawn").Process(target=run_core, args=(spec,))
    core.start()
    audio = decode_audio(jfk_path)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"ghost")
    sub.connect(spec.output_address)
    push = ctx.socket(zmq.PUSH)
    push.connect(spec.input_address)

    async def run():
        client = await EngineClient([(spec.input_address, spec.output_address)]).start(timeout=120)
        try:
            push.send(p.encode(p.Bye(gateway="ghost")))
            push.send(p.encode(p.Submit(id="ghost.1", gateway="ghost", audio=p.audio_bytes(audio),
                                        options=DecodeOptions(temperatures=(0.0,)), priority=int(Priority.FILE))))
            result = await asyncio.wait_for(client.transcribe(audio, DecodeOptions(temperatures=(0.0,))), 120)
            assert "country" in result.text
        finally:
            await client.close()

    try:
        asyncio.run(run())
        assert not sub.poll(2000), "the core answered a gateway that had said Bye"
    finally:
        push.close(0)
        sub.close(0)
        ctx.term()
        core.terminate()
        core.join(60)


def test_a_gateway_answers_while_its_engine_cores_load(tmp_path, jfk_path):
    """The cores of a large model load for minutes: meanwhile the gateway answers `/health` with 503
    `loading`, the API with 503 `loading` and Retry-After, a WebSocket with close 1013; once its cores
    are Ready it serves (it used to accept no request at all until then, so probes and clients hung)."""
    import httpx
    import websockets

    from streamer.config import load_settings
    from streamer.server.app import create_app, running

    spec = CoreSpec(index=0, model=ModelConfig(model="tiny.en", device="cpu"), engine=EngineConfig(max_slots=4),
                    input_address=f"ipc://{tmp_path}/in", output_address=f"ipc://{tmp_path}/out", cpu_threads=1)
    core = multiprocessing.get_context("spawn").Process(target=run_core, args=(spec,))
    core.start()
    loaded = threading.Event()  # the cores "finish loading" when the test says so
    client = EngineClient([(spec.input_address, spec.output_address)])

    async def connect():
        while not loaded.is_set():
            await asyncio.sleep(0.05)
        return await client.start(timeout=120)

    with open(jfk_path, "rb") as f:
        jfk = f.read()
    try:
        with running(create_app(load_settings({}), connect=connect)) as base:
            r = httpx.get(base + "/health", timeout=5)
            assert r.status_code == 503 and r.json()["status"] == "loading"
            r = httpx.post(base + "/v1/audio/transcriptions", files={"file": ("jfk.ogg", jfk)},
                           data={"model": "whisper-1"}, timeout=5)
            assert r.status_code == 503 and r.json()["error"]["code"] == "loading" and r.headers["retry-after"] == "5"

            async def stream():
                async with websockets.connect(base.replace("http", "ws") + "/v1/stream") as ws:
                    with pytest.raises(websockets.ConnectionClosed):
                        await ws.recv()
                    return ws.close_code

            assert asyncio.run(stream()) == 1013
            assert 'streamer_errors_total{code="loading"} 2.0' in httpx.get(base + "/metrics", timeout=5).text
            loaded.set()
            give_up = time.monotonic() + 120
            while httpx.get(base + "/health", timeout=5).json()["status"] != "ok":
                assert time.monotonic() < give_up, "never ready"
                time.sleep(0.1)
            r = httpx.post(base + "/v1/audio/transcriptions", files={"file": ("jfk.ogg", jfk)},
                           data={"model": "whisper-1"}, timeout=120)
            assert r.status_code == 200 and "country" in r.json()["text"].lower()
    finally:
        loaded.set()
        core.terminate()
        core.join(60)
