"""Admission latency of windows whose prompts all differ in length: the live-final case.

Every live final carries the stream's previous text as its prompt, so its prefill has a shape the
engine has not seen before. This submits one window at a time (real speech, `en/jfk.ogg`) with
prompts of `--windows` distinct lengths and reports the time to its first token and to its result,
for the attention backends the engine's prefill uses (`runner.SDPA_PATHS["prefill"]`) and, on CUDA,
for the same list with cuDNN's attention first (torch's own preference on Hopper), which builds an
execution plan per new shape. Each variant gets prompt lengths the other never used. The decoder
step (CUDA graphs, cuDNN: `SDPA_PATHS["graph_step"]`) is the same in both.

With `--shape large-v3` (random fp16 weights of that shape, end-of-text suppressed: speed only) the
variants are the `--precisions` instead, for instance full_fp16 (whose cross cache is the hybrid for
wide models: a window's K/V are projected from its encoder states at the first step that reads
them) against `full_fp16:cross_kv_cache=fp16` (K/V projected at admission). `--background N` keeps N
other windows decoding meanwhile, as live streams do.

    python benchmarks/bench_prefill.py [--model tiny.en] [--device cuda] [--windows 12]
    python benchmarks/bench_prefill.py --device cuda --shape large-v3 --tokenizer DIR/tokenizer.json \
        --precisions full_fp16,full_fp16:cross_kv_cache=fp16 --background 0,64
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

from common import AUDIO_DIR, environment, table, write_json

PROMPT = ("and so my fellow americans ask not what your country can do for you ask what you can do for your "
          "country my fellow citizens of the world ask not what america will do for you but what together we "
          "can do for the freedom of man").split()


async def one(engine, audio, options) -> tuple[float, float]:
    """Seconds to the window's first token and to its result."""
    t0 = time.perf_counter()
    handle = engine.submit(audio, options, stream_tokens=True)
    first = None
    async for _ in handle.tokens():
        first = first or time.perf_counter() - t0
    await handle.result()
    return first, time.perf_counter() - t0


async def measure(engine, audio, prompts: list[str], background: int, max_new_tokens: int | None) -> tuple[list, list]:
    """`one` for each prompt in turn while `background` other windows keep decoding (each one that
    ends is replaced), after a warm-up at that load."""
    from streamer.engine.request import DecodeOptions

    plain = DecodeOptions(language="en", temperatures=(0.0,), max_new_tokens=max_new_tokens)
    stop = asyncio.Event()

    async def keep_busy():
        while not stop.is_set():
            await engine.transcribe(audio, plain)

    busy = [asyncio.create_task(keep_busy()) for _ in range(background)]
    await asyncio.sleep(0)
    await one(engine, audio, plain)  # warm-up at this load, no prompt
    firsts, totals = [], []
    for prompt in prompts:
        first, total = await one(engine, audio, dataclasses.replace(plain, prompt=prompt))
        firsts.append(first)
        totals.append(total)
    stop.set()
    await asyncio.gather(*busy)
    return firsts, totals


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--device", default="cpu")
    p.add_argument("--windows", type=int, default=12, help="distinct prompt lengths per variant and load")
    p.add_argument("--shape", help="a bench_engine shape (random fp16 weights) instead of --model")
    p.add_argument("--tokenizer", help="a multilingual tokenizer.json (with --shape)")
    p.add_argument("--precisions", default="full_fp16,full_fp16:cross_kv_cache=fp16", help="with --shape: the variants (none: plain PyTorch)")
    p.add_argument("--background", default="0", help="comma list: windows decoding meanwhile")
    p.add_argument("--max-new-tokens", type=int, default=None, help="per window (--shape default: 30)")
    args = p.parse_args()

    from torch.nn.attention import SDPBackend

    from streamer.audio.decode import decode_audio
    from streamer.config import EngineConfig, ModelConfig
    from streamer.engine import runner
    from streamer.engine.engine import Engine

    audio = decode_audio(str(AUDIO_DIR / "en" / "jfk.ogg"))
    loads = [int(x) for x in args.background.split(",")]
    n_variants = len(args.precisions.split(",")) if args.shape else 2  # (tiny.en: 1 on the CPU)
    if args.windows * n_variants * len(loads) > len(PROMPT):  # before any model loads
        raise SystemExit(f"--windows {args.windows} × {n_variants} variants × {len(loads)} loads needs more "
                         f"than {len(PROMPT)} prompt lengths")
    ours = list(runner.SDPA_PATHS["prefill"])
    if args.shape:  # variants: (name, make the engine, prefill backends)
        from bench_engine import random_model

        slots = max(loads) + 1
        variants = [(precision, lambda precision=precision: Engine(random_model(args.shape, args.tokenizer, args.device),
                                                                   EngineConfig(max_slots=slots),
                                                                   precision=None if precision == "none" else precision), ours)
                    for precision in args.precisions.split(",")]
        max_new_tokens, model = args.max_new_tokens or 30, f"{args.shape} (random fp16)"
    else:
        engine = Engine.load(ModelConfig(model=args.model, device=args.device),
                             EngineConfig(max_slots=max(loads) + 1) if max(loads) else EngineConfig())
        variants = [("ours", lambda: engine, ours)]
        if engine.runner.device.type == "cuda":
            variants.insert(0, ("with cuDNN first", lambda: engine, [SDPBackend.CUDNN_ATTENTION] + ours))
        max_new_tokens, model = args.max_new_tokens, args.model
    rows, lengths = [], iter(range(1, len(PROMPT) + 1))  # distinct lengths: checked above
    for name, make, backends in variants:
        engine = make()
        runner.SDPA_PATHS["prefill"] = backends
        for background in loads:
            words = [next(lengths) for _ in range(args.windows)]
            prompts = [" ".join(PROMPT[:n]) for n in words]
            firsts, totals = asyncio.run(measure(engine, audio, prompts, background, max_new_tokens))
            rows.append({"variant": name, "background": background, "windows": args.windows,
                         "first_token_p50_ms": 1000 * statistics.median(firsts), "first_token_max_ms": 1000 * max(firsts),
                         "result_p50_ms": 1000 * statistics.median(totals)})
            print(table(rows[-1:], list(rows[-1])), flush=True)
        runner.SDPA_PATHS["prefill"] = ours
        if args.shape:
            engine.close()
    if not args.shape:
        engine.close()
    device = engine.runner.device.type
    print("\n" + table(rows, list(rows[0])))
    name = f"bench_prefill_{device}" + (f"_{args.shape}" if args.shape else "") + ".json"
    print("wrote", write_json(name, {"environment": environment(), "model": model, "max_new_tokens": max_new_tokens,
                                     "rows": rows}))


if __name__ == "__main__":
    main()
