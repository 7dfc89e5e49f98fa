"""Sweep the launch of the 4-bit cross-attention kernel (cuda_ops/cross_int4.py) on the GPU.

Large-v3 cross-attention (H=20, T=1500, D=64); per batch, every launch (positions per step x warps x
cp.async stages) checked against the fp32 reference, then timed under CUDA graphs over enough copies
of the cache to leave the L2 cold (bench_attention.py's method), beside the FP8 tile cache's kernel
as the engine runs it. Prints the table and the launch with the least time summed over the batches
(`best: ...`; a v1 launch BxWxS is for STREAMER_INT4_ATTN_LAUNCH); JSON under benchmarks/results.

Issue 15's v2 kernel (`decode_attention_int4_v2_triton`: packed fp16x2 on the codes) is timed in the
same run: "v2 sS[wW]" = S cp.async stages, wW = splits until B x H x splits reaches W programs per SM (default V2_WAVES).

    python benchmarks/sweep_int4_attention.py [--batches 1,8,32,128,256] [--v1 all|BxWxS,...] [--no-v2]
        [--out sweep_int4_attention.json]
"""

from __future__ import annotations

import argparse

import torch

from bench_attention import capture, copy_bandwidth_gbps, replay_us
from common import environment, write_json
from cuda_ops.attention import auto_fp8_tile_splits, decode_attention_triton, quantize_kv_tiles
from cuda_ops.cross_int4 import (
    V2_WAVES, decode_attention_int4_reference, decode_attention_int4_triton, decode_attention_int4_v2_triton,
    quantize_k, quantize_v,
)

H, T, D = 20, 1500, 64
LAUNCHES = [(32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 4, 2), (128, 8, 2),
            (64, 2, 3), (128, 4, 3)]
# v2: (stages, K centred, waves)
V2_LAUNCHES = [(2, V2_WAVES), (3, V2_WAVES), (4, V2_WAVES), (3, 4), (3, 16)]  # (stages, waves)


def v1_call(c, bt, nw, st, out=None):
    return decode_attention_int4_triton(c["q"], c["kc"], c["vc"], c["ks"], c["vs"], out=out, block_t=bt, num_warps=nw,
                                        stages=st)


def v2_call(c, st, waves, out=None):
    B, H = c["q"].shape[:2]
    splits = auto_fp8_tile_splits(B * H, T, torch.cuda.get_device_properties(0).multi_processor_count, waves)
    return decode_attention_int4_v2_triton(c["q"], c["kc"], c["vc"], c["ks"], c["vs"], out=out, num_splits=splits,
                                           stages=st)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,8,32,128,256")
    p.add_argument("--v1", default="all", help="v1 launches: all, or BxWxS,... (e.g. 64x4x3, the default launch)")
    p.add_argument("--no-v2", action="store_true", help="leave out issue 15's v2 kernel")
    p.add_argument("--out", default="sweep_int4_attention.json")
    args = p.parse_args()
    v1 = LAUNCHES if args.v1 == "all" else [tuple(int(x) for x in n.split("x")) for n in args.v1.split(",") if n]
    cases = [(f"{bt}x{nw}x{st}", v1_call, (bt, nw, st)) for bt, nw, st in v1]
    if not args.no_v2:
        cases += [(f"v2 s{st}" + (f"w{wv}" if wv != V2_WAVES else ""), v2_call, (st, wv)) for st, wv in V2_LAUNCHES]
    ceiling = copy_bandwidth_gbps()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, total = [], {}
    for B in (int(x) for x in args.batches.split(",")):
        bytes_int4 = B * H * (T * D + (-(-T // 128) * D + T) * 2)
        copies = max(2, min(16, -(-400_000_000 // (bytes_int4 * 3))))
        sets = []
        for _ in range(copies):
            k = torch.randn(B, H, T, D, device="cuda", dtype=torch.float16, generator=gen)
            v = torch.randn(B, H, T, D, device="cuda", dtype=torch.float16, generator=gen)
            q = torch.randn(B, H, D, device="cuda", dtype=torch.float16, generator=gen)
            (kc, ks), (vc, vs) = quantize_k(k), quantize_v(v)
            (k8, k8s), (v8, v8s) = quantize_kv_tiles(k), quantize_kv_tiles(v)
            sets.append(dict(q=q, kc=kc, vc=vc, ks=ks, vs=vs, k8=k8, v8=v8, k8s=k8s, v8s=v8s, out=torch.empty_like(q)))
            del k, v
        sets = [sets[i % copies] for i in range(max(4, copies))]
        lengths = torch.full((B,), T, dtype=torch.int32, device="cuda")
        c = sets[0]
        ref = decode_attention_int4_reference(c["q"], c["kc"], c["vc"], c["ks"], c["vs"]).float()
        fp8_calls = [lambda c=c: decode_attention_triton(c["q"], c["k8"], c["v8"], lengths, k_scale=c["k8s"],
                                                         v_scale=c["v8s"], out=c["out"]) for c in sets]
        fp8_us = replay_us(capture(fp8_calls), fp8_calls, reps=20)
        row = {"B": B, "fp8_tile_us": fp8_us, "int4_bytes": bytes_int4, "launches": {}}
        for name, fn, launch in cases:
            try:
                got = fn(c, *launch).float()
                err = (got - ref).abs().max().item()
                calls = [lambda c=c, fn=fn, launch=launch: fn(c, *launch, out=c["out"]) for c in sets]
                us = replay_us(capture(calls), calls, reps=20)
            except Exception as e:  # noqa: BLE001
                row["launches"][name] = {"error": repr(e)[:200]}
                continue
            pct = 100 * bytes_int4 / us / 1e3 / ceiling
            row["launches"][name] = {"us": us, "pct_of_copy": pct, "max_err": err}
            total[name] = total.get(name, 0.0) + us
        rows.append(row)
        ok = {n: r for n, r in row["launches"].items() if "us" in r}
        if not ok:
            print(f"B={B:>4}: every launch failed: {next(iter(row['launches'].values()))}", flush=True)
            continue
        best = min(ok, key=lambda n: ok[n]["us"])
        err1 = max([r["max_err"] for n, r in ok.items() if "v2" not in n] or [0])
        err2 = max([r["max_err"] for n, r in ok.items() if "v2" in n] or [0])
        print(f"B={B:>4}: FP8 tile {fp8_us:7.1f} us | " + "  ".join(f"{n} {r['us']:.1f}" for n, r in ok.items())
              + f" | best {best} {ok[best]['us']:.1f} us ({ok[best]['pct_of_copy']:.0f} % of copy, "
              f"{fp8_us / ok[best]['us']:.2f}x FP8), max err v1 {err1:.2e} v2 {err2:.2e}", flush=True)
    best = min((n for n in total if all(n in r["launches"] and "us" in r["launches"][n] for r in rows)), key=total.get)
    print(f"best: {best}")
    write_json(args.out, {"environment": environment(), "copy_GBps": ceiling, "H": H, "T": T, "D": D, "rows": rows,
                          "sum_us": total, "best": best})


if __name__ == "__main__":
    main()
