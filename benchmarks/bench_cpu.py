"""CPU speed on one 30-s window of real speech: ours vs transformers' generate vs faster-whisper.

Same weights (tiny.en from its CTranslate2 bundle; transformers gets them through a Hugging Face
directory we write), same audio, greedy, fp32 (faster-whisper int8 as well, for reference),
2 threads. Each system runs in its own process, as it would in production: threads pools of one
library (OpenMP's, CTranslate2's) then neither share cores with another's nor throttle it. Times
exclude model loading: one warm-up each, then --repeat interleaved rounds (one run of each system
per round, after 0.5 s of idle), so that every round compares the systems under the same load.

    python benchmarks/bench_cpu.py [--model tiny.en] [--threads 2] [--repeat 3] [--source long|prompts]

The window: by default 29 s of the shared 6-minute recording from 0:30 (dense speech, 89 tokens
with tiny.en: the "~90 tokens" case of issue 2); `--source prompts` joins short English prompts
instead (52 tokens, more pauses).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time

from common import concat, ct2_dir, environment, manifest, table, write_json

PAUSE_S = 0.5
"""Idle time before each timed run: the previous system's workers spin for a while after it."""
OURS = "streamer (ours)"
"""fp32 decoder steps over fp16 weights; the encoder in `ModelConfig.cpu_encoder`'s resolved dtype (in the JSON)."""
SYSTEMS = (OURS, "transformers generate fp32", "faster-whisper float32", "faster-whisper int8",
           "ctranslate2 fp32, our features")


def window(args) -> tuple:
    """The audio of the timed window, and where it comes from."""
    from streamer.audio.decode import decode_audio

    if args.source == "long":
        long = manifest("en", folder="long/")[0]
        start = int(args.start * 16000)
        return decode_audio(long["path"])[start:start + 29 * 16000], [f"{long['path']}@{args.start:g}s"]
    return concat([r["path"] for r in manifest("en")[40:]], 29.0)


def build(name: str, args, audio):
    """A function that transcribes `audio` with system `name` and returns its token count; for
    ours also the many-files measurement."""
    import numpy as np
    import torch

    if name == OURS:  # what `streamer transcribe` builds
        from streamer.config import EngineConfig, ModelConfig
        from streamer.engine.engine import Engine
        from streamer.engine.request import DecodeOptions

        engine = Engine.load(ModelConfig(model=args.model, device="cpu"), EngineConfig())
        loop = asyncio.new_event_loop()
        return (lambda: len(loop.run_until_complete(engine.transcribe(audio, DecodeOptions(temperatures=(0.0,)))).tokens),
                lambda: many_files(engine, loop, args))
    from streamer.model.weights import load_model

    loaded = load_model(args.model)
    if name == "transformers generate fp32":
        import transformers

        from streamer.model.weights import save_hf_checkpoint

        with tempfile.TemporaryDirectory() as d:
            save_hf_checkpoint(loaded, d)
            hf = transformers.WhisperForConditionalGeneration.from_pretrained(d, attn_implementation="sdpa").eval()
        fe = transformers.WhisperFeatureExtractor(feature_size=loaded.dims.n_mels)

        def run_hf():
            with torch.inference_mode():
                feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
                return hf.generate(feats, max_new_tokens=224).shape[1]
        return run_hf, None
    import ctranslate2
    from faster_whisper import WhisperModel

    if name.startswith("faster-whisper"):
        fw = WhisperModel(ct2_dir(args.model), device="cpu", compute_type=name.split()[-1], cpu_threads=args.threads)

        def run_fw():
            segments, _ = fw.transcribe(audio, beam_size=1, language="en", vad_filter=False, without_timestamps=True,
                                        temperature=0.0)
            return sum(len(s.tokens) for s in segments)
        return run_fw, None
    # faster-whisper's engine (CTranslate2, fp32) on our log-mel, i.e. audio padded to 30 s as
    # transformers pads it (faster-whisper pads the spectrogram instead): the same input, so the
    # same tokens, and the time per window compares like with like.
    from streamer.audio.features import log_mel_spectrogram

    ct = WhisperModel(ct2_dir(args.model), device="cpu", compute_type="float32", cpu_threads=args.threads).model
    prompt = [loaded.tokenizer.sot_sequence("en", "transcribe", timestamps=False)]

    def run_ct2():
        mel = ctranslate2.StorageView.from_array(np.ascontiguousarray(log_mel_spectrogram(audio, loaded.dims.n_mels).numpy()))
        return len(ct.generate(mel, prompt, beam_size=1, max_length=224, suppress_blank=True, suppress_tokens=[-1])[0].sequences_ids[0])
    return run_ct2, None


