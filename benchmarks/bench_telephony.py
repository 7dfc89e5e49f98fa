"""WER of the same recordings as 16-kHz PCM and as 8-kHz telephone audio (G.711 μ-law, A-law).

Each recording (16 kHz after decoding) is band-limited to 8 kHz by libswresample, encoded with
`streamer.audio.g711`, and brought back to 16 kHz through the server's own live-stream path
(`StreamResampler(8000, 1, "mulaw")`, as `/v1/stream` with `encoding: "mulaw"` does); `pcm_8k`
is the 8-kHz step alone (band limit without companding). Every condition is transcribed whole
by the engine (greedy with the temperature fallback, no VAD), as `benchmarks/wer.py` does.

    python benchmarks/bench_telephony.py --model tiny.en            # JSON to results/telephony_tiny.en.json
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
from common import environment, manifest, table, telephone_bytes, wer, write_json

CONDITIONS = ("pcm_16k", "pcm_8k", "mulaw_8k", "alaw_8k")


def telephone(audio: np.ndarray, condition: str) -> np.ndarray:
    """16-kHz float audio -> what the server hands the engine for `condition`."""
    from streamer.audio.decode import StreamResampler

    if condition == "pcm_16k":
        return audio
    encoding = "pcm_s16le" if condition == "pcm_8k" else condition.split("_")[0]
    up = StreamResampler(8000, 1, encoding)
    return np.concatenate([up.push(telephone_bytes(audio, encoding)), up.flush()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--language", default="en")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--limit", type=int, default=None, help="first N recordings only")
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    args = parser.parse_args()

    from streamer.audio.decode import decode_audio
    from streamer.config import ModelConfig
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions

    rows = [r for r in manifest(args.language) if r["duration"] <= 30][: args.limit]
    originals = [decode_audio(r["path"]) for r in rows]
    references = [r["text"] for r in rows]
    engine = Engine.load(ModelConfig(model=args.model, device=args.device))
    options = DecodeOptions(language=args.language)
    out = []
    for condition in args.conditions.split(","):
        audios = [telephone(a, condition) for a in originals]

        async def run():
            return await asyncio.gather(*(engine.transcribe(a, options) for a in audios))

        t0 = time.perf_counter()
        results = asyncio.run(run())
        elapsed = time.perf_counter() - t0
        texts = [r.text for r in results]
        out.append({"condition": condition, "wer_pct": round(wer(references, texts, args.language), 2),
                    "recordings": len(rows), "minutes": round(sum(len(a) for a in originals) / 16000 / 60, 1),
                    "wall_s": round(elapsed, 1), "texts": texts})
        print(f"{condition}: WER {out[-1]['wer_pct']:.2f} % ({elapsed:.0f} s)", flush=True)
        path = write_json(f"telephony_{args.model}.json", {"model": args.model, "language": args.language,
                                                           "environment": environment(), "results": out})
    engine.close()
    print(table(out, ["condition", "wer_pct", "recordings", "minutes", "wall_s"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
