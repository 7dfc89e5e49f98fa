"""Hypotheses of one recording from our own engine, cached as JSON for offline combination rules
(session 14, issue #12): text and segments (start, end, text) per file and system.

    python benchmarks/hyps14.py --model tiny.en --files messy-en-8-0 --systems unprompted,fast,fast-b5 --out h.json

Systems: `accurate` (the conditioned chain alone, `vote=False`: main before session 14),
`accurate-vote` (what `accurate` does since session 14: the chain, voted on), `unprompted` (the same sequential seek and 5 beams,
every window decoded without the previous-text prompt: `accurate.decode_window` wrapped to drop
`prompt_tokens`), `fast` (greedy) and `fast-b5` (fast's windows, 5 beams); since session 16 also
`plain` (the conditioned chain with its windows cut as openai/whisper cuts them, `CHAINS`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

from common import table, wer, write_json

from bench_live_accuracy import recording


CHAINS = {"plain": {"by_speech": False}}
"""Conditioned chains measured on their own, as `_sequential`'s options (session 16)."""


async def chain(engine, audio, options, **kw):
    """A conditioned chain (`_sequential` with the options `kw`), joined into a transcript."""
    from streamer.engine.request import SAMPLE_RATE
    from streamer.longform.accurate import _sequential
    from streamer.longform.speech import find_speech
    from streamer.longform.transcript import join

    speech = await asyncio.to_thread(find_speech, audio)
    windows, language = await _sequential(engine, audio, speech, options, options.language, **kw)
    return join(windows, language=language, duration=len(audio) / SAMPLE_RATE, task=options.task)


def main(doc: str = __doc__, files: str = "messy-en-8-1", systems: str = "unprompted,fast,fast-b5",
         out: str = "hyps14.json") -> None:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default=files)
    parser.add_argument("--systems", default=systems)
    parser.add_argument("--out", default=out)
    args = parser.parse_args()

    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.longform import accurate, transcribe_long
    from streamer.longform.accurate import transcribe_accurate

    settings = load_settings({"MODEL_ID": args.model})
    engine = Engine.load(ModelConfig(model=args.model, device="cpu"), settings.engine)
    original = accurate.decode_window

    async def unprompted(engine_, audio, options, *, started):
        return await original(engine_, audio, dataclasses.replace(options, prompt_tokens=None), started=started)

    rows = []
    for spec in args.files.split(","):
        rec = recording(spec)
        for system in args.systems.split(","):
            accurate.decode_window = unprompted if system == "unprompted" else original
            mode = "fast" if system.startswith("fast") else "accurate"
            options = DecodeOptions(language=rec["language"], beam_size=5 if system == "fast-b5" else 1)
            t0 = time.perf_counter()
            if system in CHAINS:
                transcript = asyncio.run(chain(engine, rec["audio"], options, **CHAINS[system]))
            elif mode == "accurate":
                transcript = asyncio.run(transcribe_accurate(engine, rec["audio"], options, vote=system == "accurate-vote"))
            else:
                transcript = asyncio.run(transcribe_long(engine, rec["audio"], mode=mode, options=options))
            rows.append({"file": rec["name"], "spec": spec, "system": system, "run": 0,
                         "wer_%": wer([rec["reference"]], [transcript.text], rec["language"]),
                         "wall_s": round(time.perf_counter() - t0, 1), "text": transcript.text,
                         "segments": [(round(s.start, 2), round(s.end, 2), s.text) for s in transcript.segments]})
            print(table(rows[-1:], ["file", "system", "wer_%", "wall_s"]), flush=True)
            write_json(args.out, {"model": args.model, "runs": rows})
    accurate.decode_window = original
    engine.close()
    print("wrote", write_json(args.out, {"model": args.model, "runs": rows}))


if __name__ == "__main__":
    main()
