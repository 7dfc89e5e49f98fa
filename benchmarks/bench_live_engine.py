"""The engine's own ceiling for live streams: N simulated sessions drive one in-process `Engine`
with no gateway, no sockets and no VAD, submitting what a live stream submits.

Each session speaks utterances of real speech (English prompts of ../shared/audio, 1-s pauses
between them) at real-time pace: every 0.5 s of speech a partial window with the utterance so far
(PARTIAL, same session: a newer one replaces its queued older one), and 0.5 s after the utterance
ends (the VAD's silence) its final (FINAL), with the real-time deadlines the gateway gives them.
Final latency is counted from submitting the final to its result (the VAD's 0.5 s not included).
Compare with `bench_streaming.py`, which serves the same load through the gateways: the gap is
what the serving path costs.

    python benchmarks/bench_live_engine.py --sessions 16,64 --seconds 20
    python benchmarks/bench_live_engine.py --model shape:large-v3-turbo --device cuda --sessions 64,200,400
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import decode_audio, environment, manifest, table, write_json  # noqa: E402

RATE = 16000
PARTIAL_EVERY_S = 0.5
VAD_SILENCE_S = 0.5
PAUSE_S = 1.0


async def session(engine, sid: str, clips: list[np.ndarray], until: float, stats: dict, rng: random.Random) -> None:
    from streamer.engine.errors import Cancelled
    from streamer.engine.request import DecodeOptions, Priority
    from streamer.engine.scheduler import QueueFull

    await asyncio.sleep(rng.uniform(0, 2.0))
    origin = time.monotonic()  # stream time 0 at real-time pace
    t = 0.0  # stream time
    k = 0
    pending = []
    while time.monotonic() < until:
        clip = clips[k % len(clips)]
        k += 1
        for end in np.arange(PARTIAL_EVERY_S, len(clip) / RATE, PARTIAL_EVERY_S):
            await asyncio.sleep(max(0.0, origin + t + end - time.monotonic()))
            try:
                h = engine.submit(clip[: int(end * RATE)], DecodeOptions(temperatures=(0.0,), max_new_tokens=32,
                                                                          language="en"),
                                  priority=Priority.PARTIAL, session_id=sid, deadline=origin + t + end)
                stats["partials"] += 1
                pending.append(asyncio.ensure_future(_partial(h, stats, Cancelled)))
            except QueueFull:
                stats["partials_refused"] += 1
        t += len(clip) / RATE
        await asyncio.sleep(max(0.0, origin + t + VAD_SILENCE_S - time.monotonic()))
        submitted = time.monotonic()
        h = engine.submit(clip, DecodeOptions(timestamps=True, language="en"), priority=Priority.FINAL,
                          session_id=sid, deadline=origin + t)
        pending.append(asyncio.ensure_future(_final(h, submitted, stats)))
        t += PAUSE_S
    await asyncio.gather(*pending, return_exceptions=True)


async def _partial(handle, stats: dict, cancelled) -> None:
    try:
        await handle.result()
    except cancelled:
        stats["partials_replaced"] += 1


async def _final(handle, submitted: float, stats: dict) -> None:
    await handle.result()
    stats["final_s"].append(time.monotonic() - submitted)


def run(engine, n: int, seconds: float, clips: list[np.ndarray]) -> dict:
    stats = {"partials": 0, "partials_replaced": 0, "partials_refused": 0, "final_s": []}
    busy0, t0 = engine.metrics()["busy_s"], time.monotonic()

    async def main():
        rng = random.Random(n)
        until = time.monotonic() + seconds
        order = list(range(len(clips)))
        await asyncio.gather(*(session(engine, f"s{i}", [clips[j] for j in rng.sample(order, len(order))], until,
                                       stats, rng) for i in range(n)))

    asyncio.run(main())
    wall = time.monotonic() - t0
    finals = stats["final_s"]
    return {"sessions": n, "finals": len(finals),
            "final_p50": float(np.percentile(finals, 50)) if finals else None,
            "final_p95": float(np.percentile(finals, 95)) if finals else None,
            "partials": stats["partials"],
            "partials_replaced": stats["partials_replaced"] / stats["partials"] if stats["partials"] else None,
            "partials_refused": stats["partials_refused"],
            "engine_busy": (engine.metrics()["busy_s"] - busy0) / wall, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--device", default="auto")
    p.add_argument("--sessions", default="16,64", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--seconds", type=float, default=25.0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from streamer.config import EngineConfig, ModelConfig
    from streamer.engine.engine import Engine

    engine = Engine.load(ModelConfig(model=args.model, device=args.device), EngineConfig())
    clips = [decode_audio(r["path"]) for r in manifest("en") if 2.0 <= r["duration"] <= 8.0][:60]
    rows = []
    try:
        for n in args.sessions:
            rows.append(run(engine, n, args.seconds, clips))
            print(table(rows[-1:], list(rows[-1])), flush=True)
    finally:
        engine.close()
    speed_only = "speed only" in engine.model_name
    print(("\n(speed only: random weights) " if speed_only else "\n") + table(rows, list(rows[0])))
    result = {"model": engine.model_name, "device": engine.device, "seconds": args.seconds,
              "environment": environment(), "runs": rows}
    label = args.model.removeprefix("shape:").split(":")[0]
    name = args.out or f"bench_live_engine_{label}_{engine.device.split(':')[0]}.json"
    print(f"wrote {write_json(name, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
