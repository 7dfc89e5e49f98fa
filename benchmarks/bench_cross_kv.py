"""Cross-attention K/V into an FP8 cache at admission: cuBLAS + the quantise pass (the default), the
Triton GEMM with the quantising epilogue (A/B), and what they replace (cuda_ops/cross_kv.py).

Per decoder layer, one encoder batch of windows (x [B, 1500, d_model] -> K, V [B, H, 1500, 64] e4m3 +
scales [B, H, 12]), each variant under a CUDA graph (triton.testing.do_bench_cudagraph median):
  cublas_fp16            F.linear alone, fp16 out (the matmul ceiling on this shape; no cache written)
  cublas+quantize_kv     what write_cross_kv did first: F.linear, then quantize_kv per (slot, head)
                         with torch ops (amax, divide, clamp, cast) and copies into the cache
  cublas+quant           F.linear, then the quantise pass (the engine's path, default launch)
  quant hN/wW            the quantise pass alone on the projection (N heads a program, W warps):
                         against its floor, one read of the fp16 projection + one write of the codes
                         and scales at the measured copy bandwidth
  fused bn/bk/w/s        the GEMM with the epilogue, launch (BLOCK_N, BLOCK_K, warps, stages)
TFLOP/s counts the matmul only (2 x B x 1500 x d_model x 2 d_model). Error: relative Frobenius norm
of the dequantised cache against the fp32 projection; `exact`: codes and scales equal to the
pure-PyTorch reference's (quantise pass) on the GPU.

    python benchmarks/bench_cross_kv.py [--batch 16] [--shape large-v3|tiny] [--out bench_cross_kv.json]

BENCH_DRY=1: a dry run on the CPU (Triton's interpreter, one window of a small shape, one timed
call per variant, copy bandwidth taken as 1 GB/s): checks the script, measures nothing.
"""

from __future__ import annotations

import argparse
import os
import time

DRY = os.environ.get("BENCH_DRY", "") not in ("", "0")
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before cuda_ops is imported

import torch
from torch.nn import functional as F

from common import environment, table, write_json  # also puts the checkout on sys.path for cuda_ops

SHAPES = {"large-v3": (1280, 20), "tiny": (384, 6), "dry": (128, 2)}  # d_model, heads (head dim 64)
T = 300 if DRY else 1500
QUANT_LAUNCHES = [(2, 8), (1, 4), (2, 4), (1, 8), (4, 8)]  # (heads per program, warps): the default first
GEMM_LAUNCHES = [  # (BLOCK_N, BLOCK_K, num_warps, num_stages): the default first
    (128, 64, 8, 3), (128, 64, 8, 4), (256, 64, 8, 3), (128, 64, 4, 4), (64, 64, 4, 4), (256, 32, 8, 4),
]


