"""One captured decode step, kernel by kernel, per preset (issue 15), on a CUDA GPU.

The engine's CUDA graph for R rows (random weights of a shape, every row at position P, so that
self-attention reads P + 1 positions as in the middle of a 2P-token window) is replayed alone:
its time (mean of 50 replays, CUDA events), its launches per step, and its kernels grouped by
`profile_engine.kind_of`, the top ones by name. Launch count is what the per-step overhead above
the floor follows (each kernel in a graph costs ~2-3 µs beyond its bytes and FLOPs).

    python benchmarks/profile_step.py --tokenizer T.json --shape large-v3 --presets full_fp16,mixed_fp8 \
        --rows 128,256 --out profile_step.json
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from bench_engine import random_model
from common import environment, table, write_json
from probe_green import cuda_ms, step_kernels
from profile_engine import kind_of, short_name


def profile(runner, rows: int, position: int) -> dict:
    b = runner.bucket(rows)
    graph = runner._graph(b)[0]
    runner.positions[:b] = position  # self-attention over position + 1 keys (each replay adds one)
    ms = cuda_ms(graph.replay, None, 50)
    runner.positions[:b] = position
    kernels = step_kernels(graph, 5)
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, us, count in kernels:
        by_kind[kind_of(name)][0] += us
        by_kind[kind_of(name)][1] += count
    return {"rows": rows, "bucket": b, "position": position, "step_ms": ms,
            "launches": sum(c for _, _, c in kernels), "kernel_us": sum(us for _, us, _ in kernels),
            "by_kind": {k: {"us": v[0], "launches": v[1]} for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1][0])},
            "top": [[short_name(n), us, c] for n, us, c in kernels[:20]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--shape", default="large-v3")
    p.add_argument("--presets", default="full_fp16,mixed_fp8")
    p.add_argument("--rows", default="128,256")
    p.add_argument("--position", type=int, default=50)
    p.add_argument("--out", default="profile_step.json")
    args = p.parse_args()
    from streamer.config import EngineConfig
    from streamer.engine.engine import Engine

    rows = [int(x) for x in args.rows.split(",")]
    result = {"command": f"python benchmarks/profile_step.py --shape {args.shape} --presets {args.presets} "
                         f"--rows {args.rows} --position {args.position}", "environment": environment(), "runs": []}
    loaded = random_model(args.shape, args.tokenizer)
    for preset in args.presets.split(","):
        engine = Engine(loaded, EngineConfig(max_slots=max(rows), max_encoder_batch=16), precision=preset)
        with torch.inference_mode():
            for r in rows:
                run = {"preset": preset, **profile(engine.runner, r, args.position)}
                result["runs"].append(run)
                print(f"\n== {args.shape} {preset}, {r} rows at position {args.position}: {run['step_ms']:.3f} ms, "
                      f"{run['launches']:.0f} launches, {run['kernel_us']:.0f} µs of kernels", flush=True)
                print(table([{"kind": k, "µs": f"{v['us']:.1f}", "launches": f"{v['launches']:.0f}"}
                             for k, v in run["by_kind"].items()], ["kind", "µs", "launches"]))
                for name, us, c in run["top"]:
                    print(f"  {us:8.1f} µs {c:4.0f}x  {name[:110]}")
        engine.close()
        torch.cuda.empty_cache()
    write_json(args.out, result)


if __name__ == "__main__":
    main()
