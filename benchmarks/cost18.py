"""Wall time and word errors of `accurate` as the tree has it (session 18, issue #12): run once on
the product (four transcripts, the majority) and once with the `confirmed+guard` patch
(docs/notes/accuracy18_confirmed.patch: five transcripts, the `plain` chain as backbone), on the
same machine one after the other.

    python benchmarks/cost18.py --files messy-en-8-0 --label product --out acc18_cost_product.json

(It replaces session 16's cost16.py, which timed the product with `plain` decoded beside it: since
session 18 `accurate` decodes `plain` itself. That script is in git history, 2b5fcb4.)
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import write_json

from bench_live_accuracy import recording
from vote14 import errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default="messy-en-8-0")
    parser.add_argument("--label", default="")
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
        t0 = time.perf_counter()
        transcript = asyncio.run(transcribe_accurate(engine, rec["audio"], DecodeOptions(language=rec["language"])))
        wall = round(time.perf_counter() - t0, 1)
        e, n = errors(rec["reference"], transcript.text, rec["language"])
        rows.append({"file": rec["name"], "spec": spec, "label": args.label, "wall_s": wall, "errors": e, "words": n,
                     "text": transcript.text})
        print({k: v for k, v in rows[-1].items() if k != "text"}, flush=True)
    engine.close()
    if args.out:
        print("wrote", write_json(args.out, {"model": args.model, "runs": rows}))


if __name__ == "__main__":
    main()
