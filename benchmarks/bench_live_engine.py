"""The engine's own ceiling for live streams: N simulated sessions drive one in-process `Engine`
with no gateway, no sockets and no VAD, submitting what a live stream submits.

Each session speaks utterances of real speech (English prompts of ../shared/audio, 1-s pauses
between them) at real-time pace: partial windows with the utterance so far under the live policy's
rules (one in the engine at a time, none beside a final, spaced by the shared partial cadence;
`--no-cadence`: every 0.5 s of speech), and 0.5 s after the utterance ends (the VAD's silence) its
final (FINAL), with the real-time deadlines the gateway gives them.
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
from streamer.loadtest.client import LONG_UTTERANCE_S  # noqa: E402  (the served load reports the same split)

RATE = 16000
PARTIAL_EVERY_S = 0.5
VAD_SILENCE_S = 0.5
PAUSE_S = 1.0


async def session(engine, sid: str, clips: list[np.ndarray], until: float, stats: dict, rng: random.Random,
                  cadence) -> None:
    """One simulated stream under the live policy's rules (`streaming/live.py`): at most one partial
    in the engine and none beside a final, partials spaced by the shared `cadence` (None: every
    0.5 s of speech), the utterance's partial cancelled when its final goes in."""
    from streamer.engine.request import DecodeOptions, Priority
    from streamer.engine.scheduler import QueueFull

    await asyncio.sleep(rng.uniform(0, 2.0))
    origin = time.monotonic()  # stream time 0 at real-time pace
    t = 0.0  # stream time
    k = 0
    pending, partial, last_partial = [], None, -1e9  # partial: (task awaiting it, its handle)
    finals_in_flight = [0]
    while time.monotonic() < until:
        clip = clips[k % len(clips)]
        k += 1
        for end in np.arange(PARTIAL_EVERY_S, len(clip) / RATE, PARTIAL_EVERY_S):
            await asyncio.sleep(max(0.0, origin + t + end - time.monotonic()))
            now = time.monotonic()
            if (partial is not None and not partial[0].done()) or finals_in_flight[0]:
                stats["partials_waited"] += 1
                continue
            if cadence is not None and now - last_partial < cadence.interval(now):
                stats["partials_thinned"] += 1
                continue
            try:
                h = engine.submit(clip[: int(end * RATE)], DecodeOptions(temperatures=(0.0,), max_new_tokens=32,
                                                                          language="en"),
                                  priority=Priority.PARTIAL, session_id=sid, deadline=origin + t + end)
            except QueueFull:
                stats["partials_refused"] += 1
                continue
            stats["partials"] += 1
            last_partial = now
            partial = (asyncio.ensure_future(_partial(h, stats)), h)
            pending.append(partial[0])
        t += len(clip) / RATE
        await asyncio.sleep(max(0.0, origin + t + VAD_SILENCE_S - time.monotonic()))
        if partial is not None and not partial[0].done():
            partial[1].cancel()
        submitted = time.monotonic()
        h = engine.submit(clip, DecodeOptions(timestamps=True, language="en"), priority=Priority.FINAL,
                          session_id=sid, deadline=origin + t)
        finals_in_flight[0] += 1
        pending.append(asyncio.ensure_future(_final(h, submitted, len(clip) / RATE, stats, cadence, finals_in_flight)))
        t += PAUSE_S
    await asyncio.gather(*pending, return_exceptions=True)


async def _partial(handle, stats: dict) -> None:
    from streamer.engine.errors import Cancelled

    try:
        await handle.result()
    except Cancelled:
        stats["partials_cancelled"] += 1


async def _final(handle, submitted: float, audio_s: float, stats: dict, cadence, in_flight: list) -> None:
    try:
        await handle.result()
    finally:
        in_flight[0] -= 1
    now = time.monotonic()
    stats["final_s"].append(now - submitted)
    stats["final_audio_s"].append(audio_s)
    if cadence is not None:
        cadence.observe_final(now - submitted, now)


