"""Benchmark decode attention (cuda_ops.attention) against PyTorch SDPA on CUDA.

Whisper large-v3 shapes (H=20, D=64): cross-attention over 1500 encoder frames and
self-attention over per-slot lengths up to 448 with slots gathered by index. For each batch:
(a) torch SDPA fp16 on q [B, H, 1, D] and K/V [B, H, T, D], (b) our kernels on fp16 K/V,
(c) our kernels on fp8 K/V. Bytes are those the op must move: the valid K/V positions plus q and
out (and the fp8 scales). As in the engine, each op is timed inside a CUDA graph (no launch gaps),
as the median over replays of one graph that calls it on several copies of its inputs, enough to
pass 256 MB so that the L2 (60 MB on an H200) holds none of them, as a decode step's 32 layers'
caches would not stay in it. "eager" is our fp8 op launched from Python (triton.testing.do_bench
median): the gap to the graph time is launch overhead. Prints a table and writes JSON under
benchmarks/results (or $BENCH_RESULTS_DIR).

    python benchmarks/bench_attention.py [--out bench_attention.json]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from common import environment, write_json  # also puts the checkout on sys.path for cuda_ops
from cuda_ops.attention import choose_num_splits, decode_attention_triton, quantize_kv

H, D = 20, 64  # large-v3 decoder
CROSS_T = 1500  # encoder frames of a 30-s window
SELF_T = 448  # decoder context
CROSS_BATCHES = (1, 8, 32, 128, 256)
SELF_BATCHES = (8, 32, 128, 256)
SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def copy_bandwidth_gbps() -> float:
    """Device-to-device copy of 2 GiB: bytes read + written per second, the practical ceiling."""
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * src.element_size() / ms / 1e6


def graph_ms(calls: list) -> float:
    """Median time of one call, from replays of a CUDA graph that makes every call once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (and Triton compilation) outside the capture
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    for _ in range(20):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / len(calls))
    return sorted(times)[len(times) // 2]


def make_inputs(B: int, T: int, slots: int, gen: torch.Generator) -> dict:
    """One copy of an op's inputs: q, fp16 and fp8 caches of `slots` rows, slot ids if slots > B."""
    q = torch.randn(B, H, D, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(slots, H, T, D, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(slots, H, T, D, device="cuda", dtype=torch.float16, generator=gen)
    slot_ids = torch.randperm(slots, device="cuda", generator=gen)[:B].to(torch.int32) if slots > B else None
    k8, k_scale = quantize_kv(k)
    v8, v_scale = quantize_kv(v)
    rows = slice(None) if slot_ids is None else slot_ids.long()
    return dict(q=q, k=k, v=v, k8=k8, v8=v8, k_scale=k_scale, v_scale=v_scale, slot_ids=slot_ids,
                k_rows=k[rows], v_rows=v[rows], out=torch.empty_like(q))  # fmt: skip


def run_case(kind: str, B: int, T: int, lengths: torch.Tensor, slots: int, ceiling: float) -> dict:
    """Time SDPA fp16, ours fp16 and ours fp8 on one shape; lengths [B] int32 on the GPU."""
    from triton.testing import do_bench

    gen = torch.Generator(device="cuda").manual_seed(0)
    kv_bytes = slots * H * T * D * 2 * 3  # fp16 + fp8 caches of one copy
    copies = max(1, min(16, -(-256_000_000 // kv_bytes)))
    sets = [make_inputs(B, T, slots, gen) for _ in range(copies)]
    varying = bool((lengths != T).any())
    mask = (torch.arange(T, device="cuda")[None, :] < lengths[:, None])[:, None, None, :] if varying else None

    def sdpa(c):  # SDPA gets the batch's own K/V rows, gathered beforehand (not timed)
        return lambda: F.scaled_dot_product_attention(c["q"][:, :, None], c["k_rows"], c["v_rows"], attn_mask=mask)

    def ours_fp16(c):
        return lambda: decode_attention_triton(c["q"], c["k"], c["v"], lengths, slot_ids=c["slot_ids"], out=c["out"])

    def ours_fp8(c):
        return lambda: decode_attention_triton(
            c["q"], c["k8"], c["v8"], lengths, k_scale=c["k_scale"], v_scale=c["v_scale"], slot_ids=c["slot_ids"], out=c["out"]
        )

    times = {name: graph_ms([make(c) for c in sets]) for name, make in
             (("sdpa_fp16", sdpa), ("ours_fp16", ours_fp16), ("ours_fp8", ours_fp8))}  # fmt: skip
    eager_fp8 = do_bench(ours_fp8(sets[0]), warmup=25, rep=200, return_mode="median")
    positions = int(lengths.sum())
    qo_bytes = 2 * B * H * D * 2
    moved = {
        "sdpa_fp16": positions * H * D * 2 * 2 + qo_bytes,
        "ours_fp16": positions * H * D * 2 * 2 + qo_bytes,
        "ours_fp8": positions * H * D * 1 * 2 + qo_bytes + 2 * B * H * 4,
    }
    row = {"kind": kind, "B": B, "T": T, "mean_length": positions / B, "splits": choose_num_splits(B * H, T, SMS)}
    for name, ms in times.items():
        gbps = moved[name] / ms / 1e6
        row[name] = {"ms": ms, "bytes": moved[name], "GBps": gbps, "pct_of_copy": 100 * gbps / ceiling}
    row["ours_fp8_eager_ms"] = eager_fp8
    row["speedup_fp8_vs_sdpa"] = times["sdpa_fp16"] / times["ours_fp8"]
    row["speedup_fp16_vs_sdpa"] = times["sdpa_fp16"] / times["ours_fp16"]
    return row


def print_table(rows: list[dict], ceiling: float) -> None:
    print(f"\ncopy bandwidth (read + write): {ceiling:.0f} GB/s; H={H}, D={D}; median microseconds per call under CUDA graphs")
    head = f"{'case':<6}{'B':>5}{'T':>6}{'mean len':>9}{'splits':>7}"
    for name in ("sdpa_fp16", "ours_fp16", "ours_fp8"):
        head += f"{name + ' us':>15}{'GB/s':>7}{'%cp':>5}"
    print(head + f"{'fp8 eager us':>13}{'fp8/sdpa':>10}{'fp16/sdpa':>10}")
    for r in rows:
        line = f"{r['kind']:<6}{r['B']:>5}{r['T']:>6}{r['mean_length']:>9.0f}{r['splits']:>7}"
        for name in ("sdpa_fp16", "ours_fp16", "ours_fp8"):
            c = r[name]
            line += f"{c['ms'] * 1e3:>15.1f}{c['GBps']:>7.0f}{c['pct_of_copy']:>5.0f}"
        line += f"{r['ours_fp8_eager_ms'] * 1e3:>13.1f}"
        print(line + f"{r['speedup_fp8_vs_sdpa']:>9.2f}x{r['speedup_fp16_vs_sdpa']:>9.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_attention.json", help="file name under the results directory")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA not available: nothing to benchmark (the kernels' CPU tests run through TRITON_INTERPRET=1)")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    ceiling = copy_bandwidth_gbps()
    rows = []
    for B in CROSS_BATCHES:
        lengths = torch.full((B,), CROSS_T, dtype=torch.int32, device="cuda")
        rows.append(run_case("cross", B, CROSS_T, lengths, B, ceiling))
    for B in SELF_BATCHES:
        gen = torch.Generator(device="cuda").manual_seed(B)
        lengths = torch.randint(1, SELF_T + 1, (B,), dtype=torch.int32, device="cuda", generator=gen)
        rows.append(run_case("self", B, SELF_T, lengths, 2 * B, ceiling))  # decode B of 2B slots
    print_table(rows, ceiling)
    result = {"environment": environment(), "copy_bandwidth_GBps": ceiling, "rows": rows}
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()
