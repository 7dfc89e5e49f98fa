"""FP8 linears at Whisper encoder-FFN shapes: where FP8 pays and where quantisation eats it.

Shapes: M = 1500 x 16 tokens (large-v3 encoder, batch 16), d_model 1280, FFN 5120.
1. GEMMs (fc1: K=1280 -> N=5120, fc2: 5120 -> 1280), TFLOP/s counting only the matmul:
   fp16 F.linear; _scaled_mm on pre-quantised e4m3 (row-wise scales); FP8Linear on fp16 input
   quantised by separate torch ops (amax, divide, cast); FP8Linear with the one-pass Triton quantiser.
2. The encoder-FFN block, residual add + LayerNorm + fc1 + GELU + fc2, captured in a CUDA graph:
   torch fp16 ops; fp16 with the fused kernels; the FP8 chain
   LN(->fp8) -> fc1 -> bias_gelu_quant(->fp8) -> fc2. Also its error against fp32.
3. Decode-sized GEMMs (M = 16, 64: one token per live sequence), where the weights dominate.
`--sweep` times the bias+GELU+quant kernel's launch configurations.

    python benchmarks/bench_fp8.py [--batch 16] [--sweep] [--out bench_fp8.json]

Prints a table and writes the JSON under benchmarks/results (or $BENCH_RESULTS_DIR).
Without CUDA it exits 0.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.nn import functional as F

from common import environment, write_json  # also puts the checkout on sys.path for cuda_ops

D_MODEL, D_FFN, WINDOW_TOKENS = 1280, 5120, 1500
FP8_MAX = 448.0


def torch_fp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Separate torch ops, as a model without fused kernels would do it."""
    scale = x.abs().amax(dim=-1).float().clamp_min(1e-12) / FP8_MAX
    return (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.double(), expected.double()
    return (torch.linalg.vector_norm(a - e) / torch.linalg.vector_norm(e)).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="30-s windows per encoder batch")
    parser.add_argument("--sweep", action="store_true", help="also time bias_gelu_quant launch configurations")
    parser.add_argument("--out", default="bench_fp8.json", help="file name under the results directory")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA not available")
        return 0

    import triton
    from triton.testing import do_bench, do_bench_cudagraph

    from cuda_ops import fp8, layernorm

    torch.set_grad_enabled(False)  # inference: no autograd records in the timed ops

    def time_us(fn, graph: bool = False) -> float:
        fn()  # compile and warm up outside the timed region (and outside graph capture)
        torch.cuda.synchronize()
        if graph:
            return do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3
        return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3

    M = WINDOW_TOKENS * args.batch
    torch.manual_seed(0)
    dev, f16 = "cuda", torch.float16
    fc1 = torch.nn.Linear(D_MODEL, D_FFN, device=dev, dtype=f16)
    fc2 = torch.nn.Linear(D_FFN, D_MODEL, device=dev, dtype=f16)
    q_fc1, q_fc2 = fp8.FP8Linear.from_linear(fc1), fp8.FP8Linear.from_linear(fc2)
    ln_w = (1 + 0.1 * torch.randn(D_MODEL, device=dev)).to(f16)
    ln_b = (0.1 * torch.randn(D_MODEL, device=dev)).to(f16)
    resid = torch.randn(M, D_MODEL, device=dev, dtype=f16)
    attn_out = torch.randn(M, D_MODEL, device=dev, dtype=f16)

    # 1. GEMMs
    gemms = []
    for name, lin, q_lin in (("fc1", fc1, q_fc1), ("fc2", fc2, q_fc2)):
        K, N = lin.in_features, lin.out_features
        x = torch.randn(M, K, device=dev, dtype=f16)
        x_q, x_s = fp8.quantize_rows(x)
        tflop = 2 * M * K * N / 1e12
        variants = {
            "fp16 F.linear": lambda: F.linear(x, lin.weight, lin.bias),
            "fp8 _scaled_mm (pre-quantised)": lambda: q_lin((x_q, x_s)),
            "fp8 torch-op quant + _scaled_mm": lambda: q_lin(torch_fp8_quantize(x)),
            "fp8 triton quant + _scaled_mm": lambda: q_lin(x),
        }
        for variant, fn in variants.items():
            us = time_us(fn)
            gemms.append({"gemm": f"{name} {M}x{K}x{N}", "variant": variant, "us": us, "TFLOP/s": tflop / us * 1e6})

    # 2. the encoder-FFN block
    def block_torch_fp16():
        s = resid + attn_out
        y = F.layer_norm(s, (D_MODEL,), ln_w, ln_b, 1e-5)
        return fc2(F.gelu(fc1(y))), s

    def block_kernels_fp16():
        y, s, _ = layernorm.layer_norm(attn_out, ln_w, ln_b, 1e-5, residual=resid)
        h = F.linear(y, fc1.weight)
        return fc2(fp8.bias_gelu(h, fc1.bias)), s

    def block_fp8():
        y_q, s, y_s = layernorm.layer_norm(attn_out, ln_w, ln_b, 1e-5, residual=resid, out_fp8=True)
        return fp8.ffn_fp8((y_q, y_s), q_fc1, q_fc2), s

    s32 = resid.float() + attn_out.float()
    y32 = F.layer_norm(s32, (D_MODEL,), ln_w.float(), ln_b.float(), 1e-5)
    expected = F.linear(F.gelu(F.linear(y32, fc1.weight.float(), fc1.bias.float())), fc2.weight.float(),
                        fc2.bias.float())
    block_flop = 2 * 2 * M * D_MODEL * D_FFN / 1e12
    blocks = []
    for name, fn in (("torch fp16 ops", block_torch_fp16), ("fp16 + fused kernels", block_kernels_fp16),
                     ("fp8 fused chain", block_fp8)):
        us = time_us(fn, graph=True)
        blocks.append({"block": name, "us": us, "TFLOP/s": block_flop / us * 1e6,
                       "rel_err_vs_fp32": rel_error(fn()[0], expected)})
    del expected, y32, s32

    # 3. decode-sized GEMMs (fc1 shape): fp16 against FP8 with a fused producer
    decode = []
    for rows in (16, 64, 256):
        x = torch.randn(rows, D_MODEL, device=dev, dtype=f16)
        x_q, x_s = fp8.quantize_rows(x)
        for variant, fn in (("fp16 F.linear", lambda: F.linear(x, fc1.weight, fc1.bias)),
                            ("fp8 (pre-quantised)", lambda: q_fc1((x_q, x_s)))):
            decode.append({"rows": rows, "variant": variant, "us": time_us(fn, graph=True)})

    # 4. the row-wise kernels alone, in GB/s of the fewest bytes they must move
    h = torch.randn(M, D_FFN, device=dev, dtype=f16)
    x = torch.randn(M, D_MODEL, device=dev, dtype=f16)
    gelu_fp16_bytes, gelu_fp8_bytes, quant_bytes = 4 * M * D_FFN, 3 * M * D_FFN + 4 * M, 3 * M * D_MODEL + 4 * M
    elementwise = []
    for name, fn, nbytes in (
        ("torch  bias + gelu (fp16)", lambda: F.gelu(h + fc1.bias), gelu_fp16_bytes),
        ("kernel bias_gelu (fp16)", lambda: fp8.bias_gelu(h, fc1.bias), gelu_fp16_bytes),
        ("torch  bias + gelu + fp8 quant", lambda: torch_fp8_quantize(F.gelu(h + fc1.bias)), gelu_fp8_bytes),
        ("kernel bias_gelu_quant", lambda: fp8.bias_gelu_quant(h, fc1.bias), gelu_fp8_bytes),
        ("torch  fp8 quant [M, 1280]", lambda: torch_fp8_quantize(x), quant_bytes),
        ("kernel quantize_rows [M, 1280]", lambda: fp8.quantize_rows(x), quant_bytes),
    ):
        us = time_us(fn)
        elementwise.append({"case": name, "us": us, "GB/s": nbytes / us / 1e3})

    sweep = []
    launch = fp8.row_launch(D_FFN)
    if args.sweep:
        q = torch.empty(M, D_FFN, device=dev, dtype=torch.float8_e4m3fn)
        scale = torch.empty(M, device=dev, dtype=torch.float32)
        nbytes = M * D_FFN * 3 + 4 * M
        for block_m in (1, 2, 4):
            for num_warps in (2, 4, 8, 16):
                def run(block_m=block_m, num_warps=num_warps):
                    fp8._bias_gelu_kernel[(triton.cdiv(M, block_m),)](
                        h, fc1.bias, q, scale, M, D_FFN, D_FFN, D_FFN, HAS_BIAS=True, QUANTIZE=True,
                        SOFT_ROUND=False, BLOCK_M=block_m, HEAD=launch.head, TAIL=launch.tail, num_warps=num_warps,
                    )
                us = time_us(run)
                sweep.append({"BLOCK_M": block_m, "num_warps": num_warps, "us": us, "GB/s": nbytes / us / 1e3})

    print(f"{torch.cuda.get_device_name()}  M={M} (batch {args.batch}), d_model {D_MODEL}, ffn {D_FFN}")
    print(f"{'gemm':24s} {'variant':34s} {'us':>8s} {'TFLOP/s':>8s}")
    for g in gemms:
        print(f"{g['gemm']:24s} {g['variant']:34s} {g['us']:8.1f} {g['TFLOP/s']:8.0f}")
    print(f"\n{'encoder-FFN block (CUDA graph)':34s} {'us':>8s} {'TFLOP/s':>8s} {'vs torch':>9s} {'rel err':>8s}")
    for blk in blocks:
        print(f"{blk['block']:34s} {blk['us']:8.1f} {blk['TFLOP/s']:8.0f} {blocks[0]['us'] / blk['us']:8.2f}x"
              f" {blk['rel_err_vs_fp32']:8.4f}")
    print(f"\n{'decode fc1 (CUDA graph)':24s} {'variant':22s} {'us':>8s}")
    for d in decode:
        print(f"rows={d['rows']:<19d} {d['variant']:22s} {d['us']:8.1f}")
    print(f"\n{'row-wise kernels':34s} {'us':>8s} {'GB/s':>8s}")
    for e in elementwise:
        print(f"{e['case']:34s} {e['us']:8.1f} {e['GB/s']:8.0f}")
    if sweep:
        print(f"\nsweep bias_gelu_quant (chosen: BLOCK_M={launch.block_m}, num_warps={launch.num_warps}):")
        print(f"{'':23s} BLOCK_M num_warps      us   GB/s")
        for s in sorted(sweep, key=lambda s: s["us"]):
            print(f"{'':23s}{s['BLOCK_M']:8d} {s['num_warps']:9d} {s['us']:7.1f} {s['GB/s']:6.0f}")

    print("wrote", write_json(args.out, {
        "environment": environment(), "M": M, "d_model": D_MODEL, "d_ffn": D_FFN,
        "gemms": gemms, "blocks": blocks, "decode": decode, "elementwise": elementwise, "sweep": sweep,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
