"""One CPU decoder step, float32 weights against float16 weights with float32 arithmetic.

What `cpu_linear.with_half_weights` buys, without the rest of a window around it: tiny.en's
encoder pass over 29 s of the shared 6-minute recording, then one-token steps at positions
10..99 of one slot (self-attention over the positions so far, cross-attention over 1500 frames),
each with its vocabulary projection. Interleaved rounds, one model per variant in this process.

    python benchmarks/bench_cpu_step.py [--model tiny.en] [--threads 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from common import environment, manifest, table, write_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()

    import torch

    from streamer.audio.decode import decode_audio
    from streamer.audio.features import log_mel_spectrogram
    from streamer.model.cpu_linear import with_half_weights
    from streamer.model.weights import load_model
    from streamer.model.whisper import KVCache

    torch.set_num_threads(args.threads)
    long = manifest("en", folder="long/")[0]
    audio = torch.from_numpy(decode_audio(long["path"])[30 * 16000:59 * 16000])
    variants = {}
    for name in ("float32 weights", "float16 weights"):
        loaded = load_model(args.model)
        if name == "float16 weights":
            half = with_half_weights(loaded.model)
            if half is loaded.model:
                raise SystemExit("this build of PyTorch has no FBGEMM, or the weights are not float16 values")
            loaded = dataclasses.replace(loaded, model=half)
        variants[name] = loaded
    times = {name: {"encoder_ms": [], "step_ms": [], "logits_ms": []} for name in variants}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, loaded in variants.items():
                model, dims = loaded.model, loaded.dims
                mel = log_mel_spectrogram(audio, dims.n_mels)
                t0 = time.perf_counter()
                features = model.encoder(mel)
                times[name]["encoder_ms"].append(1e3 * (time.perf_counter() - t0))
                cache = KVCache(dims, 1, torch.device("cpu"), torch.float32)
                model.decoder.write_cross_kv(features, cache, 0)
                token = torch.tensor([[loaded.tokenizer.sot]])

                def step(position: int):
                    hidden = model.decoder(token, torch.tensor([[position]]), 0, cache, kv_len=position + 1)
                    return model.decoder.logits(hidden)

                for position in range(10):
                    step(position)
                t0 = time.perf_counter()
                for position in range(10, 100):
                    step(position)
                times[name]["step_ms"].append(1e3 * (time.perf_counter() - t0) / 90)
                hidden = torch.randn(1, 1, dims.n_text_state)
                t0 = time.perf_counter()
                for _ in range(50):
                    model.decoder.logits(hidden)
                times[name]["logits_ms"].append(1e3 * (time.perf_counter() - t0) / 50)
    rows = [{"weights": name, **{k: round(statistics.median(v), 2) for k, v in t.items()}} for name, t in times.items()]
    base = rows[0]["step_ms"]
    for r in rows:
        r["step_speedup"] = round(base / r["step_ms"], 2)
    print(f"{args.model}, {args.threads} threads, {args.rounds} interleaved rounds, median ms")
    print(table(rows, ["weights", "encoder_ms", "step_ms", "logits_ms", "step_speedup"]))
    path = write_json(f"bench_cpu_step_{args.model}.json", {
        "command": f"python benchmarks/bench_cpu_step.py --model {args.model} --threads {args.threads} --rounds {args.rounds}",
        "environment": environment(), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
