"""When `accurate`'s voted segments reach `on_segments` (session 15): per recording, the wall time of
the first and of each batch of segments against the whole run, the audio they reach, and the text
against session 14's product run (`acc14_product_*.json`, `accurate-vote`).

    python benchmarks/stream15.py --model tiny.en --files messy-en-8-0 --out acc15_stream_tiny.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from common import write_json

from bench_live_accuracy import recording
from vote14 import RESULTS, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default="messy-en-8-0")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.longform import transcribe_long

    before = {}
    for path in RESULTS.glob("acc14_product*.json"):
        for r in json.loads(path.read_text())["runs"]:
            if r["system"] == "accurate-vote":
                before[r["file"]] = r["text"]
    settings = load_settings({"MODEL_ID": args.model})
    engine = Engine.load(ModelConfig(model=args.model, device="cpu"), settings.engine)
    rows = []
    for spec in args.files.split(","):
        rec = recording(spec)
        batches, t0 = [], time.perf_counter()
        progress = []

        def on_segments(segments, t0=t0, batches=batches):
            batches.append((round(time.perf_counter() - t0, 1), round(segments[-1].end, 1), len(segments)))

        def on_progress(f, t0=t0, progress=progress):
            progress.append((round(time.perf_counter() - t0, 1), round(f, 2)))

        transcript = asyncio.run(transcribe_long(engine, rec["audio"], mode="accurate", on_segments=on_segments,
                                                 options=DecodeOptions(language=rec["language"]), on_progress=on_progress))
        wall = round(time.perf_counter() - t0, 1)
        e, n = errors(rec["reference"], transcript.text, rec["language"])
        row = {"file": rec["name"], "spec": spec, "wall_s": wall, "audio_s": round(len(rec["audio"]) / 16000, 1),
               "errors": e, "words": n, "same_text_as_session_14": before.get(rec["name"]) == transcript.text,
               "first_segments_s": batches[0][0] if batches else None, "batches": batches, "progress": progress}
        rows.append(row)
        print({k: v for k, v in row.items() if k not in ("batches", "progress")}, flush=True)
        print("  (wall s, audio s reached, segments):", batches, flush=True)
        if args.out:
            write_json(args.out, {"model": args.model, "rows": rows})
    engine.close()


if __name__ == "__main__":
    main()
