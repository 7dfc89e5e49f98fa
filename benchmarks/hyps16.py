"""A fifth hypothesis for `accurate`'s vote, cached as hyps14.py caches the other four (session 16,
issue #12): the conditioned chain with its windows cut as openai/whisper and faster-whisper cut them
(`_sequential(by_speech=False)`, `plain`), text and segments per file; and `accurate-vote`, the
product as the tree runs it. (`late`, in commit b2467cb only: the chain cut by the VAD with a
window's last segment decoded again at the start of the next window when it ended within 5 s of
the window's end; negative on messy-en-8-0, removed.)

    python benchmarks/hyps16.py --model tiny.en --files messy-en-8-0 --systems plain --out acc16_hyps_tiny.json

Systems: `plain` (the chain alone, 5 beams, conditioned),
`accurate-vote` (`transcribe_accurate()`, whatever the tree's default vote is), `accurate` (the
chain cut by the VAD, `vote=False`).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import table, wer, write_json

from bench_live_accuracy import recording


CHAINS = {"plain": {"by_speech": False}}
"""The conditioned chains measured, as `_sequential`'s options."""


async def chain(engine, audio, options, **kw):
    """A conditioned chain (`_sequential` with the options `kw`), joined into a transcript."""
    from streamer.engine.request import SAMPLE_RATE
    from streamer.longform.accurate import _sequential
    from streamer.longform.speech import find_speech
    from streamer.longform.transcript import join

    speech = await asyncio.to_thread(find_speech, audio)
    windows, language = await _sequential(engine, audio, speech, options, options.language, **kw)
    return join(windows, language=language, duration=len(audio) / SAMPLE_RATE, task=options.task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default="messy-en-8-0")
    parser.add_argument("--systems", default="plain")
    parser.add_argument("--out", default="hyps16.json")
    args = parser.parse_args()

    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.longform.accurate import transcribe_accurate

    settings = load_settings({"MODEL_ID": args.model})
    engine = Engine.load(ModelConfig(model=args.model, device="cpu"), settings.engine)
    rows = []
    for spec in args.files.split(","):
        rec = recording(spec)
        for system in args.systems.split(","):
            options = DecodeOptions(language=rec["language"])
            t0 = time.perf_counter()
            if system in CHAINS:
                transcript = asyncio.run(chain(engine, rec["audio"], options, **CHAINS[system]))
            else:
                transcript = asyncio.run(transcribe_accurate(engine, rec["audio"], options, vote=system == "accurate-vote"))
            rows.append({"file": rec["name"], "spec": spec, "system": system, "run": 0,
                         "wer_%": wer([rec["reference"]], [transcript.text], rec["language"]),
                         "wall_s": round(time.perf_counter() - t0, 1), "text": transcript.text,
                         "segments": [(round(s.start, 2), round(s.end, 2), s.text) for s in transcript.segments]})
            print(table(rows[-1:], ["file", "system", "wer_%", "wall_s"]), flush=True)
            write_json(args.out, {"model": args.model, "runs": rows})
    engine.close()
    print("wrote", write_json(args.out, {"model": args.model, "runs": rows}))


if __name__ == "__main__":
    main()
