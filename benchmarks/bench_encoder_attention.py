"""The encoder's self-attention on CUDA per SDPA backend (issue 15: is cuDNN, which the engine's
encoder path puts first, the fastest there?).

Whisper large-v3 (and large-v3-turbo: the same encoder): q, k, v [B, 20, 1500, 64] fp16, no mask, as
`FusedEncoderBlock` calls it, B = the engine's encoder batch. Each backend is timed inside a CUDA
graph (its plan, if any, built before the capture), as the median over replays of one graph that
calls it on 4 copies of its inputs. TFLOP/s counts 4 * B * H * T^2 * D (QK^T and PV).
At 256 large-v3 windows the encoder's attention is ~0.3 s of a 3.38-s full_fp16 run (session 17).

    python benchmarks/bench_encoder_attention.py [--batches 8,16,32] [--out bench_encoder_attention.json]

BENCH_DRY=1: on the CPU (tiny shapes, host time, the math backend only): checks the script, measures
nothing.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

from bench_attention import DRY, capture, replay_us
from common import environment, table, write_json

H, T, D = 20, 1500, 64
COPIES = 4
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def run(batch: int, name: str, backend: SDPBackend, shape: tuple[int, int, int]) -> dict:
    h, t, d = shape
    device, dtype = ("cpu", torch.float32) if DRY else ("cuda", torch.float16)
    gen = torch.Generator(device=device).manual_seed(batch)
    qkv = [[torch.randn(batch, h, t, d, device=device, dtype=dtype, generator=gen) for _ in range(3)]
           for _ in range(COPIES)]
    outs = [None] * COPIES

    def call(i: int):
        def f():
            with sdpa_kernel([backend]):
                outs[i] = scaled_dot_product_attention(*qkv[i])
        return f

    calls = [call(i) for i in range(COPIES)]
    try:
        graph = capture(calls)
    except RuntimeError as e:  # the backend does not take this shape or dtype here
        return {"batch": batch, "backend": name, "ms": None, "TFLOPs": None, "note": str(e).splitlines()[0][:80]}
    ms = replay_us(graph, calls) / 1000
    ref = scaled_dot_product_attention(*(x.float() for x in qkv[0]))
    err = (outs[0].float() - ref).abs().max().item()
    return {"batch": batch, "backend": name, "ms": ms, "TFLOPs": 4 * batch * h * t * t * d / ms / 1e9,
            "max_abs_err": err, "note": ""}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="8,16,32")
    p.add_argument("--out", default="bench_encoder_attention.json")
    args = p.parse_args()
    shape = (2, 150, 64) if DRY else (H, T, D)
    backends = {"math": SDPBackend.MATH} if DRY else BACKENDS
    rows = [run(int(b), name, be, shape) for b in args.batches.split(",") for name, be in backends.items()]
    cols = ["batch", "backend", "ms", "TFLOPs", "max_abs_err", "note"]
    print(table(rows, cols))
    write_json(args.out, {"environment": environment(), "shape": {"H": shape[0], "T": shape[1], "D": shape[2]},
                          "rows": rows})


if __name__ == "__main__":
    main()
