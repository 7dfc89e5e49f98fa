"""Wall time of `accurate` (the product: four transcripts and the vote) alone and with the fifth
hypothesis (`plain`, hyps16.py) decoded alongside it in the same engine (session 16, issue #12):
what the fifth task would add on this CPU (the vote itself takes about 0.1 s).

    python benchmarks/cost16.py --files messy-en-8-0 --out acc16_cost_tiny.json
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import write_json

from bench_live_accuracy import recording
from hyps14 import CHAINS, chain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default="messy-en-8-0")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.longform.accurate import transcribe_accurate

    engine = Engine.load(ModelConfig(model=args.model, device="cpu"), load_settings({"MODEL_ID": args.model}).engine)
    rows = []
    for spec in args.files.split(","):
        rec = recording(spec)
        options = DecodeOptions(language=rec["language"])

        async def product():
            return await transcribe_accurate(engine, rec["audio"], options)

        async def with_plain():
            return await asyncio.gather(product(), chain(engine, rec["audio"], options, **CHAINS["plain"]))

        for system, run in (("accurate", product), ("accurate+plain", with_plain)):
            t0 = time.perf_counter()
            asyncio.run(run())
            rows.append({"file": rec["name"], "spec": spec, "system": system, "wall_s": round(time.perf_counter() - t0, 1)})
            print(rows[-1], flush=True)
    engine.close()
    if args.out:
        print("wrote", write_json(args.out, {"model": args.model, "runs": rows}))


if __name__ == "__main__":
    main()
