"""Host time of one beam group's step on the engine thread: `BeamGroup.select` over the group's top
candidates, then the sampler fields the runner sends to the device for each new beam.

    python benchmarks/bench_beam.py [--beams 5] [--length 80] [--steps 20000]

Pure Python (no model, no GPU): the part of a beam search step that runs once per group per step and
made `accurate` host-bound on the H200 (session 19's py-spy). Prints microseconds per group step and
writes benchmarks/results/bench_beam.json. Session 20's change (no sequence keys, the last timestamp
carried) measured 18.4 -> 7.4 us at 5 beams of 80 tokens on this machine's CPU.
"""

from __future__ import annotations

import argparse
import random
import time

from common import environment, table, write_json
from streamer.engine.beam import TOPK, BeamGroup, Hypothesis

EOT, TIMESTAMP_BEGIN, VOCAB = 50256, 50364, 51864


def group_step_us(beams: int, length: int, steps: int, seed: int = 0) -> float:
    rng = random.Random(seed)
    group = BeamGroup(beams, EOT, 224, timestamp_begin=TIMESTAMP_BEGIN)
    current = [Hypothesis([rng.randrange(EOT) for _ in range(length)] + [i], -rng.random()) for i in range(beams)]
    lps = [sorted((-3 * rng.random() for _ in range(TOPK)), reverse=True) for _ in range(beams)]
    ids = [rng.sample(range(VOCAB), TOPK) for _ in range(beams)]
    t0 = time.perf_counter()
    for _ in range(steps):
        group.finished.clear()
        fields = [[len(b.tokens), b.tokens[-1], b.tokens[-2], b.last_timestamp] for b in group.select(current, lps, ids)]
    assert len(fields) == beams
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--beams", default="2,5")
    p.add_argument("--length", default="20,80,200")
    p.add_argument("--steps", type=int, default=20000)
    args = p.parse_args()
    rows = [{"beams": b, "tokens": n, "us_per_group_step": round(group_step_us(b, n, args.steps), 2)}
            for b in map(int, args.beams.split(",")) for n in map(int, args.length.split(","))]
    print(table(rows, ["beams", "tokens", "us_per_group_step"]))
    write_json("bench_beam.json", {"command": "python benchmarks/bench_beam.py", "environment": environment(), "rows": rows})


if __name__ == "__main__":
    main()