def copy_bandwidth_gbps() -> float:
    """Device-to-device copy of 2 GiB: bytes read + written per second (as bench_attention.py)."""
    if DRY:
        return 1.0
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    del src, dst
    return 2 * (1 << 30) * 2 / ms / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="windows per encoder batch (the engine's max_encoder_batch)")
    p.add_argument("--shape", default="large-v3", choices=sorted(SHAPES))
    p.add_argument("--out", default="bench_cross_kv.json")
    p.add_argument("--no-gemm", action="store_true", help="skip the fused GEMM launches")
    args = p.parse_args()
    if DRY:
        args.batch, args.shape = 1, "dry"

        def do_bench_cudagraph(fn, rep, return_mode):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    elif not torch.cuda.is_available():
        print("CUDA not available")
        return 0
    else:
        from triton.testing import do_bench_cudagraph

    from cuda_ops.attention import SCALE_TILE, dequantize_kv, quantize_kv
    from cuda_ops.cross_kv import cross_kv_fp8_reference, write_cross_kv_fp8, write_cross_kv_fp8_triton

    torch.set_grad_enabled(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    copy_gbps = copy_bandwidth_gbps()
    d_model, H = SHAPES[args.shape]
    B, Dh, dev = args.batch, d_model // H, "cpu" if DRY else "cuda"
    torch.manual_seed(0)
    x = torch.randn(B, T, d_model, device=dev, dtype=torch.float16)
    lin = torch.nn.Linear(d_model, 2 * d_model, device=dev, dtype=torch.float16)
    tiles = -(-T // SCALE_TILE)
    k8, v8 = (torch.empty(B, H, T, Dh, device=dev, dtype=torch.float8_e4m3fn) for _ in range(2))
    ks, vs = (torch.empty(B, H, tiles, device=dev) for _ in range(2))
    ks_head, vs_head = (torch.empty(B, H, device=dev) for _ in range(2))
    y16 = F.linear(x, lin.weight, lin.bias)  # the projection the quantise pass reads
    y32 = (x.float() @ lin.weight.float().t() + lin.bias.float()).view(B, T, 2, H, Dh).permute(2, 0, 3, 1, 4)
    ref = cross_kv_fp8_reference(y16, None, None, H)
    tflop = 2 * B * T * d_model * 2 * d_model / 1e12
    quant_bytes = B * T * 2 * d_model * (2 + 1) + 2 * B * H * tiles * 4  # fp16 read, e4m3 written, scales
    quant_floor_us = quant_bytes / copy_gbps / 1e3

    def old():
        k, v = (t.view(B, T, H, Dh).transpose(1, 2) for t in F.linear(x, lin.weight, lin.bias).chunk(2, dim=-1))
        (k8[:], ks_head[:]), (v8[:], vs_head[:]) = quantize_kv(k), quantize_kv(v)

    def engine_path():  # streamer.model.whisper.TextDecoder.write_cross_kv with cross_kv_epilogue=0
        write_cross_kv_fp8(F.linear(x, lin.weight, lin.bias), None, None, k8, v8, ks, vs)

    def error(tiled: bool) -> float:
        sk, sv = (ks, vs) if tiled else (ks_head, vs_head)
        back = torch.stack([dequantize_kv(k8, sk), dequantize_kv(v8, sv)])
        return (torch.linalg.vector_norm(back - y32) / torch.linalg.vector_norm(y32)).item()

    def exact() -> bool:
        return all(torch.equal(a.float(), b.float()) for a, b in zip((k8, v8, ks, vs), ref))

    variants = [("cublas_fp16", lambda: F.linear(x, lin.weight, lin.bias), None, "gemm"),
                ("cublas+quantize_kv", old, False, "gemm"), ("cublas+quant", engine_path, True, "gemm")]
    for hp, w in QUANT_LAUNCHES:
        if H % hp == 0:
            variants.append((f"quant h{hp}/w{w}", lambda hp=hp, w=w: write_cross_kv_fp8_triton(
                y16, None, None, k8, v8, ks, vs, heads=hp, num_warps=w), True, "quant"))
    for bn, bk, w, s in ([] if args.no_gemm else GEMM_LAUNCHES):
        def fused(bn=bn, bk=bk, w=w, s=s):
            write_cross_kv_fp8_triton(x, lin.weight, lin.bias, k8, v8, ks, vs, block_n=bn, block_k=bk,
                                      num_warps=w, num_stages=s)
        variants.append((f"fused {bn}/{bk}/{w}/{s}", fused, True, "gemm"))

    rows = []
    for name, fn, tiled, kind in variants:
        try:
            for t in (k8, v8):
                t.view(torch.uint8).fill_(0x7F)  # NaN poison: a variant must write everything
            for t in (ks, vs):
                t.fill_(float("nan"))
            fn()
            if not DRY:
                torch.cuda.synchronize()
            err = None if tiled is None else error(tiled)
            ok = exact() if kind == "quant" or name == "cublas+quant" else None
            us = do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
            row = {"variant": name, "us": round(us, 1), "TFLOP/s": round(tflop / us * 1e6, 1),
                   "rel_err": None if err is None else round(err, 5), "exact": ok}
            if kind == "quant":
                row.update({"GB/s": round(quant_bytes / us / 1e3), "floor_us": round(quant_floor_us, 1),
                            "pct_of_floor": round(100 * quant_floor_us / us, 1)})
                row["TFLOP/s"] = None
            rows.append(row)
        except Exception as e:  # one launch failing (e.g. out of shared memory) must not lose the rest
            rows.append({"variant": name, "us": None, "TFLOP/s": None, "rel_err": None, "error": repr(e)[:200]})
        print(rows[-1], flush=True)
    by = {r["variant"]: r for r in rows}
    gemm_us = by["cublas_fp16"]["us"]
    summary = {"copy_GBps": round(copy_gbps), "quant_bytes": quant_bytes, "quant_floor_us": round(quant_floor_us, 1),
               "cublas_us": gemm_us, "floor_cublas_plus_quant_us": round(gemm_us + quant_floor_us, 1) if gemm_us else None,
               "engine_path_us": by["cublas+quant"]["us"],
               "gemm_tflops_needed_to_beat_engine_path": round(tflop / by["cublas+quant"]["us"] * 1e6)
               if by["cublas+quant"]["us"] else None}
    fused = [r for r in rows if r["variant"].startswith("fused") and r.get("us")]
    if fused:
        best = min(fused, key=lambda r: r["us"])
        summary["best_fused"] = best["variant"]
        summary["best_fused_us"] = best["us"]
        summary["fused_beats_engine_path"] = bool(summary["engine_path_us"] and best["us"] < summary["engine_path_us"])
    print(f"\ncross K/V of {B} windows, {args.shape} (d_model {d_model}, H {H}), one layer; CUDA graphs; "
          f"copy {copy_gbps:.0f} GB/s")
    print(table(rows, ["variant", "us", "TFLOP/s", "GB/s", "pct_of_floor", "rel_err", "exact"]))
    print("summary:", summary)
    print("wrote", write_json(args.out, {"environment": environment(), "shape": args.shape, "batch": B,
                                        "summary": summary, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
