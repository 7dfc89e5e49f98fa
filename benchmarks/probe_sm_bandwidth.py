"""Probe on a CUDA GPU (issue 15): how much of the HBM bandwidth and of the fp16 matmul rate do N SMs
reach? The question behind overlapping the encoder (compute-bound) with decode steps (bound by reading
the cross K/V): if the step's cross-attention reads at the full bandwidth on part of the SMs, the
encoder could run beside it on the rest and the two would add up to less than one after the other.
Session 12 (probe_green.py) found that a whole decode step beside an encoder on 96 SMs gained ~5 %;
this measures the pieces, per SM count, on a green context (`probe_green.green_stream`).

Per N (SMs of the partition; "all" = the whole GPU on the default stream):
- copy: `y.copy_(x)`, 1 GiB fp16, GB/s counted as read + write;
- read: `x.sum(dtype=float32)` of the same, GB/s of reads;
- attn ours / attn cudnn: one large-v3 cross-attention layer at B rows (q [B, 20, 64], K/V
  [B, 20, 1500, 64] fp16): `cuda_ops.attention.decode_attention_triton` (its split count chosen for N
  SMs) and SDPA with cuDNN's backend (what full_fp16's captured step runs), GB/s of K/V read;
- gemm: an 8192^3 fp16 matmul, TFLOP/s.

    python benchmarks/probe_sm_bandwidth.py [--sms 16,32,48,64,80,96,112,128] [--rows 256]
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

from common import environment, table, write_json
from probe_green import cuda_ms, green_stream

H, T, D = 20, 1500, 64


def measure(stream, sms: int, rows: int) -> dict:
    from cuda_ops.attention import choose_num_splits, decode_attention_triton

    gib = 1 << 30
    x = torch.randn(gib // 2, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    row = {"sms": sms}
    row["copy_GBps"] = 2 * gib / cuda_ms(lambda: y.copy_(x), stream) / 1e6
    row["read_GBps"] = gib / cuda_ms(lambda: x.sum(dtype=torch.float32), stream) / 1e6
    del x, y
    q = torch.randn(rows, H, D, device="cuda", dtype=torch.float16)
    k = torch.randn(rows, H, T, D, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    lengths = torch.full((rows,), T, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    kv_bytes = 2 * k.numel() * k.element_size()
    splits = choose_num_splits(rows * H, T, sms)
    row["attn_ours_GBps"] = kv_bytes / cuda_ms(
        lambda: decode_attention_triton(q, k, v, lengths, out=out, num_splits=splits, full_length=True), stream) / 1e6
    q4 = q.unsqueeze(2)

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            scaled_dot_product_attention(q4, k, v)
    try:
        row["attn_cudnn_GBps"] = kv_bytes / cuda_ms(cudnn, stream) / 1e6
    except RuntimeError as e:
        row["attn_cudnn_GBps"] = None
        row["note"] = str(e).splitlines()[0][:60]
    del q, k, v, out
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    row["gemm_TFLOPs"] = 2 * 8192**3 / cuda_ms(lambda: torch.matmul(a, a, out=c), stream) / 1e9
    torch.cuda.synchronize()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sms", default="16,32,48,64,80,96,112,128")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--out", default="probe_sm_bandwidth.json")
    args = p.parse_args()
    total = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [measure(torch.cuda.current_stream(), total, args.rows)]
    for n in (int(s) for s in args.sms.split(",")):
        if 0 < n < total:
            green = green_stream(n)
            rows.append(measure(green.stream, green.sms, args.rows))
    for r in rows:  # each as a share of the whole GPU's
        r["attn_ours_of_all"] = r["attn_ours_GBps"] / rows[0]["attn_ours_GBps"]
        r["gemm_of_all"] = r["gemm_TFLOPs"] / rows[0]["gemm_TFLOPs"]
    cols = ["sms", "copy_GBps", "read_GBps", "attn_ours_GBps", "attn_cudnn_GBps", "gemm_TFLOPs", "attn_ours_of_all", "gemm_of_all"]
    print(table(rows, cols))
    write_json(args.out, {"environment": environment(), "rows_per_attention": args.rows, "rows": rows})


if __name__ == "__main__":
    main()
