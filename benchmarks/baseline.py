"""A rerun of bench_engine.py against recorded runs: the ratio per row, and rows more than 10 % slower.

Rows are matched by (model, precision, system, windows): the model is the label's name before
" (" ("large-v3", "tiny.en"), the precision what follows ", precision " ("plain" when absent, as in
the oldest files), the system "ours" or "transformers". Compared per row: `wall_s` and `step_ms`
(slower = larger), and per run the encoder's `encoder_windows_per_s` (slower = smaller). With
several baseline files, each row is compared with the fastest recorded value for it: a regressed
run that was committed (as the decode step of 2026-11-30 14:12 was, issue 15) does not become the
new standard. A row that no file has for its own preset is compared with the preset it must not
be slower than (`FALLBACK`: full_fp16 is plain PyTorch plus our kernels, the FP8 presets are
offered only where they beat full_fp16; a preset with fields overridden, "full_fp16:cross_kv_cache=absorbed",
is held to the preset itself), marked "(via PRESET)". Runs with a different forced
token count are not compared.

    python benchmarks/baseline.py NEW.json OLD.json [OLD2.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SLOWER = 1.10
"""A row is flagged when it takes more than this times its baseline's time."""

FALLBACK = {"full_fp16": "plain", "mixed_fp8": "full_fp16", "aggressive_fp8": "mixed_fp8"}
"""preset -> the preset whose recorded rows it is held to when it has none of its own."""

# metric -> True when larger is slower
METRICS = {"wall_s": True, "step_ms": True}
ENCODER_METRIC = "encoder_windows_per_s"


def run_key(label: str) -> tuple[str, str]:
    """(model, precision) of a run label such as 'large-v3 (random ...), precision mixed_fp8'."""
    head, _, precision = label.partition(", precision ")
    return head.split(" (")[0].strip(), precision.strip() or "plain"


def measurements(report: dict) -> dict[tuple, float]:
    """{(model, precision, system, windows, metric): value} of one bench_engine report."""
    out: dict[tuple, float] = {}
    tokens = report.get("tokens_forced")
    for run in report.get("runs", []):
        model, precision = run_key(run["model"])
        for row in run.get("ours", []):
            for metric in METRICS:
                if row.get(metric):
                    out[(model, precision, "ours", row["windows"], metric, tokens)] = row[metric]
        for row in run.get("transformers", []):
            if row.get("wall_s"):  # the same for every precision of a model: any run's copy
                out.setdefault((model, "-", "transformers", row["windows"], "wall_s", tokens), row["wall_s"])
        value = (run.get("encoder") or {}).get(ENCODER_METRIC)
        if value:
            out[(model, precision, "ours", "encoder", ENCODER_METRIC, tokens)] = value
    return out


def _slower_when_larger(metric: str) -> bool:
    return METRICS.get(metric, False)


def best_of(baselines: list[tuple[str, dict]]) -> dict[tuple, tuple[float, str]]:
    """{key: (fastest recorded value, file it came from)} over (name, report) pairs."""
    best: dict[tuple, tuple[float, str]] = {}
    for name, report in baselines:
        for key, value in measurements(report).items():
            larger_slower = _slower_when_larger(key[4])
            old = best.get(key)
            if old is None or (value < old[0] if larger_slower else value > old[0]):
                best[key] = (value, name)
    return best


def compare(report: dict, baselines: list[tuple[str, dict]], slower: float = SLOWER) -> list[dict]:
    """One dict per measurement of `report` that has a baseline: ratio = how many times slower."""
    best = best_of(baselines)
    rows = []
    for key, value in measurements(report).items():
        found, via = _lookup(best, key)
        if found is None:
            continue
        old, source = found
        if via != key[1]:
            source += f" (via {via})"
        ratio = value / old if _slower_when_larger(key[4]) else old / value
        model, precision, system, windows, metric, _ = key
        rows.append({"model": model, "precision": precision, "system": system, "windows": windows, "metric": metric,
                     "baseline": old, "now": value, "slower_x": ratio, "flag": "SLOWER" if ratio > slower else "",
                     "baseline_file": source})
    return rows


def _lookup(best: dict, key: tuple):
    """(best[key] or that of the first FALLBACK preset that has one, the precision it came from)."""
    precision = key[1]
    while precision is not None:
        k = (key[0], precision, *key[2:])
        if k in best:
            return best[k], precision
        # A preset with fields overridden ("full_fp16:cross_kv_cache=absorbed") is held to its preset.
        precision = precision.split(":")[0] if ":" in precision else FALLBACK.get(precision)
    return None, None


def unmatched(report: dict, baselines: list[tuple[str, dict]]) -> list[tuple]:
    """Measurements of `report` that no baseline has (new shapes, or batch sizes no preset ran)."""
    best = best_of(baselines)
    return [k for k in measurements(report) if _lookup(best, k)[0] is None]


def load(paths: list[str]) -> list[tuple[str, dict]]:
    return [(Path(p).name, json.loads(Path(p).read_text())) for p in paths]


COLUMNS = ["model", "precision", "system", "windows", "metric", "baseline", "now", "slower_x", "flag", "baseline_file"]


def main() -> int:
    from common import table

    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    report = json.loads(Path(sys.argv[1]).read_text())
    rows = compare(report, load(sys.argv[2:]))
    print(table(rows, COLUMNS) if rows else "no row matches a baseline")
    flagged = [r for r in rows if r["flag"]]
    print(f"{len(flagged)} of {len(rows)} compared rows more than {SLOWER - 1:.0%} slower than their baseline")
    return 3 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
