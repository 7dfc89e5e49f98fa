"""Fused residual + LayerNorm (fp16 or FP8 out) against PyTorch's separate ops, in GB/s.

Default shape: Whisper large-v3's encoder at batch 16 (1500 x 16 rows, hidden 1280). Bytes are
the fewest the operation must move (each input read once, each output written once), so GB/s is
comparable with the device's copy bandwidth, measured first. `--sweep` times the kernel's
launch configurations (rows per program, warps) to back the choice in cuda_ops/layernorm.py.

    python benchmarks/bench_layernorm.py [--rows 24000] [--hidden 1280] [--dtype fp16] [--sweep]

Prints a table and writes the JSON (--out, default bench_layernorm.json) under benchmarks/results
(or $BENCH_RESULTS_DIR). Without CUDA it exits 0.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.nn import functional as F

from common import environment, write_json  # also puts the checkout on sys.path for cuda_ops

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
FP8_MAX = 448.0


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 2 GiB, bytes read plus written: the ceiling for these kernels."""
    from triton.testing import do_bench

    src = torch.empty(2**30, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=50, return_mode="median")
    return 2 * src.numel() * src.element_size() / ms / 1e6


def torch_fp8_quantize(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What a model does without a fused kernel: amax, scale, divide, cast as separate ops."""
    scale = y.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / FP8_MAX
    return (y.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1500 * 16)
    parser.add_argument("--hidden", type=int, default=1280)
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    parser.add_argument("--sweep", action="store_true", help="also time the kernel's launch configurations")
    parser.add_argument("--out", default="bench_layernorm.json", help="file name under the results directory")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA not available")
        return 0

    import triton
    from triton.testing import do_bench

    from cuda_ops import layernorm

    torch.set_grad_enabled(False)  # inference: no autograd records in the timed ops
    M, D, dtype = args.rows, args.hidden, DTYPES[args.dtype]
    size = dtype.itemsize
    torch.manual_seed(0)
    x = torch.randn(M, D, device="cuda", dtype=dtype)
    r = torch.randn(M, D, device="cuda", dtype=dtype)
    w = torch.randn(D, device="cuda", dtype=dtype)
    b = torch.randn(D, device="cuda", dtype=dtype)
    eps = 1e-5

    def torch_residual_ln():
        s = x + r
        return F.layer_norm(s, (D,), w, b, eps), s

    cases = [  # name, fn, fewest bytes moved
        ("torch  layer_norm", lambda: F.layer_norm(x, (D,), w, b, eps), 2 * M * D * size),
        ("kernel layer_norm", lambda: layernorm.layer_norm(x, w, b, eps), 2 * M * D * size),
        ("torch  add + layer_norm", torch_residual_ln, 4 * M * D * size),
        ("kernel add + layer_norm", lambda: layernorm.layer_norm(x, w, b, eps, residual=r), 4 * M * D * size),
        ("torch  add + layer_norm + fp8 quant", lambda: torch_fp8_quantize(torch_residual_ln()[0]),
         3 * M * D * size + M * D + 4 * M),
        ("kernel add + layer_norm -> fp8", lambda: layernorm.layer_norm(x, w, b, eps, residual=r, out_fp8=True),
         3 * M * D * size + M * D + 4 * M),
    ]
    copy_gbs = copy_bandwidth_gbs()
    rows = []
    for name, fn, nbytes in cases:
        fn()
        ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
        gbs = nbytes / ms / 1e6
        rows.append({"case": name, "us": ms * 1e3, "GB/s": gbs, "of_copy": gbs / copy_gbs})

    sweep = []
    if args.sweep:
        launch = layernorm.row_launch(D)
        q = torch.empty(M, D, device="cuda", dtype=torch.float8_e4m3fn)
        y, s_out = torch.empty_like(x), torch.empty_like(x)
        scale = torch.empty(M, device="cuda", dtype=torch.float32)
        for out_fp8, nbytes in ((False, cases[3][2]), (True, cases[5][2])):
            for block_m in (1, 2, 4, 8):
                for num_warps in (1, 2, 4, 8):
                    def run(block_m=block_m, num_warps=num_warps, out_fp8=out_fp8):
                        layernorm._layer_norm_kernel[(triton.cdiv(M, block_m),)](
                            x, r, s_out, w, b, q if out_fp8 else y, scale, M, D, D, D, D, D, eps,
                            HAS_RESIDUAL=True, OUT_FP8=out_fp8, SOFT_ROUND=False, BLOCK_M=block_m,
                            HEAD=launch.head, TAIL=launch.tail, num_warps=num_warps,
                        )
                    run()
                    ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                    sweep.append({"out": "fp8" if out_fp8 else args.dtype, "BLOCK_M": block_m,
                                  "num_warps": num_warps, "us": ms * 1e3, "GB/s": nbytes / ms / 1e6})

    print(f"{torch.cuda.get_device_name()}  rows={M} hidden={D} {args.dtype}  copy {copy_gbs:.0f} GB/s")
    print(f"{'case':40s} {'us':>9s} {'GB/s':>8s} {'of copy':>8s}")
    for row in rows:
        print(f"{row['case']:40s} {row['us']:9.1f} {row['GB/s']:8.0f} {row['of_copy']:8.0%}")
    for torch_row, kernel_row in zip(rows[0::2], rows[1::2]):
        print(f"speed-up {kernel_row['case'][7:]:34s} {torch_row['us'] / kernel_row['us']:5.2f}x")
    if sweep:
        print(f"sweep, add + layer_norm (chosen: BLOCK_M={launch.block_m}, num_warps={launch.num_warps}):")
        print("  out   BLOCK_M num_warps      us   GB/s")
        for s in sorted(sweep, key=lambda s: (s["out"], s["us"])):
            print(f"  {s['out']:5s} {s['BLOCK_M']:7d} {s['num_warps']:9d} {s['us']:7.1f} {s['GB/s']:6.0f}")

    print("wrote", write_json(args.out, {
        "environment": environment(), "rows": M, "hidden": D, "dtype": args.dtype,
        "copy_GB/s": copy_gbs, "cases": rows, "sweep": sweep,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
