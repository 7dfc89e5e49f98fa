"""Host time per call of the ops an eager prefill runs (the `accurate` engine thread spends a quarter
of its time in small eager prefills, session 20's py-spy): cuBLAS linears at a repeated shape and at
row counts it has not seen (its heuristics are looked up per new shape), our Triton LayerNorm, K/V
write and GELU launches against PyTorch's ops. Calls are queued back to back and timed to the last
one's completion, so with kernels this small the time is the host's launch cost.

    python benchmarks/probe_launch.py [--width 384] [--calls 200]

Needs CUDA. Prints a table and writes benchmarks/results/probe_launch.json.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from common import environment, table, write_json
from cuda_ops.decode_linear import _bucketed_linear, bucket_sizes
from cuda_ops.fp8 import bias_gelu
from cuda_ops.kv_write import write_kv_triton
from cuda_ops.layernorm import layer_norm_triton


def per_call_us(fn, calls: int) -> float:
    fn(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=384)  # tiny.en
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    d, n = args.width, args.calls
    dev, dt = "cuda", torch.float16
    w1, b1 = torch.randn(4 * d, d, device=dev, dtype=dt) / 30, torch.randn(4 * d, device=dev, dtype=dt)
    w2, b2 = torch.randn(2 * d, d, device=dev, dtype=dt) / 30, torch.randn(2 * d, device=dev, dtype=dt)  # never warmed
    ln_w, ln_b = torch.ones(d, device=dev, dtype=dt), torch.zeros(d, device=dev, dtype=dt)
    x = torch.randn(8, 40, d, device=dev, dtype=dt)
    r = torch.randn_like(x)
    big = torch.randn(1400, d, device=dev, dtype=dt)
    h = torch.randn(8, 40, 4 * d, device=dev, dtype=dt)
    heads = d // 64
    cache = torch.zeros(64, heads, 448, 64, device=dev, dtype=dt)
    kv = torch.randn(8, 40, heads, 64, device=dev, dtype=dt)
    rows = torch.arange(8, device=dev)[:, None].expand(8, 40)
    pos = torch.arange(40, device=dev)[None].expand(8, 40)
    w3, b3 = torch.randn(3 * d, d, device=dev, dtype=dt) / 30, torch.randn(3 * d, device=dev, dtype=dt)  # never warmed
    w4 = torch.randn(5 * d, d, device=dev, dtype=dt) / 30  # never warmed
    fresh, fresh3, fresh4 = (iter(range(1, 10 ** 6)) for _ in range(3))

    for m in bucket_sizes(1300):  # the buckets, warmed
        F.linear(big[:m], w3, b3)
    cases = {
        "F.linear, one shape [320, d]": lambda i: F.linear(x, w1, b1),
        "F.linear, a new row count each call": lambda i: F.linear(big[: 1 + next(fresh) % 1199], w2, b2),
        "F.linear, row counts seen before": lambda i: F.linear(big[: 1 + i % 1199], w1, b1),
        "x @ w.t() (no bias), a new row count each call": lambda i: big[: 1 + next(fresh4) % 1199] @ w4.t(),
        "padded to a bucket (warmed), new row counts": lambda i: _bucketed_linear(big[: 1 + next(fresh3) % 1199], w3, b3),
        "layer_norm_triton, residual": lambda i: layer_norm_triton(x, ln_w, ln_b, 1e-5, residual=r),
        "F.layer_norm(x + r)": lambda i: F.layer_norm(x + r, (d,), ln_w, ln_b),
        "bias_gelu (Triton)": lambda i: bias_gelu(h, None),
        "F.gelu": lambda i: F.gelu(h),
        "write_kv_triton": lambda i: write_kv_triton(kv, kv, cache, cache, rows, pos),
        "index_put K and V": lambda i: (cache.__setitem__((rows, slice(None), pos), kv),
                                        cache.__setitem__((rows, slice(None), pos), kv)),
    }
    for i in range(1, 1200):  # "seen before": every row count once, untimed
        F.linear(big[:i], w1, b1)
    if os.environ.get("DISABLE_ADDMM_CUDA_LT"):
        print("DISABLE_ADDMM_CUDA_LT =", os.environ["DISABLE_ADDMM_CUDA_LT"])
    out = [{"op": name, "us_per_call": round(per_call_us(fn, n), 1)} for name, fn in cases.items()]
    print(table(out, ["op", "us_per_call"]))
    write_json("probe_launch.json", {"command": f"python benchmarks/probe_launch.py --width {d} --calls {n}",
                                     "environment": environment(), "rows": out})


if __name__ == "__main__":
    main()
