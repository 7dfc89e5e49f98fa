"""What context each system decodes a passage in (session 16, issue #12): every window of
faster-whisper's sequential transcription and of our conditioned chain, with its start, length and
exact prompt tokens, and then the passage decoded again with the window start and the prompt of
each system swapped, by both engines.

    python benchmarks/context16.py trace --files messy-en-8-0 --out acc16_context_trace.json
    python benchmarks/context16.py swap --trace acc16_context_trace.json --file messy-en-8-0 --at 300,184 --out acc16_context_swap.json

`trace`: faster-whisper 5 beams (no VAD, conditioned, as `trace_fw.py`) with
`generate_with_fallback` and `_split_segments_by_timestamps` wrapped to record each window's prompt
and seek; our chain alone (`transcribe_accurate(vote=False)`) with `decode_window` wrapped.
`swap`: for each time in `--at`, the window of each system that holds it; that window's audio
decoded with each system's prompt and with none, by our engine (`decode_window`, 5 beams) and by
faster-whisper (`transcribe` of the 30-s slice with the prompt tokens as `initial_prompt`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from common import ct2_dir, wer, write_json

from bench_live_accuracy import recording

WINDOW_S = 30.0


def render(tokens: list[int], tok) -> str:
    """Tokens as text with timestamps written `<s.ss>` (special tokens left out)."""
    return "".join(f"<{tok.time_of(t):.2f}>" if t >= tok.timestamp_begin else tok.decode([t]) if t < tok.eot else ""
                   for t in tokens)


def trace_fw(model: str, rec: dict) -> dict:
    """faster-whisper's windows: seek (s), length (s), prompt tokens (after `<|startofprev|>`),
    output tokens, temperature; and its transcript."""
    from faster_whisper import WhisperModel

    fw = WhisperModel(ct2_dir(model), device="cpu", compute_type="float32", cpu_threads=1)
    windows: list[dict] = []
    generate, split = fw.generate_with_fallback, fw._split_segments_by_timestamps

    def generate_traced(encoder_output, prompt, tokenizer, options):
        out = generate(encoder_output, prompt, tokenizer, options)
        sot = prompt.index(tokenizer.sot)
        windows.append({"prompt": prompt[1:sot] if prompt[0] == tokenizer.sot_prev else [], "tokens": out[0].sequences_ids[0],
                        "temperature": out[2], "avg_logprob": round(out[1], 3), "no_speech": round(out[0].no_speech_prob, 3)})
        return out

    def split_traced(*, tokenizer, tokens, time_offset, segment_size, segment_duration, seek):
        windows[-1].update(start_s=round(time_offset, 2), length_s=round(segment_duration, 2))
        return split(tokenizer=tokenizer, tokens=tokens, time_offset=time_offset, segment_size=segment_size,
                     segment_duration=segment_duration, seek=seek)

    fw.generate_with_fallback, fw._split_segments_by_timestamps = generate_traced, split_traced
    t0 = time.perf_counter()
    segments, _ = fw.transcribe(rec["audio"], beam_size=5, language=rec["language"], vad_filter=False,
                                condition_on_previous_text=True)
    segments = list(segments)
    text = "".join(s.text for s in segments)
    return {"system": "fw-beam5", "wall_s": round(time.perf_counter() - t0, 1), "text": text,
            "wer_%": wer([rec["reference"]], [text], rec["language"]), "windows": windows,
            "segments": [(round(s.start, 2), round(s.end, 2), s.text) for s in segments]}


def trace_ours(engine, rec: dict) -> dict:
    """Our conditioned chain's windows (`transcribe_accurate(vote=False)`), as `trace_fw`."""
    from streamer.engine.request import SAMPLE_RATE, DecodeOptions
    from streamer.longform import accurate

    windows: list[dict] = []
    base = rec["audio"].__array_interface__["data"][0]
    original = accurate.decode_window

    async def traced(engine_, audio, options, *, started):
        result = await original(engine_, audio, options, started=started)
        offset = (audio.__array_interface__["data"][0] - base) // audio.itemsize
        windows.append({"start_s": round(offset / SAMPLE_RATE, 2), "length_s": round(len(audio) / SAMPLE_RATE, 2),
                        "prompt": list(options.prompt_tokens or ()), "tokens": list(result.tokens),
                        "temperature": result.temperature, "avg_logprob": round(result.avg_logprob, 3),
                        "no_speech": round(result.no_speech_prob, 3)})
        return result

    accurate.decode_window = traced
    try:
        t0 = time.perf_counter()
        transcript = asyncio.run(accurate.transcribe_accurate(engine, rec["audio"], DecodeOptions(language=rec["language"]),
                                                              vote=False))
    finally:
        accurate.decode_window = original
    return {"system": "acc", "wall_s": round(time.perf_counter() - t0, 1), "text": transcript.text,
            "wer_%": wer([rec["reference"]], [transcript.text], rec["language"]), "windows": windows,
            "segments": [(round(s.start, 2), round(s.end, 2), s.text) for s in transcript.segments]}


