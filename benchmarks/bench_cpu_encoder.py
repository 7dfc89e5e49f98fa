"""The CPU encoder in bfloat16 against float32 (`ModelConfig.cpu_encoder`), in one run.

Per model and language: WER of the asterisk prompts (each file one window, greedy with fallback,
as `wer.py` decodes them), the wall time of the whole set and the encoder pass alone (one 30-s
window, best of 5). English adds the shared 6-minute file through long-form `fast`.

    python benchmarks/bench_cpu_encoder.py                       # tiny.en en, base es and fr
    python benchmarks/bench_cpu_encoder.py --runs tiny.en:en
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import environment, manifest, table, wer, write_json
from wer import ours


def encoder_ms(model: str, setting: str) -> float:
    import torch

    from streamer.model.cpu_encoder import resolve, with_cpu_encoder
    from streamer.model.weights import load_model

    loaded = load_model(model)
    encoder = with_cpu_encoder(loaded.model, resolve(setting)).encoder
    mel = torch.zeros(1, loaded.dims.n_mels, 3000)
    times = []
    with torch.inference_mode():
        for _ in range(6):
            t0 = time.perf_counter()
            encoder(mel)
            times.append(time.perf_counter() - t0)
    return 1000 * min(times[1:])


def long_fast(model: str, setting: str) -> float:
    from streamer.audio.decode import decode_audio
    from streamer.config import ModelConfig
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.longform import transcribe_long

    row = manifest("en", folder="long/")[0]
    engine = Engine.load(ModelConfig(model=model, device="cpu", cpu_encoder=setting))
    result = asyncio.run(transcribe_long(engine, decode_audio(row["path"]), mode="fast", options=DecodeOptions(language="en")))
    engine.close()
    return wer([row["text"]], [result.text], "en")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="tiny.en:en,base:es,base:fr", help="model:language pairs")
    p.add_argument("--settings", default="float32,bfloat16")
    args = p.parse_args()
    from streamer.model.cpu_encoder import native_bfloat16

    out = []
    for run in args.runs.split(","):
        model, language = run.split(":")
        rows = manifest(language)
        refs = [r["text"] for r in rows]
        for setting in args.settings.split(","):
            texts, wall, _ = ours(model, rows, language, "cpu", cpu_encoder=setting)
            row = {"model": model, "language": language, "cpu_encoder": setting, "files": len(rows),
                   "wer_%": wer(refs, texts, language), "wall_s": wall, "encoder_ms": encoder_ms(model, setting)}
            if language == "en":
                row["long_fast_wer_%"] = long_fast(model, setting)
            row["texts"] = texts
            out.append(row)
        base = out[-len(args.settings.split(",")):]
        for r in base:
            r["wall_vs_first"] = r["wall_s"] / base[0]["wall_s"]
            r["encoder_vs_first"] = r["encoder_ms"] / base[0]["encoder_ms"]
    print(f"native bfloat16 on this CPU: {native_bfloat16()}")
    print(table(out, ["model", "language", "cpu_encoder", "files", "wer_%", "long_fast_wer_%", "wall_s", "wall_vs_first",
                      "encoder_ms", "encoder_vs_first"]))
    path = write_json("bench_cpu_encoder.json", {
        "command": "python benchmarks/bench_cpu_encoder.py --runs " + args.runs + " --settings " + args.settings,
        "environment": environment(), "native_bfloat16": native_bfloat16(), "rows": out})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