def many_files(engine, loop, args) -> dict:
    """Many recordings in one call share engine steps (what `streamer transcribe a b c ...` does)."""
    from streamer.audio.decode import decode_audio
    from streamer.engine.request import DecodeOptions

    clips = [decode_audio(r["path"]) for r in manifest("en")[:args.files]]

    async def together():
        return await asyncio.gather(*(engine.transcribe(c, DecodeOptions(temperatures=(0.0,))) for c in clips))

    async def one_by_one():
        return [await engine.transcribe(c, DecodeOptions(temperatures=(0.0,))) for c in clips]

    loop.run_until_complete(together())  # warm-up
    t0 = time.perf_counter()
    loop.run_until_complete(one_by_one())
    t_seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    loop.run_until_complete(together())
    t_all = time.perf_counter() - t0
    return {"files": len(clips), "audio_s": sum(len(c) for c in clips) / 16000, "one_by_one_s": t_seq,
            "together_s": t_all, "ratio": t_all / t_seq}


def worker(name: str, args, conn) -> None:
    """One system in its own process: `run` -> seconds of one transcription, `many`, `stop`."""
    import torch

    torch.set_num_threads(args.threads)
    audio, _ = window(args)
    run, many = build(name, args, audio)
    conn.send(run())  # warm-up; its token count
    while (command := conn.recv()) != "stop":
        if command == "run":
            t0 = time.perf_counter()
            run()
            conn.send(time.perf_counter() - t0)
        else:
            conn.send(many())


def main() -> None:
    from streamer.model.cpu_encoder import resolve as resolve_cpu_encoder

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--files", type=int, default=16, help="also: this many recordings at once vs one after another")
    p.add_argument("--source", choices=("long", "prompts"), default="long", help="where the window comes from")
    p.add_argument("--start", type=float, default=30.0, help="with --source long: the window's start, seconds")
    args = p.parse_args()

    context = multiprocessing.get_context("spawn")
    pipes, processes, tokens = {}, [], {}
    for name in SYSTEMS:  # one at a time: loading in parallel would only slow each other down
        parent, child = context.Pipe()
        process = context.Process(target=worker, args=(name, args, child), daemon=True)
        process.start()
        pipes[name], tokens[name] = parent, parent.recv()
        processes.append(process)
    times: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    for _ in range(args.repeat):
        for name in SYSTEMS:
            time.sleep(PAUSE_S)
            pipes[name].send("run")
            times[name].append(pipes[name].recv())
    pipes[OURS].send("many")
    many = pipes[OURS].recv()
    for name in SYSTEMS:
        pipes[name].send("stop")
    for process in processes:
        process.join(60)

    rows = []
    for name in SYSTEMS:
        ratios = [theirs / ours for theirs, ours in zip(times[name], times[OURS])]
        rows.append({"system": name, "seconds": statistics.median(times[name]), "min_s": min(times[name]),
                     "max_s": max(times[name]), "tokens": tokens[name], "ours_speedup": statistics.median(ratios)})
    audio, used = window(args)
    print(f"\n{args.model}, one {len(audio) / 16000:.1f}-s window of speech, greedy, {args.threads} threads, "
          f"{args.repeat} interleaved rounds, one process per system; median seconds; "
          "ours_speedup = median over rounds of their time / ours")
    print(table(rows, ["system", "seconds", "min_s", "max_s", "tokens", "ours_speedup"]))
    print(f"ours: the encoder in {resolve_cpu_encoder('auto')} (CPU_ENCODER=auto on this CPU)")
    print(f"\n{many['files']} recordings ({many['audio_s']:.0f} s of audio): one after another {many['one_by_one_s']:.2f} s, "
          f"all at once {many['together_s']:.2f} s (ratio {many['ratio']:.2f})")
    suffix = "" if args.source == "long" else f"_{args.source}"
    path = write_json(f"bench_cpu_{args.model}{suffix}.json", {"command": f"python benchmarks/bench_cpu.py --model {args.model} "
                      f"--threads {args.threads} --repeat {args.repeat} --source {args.source} --start {args.start:g}",
                      "environment": environment(), "ours_cpu_encoder": str(resolve_cpu_encoder("auto")),
                      "audio_files": used, "rows": rows, "many_files": many})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
