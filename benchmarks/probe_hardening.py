"""Probes of issue #13 against a real server in this process (tiny.en, CPU, 127.0.0.1): a client
that never reads, threads left by Realtime sessions, log noise of abrupt disconnects.

    PYTHONPATH=. python benchmarks/probe_hardening.py [--seconds 8] [--sessions 40] [--drops 20]

Prints one JSON object. Runs on older trees too (settings they lack are left out), so that a
before/after comparison is one command per tree.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import gc
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import websockets

from streamer.audio.decode import decode_audio
from streamer.config import ServerConfig, load_settings
from streamer.engine.engine import Engine
from streamer.server.app import create_app, running

AUDIO = Path(__file__).resolve().parents[2] / "shared" / "audio" / "en" / "jfk.ogg"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(logging.Formatter("%(name)s %(message)s").format(record))


async def never_read(url: str, seconds: float) -> dict:
    base = peak = rss_mb()
    message = json.dumps({"type": "ping", "id": "x" * 200_000})
    sent = 0
    started = time.monotonic()
    async with websockets.connect(url + "/v1/stream", max_size=None, max_queue=1) as ws:
        while time.monotonic() - started < seconds:
            try:
                await asyncio.wait_for(ws.send(message), 1.0)
                sent += 1
            except (asyncio.TimeoutError, websockets.ConnectionClosed):
                break
            peak = max(peak, rss_mb())
        stopped = time.monotonic() - started
        with contextlib.suppress(websockets.ConnectionClosed, asyncio.TimeoutError):
            while True:
                await asyncio.wait_for(ws.recv(), 60)
        return {"pings_sent": sent, "send_blocked_after_s": round(stopped, 1), "rss_growth_mb": round(peak - base),
                "close_code": ws.close_code, "close_reason": ws.close_reason, "closed_after_s":
                round(time.monotonic() - started, 1)}


async def realtime_sessions(url: str, n: int, audio: np.ndarray) -> None:
    pcm = (np.clip(audio[:32000], -1, 1) * 32767).astype("<i2").tobytes()
    for _ in range(n):
        async with websockets.connect(url + "/v1/realtime?intent=transcription") as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 48000}}}}}))  # a second segmentation
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
            await asyncio.sleep(0.05)


async def drop_mid_utterance(url: str, n: int, audio: np.ndarray) -> None:
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    for _ in range(n):
        ws = await websockets.connect(url + "/v1/stream")
        await ws.send(json.dumps({"type": "start", "vad": {"min_silence_ms": 200}}))
        await ws.recv()
        for i in range(0, len(pcm) * 2 // 3, 16000):
            await ws.send(pcm[i:i + 16000])
        await asyncio.sleep(0.3)
        ws.transport.abort()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8.0, help="how long the non-reading client sends")
    p.add_argument("--sessions", type=int, default=40, help="Realtime sessions for the thread count")
    p.add_argument("--drops", type=int, default=20, help="native streams dropped mid-utterance")
    p.add_argument("--audio", default=str(AUDIO), help="the recording streamed (default: ../shared/audio/en/jfk.ogg)")
    args = p.parse_args()
    fields = {f.name for f in dataclasses.fields(ServerConfig)}
    server = {k: v for k, v in {"max_connections_per_client": 0}.items() if k in fields}
    settings = load_settings({}, server=server)
    engine = Engine.load(settings.model, settings.engine)
    audio = decode_audio(args.audio)
    out: dict = {}
    try:
        with running(create_app(settings, engine)) as base:
            url = base.replace("http://", "ws://")
            lines = Lines()
            for name in ("", "asyncio", "uvicorn"):
                logging.getLogger(name).addHandler(lines)
            out["never_read"] = asyncio.run(never_read(url, args.seconds))
            gc.disable()
            before = threads()
            asyncio.run(realtime_sessions(url, args.sessions, audio))
            time.sleep(1.0)
            out["threads"] = {"before": before, f"after_{args.sessions}_realtime_sessions": threads()}
            gc.enable()
            gc.collect()
            time.sleep(0.5)
            out["threads"]["after_gc"] = threads()
            asyncio.run(drop_mid_utterance(url, args.drops, audio))
            time.sleep(1.0)
            gc.collect()
            time.sleep(0.5)
            text = "\n".join(lines.lines)
            out["drops"] = {"streams": args.drops, "never_retrieved_lines": text.count("never retrieved"),
                            "tracebacks": text.count("Traceback")}
    finally:
        engine.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
