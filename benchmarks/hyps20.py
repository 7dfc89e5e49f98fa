"""The `plain` chain again, with each segment's window start saved (session 20, issue #12).

    python benchmarks/hyps20.py --model tiny.en --files messy-en-8-3 --out acc20_plain_seeks_tiny.json

hyps14.py caches (start, end, text) per segment; rescoring a disputed phrase in the window where
the backbone decoded it (rescore20.py, `ob`/`op`) needs the window: `TranscriptSegment.seek`. The
chain is `_sequential(by_speech=False)` as `accurate` runs it (hyps14.CHAINS['plain']); segments are
saved as (window start s, start, end, text). Deterministic: the text is checked against the cached
`plain` of the same file where `--check` names the cache.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import write_json

from bench_live_accuracy import recording
from hyps14 import chain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default="messy-en-8-3")
    parser.add_argument("--out", default="acc20_plain_seeks.json")
    args = parser.parse_args()

    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions

    import rescore20

    cached = rescore20.load()
    settings = load_settings({"MODEL_ID": args.model})
    engine = Engine.load(ModelConfig(model=args.model, device="cpu"), settings.engine)
    rows = []
    for spec in args.files.split(","):
        rec = recording(spec)
        options = DecodeOptions(language=rec["language"], beam_size=1)
        t0 = time.perf_counter()
        transcript = asyncio.run(chain(engine, rec["audio"], options, by_speech=False))
        segments = [(s.seek / 100, round(s.start, 2), round(s.end, 2), s.text) for s in transcript.segments]
        old = cached.get(rec["name"], {}).get("plain")
        same = old is not None and [t for *_, t in old] == [t for *_, t in segments]
        rows.append({"file": rec["name"], "spec": spec, "system": "plain", "wall_s": round(time.perf_counter() - t0, 1),
                     "same_as_cached": same, "text": transcript.text, "segments": segments})
        print(spec, rows[-1]["wall_s"], "s, same as cached:", same, flush=True)
        write_json(args.out, {"model": args.model, "runs": rows})
    engine.close()


if __name__ == "__main__":
    main()
