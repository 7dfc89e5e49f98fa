"""Per-window trace of `accurate` on the issue-12 files: every decoded window (start, length, prompt
length, temperature, verdict, text with its timestamps) and the WER per file, into one JSON.

    python benchmarks/trace_accurate.py --model tiny.en --files messy-en-8-1,6min --out trace.json

The conditioned chain alone (`transcribe_accurate(vote=False)`, `accurate` before session 14);
`--vote` runs `accurate` as the product does (the same code path as `bench_live_accuracy.py
--offline accurate`), and the trace then holds the windows of both of its chains, interleaved. Only
`decode_window` is wrapped to record what it returned.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import table, wer, write_json

from bench_live_accuracy import recording


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default="messy-en-8-1")
    parser.add_argument("--out", default="trace_accurate.json")
    parser.add_argument("--vote", action="store_true", help="accurate with its vote (the product)")
    args = parser.parse_args()

    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine
    from streamer.engine.request import SAMPLE_RATE, DecodeOptions
    from streamer.longform import accurate

    settings = load_settings({"MODEL_ID": args.model})
    engine = Engine.load(ModelConfig(model=args.model, device="cpu"), settings.engine)
    tok = engine.tokenizer
    windows: list[dict] = []
    base = [0]  # address of the recording's first sample: a window's audio is a view into it
    original = accurate.decode_window

    async def traced(engine_, audio, options, *, started):
        result = await original(engine_, audio, options, started=started)
        parts = []
        for t in result.tokens:
            parts.append(f"<{tok.time_of(t):.2f}>" if t >= tok.timestamp_begin else tok.decode([t]) if t < tok.eot else "")
        offset = (audio.__array_interface__["data"][0] - base[0]) // audio.itemsize
        windows.append({"start_s": round(offset / SAMPLE_RATE, 2), "length_s": round(len(audio) / SAMPLE_RATE, 2),
                        "prompt": len(options.prompt_tokens or ()), "prefix": len(options.prefix_tokens or ()), "temperature": result.temperature,
                        "avg_logprob": round(result.avg_logprob, 3), "no_speech": round(result.no_speech_prob, 3),
                        "verdict": {k: v for k, v in vars(result.verdict).items() if v and k != "temperature"},
                        "text": "".join(parts)})
        return result

    accurate.decode_window = traced
    rows = []
    for spec in args.files.split(","):
        rec = recording(spec)
        windows.clear()
        base[0] = rec["audio"].__array_interface__["data"][0]
        t0 = time.perf_counter()
        transcript = asyncio.run(accurate.transcribe_accurate(engine, rec["audio"], DecodeOptions(language=rec["language"]),
                                                              vote=args.vote))
        text = transcript.text
        rows.append({"file": rec["name"], "system": "accurate-vote" if args.vote else "accurate", "run": 0,
                     "wer_%": wer([rec["reference"]], [text], rec["language"]),
                     "wall_s": round(time.perf_counter() - t0, 1), "windows": len(windows), "text": text,
                     "segments": [(round(s.start, 2), round(s.end, 2), s.text) for s in transcript.segments],
                     "trace": list(windows)})
        print(table(rows[-1:], ["file", "system", "wer_%", "wall_s", "windows"]), flush=True)
        write_json(args.out, {"model": args.model, "runs": rows})
    engine.close()
    print("wrote", write_json(args.out, {"model": args.model, "runs": rows}))


if __name__ == "__main__":
    main()
