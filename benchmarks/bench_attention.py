"""Benchmark decode attention (cuda_ops.attention) against PyTorch SDPA on CUDA.

Whisper large-v3 shapes (H=20, D=64): cross-attention over 1500 encoder frames and
self-attention over per-slot lengths up to 448 with slots gathered by index. For each batch:
(a) torch SDPA fp16 on q [B, H, 1, D] and K/V [B, H, T, D], (b) our kernels on fp16 K/V,
(c) our kernels on fp8 K/V with a scale per (slot, head), (d) with a scale per (slot, head, 128
positions), as the engine's cross cache holds them (cuda_ops/cross_kv.py). Bytes are those the op must move: the valid K/V positions plus q and
out (and the fp8 scales). As in the engine, each op is timed inside a CUDA graph (no launch gaps),
as the median over replays of one graph that calls it on several copies of its inputs, enough to
pass 256 MB so that the L2 (60 MB on an H200) holds none of them, as a decode step's 32 layers'
caches would not stay in it. "eager" is our fp8 op launched from Python (triton.testing.do_bench
median): the gap to the graph time is launch overhead. Prints a table and writes JSON under
benchmarks/results (or $BENCH_RESULTS_DIR).

    python benchmarks/bench_attention.py [--out bench_attention.json] [--sweep] [--no-table]

`--sweep`: cross-attention with tile-scaled FP8 K/V over batch x splits x BLOCK_T x warps, and the
A/Bs of compile-time strides (const_strides), reading no lengths (full_length) and loading the
next tile before this tile's math (prefetch) at each batch's chosen launch.

BENCH_DRY=1: a dry run on the CPU (Triton's interpreter, H=2, T=300, a few launches, one timed call
each, copy bandwidth taken as 1 GB/s): checks the script, measures nothing.
"""

from __future__ import annotations

import argparse
import os
import time

DRY = os.environ.get("BENCH_DRY", "") not in ("", "0")
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before cuda_ops is imported

import torch
import torch.nn.functional as F

from common import environment, write_json  # also puts the checkout on sys.path for cuda_ops
from cuda_ops.attention import WAVES, choose_launch, choose_num_splits, decode_attention_triton, quantize_kv, quantize_kv_tiles

H, D = (2, 64) if DRY else (20, 64)  # large-v3 decoder
CROSS_T = 300 if DRY else 1500  # encoder frames of a 30-s window
DEV = "cpu" if DRY else "cuda"
SELF_T = 448  # decoder context
CROSS_BATCHES = (1, 8, 32, 128, 256)
SELF_BATCHES = (8, 32, 128, 256)
SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def copy_bandwidth_gbps() -> float:
    """Device-to-device copy of 2 GiB: bytes read + written per second, the practical ceiling."""
    if DRY:
        return 1.0
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.float16, device=DEV)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * src.element_size() / ms / 1e6


def graph_ms(calls: list) -> float:
    """Median time of one call, from replays of a CUDA graph that makes every call once."""
    if DRY:
        t0 = time.perf_counter()
        for call in calls:
            call()
        return (time.perf_counter() - t0) * 1e3 / len(calls)
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
    q = torch.randn(B, H, D, device=DEV, dtype=torch.float16, generator=gen)
    k = torch.randn(slots, H, T, D, device=DEV, dtype=torch.float16, generator=gen)
    v = torch.randn(slots, H, T, D, device=DEV, dtype=torch.float16, generator=gen)
    slot_ids = torch.randperm(slots, device=DEV, generator=gen)[:B].to(torch.int32) if slots > B else None
    k8, k_scale = quantize_kv(k)
    v8, v_scale = quantize_kv(v)
    k8t, k_tile = quantize_kv_tiles(k)
    v8t, v_tile = quantize_kv_tiles(v)
    rows = slice(None) if slot_ids is None else slot_ids.long()
    return dict(q=q, k=k, v=v, k8=k8, v8=v8, k_scale=k_scale, v_scale=v_scale, slot_ids=slot_ids,
                k8t=k8t, v8t=v8t, k_tile=k_tile, v_tile=v_tile,
                k_rows=k[rows], v_rows=v[rows], out=torch.empty_like(q))  # fmt: skip


