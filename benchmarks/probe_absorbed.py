"""One decoder layer's cross-attention at a decode step, as the captured step runs it (cuDNN's attention
over the window's K and V cache, [B, H, 1500, Dh] each) against the absorbed form
(cuda_ops/cross_absorbed.py: the query folded through W_k, one read of the encoder states X
[B, 1500, D], the output through W_v), measured before it is built into the model.

    python benchmarks/probe_absorbed.py [--width 1280] [--rows 32,128,256] [--device cuda] [--sweep]

Where the tensor-core kernel applies (cross_absorbed_mma.py) its columns (mma_*) follow, with its time
at 1, 2, 4 and 8 spans a row in the sweep list, and with each of `--tiles` (positions a tile x stages).

Times are of CUDA-graph replays (as the engine's captured step; `--eager`: launches from Python).
Prints per row count: ms of cuDNN (and flash) over K/V, of the absorbed kernel alone and of the whole
absorbed path (absorb_query + kernel + absorbed_output), the bytes each reads as GB/s, and the
largest difference of the absorbed path's output from the K/V path's; then, per row count, a prompt's
prefill (`--prefill-tokens` tokens a row): cuDNN over K/V, the two GEMMs and the mma kernel. `--sweep` times every launch in
LAUNCHES and reports the best per row count. Writes benchmarks/results/probe_absorbed.json.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import environment, table, write_json
from cuda_ops import cross_absorbed_mma
from cuda_ops.cross_absorbed import (DEFAULT_LAUNCH, GEMM_ROWS, AbsorbedLaunch, absorb_query, absorbed_attention,
                                     absorbed_attention_gemm, absorbed_flops, absorbed_output, choose_splits)

# Session 22's sweeps (H100, results/s22_h100/probe_absorbed_sweep{1,2}.json): the best were 16/64/1/8/2
# (0.60 ms at 256 rows: 1.6 TB/s over X, 0.96x cuDNN over K/V) and 32/32/1/8/2 with reload_q (0.30 ms at
# 128); transposed launches, 16 warps, smaller blocks and deeper pipelines lost or did not fit. Next:
# the next block's X loaded before this block's products (prefetch), with each sweep entry's registers
# and spills (`compiled_kernels`) to tell latency from spills.
# Also positions as M (the wgmma shape) with one stage: session 22 tried them with two only, where a
# 64 x 1280 block of X alone is 160 KB a stage.
LAUNCHES = [AbsorbedLaunch(16, 64, 1, 8, 2), AbsorbedLaunch(32, 32, 1, 8, 2, False, True)] + [
    AbsorbedLaunch(g, bt, 1, 8, st, False, reload, True)
    for g, bt, reload, st in itertools.product((16, 32), (16, 32), (False, True), (1, 2))] + [
    AbsorbedLaunch(g, 64, 1, w, 1, True) for g, w in itertools.product((16, 32), (4, 8))]


def compiled_kernels() -> dict:
    """{cache key: (registers a thread, spilled registers, shared memory bytes)} of every compiled
    `_absorbed_kernel` variant (Triton's per-device cache; {} where its layout differs)."""
    from cuda_ops.cross_absorbed import _absorbed_kernel

    out = {}
    try:
        for caches in _absorbed_kernel.device_caches.values():
            for key, k in caches[0].items():
                out[key] = (getattr(k, "n_regs", None), getattr(k, "n_spills", None), getattr(k.metadata, "shared", None))
    except (AttributeError, TypeError, IndexError):
        pass
    return out


def timer(dev: torch.device, calls: int, graphs: bool = True):
    """ms a call of fn. On CUDA `calls` calls are captured in one CUDA graph and replayed, as the engine
    replays its decode step: eager launches would time Python (the mma kernel's ctypes launch and the
    span merge's small ops cost more than the kernel itself at 32 rows)."""
    def ms(fn) -> float:
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
            graph = None
            if graphs:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(calls):
                        fn()
                graph.replay()
                torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if graph is not None:
                graph.replay()
            else:
                for _ in range(calls):
                    fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls * 1e3
    return ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=1280)  # large-v3
    p.add_argument("--rows", default="32,128,256")
    p.add_argument("--device", default="cuda")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--prefill-tokens", type=int, default=4,
                   help="also time a prefill of this many tokens a row: cuDNN, the GEMMs, the mma kernel (0: not)")
    p.add_argument("--eager", action="store_true", help="time eager launches, not a replayed CUDA graph")
    p.add_argument("--tiles", default="",
                   help="also time the mma kernel with these tiles (positions x stages, e.g. 32x2,16x4,16x5)")
    args = p.parse_args()
    dev = torch.device(args.device)
    dtype = torch.float16
    D, dh, T = args.width, 64, 1500
    H = D // dh
    ms = timer(dev, args.calls, graphs=not args.eager)
    gen = torch.Generator(device="cpu").manual_seed(0)
    w_kv = (torch.randn(2 * D, D, generator=gen) * D**-0.5).to(dev, dtype)
    b_v = (torch.randn(D, generator=gen) * 0.1).to(dev, dtype)
    w_k, w_v = w_kv[:D], w_kv[D:]
    rows_out, sweep_out, prefill_out = [], [], []
    for B in (int(r) for r in args.rows.split(",")):
        x = torch.randn(B, T, D, generator=gen).to(dev, dtype)  # encoder states after ln_post: unit scale
        q = torch.randn(B, H, dh, generator=gen).to(dev, dtype)
        kv = x @ w_kv.t()
        k, v = kv[..., :D], kv[..., D:] + b_v
        k, v = (t.reshape(B, T, H, dh).transpose(1, 2).contiguous() for t in (k, v))  # the cache layout
        q4 = q[:, :, None]

        def sdpa(backend):
            def run():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q4, k, v)[:, :, 0]
            return run

        ref = sdpa(SDPBackend.CUDNN_ATTENTION if dev.type == "cuda" else SDPBackend.MATH)().float()
        qa = absorb_query(q, w_k)  # for the kernel alone

        def absorbed(launch):
            return lambda: absorbed_output(absorbed_attention(absorb_query(q, w_k), x, launch=launch), w_v, b_v)

        best = DEFAULT_LAUNCH
        if args.sweep and dev.type == "cuda":
            timed = []
            for launch in LAUNCHES:
                seen = compiled_kernels()
                try:
                    t = ms(lambda: absorbed_attention(qa, x, launch=launch))
                except Exception as e:  # noqa: BLE001 - a launch that does not compile (registers, shared memory)
                    sweep_out.append({"rows": B, **launch._asdict(), "error": type(e).__name__})
                    continue
                timed.append((t, launch))
                new = [v for k, v in compiled_kernels().items() if k not in seen]  # compiled by this launch
                regs = dict(zip(("regs", "spills", "shared"), new[0])) if new else {}
                sweep_out.append({"rows": B, **launch._asdict(), "kernel_ms": round(t, 4), **regs})
                print(f"sweep rows {B} {'/'.join(map(str, launch))}: {t:.4f} ms {regs}", flush=True)
            best = min(timed)[1]
        diff = (absorbed(best)().float() - ref).abs().max().item()
        kv_bytes = 2 * B * T * D * 2
        x_bytes = B * T * D * 2
        row = {"rows": B, "launch": "/".join(map(str, best)),
               "splits": best.splits or choose_splits(B, -(-H // best.group), T, 132, best.block_t)}
        if dev.type == "cuda":
            for name, backend in (("cudnn_ms", SDPBackend.CUDNN_ATTENTION), ("flash_ms", SDPBackend.FLASH_ATTENTION)):
                row[name] = round(ms(sdpa(backend)), 4)
        else:
            row["cudnn_ms"] = round(ms(sdpa(SDPBackend.MATH)), 4)
        row["kernel_ms"] = round(ms(lambda: absorbed_attention(qa, x, launch=best)), 4)
        row["absorb_q_ms"] = round(ms(lambda: absorb_query(q, w_k)), 4)
        row["absorbed_ms"] = round(ms(lambda: absorbed_output(absorbed_attention(absorb_query(q, w_k), x, launch=best),
                                                              w_v, b_v)), 4)
        row["cudnn_GBps"] = round(kv_bytes / row["cudnn_ms"] / 1e6)
        row["kernel_GBps"] = round(x_bytes / row["kernel_ms"] / 1e6)
        row["kernel_TFLOPs"] = round(absorbed_flops(B, H, T, D) / row["kernel_ms"] / 1e9, 1)
        row["speedup"] = round(row["cudnn_ms"] / row["absorbed_ms"], 3)
        row["max_diff"] = float(f"{diff:.3g}")
        if cross_absorbed_mma.usable(qa, x):  # the tensor-core kernel (launch None), and its spans per row
            row["mma_ms"] = round(ms(lambda: absorbed_attention(qa, x)), 4)
            row["mma_GBps"] = round(x_bytes / row["mma_ms"] / 1e6)
            row["mma_TFLOPs"] = round(absorbed_flops(B, H, T, D) / row["mma_ms"] / 1e9, 1)
            row["mma_absorbed_ms"] = round(ms(absorbed(None)), 4)
            row["mma_speedup"] = round(row["cudnn_ms"] / row["mma_absorbed_ms"], 3)
            row["mma_max_diff"] = float(f"{(absorbed(None)().float() - ref).abs().max().item():.3g}")
            for splits in (1, 2, 4, 8, 16):
                t = ms(lambda: cross_absorbed_mma.absorbed_attention_mma(qa, x, splits=splits))
                sweep_out.append({"rows": B, "kernel": "mma", "splits": splits, "kernel_ms": round(t, 4)})
                print(f"mma rows {B} splits {splits}: {t:.4f} ms", flush=True)
            default = cross_absorbed_mma.absorbed_attention_mma(qa, x).float()
            for text in filter(None, args.tiles.split(",")):
                tile = cross_absorbed_mma.parse_tile(text)
                entry = {"rows": B, "kernel": "mma", "tile": text}
                try:
                    t = ms(lambda: cross_absorbed_mma.absorbed_attention_mma(qa, x, tile=tile))
                except (ValueError, RuntimeError) as e:  # more shared memory than the device gives
                    sweep_out.append({**entry, "error": str(e)})
                    print(f"mma rows {B} tile {text}: {e}", flush=True)
                    continue
                diff = (cross_absorbed_mma.absorbed_attention_mma(qa, x, tile=tile).float() - default).abs().max().item()
                sweep_out.append({**entry, "kernel_ms": round(t, 4), "GBps": round(x_bytes / t / 1e6),
                                  "max_diff_vs_default": float(f"{diff:.3g}")})
                print(f"mma rows {B} tile {text}: {t:.4f} ms, {x_bytes / t / 1e6:.0f} GB/s, diff {diff:.3g}", flush=True)
        rows_out.append(row)
        print(table([row], list(row)), flush=True)
        if dev.type == "cuda" and args.prefill_tokens:  # a prompt's prefill: tokens x heads query rows a window
            n = args.prefill_tokens
            qn = torch.randn(B, H, n, dh, generator=gen).to(dev, dtype)
            qan = absorb_query(qn.transpose(1, 2).reshape(B * n, H, dh), w_k).reshape(B, n * H, D)

            def cudnn_n():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(qn, k, v)
            pre = {"rows": B, "tokens": n, "query_rows": n * H, "cudnn_ms": round(ms(cudnn_n), 4),
                   "gemm_ms": round(ms(lambda: absorbed_attention_gemm(qan, x)), 4)}
            if cross_absorbed_mma.usable(qan, x):
                pre["mma_ms"] = round(ms(lambda: cross_absorbed_mma.absorbed_attention_mma(qan, x)), 4)
            pre["dispatch"] = "gemm" if n * H > GEMM_ROWS else "mma"
            prefill_out.append(pre)
            print(table([pre], list(pre)), flush=True)
    print(table(rows_out, list(rows_out[0])))
    write_json("probe_absorbed.json", {"command": "python benchmarks/probe_absorbed.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items()), "environment": environment(), "rows": rows_out,
        "sweep": sweep_out, "prefill": prefill_out})


if __name__ == "__main__":
    main()
