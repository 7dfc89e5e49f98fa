"""Admission latency of windows whose prompts all differ in length: the live-final case.

Every live final carries the stream's previous text as its prompt, so its prefill has a shape the
engine has not seen before. This submits one window at a time (real speech, `en/jfk.ogg`) with
prompts of `--windows` distinct lengths and reports the time to its first token and to its result,
for the attention backends the engine's prefill uses (`runner.SDPA_PATHS["prefill"]`) and, on CUDA,
for the same list with cuDNN's attention first (torch's own preference on Hopper), which builds an
execution plan per new shape. Each variant gets prompt lengths the other never used. The decoder
step (CUDA graphs, cuDNN: `SDPA_PATHS["graph_step"]`) is the same in both.

    python benchmarks/bench_prefill.py [--model tiny.en] [--device cuda] [--windows 12]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from common import AUDIO_DIR, environment, table, write_json

PROMPT = ("and so my fellow americans ask not what your country can do for you ask what you can do for your "
          "country my fellow citizens of the world ask not what america will do for you but what together we "
          "can do for the freedom of man").split()


async def one(engine, audio, options) -> tuple[float, float]:
    t0 = time.perf_counter()
    handle = engine.submit(audio, options, stream_tokens=True)
    first = None
    async for _ in handle.tokens():
        first = first or time.perf_counter() - t0
    await handle.result()
    return first, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--device", default="cpu")
    p.add_argument("--windows", type=int, default=12, help="distinct prompt lengths per variant")
    args = p.parse_args()

    from torch.nn.attention import SDPBackend

    from streamer.audio.decode import decode_audio
    from streamer.config import ModelConfig
    from streamer.engine import runner
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions

    engine = Engine.load(ModelConfig(model=args.model, device=args.device))
    audio = decode_audio(str(AUDIO_DIR / "en" / "jfk.ogg"))
    ours = list(runner.SDPA_PATHS["prefill"])
    variants = [("ours", ours)]
    if engine.runner.device.type == "cuda":
        variants.insert(0, ("with cuDNN first", [SDPBackend.CUDNN_ATTENTION] + ours))
    asyncio.run(one(engine, audio, DecodeOptions(language="en", temperatures=(0.0,))))  # warm-up, no prompt
    rows, lengths = [], iter(range(1, len(PROMPT) + 1))
    for name, backends in variants:
        runner.SDPA_PATHS["prefill"] = backends
        firsts, totals = [], []
        for _ in range(args.windows):
            words = next(lengths, None)
            if words is None:
                raise SystemExit(f"--windows {args.windows} × {len(variants)} variants needs more than {len(PROMPT)} prompt lengths")
            options = DecodeOptions(language="en", prompt=" ".join(PROMPT[:words]), temperatures=(0.0,))
            first, total = asyncio.run(one(engine, audio, options))
            firsts.append(first)
            totals.append(total)
        rows.append({"attention": name, "windows": args.windows, "first_token_p50_ms": 1000 * statistics.median(firsts),
                     "first_token_max_ms": 1000 * max(firsts), "result_p50_ms": 1000 * statistics.median(totals)})
        print(table(rows[-1:], list(rows[-1])), flush=True)
    runner.SDPA_PATHS["prefill"] = ours
    engine.close()
    print("\n" + table(rows, list(rows[0])))
    print("wrote", write_json(f"bench_prefill_{engine.runner.device.type}.json",
                              {"environment": environment(), "model": args.model, "rows": rows}))


if __name__ == "__main__":
    main()
