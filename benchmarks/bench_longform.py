"""Long-form transcription: WER and real-time factor of our `fast` (greedy) and `accurate` (5 beams)
modes against faster-whisper (sequential `transcribe` greedy and with 5 beams, and its
`BatchedInferencePipeline`) on the same CTranslate2 weights and the same long recordings; and the
throughput of N concurrent uploads.

Recordings: the shared 6-minute file, plus English prompts joined with 0.5-s pauses into files of
the given lengths (built here). WER after Whisper's English normaliser on both sides; RTF is wall
time over audio time (lower is faster). Each system is warmed up on a short clip first. Windows
that fail the fallback checks are re-decoded with sampling, so a run depends on the random seed:
each file is run with `--seeds` seeds and the table shows the mean WER and its range.

    python benchmarks/bench_longform.py                          # CPU: 6-min file, 5- and 15-min joins
    python benchmarks/bench_longform.py --minutes 5,15,30 --systems fast,accurate,fw-seq,fw-batched
    python benchmarks/bench_longform.py --device cuda --concurrent 8,32,64 --systems none   # GPU throughput
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np

from common import AUDIO_DIR, concat, ct2_dir, environment, manifest, table, wer, write_json

from streamer.audio import SAMPLE_RATE

SYSTEMS = ("fast", "accurate", "fw-seq", "fw-seq-beam5", "fw-batched")


def recordings(minutes: list[float]) -> list[tuple[str, np.ndarray, str]]:
    """(name, audio, reference text): the shared 6-minute file, then joins of English prompts."""
    from streamer.audio.decode import decode_audio

    long = manifest("en", folder="long/")[0]
    out = [("asterisk_en_6min", decode_audio(long["path"]), long["text"])]
    prompts = sorted(manifest("en"), key=lambda r: r["audio"])
    text_of = {r["path"]: r["text"] for r in prompts}
    for m in minutes:
        audio, used = concat([r["path"] for r in prompts], 60 * m)
        out.append((f"asterisk_en_join_{m:g}min", audio, " ".join(text_of[p] for p in used)))
    return out


def run_ours(engine, audio: np.ndarray, mode: str) -> str:
    from streamer.engine.request import DecodeOptions
    from streamer.longform import transcribe_long

    return asyncio.run(transcribe_long(engine, audio, mode=mode, options=DecodeOptions(language="en"))).text


def run_faster_whisper(model, audio: np.ndarray, batched: bool, beam_size: int = 1) -> str:
    if batched:
        from faster_whisper import BatchedInferencePipeline

        segments, _ = BatchedInferencePipeline(model).transcribe(audio, beam_size=1, language="en")
    else:
        segments, _ = model.transcribe(audio, beam_size=beam_size, language="en", vad_filter=False,
                                       condition_on_previous_text=True)
    return "".join(s.text for s in segments)


def seed_everything(seed: int) -> None:
    """Temperature fallback samples: seed both samplers so that a run can be repeated."""
    import ctranslate2
    import torch

    torch.manual_seed(seed)
    ctranslate2.set_random_seed(seed)


def summary(rows: list[dict]) -> list[dict]:
    """Per file and system over the seeds: mean WER with its range, mean RTF."""
    out = []
    for key in dict.fromkeys((r["file"], r["system"]) for r in rows):
        runs = [r for r in rows if (r["file"], r["system"]) == key]
        wers = [r["wer_%"] for r in runs]
        out.append({"file": key[0], "minutes": runs[0]["minutes"], "system": key[1], "runs": len(runs),
                    "wer_%": sum(wers) / len(wers), "wer_min": min(wers), "wer_max": max(wers),
                    "rtf": sum(r["rtf"] for r in runs) / len(runs)})
    return out


def accuracy(args, files) -> list[dict]:
    from streamer.config import ModelConfig
    from streamer.engine.engine import Engine

    systems = [s for s in args.systems.split(",") if s in SYSTEMS]
    engine = Engine.load(ModelConfig(model=args.model, device=args.device)) if {"fast", "accurate"} & set(systems) else None
    fw = None
    if {"fw-seq", "fw-seq-beam5", "fw-batched"} & set(systems):
        from faster_whisper import WhisperModel

        fw = WhisperModel(ct2_dir(args.model), device="cpu", compute_type="float32", cpu_threads=os.cpu_count() or 1)
    warm = files[0][1][: 20 * SAMPLE_RATE]
    rows = []
    for system in systems:
        run = {"fast": lambda a: run_ours(engine, a, "fast"), "accurate": lambda a: run_ours(engine, a, "accurate"),
               "fw-seq": lambda a: run_faster_whisper(fw, a, False),
               "fw-seq-beam5": lambda a: run_faster_whisper(fw, a, False, beam_size=5),
               "fw-batched": lambda a: run_faster_whisper(fw, a, True)}[system]
        run(warm)
        for name, audio, reference in files:
            for seed in range(args.seeds):
                seed_everything(seed)
                t0 = time.perf_counter()
                text = run(audio)
                wall = time.perf_counter() - t0
                seconds = len(audio) / SAMPLE_RATE
                rows.append({"file": name, "minutes": round(seconds / 60, 1), "system": system, "seed": seed,
                             "wer_%": wer([reference], [text], "en"), "rtf": wall / seconds, "wall_s": wall})
                print(table(rows[-1:], list(rows[-1])), flush=True)
    if engine is not None:
        engine.close()
    return rows


def throughput(args, files) -> list[dict]:
    """One upload, then N uploads of the same recording at once (for each N of `--concurrent`) through
    one engine, per mode: audio seconds per wall second, and how much N at once gain over one (their
    windows share steps)."""
    from streamer.config import ModelConfig
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.longform import transcribe_long

    engine = Engine.load(ModelConfig(model=args.model, device=args.device))
    name, audio, reference = files[0]
    rows = []
    for mode in ("fast", "accurate"):
        async def run(n: int):
            return await asyncio.gather(*(transcribe_long(engine, audio, mode=mode, options=DecodeOptions(language="en"))
                                          for _ in range(n)))

        asyncio.run(run(1))  # warm-up (graphs, kernels)
        single = None
        for n in [1] + args.concurrent:
            t0 = time.perf_counter()
            transcripts = asyncio.run(run(n))
            wall = time.perf_counter() - t0
            rate = len(audio) / SAMPLE_RATE * n / wall
            single = single or rate
            rows.append({"file": name, "mode": mode, "uploads": n, "wall_s": wall, "audio_s_per_s": rate,
                         "gain_vs_one": rate / single,
                         "wer_%": wer([reference] * len(transcripts), [t.text for t in transcripts], "en")})
            print(table(rows[-1:], list(rows[-1])), flush=True)
    engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--minutes", default="5,15", help="lengths of the joined recordings, comma-separated ('' for none)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join(SYSTEMS)}; 'none' to skip")
    parser.add_argument("--seeds", type=int, default=2, help="runs per file and system (fallback samples differ)")
    parser.add_argument("--concurrent", default="", help="also measure N concurrent uploads through the engine, "
                        "for each N of this comma-separated list")
    parser.add_argument("--out", default="bench_longform.json")
    args = parser.parse_args()
    args.concurrent = [int(n) for n in args.concurrent.split(",") if n.strip()]

    files = recordings([float(m) for m in args.minutes.split(",") if m.strip()])
    result = {"environment": environment(), "model": args.model, "device": args.device, "audio_dir": str(AUDIO_DIR)}
    result["runs"] = accuracy(args, files)
    result["accuracy"] = summary(result["runs"])
    if result["accuracy"]:
        print("\n" + table(result["accuracy"], ["file", "minutes", "system", "runs", "wer_%", "wer_min", "wer_max", "rtf"]))
    if args.concurrent:
        result["throughput"] = throughput(args, files)
        print("\n" + table(result["throughput"], ["file", "mode", "uploads", "wall_s", "audio_s_per_s", "gain_vs_one", "wer_%"]))
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()
