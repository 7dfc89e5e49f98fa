#!/usr/bin/env bash
# FP8 kernels of issue 15 (session 6) on the H200 in one call of at most BUDGET_S seconds (default 320):
#   1. CUDA tests of the FP8 kernels: cross-K/V quantise pass + GEMM epilogue, decode attention, FP8
#      linears (tests/kernels/test_{cross_kv,attention,fp8}.py; failures are listed, nothing stops);
#   2. bench_cross_kv.py (large-v3, 16 windows): cuBLAS alone, cuBLAS + the old quantize_kv, cuBLAS + the
#      quantise pass (the engine's path), the pass alone per launch against its floor (one read + one
#      write at the measured copy bandwidth), the fused GEMM launches;
#   3. bench_attention.py --sweep --batches 32,128,256: FP8 (tile-scaled) decode cross-attention at the
#      chosen launch (choose_launch) against the copy bandwidth (target >= 80 %), and the sweep around it.
# No inputs to stage, nothing installed: torch and triton of the machine, from the repo root:
#   run(command="bash benchmarks/gpu_fp8s6.sh", timeout_s=420)
# Env: SKIP_TESTS=1, SKIP_CROSS=1, SKIP_ATTN=1, ATTN_BATCHES (32,128,256), BUDGET_S (320).
# JSON: benchmarks/results/bench_cross_kv_fp8s6.json, bench_attention_fp8s6.json (copied to $OUT with the
# logs cuda_tests_fp8s6.log, bench_cross_kv_fp8s6.log, bench_attention_fp8s6.log, summary_fp8s6.txt).
# Expected: ~40-90 s tests, ~45 s cross K/V, ~60-120 s attention: ~3-4 min (caps 90 + 75 + 140 s).
# BENCH_DRY=1 runs the two benchmarks on a CPU through Triton's interpreter (a check of the script).
set -uo pipefail
START=$SECONDS
BUDGET=${BUDGET_S:-320}
OUT=${OUT:-/tmp/fp8s6_out}
mkdir -p "$OUT" benchmarks/results
source benchmarks/gpu_budget.sh
source benchmarks/gpu_kernel_env.sh

if [ -z "${SKIP_TESTS:-}" ]; then
  t=$SECONDS
  timeout $(cap 90 215) python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_cross_kv.py \
    tests/kernels/test_attention.py tests/kernels/test_fp8.py > "$OUT/cuda_tests_fp8s6.log" 2>&1
  echo "=== CUDA kernel tests rc=$? $((SECONDS - t)) s: $(tail -1 "$OUT/cuda_tests_fp8s6.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/cuda_tests_fp8s6.log" | head -30
fi

if [ -z "${SKIP_CROSS:-}" ]; then
  t=$SECONDS
  (cd benchmarks && timeout $(cap 75 140) python3 bench_cross_kv.py --batch 16 --out bench_cross_kv_fp8s6.json) \
    > "$OUT/bench_cross_kv_fp8s6.log" 2>&1
  echo "=== bench_cross_kv rc=$? $((SECONDS - t)) s"
  sed -n '/^cross K\/V of/,$p' "$OUT/bench_cross_kv_fp8s6.log"
  grep -E "Error|error" "$OUT/bench_cross_kv_fp8s6.log" | head -5
fi

if [ -z "${SKIP_ATTN:-}" ]; then
  t=$SECONDS
  (cd benchmarks && timeout $(cap 140 5) python3 bench_attention.py --sweep --batches "${ATTN_BATCHES:-32,128,256}" \
    --no-self --out bench_attention_fp8s6.json) > "$OUT/bench_attention_fp8s6.log" 2>&1
  echo "=== bench_attention rc=$? $((SECONDS - t)) s"
  grep -E "^sweep" "$OUT/bench_attention_fp8s6.log" | cut -c1-400
  sed -n '/^copy bandwidth/,$p' "$OUT/bench_attention_fp8s6.log"
  grep -E "Error|error" "$OUT/bench_attention_fp8s6.log" | grep -v "'error'" | head -5
fi

cp benchmarks/results/bench_cross_kv_fp8s6.json benchmarks/results/bench_attention_fp8s6.json "$OUT/" 2>/dev/null
{
  echo "=== summary ($((SECONDS - START)) s in all)"
  tail -1 "$OUT/cuda_tests_fp8s6.log" 2>/dev/null
  grep -E "^summary:" "$OUT/bench_cross_kv_fp8s6.log" 2>/dev/null
  sed -n '/^FP8 cross-attention/,$p' "$OUT/bench_attention_fp8s6.log" 2>/dev/null | grep -v "^wrote"
} 2>&1 | tee "$OUT/summary_fp8s6.txt"