def holding(windows: list[dict], at: float) -> dict:
    """The last window that starts at or before `at` seconds."""
    return [w for w in windows if w.get("start_s", 1e9) <= at][-1]


def swap(model: str, engine, rec: dict, systems: dict[str, dict], at: float) -> list[dict]:
    """The window of each system holding `at`, decoded with each system's prompt and none, by both engines."""
    import numpy as np
    from faster_whisper import WhisperModel

    from streamer.engine.request import SAMPLE_RATE, DecodeOptions
    from streamer.longform.decode import decode_window

    tok = engine.tokenizer
    fw = WhisperModel(ct2_dir(model), device="cpu", compute_type="float32", cpu_threads=1)
    prompts = {name: holding(s["windows"], at)["prompt"] for name, s in systems.items()} | {"none": []}
    rows = []
    for start_name, s in systems.items():
        start = holding(s["windows"], at)["start_s"]
        audio = rec["audio"][round(start * SAMPLE_RATE):round((start + WINDOW_S) * SAMPLE_RATE)]
        for prompt_name, prompt in prompts.items():
            options = DecodeOptions(language=rec["language"], timestamps=True, beam_size=5,
                                    prompt_tokens=tuple(prompt[-223:]) or None)
            ours = asyncio.run(decode_window(engine, audio, options, started=True))
            fw_segments, _ = fw.transcribe(np.ascontiguousarray(audio), beam_size=5, language=rec["language"],
                                           vad_filter=False, initial_prompt=list(prompt[-223:]) or None)
            fw_tokens = [t for seg in fw_segments for t in seg.tokens]
            rows.append({"at_s": at, "window_from": start_name, "start_s": start, "prompt_from": prompt_name,
                         "prompt_tokens": len(prompt[-223:]), "prompt_tail": render(prompt[-40:], tok),
                         "ours": render(ours.tokens, tok), "fw": render(fw_tokens, tok)})
            print(json.dumps({k: rows[-1][k] for k in ("at_s", "window_from", "start_s", "prompt_from", "prompt_tokens")}))
            print("   ours:", rows[-1]["ours"])
            print("   fw:  ", rows[-1]["fw"], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["trace", "swap"])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default="messy-en-8-0")
    parser.add_argument("--trace", default="acc16_context_trace.json")
    parser.add_argument("--file", default="messy-en-8-0")
    parser.add_argument("--at", default="300")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    engine = Engine.load(ModelConfig(model=args.model, device="cpu"), load_settings({"MODEL_ID": args.model}).engine)
    tok = engine.tokenizer
    if args.command == "trace":
        runs = []
        for spec in args.files.split(","):
            rec = recording(spec)
            for run in (trace_fw(args.model, rec), trace_ours(engine, rec)):
                for w in run["windows"]:
                    w["prompt_text"], w["text"] = render(w["prompt"], tok), render(w["tokens"], tok)
                runs.append({"file": rec["name"], "spec": spec, **run})
                print(rec["name"], run["system"], f"{run['wer_%']:.2f}", run["wall_s"], "s", flush=True)
        print("wrote", write_json(args.out or "acc16_context_trace.json", {"model": args.model, "runs": runs}))
    else:
        rec = recording(args.file)
        from pathlib import Path
        trace = json.loads((Path(__file__).parent / "results" / args.trace).read_text())
        systems = {r["system"]: r for r in trace["runs"] if r["spec"] == args.file}
        rows = [row for at in args.at.split(",") for row in swap(args.model, engine, rec, systems, float(at))]
        if args.out:
            print("wrote", write_json(args.out, {"model": args.model, "file": args.file, "rows": rows}))
    engine.close()


if __name__ == "__main__":
    main()
