"""CPU speed on one 30-s window of real speech: ours vs transformers' generate vs faster-whisper.

Same weights (tiny.en from its CTranslate2 bundle; transformers gets them through a Hugging Face
directory we write), same audio, greedy, fp32 (faster-whisper int8 as well, for reference),
2 threads. Times exclude model loading; each is the median of --repeat runs after one warm-up.

    python benchmarks/bench_cpu.py [--model tiny.en] [--threads 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from common import concat, ct2_dir, environment, manifest, table, write_json


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
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from streamer.config import EngineConfig
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.model.weights import load_model, save_hf_checkpoint

    audio, used = concat([r["path"] for r in manifest("en")[40:]], 29.0)
    loaded = load_model(args.model)
    engine = Engine(loaded, EngineConfig(max_slots=4))
    loop = asyncio.new_event_loop()

    def run_ours():
        return loop.run_until_complete(engine.transcribe(audio, DecodeOptions(temperatures=(0.0,))))

    rows = []
    t, r = timed(run_ours, args.repeat)
    n_tokens = len(r.tokens)
    rows.append({"system": "streamer (ours) fp32", "seconds": t, "tokens": n_tokens})

    # Many recordings in one call share engine steps (what `streamer transcribe a b c ...` does).
    from streamer.audio.decode import decode_audio

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

    import transformers

    with tempfile.TemporaryDirectory() as d:
        save_hf_checkpoint(loaded, d)
        hf = transformers.WhisperForConditionalGeneration.from_pretrained(d, attn_implementation="sdpa").eval()
    fe = transformers.WhisperFeatureExtractor(feature_size=loaded.dims.n_mels)

    def run_hf():
        with torch.inference_mode():
            feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
            return hf.generate(feats, max_new_tokens=224)

    t, out = timed(run_hf, args.repeat)
    rows.append({"system": "transformers generate fp32", "seconds": t, "tokens": out.shape[1]})

    from faster_whisper import WhisperModel

    for compute in ("float32", "int8"):
        fw = WhisperModel(ct2_dir(args.model), device="cpu", compute_type=compute, cpu_threads=args.threads)

        def run_fw():
            segs, _ = fw.transcribe(audio, beam_size=1, language="en", vad_filter=False, without_timestamps=True,
                                    temperature=0.0)
            return [s for s in segs]

        t, segs = timed(run_fw, args.repeat)
        rows.append({"system": f"faster-whisper {compute}", "seconds": t, "tokens": sum(len(s.tokens) for s in segs)})

    ours = rows[0]["seconds"]
    for r in rows:
        r["ours_speedup"] = r["seconds"] / ours
    print(f"\n{args.model}, one {len(audio) / 16000:.1f}-s window of speech, greedy, {args.threads} threads, "
          f"median of {args.repeat}; ours_speedup = their time / ours")
    print(table(rows, ["system", "seconds", "tokens", "ours_speedup"]))
    print(f"\n{many['files']} recordings ({many['audio_s']:.0f} s of audio): one after another {many['one_by_one_s']:.2f} s, "
          f"all at once {many['together_s']:.2f} s (ratio {many['ratio']:.2f})")
    path = write_json(f"bench_cpu_{args.model}.json", {"command": f"python benchmarks/bench_cpu.py --model {args.model} "
                      f"--threads {args.threads} --repeat {args.repeat}", "environment": environment(),
                      "audio_files": used, "rows": rows, "many_files": many})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
