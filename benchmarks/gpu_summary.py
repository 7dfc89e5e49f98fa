"""The compact end of a gpu_session.sh run: per model and preset the rtf, decode step (and its
floor) and speedup per batch, the encoder, the rows flagged against the baseline, first-token
latency against the committed run, and the tests' closing line.

    python benchmarks/gpu_summary.py ENGINE.json [PREFILL.json COMMITTED_PREFILL.json] [TESTS.log]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import table


def engine_rows(report: dict) -> list[dict]:
    rows = []
    for run in report.get("runs", []):
        model = run["model"].split(" (")[0] + " " + run["model"].partition(", precision ")[2]
        enc = run.get("encoder") or {}
        for o in run["ours"]:
            rows.append({"run": model, "windows": o["windows"], "wall_s": o.get("wall_s"), "rtf": o.get("rtf"),
                         "step_ms": o.get("step_ms"), "floor_ms": o.get("step_floor_ms"),
                         "step/floor": o.get("step_over_floor"), "vs_hf": o.get("speedup_vs_transformers"),
                         "enc_w/s": enc.get("encoder_windows_per_s") if o is run["ours"][0] else None})
    return rows


def preset_ratios(report: dict, base: str = "full_fp16") -> list[dict]:
    """Per model and batch: each other preset's step and wall time over `base`'s (< 1: faster).
    Issue 15's rule: an FP8 preset is offered as better only at <= 1 for every batch."""
    runs: dict[tuple, dict] = {}
    for run in report.get("runs", []):
        model, precision = run["model"].split(" (")[0], run["model"].partition(", precision ")[2]
        for o in run["ours"]:
            runs[(model, precision, o["windows"])] = o
    rows = []
    for (model, precision, windows), o in runs.items():
        ref = runs.get((model, base, windows))
        if precision == base or ref is None:
            continue
        ratio = lambda k: round(o[k] / ref[k], 3) if o.get(k) and ref.get(k) else None  # noqa: E731
        rows.append({"model": model, "preset": precision, "windows": windows, "step_ms": o.get("step_ms"),
                     f"{base}_step_ms": ref.get("step_ms"), "step_ratio": ratio("step_ms"), "wall_ratio": ratio("wall_s"),
                     "rtf": o.get("rtf")})
    return rows


def main() -> None:
    args = [Path(a) for a in sys.argv[1:]]
    engine = next((a for a in args if a.name.startswith("bench_engine") and a.exists()), None)
    if engine:
        report = json.loads(engine.read_text())
        print(f"engine ({engine.name}; ceilings {report.get('ceilings')})")
        print(table(engine_rows(report), ["run", "windows", "wall_s", "rtf", "step_ms", "floor_ms", "step/floor",
                                          "vs_hf", "enc_w/s"]))
        base = report.get("baseline")
        if base:
            flagged = [r for r in base["rows"] if r["flag"]]
            print(f"baseline: {base['flagged']} of {len(base['rows'])} compared rows > 10 % slower "
                  f"({len(base['not_in_baseline'])} measurements have no baseline)")
            if flagged:
                print(table(flagged, ["model", "precision", "system", "windows", "metric", "baseline", "now", "slower_x",
                                      "baseline_file"]))
        ratios = preset_ratios(report)
        if ratios:
            print("against full_fp16 (ratio < 1: faster; the FP8 target is <= 1 at every batch)")
            print(table(ratios, list(ratios[0])))
        for name, t in report.get("transcripts", {}).items():
            for against in ("transformers", "full_fp16"):  # full_fp16's: runs without transformers have one too
                ref = t.get(against, [])
                same = {k: sum(a.strip() == b.strip() for a, b in zip(v, ref)) for k, v in t.items()
                        if k not in ("files", "transformers", against)}
                print(f"{name} greedy transcripts equal to {against} (of {len(ref)}, stripped): {same}")
        for e in report.get("errors", []):
            print("ERROR", e)
    else:
        print("engine: no result (see bench_engine.log)")
    prefill = [a for a in args if a.name.startswith("bench_prefill")]
    if prefill and prefill[0].exists():
        def variant(r: dict) -> str:  # runs before session 29 name it "attention"
            return r.get("variant", r.get("attention"))

        rows = [dict(r, variant=variant(r)) for r in json.loads(prefill[0].read_text())["rows"]]
        if len(prefill) > 1 and prefill[1].exists():
            rows += [dict(r, variant=variant(r) + " (committed)") for r in json.loads(prefill[1].read_text())["rows"]]
        print("\nfirst token of windows with new prompt lengths (bench_prefill.py)")
        print(table(rows, ["variant", "background", "windows", "first_token_p50_ms", "first_token_max_ms", "result_p50_ms"]))
    log = next((a for a in args if a.suffix == ".log" and a.exists()), None)
    if log:
        tail = [line for line in log.read_text().splitlines() if line.strip()]
        print("\ntests:", tail[-1] if tail else "(no output)")


if __name__ == "__main__":
    main()
