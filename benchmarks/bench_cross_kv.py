"""Cross-attention K/V into an FP8 cache at admission: the projection with a quantising epilogue
(cuda_ops/cross_kv.py) against cuBLAS + the quantisation it replaces.

Per decoder layer, one encoder batch of windows (x [B, 1500, d_model] -> K, V [B, H, 1500, 64] e4m3 +
scales), each variant under a CUDA graph (triton.testing.do_bench_cudagraph median):
  cublas_fp16         F.linear alone, fp16 out (the matmul ceiling on this shape; no cache written)
  cublas+quantize_kv  what write_cross_kv did before: F.linear, then quantize_kv per (slot, head)
                      with torch ops (amax, divide, clamp, cast) and copies into the cache
  cublas+tile_quant   F.linear, then cross_kv.py's kernel without the GEMM (one read, one write)
  fused bn/bk/w/s     cross_kv.py's GEMM with the epilogue, launch (BLOCK_N, BLOCK_K, warps, stages)
TFLOP/s counts the matmul only (2 x B x 1500 x d_model x 2 d_model). Error: relative Frobenius norm
of the dequantised cache against the fp32 projection.

    python benchmarks/bench_cross_kv.py [--batch 16] [--shape large-v3|tiny] [--out bench_cross_kv.json]
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F

from common import environment, table, write_json  # also puts the checkout on sys.path for cuda_ops

SHAPES = {"large-v3": (1280, 20), "tiny": (384, 6)}  # d_model, heads (head dim 64)
T = 1500
LAUNCHES = [  # (BLOCK_N, BLOCK_K, num_warps, num_stages): the default first
    (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 4),
    (64, 64, 4, 3), (64, 64, 4, 4), (128, 32, 4, 4), (64, 32, 4, 5),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="windows per encoder batch (the engine's max_encoder_batch)")
    p.add_argument("--shape", default="large-v3", choices=sorted(SHAPES))
    p.add_argument("--out", default="bench_cross_kv.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("CUDA not available")
        return 0
    from triton.testing import do_bench_cudagraph

    from cuda_ops.attention import SCALE_TILE, dequantize_kv, quantize_kv
    from cuda_ops.cross_kv import write_cross_kv_fp8_triton

    torch.set_grad_enabled(False)
    d_model, H = SHAPES[args.shape]
    B, Dh, dev = args.batch, d_model // H, "cuda"
    torch.manual_seed(0)
    x = torch.randn(B, T, d_model, device=dev, dtype=torch.float16)
    lin = torch.nn.Linear(d_model, 2 * d_model, device=dev, dtype=torch.float16)
    tiles = -(-T // SCALE_TILE)
    k8, v8 = (torch.empty(B, H, T, Dh, device=dev, dtype=torch.float8_e4m3fn) for _ in range(2))
    ks, vs = (torch.empty(B, H, tiles, device=dev) for _ in range(2))
    ks_head, vs_head = (torch.empty(B, H, device=dev) for _ in range(2))
    y32 = (x.float() @ lin.weight.float().t() + lin.bias.float()).view(B, T, 2, H, Dh).permute(2, 0, 3, 1, 4)
    tflop = 2 * B * T * d_model * 2 * d_model / 1e12

    def old():
        k, v = (t.view(B, T, H, Dh).transpose(1, 2) for t in F.linear(x, lin.weight, lin.bias).chunk(2, dim=-1))
        (k8[:], ks_head[:]), (v8[:], vs_head[:]) = quantize_kv(k), quantize_kv(v)

    def tile_quant():
        write_cross_kv_fp8_triton(F.linear(x, lin.weight, lin.bias), None, None, k8, v8, ks, vs)

    def error(tiled: bool) -> float:
        sk, sv = (ks, vs) if tiled else (ks_head, vs_head)
        back = torch.stack([dequantize_kv(k8, sk), dequantize_kv(v8, sv)])
        return (torch.linalg.vector_norm(back - y32) / torch.linalg.vector_norm(y32)).item()

    variants = [("cublas_fp16", lambda: F.linear(x, lin.weight, lin.bias), None),
                ("cublas+quantize_kv", old, False), ("cublas+tile_quant", tile_quant, True)]
    for bn, bk, w, s in LAUNCHES:
        def fused(bn=bn, bk=bk, w=w, s=s):
            write_cross_kv_fp8_triton(x, lin.weight, lin.bias, k8, v8, ks, vs, block_n=bn, block_k=bk,
                                      num_warps=w, num_stages=s)
        variants.append((f"fused {bn}/{bk}/{w}/{s}", fused, True))

    rows = []
    for name, fn, tiled in variants:
        try:
            fn()
            torch.cuda.synchronize()
            us = do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
            err = None if tiled is None else error(tiled)
            rows.append({"variant": name, "us": round(us, 1), "TFLOP/s": round(tflop / us * 1e6, 1),
                         "rel_err": None if err is None else round(err, 5)})
        except Exception as e:  # one launch failing (e.g. out of shared memory) must not lose the rest
            rows.append({"variant": name, "us": None, "TFLOP/s": None, "rel_err": None, "error": repr(e)[:200]})
        print(rows[-1], flush=True)
    print(f"\ncross K/V of {B} windows, {args.shape} (d_model {d_model}, H {H}), one layer; CUDA graphs")
    print(table(rows, ["variant", "us", "TFLOP/s", "rel_err"]))
    print("wrote", write_json(args.out, {"environment": environment(), "shape": args.shape, "batch": B, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
