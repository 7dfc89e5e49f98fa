"""faster-whisper's sequential transcription (same CTranslate2 weights, no VAD, conditioned) with
every segment's window (seek), times, temperature and scores, for comparing windows with
`trace_accurate.py`.

    python benchmarks/trace_fw.py --model tiny.en --files messy-en-8-1 --beam 5 --out fw_trace.json
"""

from __future__ import annotations

import argparse
import os
import time

from common import ct2_dir, table, wer, write_json

from bench_live_accuracy import recording


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default="messy-en-8-1")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CTranslate2 CPU threads")
    parser.add_argument("--out", default="trace_fw.json")
    args = parser.parse_args()

    from faster_whisper import WhisperModel

    fw = WhisperModel(ct2_dir(args.model), device="cpu", compute_type="float32", cpu_threads=args.threads)
    rows = []
    for spec in args.files.split(","):
        rec = recording(spec)
        t0 = time.perf_counter()
        segments, _ = fw.transcribe(rec["audio"], beam_size=args.beam, language=rec["language"], vad_filter=False,
                                    condition_on_previous_text=True)
        segments = list(segments)
        text = "".join(s.text for s in segments)
        rows.append({"file": rec["name"], "system": f"fw-beam{args.beam}", "run": 0,
                     "wer_%": wer([rec["reference"]], [text], rec["language"]), "wall_s": round(time.perf_counter() - t0, 1),
                     "text": text, "segments": [(round(s.seek / 100, 2), round(s.start, 2), round(s.end, 2), s.temperature,
                                                 round(s.avg_logprob, 3), s.text) for s in segments]})
        print(table(rows[-1:], ["file", "system", "wer_%", "wall_s"]), flush=True)
    print("wrote", write_json(args.out, {"model": args.model, "runs": rows}))


if __name__ == "__main__":
    main()
