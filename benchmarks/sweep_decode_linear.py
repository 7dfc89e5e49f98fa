"""The decode step's linears: our split-K GEMM (cuda_ops/decode_linear.py) against cuBLAS, per weight
shape and row count, on a CUDA GPU; writes a launch table (the engine takes it with
STREAMER_DECODE_LINEAR=<its path>). On the H200 (session 16) cuBLAS won nearly everywhere: see
cuda_ops/decode_linear.py and docs/benchmarks.md.

Each measurement is a CUDA graph of 32 calls, each with its own weight (as the 32 layers of a
large-v3 step: weights come from HBM, not L2), replayed; µs per call (the median of 10 replays;
session 16's run took the mean). cuBLAS is F.linear, and for
fc1 F.linear then our GELU kernel (what the step ran before). Every candidate launch is checked
against the fp32 reference first. A (shape, rows) goes to the kernel only where its best launch is
at least MARGIN faster than cuBLAS; the table maps each row count up to the next measured one.

    python benchmarks/sweep_decode_linear.py --widths 1280 --rows 1,8,32,64,128,256 \
        --out sweep_decode_linear_h200.json --table decode_linear_table.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import torch.nn.functional as F

from bench_attention import capture, replay_us
from common import environment, table, write_json

MARGIN = 0.97
LAYERS = 32


def shapes(d: int) -> list[tuple[str, int, int, bool]]:
    """(site, N, K, gelu) of a decoder block of width d."""
    return [("qkv", 3 * d, d, False), ("attn_out/cross_q/cross_out", d, d, False), ("fc1+gelu", 4 * d, d, True),
            ("fc2", d, 4 * d, False)]


def candidates(m: int, k: int):
    from cuda_ops.decode_linear import GemmLaunch
    import triton

    bm0 = min(128, max(16, triton.next_power_of_2(m)))
    for bm, bn, bk, split in itertools.product(sorted({bm0, min(bm0, 64)}), (32, 64), (64, 128), (1, 2, 4, 8, 16)):
        if split <= triton.cdiv(k, bk):
            yield GemmLaunch(bm, bn, bk, split, 4, 3)


def per_call_us(fn) -> float:
    """µs per call of fn(i) for i in range(LAYERS), captured in one graph (bench_attention's)."""
    calls = [lambda i=i: fn(i) for i in range(LAYERS)]
    return replay_us(capture(calls), calls, reps=10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", default="1280")
    p.add_argument("--rows", default="1,8,32,64,128,256")
    p.add_argument("--out", default="sweep_decode_linear.json")
    p.add_argument("--table", default="decode_linear_table.json", help="where the launch table goes (a path)")
    args = p.parse_args()
    from cuda_ops.decode_linear import decode_linear_reference, decode_linear_triton
    from cuda_ops.fp8 import bias_gelu

    rows_list = [int(x) for x in args.rows.split(",")]
    result = {"command": f"python benchmarks/sweep_decode_linear.py --widths {args.widths} --rows {args.rows}",
              "environment": environment(), "margin": MARGIN, "rows": []}
    table_out: dict[str, list[list[int]]] = {}
    t0 = time.time()
    torch.manual_seed(0)
    for d in (int(x) for x in args.widths.split(",")):
        for site, n, k, gelu in shapes(d):
            ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5 for _ in range(LAYERS)]
            bs = [torch.randn(n, device="cuda", dtype=torch.float16) for _ in range(LAYERS)]
            entries = []
            for m in rows_list:
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(LAYERS)]
                ref = decode_linear_reference(x, ws[0], bs[0], gelu).float()

                def cublas(i):
                    y = F.linear(x, ws[i], bs[i])
                    return bias_gelu(y, None) if gelu else y

                base = per_call_us(cublas)
                best, best_us, tried = None, float("inf"), 0
                for launch in candidates(m, k):
                    got = decode_linear_triton(x, ws[0], bs[0], gelu, launch).float()
                    if not torch.allclose(got, ref, rtol=2e-2, atol=2e-2):
                        raise AssertionError(f"{site} {m} rows {launch}: max error {(got - ref).abs().max():.3g}")
                    us = per_call_us(lambda i: decode_linear_triton(x, ws[i], bs[i], gelu, launch, out=outs[i]))
                    tried += 1
                    if us < best_us:
                        best, best_us = launch, us
                row = {"width": d, "site": site, "N": n, "K": k, "rows": m, "cublas_us": base, "ours_us": best_us,
                       "speedup": base / best_us, "launch": list(best), "tried": tried,
                       "floor_us": 1e6 * (n * k * 2) / 4.27e12}
                result["rows"].append(row)
                entries.append([m, *best] if best_us < MARGIN * base else [m])
                print(f"{d} {site:<28} {m:>4} rows: cuBLAS {base:7.2f} µs, ours {best_us:7.2f} µs ({base / best_us:4.2f}x) "
                      f"{tuple(best)} [{tried} launches, {time.time() - t0:.0f} s]", flush=True)
            table_out[f"{n},{k}"] = entries
    print(table(result["rows"], ["width", "site", "rows", "cublas_us", "ours_us", "speedup", "floor_us", "launch"]))
    with open(args.table, "w") as f:
        json.dump(table_out, f, indent=1)
    print(f"wrote {args.table}")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
