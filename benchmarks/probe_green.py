"""Probe on a CUDA GPU (issue 15): does an encoder pass confined to part of the SMs (a CUDA green
context, `green_stream` below) leave decode steps their pace, and where does a decode step's time go?

Measured on the H200 in session 12 (docs/benchmarks.md): it does not pay. A decode step is bound by
memory bandwidth, which it reaches only with nearly every SM issuing loads: 5 steps of 256 rows beside
one encoder pass on 96 SMs took 110 ms against 116 ms one after the other, and the engine with the
encoder so confined ran 256 large-v3 windows at rtf 2,283-2,291 against 2,617 without overlap. So
this stays a probe (the green-context code lives here, not in the engine).

1. Confinement: an fp16 GEMM on a 16-SM green stream against the whole GPU, eager and as CUDA
   graphs captured on either stream (which context a replayed graph's kernels run in).
2. A decode step (the engine's captured graph at R rows) kernel by kernel (torch.profiler).
3. One encoder pass (16 windows, captured) on M SMs beside K decode steps on the rest, against the
   two run one after the other, and against today's overlap (no partition, step stream priority).
4. `--split S`: the step captured on S SMs and the encoder on the other SMs (`green_pair`), disjoint,
   side by side (session 18: cuDNN's cross-attention reads at 95 % of its bandwidth on 64 SMs,
   probe_sm_bandwidth.py; session 12 had confined only the encoder).

    python benchmarks/probe_green.py --tokenizer T.json --shape large-v3 --preset mixed_fp8 \
        --rows 256,64 --encoder-sms 96,112,120
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from bench_engine import random_model
from common import environment, write_json

from streamer.engine.partition import green_pair, green_stream

def cuda_ms(fn, stream=None, n: int = 10) -> float:
    stream = stream or torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(n):
            fn()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / n


def capture(fn, stream) -> torch.cuda.CUDAGraph:
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        fn()
    torch.cuda.synchronize()
    return g


def confinement(green) -> dict:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    out = torch.empty_like(a)
    mm = lambda: torch.matmul(a, a, out=out)  # noqa: E731
    plain = torch.cuda.Stream()
    g_plain = capture(mm, plain)
    g_green = capture(mm, green.stream)
    r = {"green_sms": green.sms,
         "eager_whole_ms": cuda_ms(mm, plain), "eager_green_ms": cuda_ms(mm, green.stream),
         "graph_plain_on_plain_ms": cuda_ms(g_plain.replay, plain),
         "graph_plain_on_green_ms": cuda_ms(g_plain.replay, green.stream),
         "graph_green_on_green_ms": cuda_ms(g_green.replay, green.stream),
         "graph_green_on_plain_ms": cuda_ms(g_green.replay, plain)}
    print("confinement (8192^3 fp16 GEMM):", {k: round(v, 3) for k, v in r.items()}, flush=True)
    return r


def step_kernels(step_graph, n: int = 5) -> list[tuple[str, float, float]]:
    """(kernel, µs per step, launches per step) over n replays of a captured step."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step_graph.replay()
        torch.cuda.synchronize()
    us, count = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[e.name[:100]] += e.time_range.end - e.time_range.start
            count[e.name[:100]] += 1
    return sorted(((k, us[k] / n, count[k] / n) for k in us), key=lambda r: -r[1])


