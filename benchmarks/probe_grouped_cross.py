"""Cross-attention of a beam search's rows, per row (each row reads its own copy of its window's K/V,
as the runner does today) against per window (a window's beams as its query positions over one copy):
the design in docs/STATUS.md "Next" 3, measured before it is built.

    python benchmarks/probe_grouped_cross.py [--windows 12] [--beams 5] [--width 384] [--device cpu]

One decoder layer's cross-attention (1500 keys, 64-wide heads), fp32 on the CPU (fp16 on CUDA). Prints
ms per call of each and their largest difference; writes benchmarks/results/probe_grouped_cross.json.
"""

from __future__ import annotations

import argparse
import time

import torch

from common import environment, table, write_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=12)
    p.add_argument("--beams", type=int, default=5)
    p.add_argument("--width", type=int, default=384)  # tiny.en
    p.add_argument("--device", default="cpu")
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args()
    w, n, dh, s = args.windows, args.beams, 64, 1500
    h = args.width // dh
    dev = torch.device(args.device)
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    q = torch.randn(w * n, h, 1, dh, device=dev, dtype=dtype)
    k_win, v_win = (torch.randn(w, h, s, dh, device=dev, dtype=dtype) for _ in range(2))
    k_rows, v_rows = k_win.repeat_interleave(n, 0), v_win.repeat_interleave(n, 0)  # the runner's copies

    def per_row():
        return torch.nn.functional.scaled_dot_product_attention(q, k_rows, v_rows) if dev.type == "cuda" else \
            ((q @ k_rows.transpose(-1, -2)) * dh ** -0.5).softmax(-1) @ v_rows

    def per_window():
        qw = q.view(w, n, h, dh).transpose(1, 2)  # [windows, H, beams, Dh]
        a = torch.nn.functional.scaled_dot_product_attention(qw, k_win, v_win) if dev.type == "cuda" else \
            ((qw @ k_win.transpose(-1, -2)) * dh ** -0.5).softmax(-1) @ v_win
        return a.transpose(1, 2).reshape(w * n, h, 1, dh)

    def ms(fn) -> float:
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / args.calls * 1e3

    diff = (per_row() - per_window()).abs().max().item()
    rows = [{"way": name, "windows": w, "beams": n, "width": args.width, "ms_per_call": round(ms(fn), 3)}
            for name, fn in (("per row", per_row), ("per window", per_window))]
    print(table(rows, list(rows[0])))
    print(f"largest difference {diff:.3g}; per window {rows[0]['ms_per_call'] / rows[1]['ms_per_call']:.2f}x faster")
    write_json("probe_grouped_cross.json", {"command": "python benchmarks/probe_grouped_cross.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items()), "environment": environment(), "rows": rows, "max_diff": diff})


if __name__ == "__main__":
    main()
