"""p95 finalisation latency against concurrent streams, one line per load-test result file.

    pip install -e '.[bench]'    # matplotlib
    python benchmarks/plot_streaming.py OUT.png RESULT.json[=LABEL] ...

Reads `bench_streaming.py` results (their `runs`), draws the p95 (solid) and p50 (dotted)
finalisation latency of each, the 1-s target, and marks runs with failed connections.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, specs = Path(argv[0]), argv[1:]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for spec in specs:
        path, _, label = spec.partition("=")
        data = json.loads(Path(path).read_text())
        runs = [r for r in data["runs"] if r.get("final_p95") is not None]
        label = label or f"{data.get('model')} ({Path(path).stem})"
        xs = [r["clients"] for r in runs]
        (line,) = ax.plot(xs, [r["final_p95"] for r in runs], marker="o", label=f"{label}: p95")
        ax.plot(xs, [r["final_p50"] for r in runs], linestyle=":", color=line.get_color())
        for r in runs:
            if r["failed"]:
                ax.annotate(f"{r['failed']} failed", (r["clients"], r["final_p95"]), textcoords="offset points",
                            xytext=(4, 6), fontsize=7, color=line.get_color())
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("concurrent live streams")
    ax.set_ylabel("finalisation latency, s (from end of speech)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Live finals: p95 (solid) and p50 (dotted) against concurrency")
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
