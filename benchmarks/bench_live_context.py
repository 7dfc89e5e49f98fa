"""What acoustic context costs a live final (`StreamingConfig.acoustic_context`), and how often
it changes the final's text.

Streams a recording through a `LivePolicy` with acoustic context on, answered by the real engine
(tiny.en on the CPU by default; no sockets, nothing else in the engine), and keeps every final
that went out with context. Each of those is then decoded again both ways, interleaved, `--repeat`
times: inside its context (the forced prefix) and alone (the utterance's own audio, no prefix).
Per final: engine wall time of the decode (queue empty: encoder, prefill and decode steps),
time to the first token (encoder and prefill), the prefix length, and whether the texts differ.

    python benchmarks/bench_live_context.py --file messy-en-8-0 --repeat 3

Finalisation latency at real-time pace adds to this the VAD's silence wait (the same both ways)
and, with context, any wait for the previous final (a final is submitted once it is in).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

import numpy as np

from common import environment, table, write_json

from bench_live_accuracy import recording
from streamer.audio import SAMPLE_RATE
from streamer.streaming.live import LiveOptions, LivePolicy, Submit

CHUNK_S = 0.1


async def finals_with_context(engine, audio: np.ndarray, language: str | None) -> list[Submit]:
    """The Submits of the finals that carried acoustic context, as the policy built them."""
    from streamer.audio.vad import SileroVAD
    from streamer.config import StreamingConfig
    from streamer.streaming.session import Session

    tok = engine.tokenizer
    policy = LivePolicy(Session(StreamingConfig(partials=False, acoustic_context=True), SileroVAD()),
                        LiveOptions(language), encode=tok.encode, max_new_tokens=engine.config.max_new_tokens,
                        timestamp_token=tok.timestamp_token)
    kept: list[Submit] = []

    async def run(actions) -> None:
        for a in actions:
            if isinstance(a, Submit):
                if a.window.context_s:
                    kept.append(a)
                result = await engine.transcribe(a.window.audio, a.options)
                await run(policy.on_result(a.job, result, time.monotonic()))

    step = int(CHUNK_S * SAMPLE_RATE)
    padded = np.concatenate([audio, np.zeros(2 * SAMPLE_RATE, np.float32)])
    for i in range(0, len(padded), step):
        await run(policy.feed(padded[i:i + step], time.monotonic()))
    await run(policy.close(time.monotonic()))
    return kept


async def timed(engine, audio, options) -> tuple[float, float, object]:
    t0 = time.perf_counter()
    result = await engine.transcribe(audio, options)
    return time.perf_counter() - t0, result.first_token_s or 0.0, result


async def compare(engine, submit: Submit, repeat: int) -> dict:
    w, o = submit.window, submit.options
    own = w.audio[round(w.context_s * SAMPLE_RATE):]
    alone_options = dataclasses.replace(o, prefix_tokens=None)
    ctx_t, ctx_first, alone_t, alone_first = [], [], [], []
    for _ in range(repeat):
        t, f, with_ctx = await timed(engine, w.audio, o)
        ctx_t.append(t), ctx_first.append(f)
        t, f, alone = await timed(engine, own, alone_options)
        alone_t.append(t), alone_first.append(f)
    kept = [s for s in with_ctx.segments if s.end > w.context_s]
    text = "".join(s.text for s in kept).strip()
    return {"utterance_s": round(len(own) / SAMPLE_RATE, 2), "context_s": round(w.context_s, 2),
            "prefix_tokens": len(o.prefix_tokens or ()),
            "ctx_ms": 1000 * statistics.median(ctx_t), "ctx_first_ms": 1000 * statistics.median(ctx_first),
            "alone_ms": 1000 * statistics.median(alone_t), "alone_first_ms": 1000 * statistics.median(alone_first),
            "ctx_tokens": len(with_ctx.tokens), "alone_tokens": len(alone.tokens),
            "differs": text != alone.text.strip(), "ctx_text": text, "alone_text": alone.text.strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--file", default="messy-en-8-0", help="6min or messy-LANG-MINUTES-SEED")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="bench_live_context.json")
    args = parser.parse_args()

    from streamer.config import EngineConfig, ModelConfig
    from streamer.engine.engine import Engine

    engine = Engine.load(ModelConfig(model=args.model, device="cpu"), EngineConfig())
    rec = recording(args.file)
    language = rec["language"] if engine.tokenizer.multilingual else None
    try:
        submits = asyncio.run(finals_with_context(engine, rec["audio"], language))
        rows = [asyncio.run(compare(engine, s, args.repeat)) for s in submits]
    finally:
        engine.close()
    summary = {"file": rec["name"], "finals_with_context": len(rows), "repeat": args.repeat}
    for k in ("ctx_ms", "alone_ms", "ctx_first_ms", "alone_first_ms", "prefix_tokens", "context_s", "utterance_s"):
        summary[k + "_median"] = round(statistics.median(r[k] for r in rows), 1) if rows else None
    summary["extra_ms_median"] = round(statistics.median(r["ctx_ms"] - r["alone_ms"] for r in rows), 1) if rows else None
    summary["texts_differ"] = sum(r["differs"] for r in rows)
    print(table([{k: (round(v) if isinstance(v, float) else v) for k, v in r.items() if not k.endswith("text")} for r in rows],
                ["utterance_s", "context_s", "prefix_tokens", "ctx_ms", "alone_ms", "ctx_first_ms", "alone_first_ms",
                 "ctx_tokens", "alone_tokens", "differs"]))
    print("\n" + table([summary], list(summary)))
    print("wrote", write_json(args.out, {"environment": environment(), "model": args.model, "summary": summary,
                                         "finals": rows}))


if __name__ == "__main__":
    main()