def run(engine, n: int, seconds: float, clips: list[np.ndarray], use_cadence: bool, budget: float | None) -> dict:
    from streamer.streaming.cadence import CadenceConfig, PartialCadence, budget_for

    cadence = PartialCadence(CadenceConfig(final_budget_s=budget or budget_for(engine.device))) if use_cadence else None
    stats = {"partials": 0, "partials_cancelled": 0, "partials_refused": 0, "partials_waited": 0,
             "partials_thinned": 0, "final_s": [], "final_audio_s": []}
    intervals: list[float] = []
    busy0, steps0, t0 = engine.metrics()["busy_s"], engine.metrics()["steps"], time.monotonic()

    async def main():
        rng = random.Random(n)
        until = time.monotonic() + seconds
        order = list(range(len(clips)))

        async def watch():
            while time.monotonic() < until:
                if cadence is not None:
                    intervals.append(cadence.interval(time.monotonic()))
                await asyncio.sleep(0.25)

        await asyncio.gather(watch(), *(session(engine, f"s{i}", [clips[j] for j in rng.sample(order, len(order))],
                                                until, stats, rng, cadence) for i in range(n)))

    asyncio.run(main())
    wall = time.monotonic() - t0
    finals = stats["final_s"]
    long = [f for f, a in zip(finals, stats["final_audio_s"]) if a > LONG_UTTERANCE_S]
    m = engine.metrics()
    steps = m["steps"] - steps0
    return {"sessions": n, "finals": len(finals),
            "final_p50": float(np.percentile(finals, 50)) if finals else None,
            "final_p95": float(np.percentile(finals, 95)) if finals else None,
            "final_audio_p95_s": float(np.percentile(stats["final_audio_s"], 95)) if finals else None,
            f"final_p95_over_{LONG_UTTERANCE_S:g}s": float(np.percentile(long, 95)) if long else None,
            "partials_per_s": stats["partials"] / wall,
            "partials_cancelled": stats["partials_cancelled"] / stats["partials"] if stats["partials"] else None,
            "partials_refused": stats["partials_refused"],
            "cadence_s": float(np.mean(intervals)) if intervals else PARTIAL_EVERY_S,
            "cadence_max_s": float(max(intervals)) if intervals else PARTIAL_EVERY_S,
            "engine_busy": (m["busy_s"] - busy0) / wall,
            "step_ms": 1000 * (m["busy_s"] - busy0) / steps if steps else None, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--device", default="auto")
    p.add_argument("--sessions", default="16,64", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--seconds", type=float, default=25.0)
    p.add_argument("--no-cadence", action="store_true", help="partials every 0.5 s of speech, as before the policy's cadence")
    p.add_argument("--budget", type=float, default=None, help="FINAL_BUDGET_S of the cadence (default: by device)")
    p.add_argument("--encode-while-finals", type=int, default=None)
    p.add_argument("--overlap-encoder", action="store_true")
    p.add_argument("--no-decode-priority", action="store_true", help="with --overlap-encoder: one stream priority")
    p.add_argument("--no-encoder-graphs", action="store_true", help="the encoder launched eagerly, not replayed")
    p.add_argument("--clip-seconds", default="0,28", type=lambda s: [float(x) for x in s.split(",")],
                   help="LO,HI: utterance lengths used (default: every English prompt the VAD passes whole, as the "
                        "load client streams; session 6 ran 2,8)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from streamer.config import EngineConfig, ModelConfig
    from streamer.engine.engine import Engine

    config = EngineConfig(overlap_encoder=args.overlap_encoder, decode_priority=not args.no_decode_priority,
                          encoder_graphs=not args.no_encoder_graphs,
                          **({"encode_while_finals": args.encode_while_finals} if args.encode_while_finals is not None else {}))
    engine = Engine.load(ModelConfig(model=args.model, device=args.device), config)
    lo, hi = args.clip_seconds
    clips = [decode_audio(r["path"]) for r in manifest("en") if lo <= r["duration"] <= hi]
    rows = []
    try:
        for n in args.sessions:
            rows.append(run(engine, n, args.seconds, clips, not args.no_cadence, args.budget))
            print(table(rows[-1:], list(rows[-1])), flush=True)
    finally:
        engine.close()
    speed_only = "speed only" in engine.model_name
    print(("\n(speed only: random weights) " if speed_only else "\n") + table(rows, list(rows[0])))
    result = {"model": engine.model_name, "device": engine.device, "seconds": args.seconds,
              "cadence": not args.no_cadence, "budget": args.budget, "overlap_encoder": args.overlap_encoder,
              "decode_priority": engine.runner.main is not None, "clip_seconds": args.clip_seconds,
              "encoder_graphs": bool(engine.runner.encoder_graphs),
              "encode_while_finals": engine.scheduler.config.encode_while_finals, "environment": environment(), "runs": rows}
    label = args.model.removeprefix("shape:").split(":")[0]
    name = args.out or f"bench_live_engine_{label}_{engine.device.split(':')[0]}.json"
    print(f"wrote {write_json(name, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
