"""CPU speed on one 30-s window of real speech: ours vs transformers' generate vs faster-whisper.

Same weights (tiny.en from its CTranslate2 bundle; transformers gets them through a Hugging Face
directory we write), same audio, greedy, fp32 (faster-whisper int8 as well, for reference),
2 threads. Times exclude model loading: one warm-up each, then --repeat interleaved rounds.

    python benchmarks/bench_cpu.py [--model tiny.en] [--threads 2] [--repeat 3] [--source long|prompts]

The window: by default 29 s of the shared 6-minute recording from 0:30 (dense speech, 89 tokens
with tiny.en: the "~90 tokens" case of issue 2); `--source prompts` joins short English prompts
instead (52 tokens, more pauses).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from common import concat, ct2_dir, environment, manifest, table, write_json


PAUSE_S = 0.5
"""Idle time before each timed run."""


def timed(fn, repeat: int) -> tuple[float, object]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--files", type=int, default=16, help="also: this many recordings at once vs one after another")
    p.add_argument("--source", choices=("long", "prompts"), default="long", help="where the window comes from")
    p.add_argument("--start", type=float, default=30.0, help="with --source long: the window's start, seconds")
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from streamer.config import EngineConfig
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.model.weights import load_model, save_hf_checkpoint

    from streamer.audio.decode import decode_audio

    if args.source == "long":
        long = manifest("en", folder="long/")[0]
        start = int(args.start * 16000)
        audio, used = decode_audio(long["path"])[start:start + 29 * 16000], [f"{long['path']}@{args.start:g}s"]
    else:
        audio, used = concat([r["path"] for r in manifest("en")[40:]], 29.0)
    loaded = load_model(args.model)
    engine = Engine(loaded, EngineConfig())  # the CPU defaults `streamer transcribe` uses (16 slots)
    loop = asyncio.new_event_loop()

    def run_ours():
        return loop.run_until_complete(engine.transcribe(audio, DecodeOptions(temperatures=(0.0,))))

    import transformers

    with tempfile.TemporaryDirectory() as d:
        save_hf_checkpoint(loaded, d)
        hf = transformers.WhisperForConditionalGeneration.from_pretrained(d, attn_implementation="sdpa").eval()
    fe = transformers.WhisperFeatureExtractor(feature_size=loaded.dims.n_mels)

    def run_hf():
        with torch.inference_mode():
            feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
            return hf.generate(feats, max_new_tokens=224)

    import ctranslate2
    import numpy as np
    from faster_whisper import WhisperModel

    def fw_runner(compute):
        fw = WhisperModel(ct2_dir(args.model), device="cpu", compute_type=compute, cpu_threads=args.threads)

        def run():
            segs, _ = fw.transcribe(audio, beam_size=1, language="en", vad_filter=False, without_timestamps=True,
                                    temperature=0.0)
            return [s for s in segs]
        return run

    def ct2_same_features():
        """faster-whisper's engine (CTranslate2, fp32) on our log-mel, i.e. audio padded to 30 s as
        transformers pads it (faster-whisper pads the spectrogram instead): the same input, so the
        same tokens, and the time per window compares like with like."""
        from streamer.audio.features import log_mel_spectrogram

        ct = WhisperModel(ct2_dir(args.model), device="cpu", compute_type="float32", cpu_threads=args.threads).model
        prompt = [loaded.tokenizer.sot_sequence("en", "transcribe", timestamps=False)]

        def run():
            mel = ctranslate2.StorageView.from_array(np.ascontiguousarray(log_mel_spectrogram(audio, loaded.dims.n_mels).numpy()))
            return ct.generate(mel, prompt, beam_size=1, max_length=224, suppress_blank=True, suppress_tokens=[-1])[0]
        return run

    systems = {"streamer (ours) fp32": run_ours, "transformers generate fp32": run_hf,
               "faster-whisper float32": fw_runner("float32"), "faster-whisper int8": fw_runner("int8"),
               "ctranslate2 fp32, our features": ct2_same_features()}
    outputs = {name: fn() for name, fn in systems.items()}  # warm-up
    # Interleaved rounds (A B C D, A B C D, ...): on a shared machine the load drifts, and each
    # round's ratios compare systems under the same conditions.
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.repeat):
        for name, fn in systems.items():
            # A pause first: the previous system's worker threads (OpenMP, CTranslate2's pool)
            # spin for a while after their last task, and would take cores from this one.
            time.sleep(PAUSE_S)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    ours_times = times["streamer (ours) fp32"]
    tokens = {"streamer (ours) fp32": len(outputs["streamer (ours) fp32"].tokens),
              "transformers generate fp32": outputs["transformers generate fp32"].shape[1],
              "ctranslate2 fp32, our features": len(outputs["ctranslate2 fp32, our features"].sequences_ids[0])}
    rows = []
    for name in systems:
        ratios = [theirs / ours for theirs, ours in zip(times[name], ours_times)]
        rows.append({"system": name, "seconds": statistics.median(times[name]), "min_s": min(times[name]),
                     "max_s": max(times[name]), "tokens": tokens[name] if name in tokens else sum(len(x.tokens) for x in outputs[name]),
                     "ours_speedup": statistics.median(ratios)})

    # Many recordings in one call share engine steps (what `streamer transcribe a b c ...` does).
    clips = [decode_audio(r["path"]) for r in manifest("en")[:args.files]]

    async def together():
        return await asyncio.gather(*(engine.transcribe(c, DecodeOptions(temperatures=(0.0,))) for c in clips))

    async def one_by_one():
        return [await engine.transcribe(c, DecodeOptions(temperatures=(0.0,))) for c in clips]

    t_seq, _ = timed(lambda: loop.run_until_complete(one_by_one()), 1)
    t_all, _ = timed(lambda: loop.run_until_complete(together()), 1)
    many = {"files": len(clips), "audio_s": sum(len(c) for c in clips) / 16000, "one_by_one_s": t_seq,
            "together_s": t_all, "ratio": t_all / t_seq}
    engine.close()

    print(f"\n{args.model}, one {len(audio) / 16000:.1f}-s window of speech, greedy, {args.threads} threads, "
          f"{args.repeat} interleaved rounds; median seconds; ours_speedup = median over rounds of their time / ours")
    print(table(rows, ["system", "seconds", "min_s", "max_s", "tokens", "ours_speedup"]))
    print(f"\n{many['files']} recordings ({many['audio_s']:.0f} s of audio): one after another {many['one_by_one_s']:.2f} s, "
          f"all at once {many['together_s']:.2f} s (ratio {many['ratio']:.2f})")
    path = write_json(f"bench_cpu_{args.model}.json", {"command": f"python benchmarks/bench_cpu.py --model {args.model} "
                      f"--threads {args.threads} --repeat {args.repeat} --source {args.source} --start {args.start:g}", "environment": environment(),
                      "audio_files": used, "rows": rows, "many_files": many})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