def run_case(kind: str, B: int, T: int, lengths: torch.Tensor, slots: int, ceiling: float) -> dict:
    """Time SDPA fp16, ours fp16 and ours fp8 on one shape; lengths [B] int32 on the GPU."""
    from triton.testing import do_bench

    gen = torch.Generator(device=DEV).manual_seed(0)
    kv_bytes = slots * H * T * D * 2 * 4  # fp16 + two fp8 caches of one copy
    copies = max(1, min(16, -(-256_000_000 // kv_bytes)))
    sets = [make_inputs(B, T, slots, gen) for _ in range(copies)]
    varying = bool((lengths != T).any())
    mask = (torch.arange(T, device=DEV)[None, :] < lengths[:, None])[:, None, None, :] if varying else None

    def sdpa(c):  # SDPA gets the batch's own K/V rows, gathered beforehand (not timed)
        return lambda: F.scaled_dot_product_attention(c["q"][:, :, None], c["k_rows"], c["v_rows"], attn_mask=mask)

    def ours_fp16(c):
        return lambda: decode_attention_triton(c["q"], c["k"], c["v"], lengths, slot_ids=c["slot_ids"], out=c["out"])

    def ours_fp8(c):
        return lambda: decode_attention_triton(
            c["q"], c["k8"], c["v8"], lengths, k_scale=c["k_scale"], v_scale=c["v_scale"], slot_ids=c["slot_ids"], out=c["out"]
        )

    def ours_fp8_tile(c):
        return lambda: decode_attention_triton(
            c["q"], c["k8t"], c["v8t"], lengths, k_scale=c["k_tile"], v_scale=c["v_tile"], slot_ids=c["slot_ids"], out=c["out"]
        )

    times = {name: graph_ms([make(c) for c in sets]) for name, make in
             (("sdpa_fp16", sdpa), ("ours_fp16", ours_fp16), ("ours_fp8", ours_fp8), ("ours_fp8_tile", ours_fp8_tile))}  # fmt: skip
    eager_fp8 = graph_ms([ours_fp8(sets[0])]) if DRY else do_bench(ours_fp8(sets[0]), warmup=25, rep=200, return_mode="median")
    positions = int(lengths.sum())
    qo_bytes = 2 * B * H * D * 2
    moved = {
        "sdpa_fp16": positions * H * D * 2 * 2 + qo_bytes,
        "ours_fp16": positions * H * D * 2 * 2 + qo_bytes,
        "ours_fp8": positions * H * D * 1 * 2 + qo_bytes + 2 * B * H * 4,
        "ours_fp8_tile": positions * H * D * 1 * 2 + qo_bytes + 2 * B * H * 4 * -(-T // 128),
    }
    splits_tile, block_t_tile = choose_launch(B * H, T, SMS, "fp8tile")
    row = {"kind": kind, "B": B, "T": T, "mean_length": positions / B, "splits": choose_num_splits(B * H, T, SMS, WAVES),
           "splits_fp8": choose_launch(B * H, T, SMS, "fp8")[0], "splits_fp8_tile": splits_tile,
           "block_t_fp8_tile": block_t_tile}
    for name, ms in times.items():
        gbps = moved[name] / ms / 1e6
        row[name] = {"ms": ms, "bytes": moved[name], "GBps": gbps, "pct_of_copy": 100 * gbps / ceiling}
    row["ours_fp8_eager_ms"] = eager_fp8
    row["speedup_fp8_vs_sdpa"] = times["sdpa_fp16"] / times["ours_fp8"]
    row["speedup_fp16_vs_sdpa"] = times["sdpa_fp16"] / times["ours_fp16"]
    return row


SWEEP_BATCHES = (1, 8, 32, 64, 128, 256)
SWEEP_SPLITS = (1, 2, 3, 4, 6, 12)
SWEEP_LAUNCHES = ((64, 4), (128, 4), (32, 4), (64, 2), (64, 8))  # (BLOCK_T, warps)


def sweep(ceiling: float, batches=SWEEP_BATCHES) -> list[dict]:
    """Tile-scaled FP8 cross-attention (T=1500) per batch: every (splits, BLOCK_T, warps), and
    the chosen launch (choose_launch) with compile-time strides, no lengths read, prefetch. Prints
    the best per batch."""
    out = []
    for B in batches:
        gen = torch.Generator(device=DEV).manual_seed(B)
        per_copy = B * H * CROSS_T * D * 2
        copies = max(1, min(16, -(-256_000_000 // per_copy)))
        sets = []
        for _ in range(copies):
            q = torch.randn(B, H, D, device=DEV, dtype=torch.float16, generator=gen)
            k8, ks = quantize_kv_tiles(torch.randn(B, H, CROSS_T, D, device=DEV, dtype=torch.float16, generator=gen))
            v8, vs = quantize_kv_tiles(torch.randn(B, H, CROSS_T, D, device=DEV, dtype=torch.float16, generator=gen))
            sets.append((q, k8, v8, ks, vs, torch.empty_like(q)))
        lengths = torch.full((B,), CROSS_T, dtype=torch.int32, device=DEV)
        moved = B * H * CROSS_T * D * 2 + 2 * B * H * D * 2 + 2 * B * H * -(-CROSS_T // 128) * 4

        def time_launch(**kw):
            calls = [lambda c=c: decode_attention_triton(c[0], c[1], c[2], lengths, k_scale=c[3], v_scale=c[4], out=c[5], **kw)
                     for c in sets]
            try:
                ms = graph_ms(calls)
            except Exception as e:  # a launch that fails to compile must not stop the sweep
                return {**kw, "error": repr(e)[:160]}
            gbps = moved / ms / 1e6
            return {**kw, "us": round(ms * 1e3, 2), "GBps": round(gbps), "pct_of_copy": round(100 * gbps / ceiling, 1)}

        splits_set, launches = ((1, 2), SWEEP_LAUNCHES[:2]) if DRY else (SWEEP_SPLITS, SWEEP_LAUNCHES)
        rows = [time_launch(num_splits=s, block_t=bt, num_warps=w) for s in splits_set for bt, w in launches]
        chosen, chosen_bt = choose_launch(B * H, CROSS_T, SMS, "fp8tile")
        default = time_launch()  # what decode_attention_triton picks by itself
        default.update(num_splits=chosen, block_t=chosen_bt)
        const = time_launch(num_splits=chosen, const_strides=True)
        full = time_launch(num_splits=chosen, full_length=True)
        const_full = time_launch(num_splits=chosen, const_strides=True, full_length=True)
        prefetch = time_launch(num_splits=chosen, prefetch=True)
        all_three = time_launch(num_splits=chosen, const_strides=True, full_length=True, prefetch=True)
        # the tensor-core path (mma=True) at the chosen splits, BLOCK_T 64 and 32, alone and with the A/Bs
        mma = {f"{bt}" + ("+const+full" if cf else ""): time_launch(num_splits=chosen, block_t=bt, mma=True,
                                                                  const_strides=cf, full_length=cf)
               for bt in (64, 32) for cf in (False, True)}
        mma_best = min((r for r in mma.values() if "us" in r), key=lambda r: r["us"], default={})
        mma_text = ", ".join(f"{name} {r.get('us')}" for name, r in mma.items())
        best = min((r for r in rows if "us" in r), key=lambda r: r["us"], default=None)
        out.append({"B": B, "chosen_splits": chosen, "chosen_block_t": chosen_bt, "default": default, "const_strides": const, "full_length": full,
                    "const_full": const_full, "prefetch": prefetch, "all_three": all_three, "mma": mma,
                    "mma_best": mma_best, "best": best, "all": rows})
        print(f"sweep B={B}: chosen {chosen} splits x BLOCK_T {chosen_bt} {default.get('us')} us ({default.get('pct_of_copy')} % of copy); "
              f"const strides {const.get('us')}, full_length {full.get('us')}, both {const_full.get('us')}, "
              f"prefetch {prefetch.get('us')}, all three {all_three.get('us')} us; "
              f"mma {mma_text} us "
              f"(best {mma_best.get('pct_of_copy')} % of copy); "
              f"best {best}", flush=True)
        del sets
        if not DRY:
            torch.cuda.empty_cache()
    return out


def print_table(rows: list[dict], ceiling: float) -> None:
    print(f"\ncopy bandwidth (read + write): {ceiling:.0f} GB/s; H={H}, D={D}; median microseconds per call under CUDA graphs")
    head = f"{'case':<6}{'B':>5}{'T':>6}{'mean len':>9}{'splits':>7}{'fp8':>4}"
    for name in ("sdpa_fp16", "ours_fp16", "ours_fp8", "ours_fp8_tile"):
        head += f"{name + ' us':>15}{'GB/s':>7}{'%cp':>5}"
    print(head + f"{'fp8 eager us':>13}{'fp8/sdpa':>10}{'fp16/sdpa':>10}")
    for r in rows:
        line = f"{r['kind']:<6}{r['B']:>5}{r['T']:>6}{r['mean_length']:>9.0f}{r['splits']:>7}{r['splits_fp8']:>4}"
        for name in ("sdpa_fp16", "ours_fp16", "ours_fp8", "ours_fp8_tile"):
            c = r[name]
            line += f"{c['ms'] * 1e3:>15.1f}{c['GBps']:>7.0f}{c['pct_of_copy']:>5.0f}"
        line += f"{r['ours_fp8_eager_ms'] * 1e3:>13.1f}"
        print(line + f"{r['speedup_fp8_vs_sdpa']:>9.2f}x{r['speedup_fp16_vs_sdpa']:>9.2f}x")


def fp8_summary(rows: list[dict], sweep_rows: list[dict] | None, ceiling: float) -> list[dict]:
    """Tile-scaled FP8 cross-attention per batch against the target: >= 80 % of the copy bandwidth."""
    best = {r["B"]: r.get("best") or {} for r in sweep_rows or []}
    mma = {r["B"]: r.get("mma_best") or {} for r in sweep_rows or []}
    out = []
    for r in rows:
        if r["kind"] != "cross":
            continue
        c = r["ours_fp8_tile"]
        b = best.get(r["B"], {})
        out.append({"B": r["B"], "splits": r["splits_fp8_tile"], "block_t": r["block_t_fp8_tile"],
                    "programs": r["B"] * H * r["splits_fp8_tile"], "us": round(c["ms"] * 1e3, 1),
                    "GBps": round(c["GBps"]), "pct_of_copy": round(c["pct_of_copy"], 1),
                    "target_80": c["pct_of_copy"] >= 80, "sdpa_fp16_us": round(r["sdpa_fp16"]["ms"] * 1e3, 1),
                    "sweep_best": (f"{b.get('num_splits')}x{b.get('block_t')}/w{b.get('num_warps')} {b.get('us')} us "
                                   f"({b.get('pct_of_copy')} %)") if b else None,
                    "mma_best": (f"x{mma[r['B']].get('block_t')} {mma[r['B']].get('us')} us ({mma[r['B']].get('pct_of_copy')} %)"
                                 if mma.get(r["B"]) else None)})
    print(f"\nFP8 cross-attention (tile scales, T={CROSS_T}, H={H}), chosen launch vs the copy bandwidth "
          f"{ceiling:.0f} GB/s (target >= 80 %)")
    cols = ["B", "splits", "block_t", "programs", "us", "GBps", "pct_of_copy", "target_80", "sdpa_fp16_us", "sweep_best",
            "mma_best"]
    print("  ".join(f"{c:>12}" for c in cols))
    for r in out:
        print("  ".join(f"{str(r[c]):>12}" for c in cols))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_attention.json", help="file name under the results directory")
    parser.add_argument("--sweep", action="store_true", help="splits x BLOCK_T x warps x batch, tile-scaled fp8 cross")
    parser.add_argument("--no-table", action="store_true", help="only the sweep")
    parser.add_argument("--batches", default=None, help="comma list of cross-attention batches (table and sweep)")
    parser.add_argument("--no-self", action="store_true", help="leave out the self-attention rows")
    args = parser.parse_args()
    if not DRY and not torch.cuda.is_available():
        print("CUDA not available: nothing to benchmark (the kernels' CPU tests run through TRITON_INTERPRET=1)")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    cross_batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else CROSS_BATCHES
    ceiling = copy_bandwidth_gbps()
    rows = []
    result = {"environment": environment(), "copy_bandwidth_GBps": ceiling, "rows": rows}
    if args.sweep:  # first: the launch choice is what the next change needs
        result["sweep"] = sweep(ceiling, cross_batches if args.batches else SWEEP_BATCHES)
        write_json(args.out, result)
    if not args.no_table:
        for B in cross_batches:
            lengths = torch.full((B,), CROSS_T, dtype=torch.int32, device=DEV)
            rows.append(run_case("cross", B, CROSS_T, lengths, B, ceiling))
        for B in () if args.no_self else SELF_BATCHES:
            gen = torch.Generator(device=DEV).manual_seed(B)
            lengths = torch.randint(1, SELF_T + 1, (B,), dtype=torch.int32, device=DEV, generator=gen)
            rows.append(run_case("self", B, SELF_T, lengths, 2 * B, ceiling))  # decode B of 2B slots
        print_table(rows, ceiling)
        result["fp8_summary"] = fp8_summary(rows, result.get("sweep"), ceiling)
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()
