"""Probe on a CUDA GPU (issue 15): does a decode step of R rows run faster as two independent steps of
R/2 rows on two streams? A full_fp16 step at 256 large-v3 rows is ~14 ms of cuDNN cross-attention,
which reads at full bandwidth on half the SMs (probe_sm_bandwidth.py), and ~3 ms of latency-bound
GEMMs, LayerNorms and self-attention. Two half-batches side by side could hide one half's small
kernels under the other's cross-attention, at the price of reading the decoder's weights twice.

Two engines of R/2 slots each (random weights of the shape, their own copies) stand in for the two
halves: each step graph is captured as the engine captures it, then the two are replayed on two
streams (K replays each) and timed against one engine's R-row step, made and closed first.

    python benchmarks/probe_two_halves.py --tokenizer T.json --shape large-v3 --preset full_fp16 --rows 256,128
"""

from __future__ import annotations

import argparse
import gc

import torch

from bench_engine import random_model
from common import environment, table, write_json
from probe_green import cuda_ms

K = 20


def engine_of(shape: str, tokenizer: str, preset: str, slots: int):
    from streamer.config import EngineConfig
    from streamer.engine.engine import Engine

    return Engine(random_model(shape, tokenizer), EngineConfig(max_slots=slots, max_encoder_batch=1), precision=preset)


def step_graph(engine, rows: int):
    runner = engine.runner
    return runner._graph(runner.bucket(rows))[0]


def side_by_side(a, b) -> float:
    """ms per pair of steps: K replays of `a` on one stream beside K of `b` on another."""
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    start, end1, end2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        start.record(torch.cuda.current_stream())
        s1.wait_event(start)
        s2.wait_event(start)
        with torch.cuda.stream(s1):
            for _ in range(K):
                a.replay()
            end1.record(s1)
        with torch.cuda.stream(s2):
            for _ in range(K):
                b.replay()
            end2.record(s2)
        torch.cuda.synchronize()
        best = min(best, max(start.elapsed_time(end1), start.elapsed_time(end2)) / K)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--shape", default="large-v3")
    p.add_argument("--preset", default="full_fp16")
    p.add_argument("--rows", default="256,128")
    p.add_argument("--out", default="probe_two_halves.json")
    args = p.parse_args()
    rows = []
    with torch.inference_mode():
        for r in (int(x) for x in args.rows.split(",")):
            whole = engine_of(args.shape, args.tokenizer, args.preset, r)
            one_ms = cuda_ms(step_graph(whole, r).replay, None, K)
            whole.close()
            del whole
            gc.collect()
            torch.cuda.empty_cache()
            print(f"after the {r}-row engine: {torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated", flush=True)
            halves = [engine_of(args.shape, args.tokenizer, args.preset, r // 2) for _ in range(2)]
            ga, gb = (step_graph(e, r // 2) for e in halves)
            half_ms = cuda_ms(ga.replay, None, K)
            pair_ms = side_by_side(ga, gb)
            for e in halves:
                e.close()
            del halves, ga, gb
            gc.collect()
            torch.cuda.empty_cache()
            row = {"rows": r, "one_step_ms": one_ms, "half_step_ms": half_ms, "two_halves_one_after_other_ms": 2 * half_ms,
                   "two_halves_side_by_side_ms": pair_ms, "side_by_side_vs_one": pair_ms / one_ms}
            print(row, flush=True)
            rows.append(row)
    print(table(rows, list(rows[0])))
    write_json(args.out, {"command": f"python benchmarks/probe_two_halves.py --shape {args.shape} --preset {args.preset} "
                                     f"--rows {args.rows}", "environment": environment(), "rows": rows})


if __name__ == "__main__":
    main()
