"""Where `accurate` spends an engine's time with many recordings at once (the GPU's `accurate`
uploads are engine-bound: core busy 0.94-0.98 at 32 uploads, session 18/19): N recordings of
`bench_uploads.py`'s set through `transcribe_accurate` in one process: audio seconds per second,
engine steps (admission steps, mean rows) and their host time, encoder passes against distinct
windows, the share of step rows in beam groups; run it under `py-spy record --threads
-f raw` for where that time goes (the vote shares this interpreter: the server's core does not).

    python benchmarks/profile_accurate.py --device cuda --model tiny.en --uploads 32 --files 8 --minutes 2
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time

import numpy as np

from bench_uploads import batch, recordings
from common import environment, write_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--device", default="cpu")
    p.add_argument("--uploads", type=int, default=32)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--minutes", type=float, default=2.0)
    p.add_argument("--out", default="profile_accurate.json")
    args = p.parse_args()

    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.longform.accurate import transcribe_accurate

    files = batch(recordings(args.files, args.minutes, shared=True), args.uploads)
    engine = Engine.load(ModelConfig(model=args.model, device=args.device), load_settings({"MODEL_ID": args.model}).engine)
    runner = engine.runner
    calls = []
    execute = runner.execute

    windows = collections.Counter()  # encoder passes per distinct window (a sample of its audio: cheap in the timed loop)
    beam_rows = []  # per step: (rows in beam groups, all rows), before it runs

    def timed(plan):
        for r in plan.encode:
            windows[(len(r.audio), np.asarray(r.audio)[::160].tobytes())] += 1
        beam_rows.append((sum(s.group is not None for s in runner.slots), len(runner.slots)))
        t0 = time.perf_counter()
        res = execute(plan)
        calls.append((len(plan.encode), len(plan.decode), time.perf_counter() - t0))
        return res

    async def all_of(recs):
        return await asyncio.gather(*(transcribe_accurate(engine, r.audio, DecodeOptions(language="en")) for r in recs))

    asyncio.run(all_of(files[:2]))  # warm-up
    runner.execute = timed
    t0 = time.perf_counter()
    asyncio.run(all_of(files))
    wall = time.perf_counter() - t0
    runner.execute = execute
    engine.close()
    audio = sum(r.seconds for r in files)
    row = {"model": args.model, "device": args.device, "uploads": args.uploads, "audio_s": audio, "wall_s": wall,
           "audio_s_per_s": audio / wall, "steps": len(calls), "execute_s": sum(c[2] for c in calls),
           "admission_steps": sum(1 for c in calls if c[0]), "mean_rows": sum(c[1] for c in calls) / max(1, len(calls)),
           "encoder_windows": sum(windows.values()), "distinct_windows": len(windows),
           "beam_row_share": sum(b for b, _ in beam_rows) / max(1, sum(n for _, n in beam_rows))}
    print(row, flush=True)
    write_json(args.out, {"environment": environment(), "rows": [row]})


if __name__ == "__main__":
    main()
