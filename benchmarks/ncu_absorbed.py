"""The absorbed cross-attention kernel (cuda_ops/cross_absorbed_mma.py) alone at one shape, for Nsight
Compute: where a block's time goes (stall reasons, pipe use, shared memory and DRAM throughput).

    ncu --kernel-name regex:absorbed_mma --launch-skip 2 --launch-count 1 --set full \\
        python benchmarks/ncu_absorbed.py [--rows 128] [--width 1280] [--tile 32x2]

Runs the kernel four times (the first compiles it) on random inputs of a large-v3 decode step.
"""

from __future__ import annotations

import argparse

import torch

from cuda_ops import cross_absorbed_mma


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--heads", type=int, default=20)
    p.add_argument("--tile", default="", help="positions x stages [x warps [x late]] (default: choose_tile's)")
    args = p.parse_args()
    gen = torch.Generator(device="cpu").manual_seed(0)
    qa = (torch.randn(args.rows, args.heads, args.width, generator=gen) * args.width**-0.5).cuda().half()
    x = torch.randn(args.rows, 1500, args.width, generator=gen).cuda().half()
    tile = cross_absorbed_mma.parse_tile(args.tile) if args.tile else None
    for _ in range(4):
        cross_absorbed_mma.absorbed_attention_mma(qa, x, tile=tile)
    torch.cuda.synchronize()
    print("ran", args.rows, "rows", tile or "default tile")


if __name__ == "__main__":
    main()
