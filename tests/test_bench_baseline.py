"""bench_engine.py --baseline: rows matched across reports, ratios, the 10 % flag (benchmarks/baseline.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import baseline  # noqa: E402

LABEL = "large-v3 (random fp16 weights, 100 forced tokens: speed only), precision {}"


def _report(step_128: float, wall_128: float, encoder: float, precision="full_fp16", hf_wall=2.8) -> dict:
    return {"tokens_forced": 100, "runs": [{
        "model": LABEL.format(precision),
        "ours": [{"system": f"ours {precision}", "windows": 1, "wall_s": 0.33, "step_ms": 2.8},
                 {"system": f"ours {precision}", "windows": 128, "wall_s": wall_128, "step_ms": step_128}],
        "encoder": {"encoder_windows_per_s": encoder},
        "transformers": [{"system": "transformers", "windows": 128, "wall_s": hf_wall},
                         {"system": "transformers", "windows": 256, "wall_s": None, "note": "out of memory"}]}]}


def _by(rows, windows, metric, system="ours"):
    return next(r for r in rows if r["windows"] == windows and r["metric"] == metric and r["system"] == system)


def test_ratios_and_the_ten_percent_flag():
    old = _report(step_128=11.16, wall_128=2.21, encoder=212)
    new = _report(step_128=18.4, wall_128=2.40, encoder=200)  # step +65 %, wall +8.6 %, encoder 6 % slower
    rows = baseline.compare(new, [("old.json", old)])
    step = _by(rows, 128, "step_ms")
    assert step["slower_x"] == pytest.approx(18.4 / 11.16) and step["flag"] == "SLOWER"
    wall = _by(rows, 128, "wall_s")
    assert wall["slower_x"] == pytest.approx(2.40 / 2.21) and wall["flag"] == ""
    enc = _by(rows, "encoder", "encoder_windows_per_s")
    assert enc["slower_x"] == pytest.approx(212 / 200) and enc["flag"] == ""  # fewer windows/s is slower
    assert _by(rows, 1, "step_ms")["slower_x"] == pytest.approx(1.0)
    assert _by(rows, 128, "wall_s", "transformers")["precision"] == "-"
    assert [r for r in rows if r["flag"]] == [step]


def test_faster_rows_are_not_flagged_and_unknown_rows_are_left_out():
    old = _report(step_128=18.4, wall_128=3.0, encoder=200)
    faster = _report(step_128=11.2, wall_128=2.2, encoder=210)
    assert not any(r["flag"] for r in baseline.compare(faster, [("old.json", old)]))
    unknown = _report(11.2, 2.2, 210, precision="full_fp16+overlap")  # a variant no file has, and no fallback
    assert [r for r in baseline.compare(unknown, [("old.json", old)]) if r["system"] == "ours"] == []
    assert len(baseline.unmatched(unknown, [("old.json", old)])) == 5  # 2 rows x 2 metrics + the encoder


def test_a_preset_without_rows_of_its_own_is_held_to_the_one_it_must_beat():
    old = _report(step_128=11.16, wall_128=2.21, encoder=212)  # full_fp16 only
    new = _report(step_128=12.5, wall_128=2.2, encoder=270, precision="mixed_fp8")
    step = _by(baseline.compare(new, [("old.json", old)]), 128, "step_ms")
    assert step["baseline_file"] == "old.json (via full_fp16)" and step["flag"] == "SLOWER"
    variant = _report(step_128=8.0, wall_128=2.0, encoder=230, precision="full_fp16:cross_kv_cache=absorbed")
    step = _by(baseline.compare(variant, [("old.json", old)]), 128, "step_ms")  # a preset's variant: held to it
    assert step["baseline_file"] == "old.json (via full_fp16)" and step["slower_x"] == pytest.approx(8.0 / 11.16)
    plain = _report(step_128=13.1, wall_128=2.68, encoder=163, precision="plain")
    rows = baseline.compare(_report(18.4, 2.4, 210), [("plain.json", plain)])
    assert _by(rows, 128, "step_ms")["flag"] == "SLOWER" and _by(rows, 128, "wall_s")["flag"] == ""


def test_the_fastest_of_several_baselines_is_the_standard():
    good, regressed = _report(11.16, 2.21, 212), _report(18.59, 3.05, 199)
    new = _report(18.4, 3.0, 200)
    for files in ([("good", good), ("regressed", regressed)], [("regressed", regressed), ("good", good)]):
        step = _by(baseline.compare(new, files), 128, "step_ms")
        assert step["baseline_file"] == "good" and step["flag"] == "SLOWER"


def test_a_different_forced_length_is_not_compared():
    old = _report(11.16, 2.21, 212)
    new = dict(_report(18.4, 3.0, 200), tokens_forced=50)
    assert baseline.compare(new, [("old.json", old)]) == []


def test_labels_without_a_precision_are_plain():
    assert baseline.run_key("large-v3-turbo (random fp16 weights, 100 forced tokens: speed only)") == ("large-v3-turbo", "plain")
    assert baseline.run_key("tiny.en (real weights, real audio), precision mixed_fp8+overlap") == ("tiny.en", "mixed_fp8+overlap")


def test_the_committed_regression_is_flagged():
    """The 2026-11-30 14:12 run (after the cuDNN change) against the 06:40 presets run: issue 15's step."""
    results = BENCH / "results"
    [(_, rerun)] = baseline.load([results / "bench_engine_overlap_h200.json"])
    rows = baseline.compare(rerun, baseline.load([results / "bench_engine_presets_h200.json", results / "bench_engine_h200.json"]))
    step = next(r for r in rows if r["precision"] == "full_fp16" and r["windows"] == 128 and r["metric"] == "step_ms")
    assert step["flag"] == "SLOWER" and step["slower_x"] == pytest.approx(18.59 / 11.16, rel=0.01)
