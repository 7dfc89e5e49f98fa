"""Where an engine run of N file windows spends its wall time (issue 15), on a CUDA GPU.

The workload of `bench_engine.py` (N copies of a 30-s window, random weights of a shape, a forced
number of tokens each, all submitted at once), run twice after a warm-up at the same size:
1. timed, with every `Runner.execute` call recorded (windows admitted, sequences decoded, host
   time of the call, its admission and decode parts): the wall splits into admission steps,
   decode-only steps and the engine loop around them (schedule, update, results);
2. under torch.profiler (CUDA kernels only): GPU busy time (the union of kernel intervals) and
   kernel time by kind (GEMM, attention, LayerNorm, copies, ...).

    python benchmarks/profile_engine.py --tokenizer T.json --audio clips.npz \
        --runs large-v3:full_fp16,large-v3:mixed_fp8,large-v3-turbo:mixed_fp8 --windows 256

A run `shape:preset:overlap` has the encoder on its own stream (`OVERLAP_ENCODER`), `...:overlap:sms48`
also the SMs split, 48 for the steps while a pass runs (`STEP_SMS`); `shape:preset:sync`
reads each decode step back before the next is launched (`ASYNC_STEPS=0`); `shape:preset:SITE=fp8` changes a
site of the preset (`cuda_ops.precision.get_preset`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import time
from collections import Counter, defaultdict

import numpy as np
import torch

from bench_engine import random_model
from common import environment, table, write_json

KINDS = [  # (kind, pattern over the kernel name), first match wins
    ("attention", r"fmha|flash|attention|cudnn|sdpa|_attn|_decode_|softmax"),  # _decode_*: ours
    ("gemm", r"gemm|cutlass|sm90_xmma|sm80_xmma|nvjet|cublas|matmul|_scaled_mm|splitK"),
    ("layernorm", r"layer_norm|layernorm|_ln_"),
    ("mel/fft", r"fft|stft|mel|spectr"),
    ("copy", r"copy|memcpy|memset|cat|index|gather|scatter"),
    ("reduce", r"reduce|argmax|max_|sum|topk|sort"),
    ("elementwise", r"elementwise|vectorized|gelu|add|mul|fill|where"),
]


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, pattern in KINDS if re.search(pattern, low)), "other")


def short_name(name: str) -> str:
    """A kernel's name without its namespaces and return type, long enough to keep the functor of
    PyTorch's generic kernels (`elementwise_kernel<128, 4, gpu_kernel_impl_nocast<...>>` is any
    elementwise op on strided tensors until its functor says which)."""
    return re.sub(r"\bvoid |\bat::native::|\(anonymous namespace\)::|\bc10::", "", name)[:160]


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, -1.0
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def profile(shape: str, precision: str, n: int, tokens: int, tokenizer: str, window: np.ndarray,
            overlap: bool = False, async_steps: bool | None = None, step_sms: int = 0, fill: bool = True) -> dict:
    from streamer.config import EngineConfig
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions

    engine = Engine(random_model(shape, tokenizer), EngineConfig(max_slots=n, max_encoder_batch=16,
                                                                 overlap_encoder=overlap, async_steps=async_steps,
                                                                 step_sms=step_sms, fill_files_first=fill),
                    precision=None if precision == "none" else precision)
    options = DecodeOptions(language="en", temperatures=(0.0,), max_new_tokens=tokens)
    loop = asyncio.new_event_loop()

    def run():
        async def all_of():
            return await asyncio.gather(*(engine.transcribe(window, options) for _ in range(n)))
        return loop.run_until_complete(all_of())

    run()  # warm-up at this size
    calls = []
    execute = engine.runner.execute

    def timed(plan):
        t0 = time.perf_counter()
        res = execute(plan)
        calls.append((len(plan.encode), len(plan.decode), time.perf_counter() - t0, res.encode_s, res.decode_s))
        return res

    engine.runner.execute = timed
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    wall = time.perf_counter() - t0
    engine.runner.execute = execute

    admit = [c for c in calls if c[0]]
    decode_only = [c for c in calls if not c[0]]
    row = {"shape": shape, "precision": precision, "overlap": overlap, "step_sms": step_sms, "fill_files_first": fill,
           "confined_steps": engine.runner.confined_steps, "async_steps": engine.runner.async_steps, "windows": n, "wall_s": wall, "rtf": n * len(window) / 16000 / wall,
           "steps": len(calls), "admission_steps": len(admit),
           "admission_steps_s": sum(c[2] for c in admit), "of_which_admit_s": sum(c[3] for c in admit),
           "of_which_decode_s": sum(c[4] for c in admit),
           "decode_only_steps_s": sum(c[2] for c in decode_only),
           "outside_steps_s": wall - sum(c[2] for c in calls),
           "decode_batch_hist": dict(sorted(Counter(c[1] for c in calls).items()))}
    full = [c[2] for c in decode_only if c[1] == n]
    row["full_step_ms"] = 1000 * float(np.median(full)) if full else None

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        prof_wall = time.perf_counter() - t0
    intervals, by_kind, by_name = [], defaultdict(float), defaultdict(float)
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        start, length = e.time_range.start, e.time_range.end - e.time_range.start
        intervals.append((start, start + length))
        by_kind[kind_of(e.name)] += length
        by_name[short_name(e.name)] += length
    gpu = busy_us(intervals) / 1e6
    row.update(profiled_wall_s=prof_wall, gpu_busy_s=gpu, gpu_idle_s=prof_wall - gpu,
               kernel_s_by_kind={k: v / 1e6 for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
               top_kernels=[(k, v / 1e6) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:40]])

    # 3. each admission part timed alone: synchronised before and after (so parts cannot overlap).
    runner, parts = engine.runner, defaultdict(float)

    def synced(name, fn):
        def call(*a, **kw):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn(*a, **kw)
            torch.cuda.synchronize()
            parts[name] += time.perf_counter() - t
            return out
        return call

    originals = {name: getattr(runner, name) for name in ("_encode", "_languages", "_sequences", "_prefill_inputs", "_prefill", "_sample_first")}
    for name, fn in originals.items():
        setattr(runner, name, synced(name, fn))
    decoder = runner.model.decoder
    write = decoder.write_cross_kv
    decoder.write_cross_kv = synced("write_cross_kv", write)
    run()
    for name in originals:
        delattr(runner, name)
    del decoder.write_cross_kv
    row["admission_parts_s"] = dict(parts)
    engine.close()
    loop.close()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="large-v3:full_fp16,large-v3:mixed_fp8,large-v3-turbo:mixed_fp8")
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--audio", required=True)
    p.add_argument("--out", default="profile_engine.json")
    args = p.parse_args()
    data = np.load(args.audio)
    window = np.concatenate([data[k].astype(np.float32) for k in sorted(data.files)])[: 30 * 16000]
    rows = []
    for run in args.runs.split(","):
        # large-v3:mixed_fp8:overlap = OVERLAP_ENCODER on; :nofill = FILL_FILES_FIRST off; NAME=VALUE parts
        # go to the preset (get_preset)
        shape, precision, *flags = run.split(":")
        precision = ":".join([precision, *(f for f in flags if "=" in f)])
        sms = [int(f[3:]) for f in flags if f.startswith("sms")]  # :sms48 = STEP_SMS=48 (with :overlap)
        row = profile(shape, precision, args.windows, args.tokens, args.tokenizer, window, overlap="overlap" in flags,
                      async_steps=False if "sync" in flags else None, step_sms=sms[0] if sms else 0,
                      fill="nofill" not in flags)
        rows.append(row)
        print(table([row], ["shape", "precision", "overlap", "fill_files_first", "step_sms", "confined_steps", "async_steps", "windows", "wall_s", "rtf", "steps", "admission_steps",
                            "admission_steps_s", "of_which_admit_s", "of_which_decode_s", "decode_only_steps_s",
                            "outside_steps_s", "full_step_ms", "profiled_wall_s", "gpu_busy_s", "gpu_idle_s"]), flush=True)
        print("kernel seconds by kind:", {k: round(v, 3) for k, v in row["kernel_s_by_kind"].items()})
        print("decode batch sizes (steps):", row["decode_batch_hist"])
        print("admission parts (synchronised):", {k: round(v, 3) for k, v in row["admission_parts_s"].items()})
        for name, s in row["top_kernels"]:
            print(f"  {s:7.3f} s  {name}")
        write_json(args.out, {"command": "python benchmarks/profile_engine.py " + " ".join(
            f"--{k} {v}" for k, v in vars(args).items() if k not in ("tokenizer", "audio", "out")),
            "environment": environment(), "rows": rows})
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