def concurrent(encoder_graph, enc_stream, step_graph, k: int) -> dict:
    """One encoder replay on `enc_stream` beside k step replays on a high-priority stream."""
    main = torch.cuda.Stream(priority=-1)
    ev = {name: torch.cuda.Event(enable_timing=True) for name in ("start", "enc", "dec")}
    for _ in range(2):
        torch.cuda.synchronize()
        ev["start"].record(torch.cuda.current_stream())
        enc_stream.wait_event(ev["start"])
        main.wait_event(ev["start"])
        with torch.cuda.stream(enc_stream):
            encoder_graph.replay()
            ev["enc"].record(enc_stream)
        with torch.cuda.stream(main):
            for _ in range(k):
                step_graph.replay()
            ev["dec"].record(main)
        torch.cuda.synchronize()
    enc_ms, dec_ms = ev["start"].elapsed_time(ev["enc"]), ev["start"].elapsed_time(ev["dec"])
    return {"encoder_done_ms": enc_ms, "steps_done_ms": dec_ms, "wall_ms": max(enc_ms, dec_ms)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--shape", default="large-v3")
    p.add_argument("--preset", default="mixed_fp8")
    p.add_argument("--rows", default="256,64")
    p.add_argument("--encoder-sms", default="96,112,120")
    p.add_argument("--split", default="", help="step SMs S,...: the step on S SMs and the encoder on the rest")
    p.add_argument("--out", default="probe_green.json")
    args = p.parse_args()
    from streamer.config import EngineConfig
    from streamer.engine.engine import Engine
    from streamer.engine.runner import attention_for

    result = {"command": f"python benchmarks/probe_green.py --shape {args.shape} --preset {args.preset} "
                         f"--rows {args.rows} --encoder-sms {args.encoder_sms} --split {args.split}", "environment": environment()}
    result["confinement"] = confinement(green_stream(16))
    rows = [int(x) for x in args.rows.split(",")]
    engine = Engine(random_model(args.shape, args.tokenizer), EngineConfig(max_slots=max(rows), max_encoder_batch=16),
                    precision=args.preset)
    runner = engine.runner
    enc = runner.encoder_graphs[16]
    enc_plain_stream = torch.cuda.Stream()
    with torch.inference_mode():
        enc_alone = cuda_ms(enc.graph.replay, enc_plain_stream, 5)
        print(f"encoder pass (16 windows, captured) alone: {enc_alone:.2f} ms", flush=True)
        result["encoder_alone_ms"] = enc_alone
        confined = {}
        for m in [int(x) for x in args.encoder_sms.split(",")]:
            gs = green_stream(m)
            with attention_for("encoder"):  # as Runner._capture_encoder
                g = capture(lambda: runner.model.encoder(enc.mel), gs.stream)
            confined[m] = (gs, g)
            result[f"encoder_on_{gs.sms}_sms_ms"] = cuda_ms(g.replay, gs.stream, 5)
            print(f"encoder pass on {gs.sms} SMs alone: {result[f'encoder_on_{gs.sms}_sms_ms']:.2f} ms", flush=True)
        split = []
        for n in [int(x) for x in args.split.split(",") if x]:
            part, rest = green_pair(n)
            with attention_for("encoder"):
                g = capture(lambda: runner.model.encoder(enc.mel), rest.stream)
            result[f"encoder_on_{rest.sms}_sms_ms"] = cuda_ms(g.replay, rest.stream, 5)
            print(f"encoder pass on the other {rest.sms} SMs alone: {result[f'encoder_on_{rest.sms}_sms_ms']:.2f} ms", flush=True)
            split.append((part, rest, g))
        result["rows"] = []
        for r in rows:
            step = runner._graph(runner.bucket(r))[0]
            step_ms = cuda_ms(step.replay, None, 20)
            kernels = step_kernels(step)
            print(f"\n== decode step at {r} rows: {step_ms:.3f} ms; kernels (µs per step, launches):", flush=True)
            for name, us, c in kernels[:25]:
                print(f"  {us:9.1f} {c:5.0f}  {name}")
            k = max(1, round(enc_alone / step_ms))
            row = {"rows": r, "step_ms": step_ms, "k_steps": k, "sequential_ms": enc_alone + k * step_ms,
                   "kernels": [list(x) for x in kernels[:40]],
                   "overlap_no_partition": concurrent(enc.graph, enc_plain_stream, step, k)}
            for m, (gs, g) in confined.items():
                row[f"overlap_encoder_{gs.sms}_sms"] = concurrent(g, gs.stream, step, k)
            for part, rest, enc_rest in split:  # both confined, on disjoint SMs
                step_part = runner._capture(runner.bucket(r), part.stream)[0]
                row[f"step_on_{part.sms}_sms_ms"] = cuda_ms(step_part.replay, part.stream, 20)
                print(f"  step on {part.sms} SMs alone: {row[f'step_on_{part.sms}_sms_ms']:.3f} ms", flush=True)
                row[f"overlap_step_{part.sms}_encoder_{rest.sms}_sms"] = concurrent(enc_rest, rest.stream, step_part, k)
            for key, v in row.items():
                if key.startswith("overlap"):
                    print(f"  {key}: wall {v['wall_ms']:.1f} ms (encoder done {v['encoder_done_ms']:.1f}, {k} steps done "
                          f"{v['steps_done_ms']:.1f}) vs sequential {row['sequential_ms']:.1f}", flush=True)
            result["rows"].append(row)
    engine.close()
    write_json(args.out, result)


if __name__ == "__main__":
    main()
