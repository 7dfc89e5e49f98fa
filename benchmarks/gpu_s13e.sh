#!/usr/bin/env bash
# Session 13, last call (issue 15): the self K/V write kernel (cuda_ops/kv_write.py) on CUDA: its
# test, then 256 large-v3 windows in mixed_fp8 with it (profile_engine.py; the index kernel was
# 0.124 s of the run). Random weights only:
#   run(command="bash benchmarks/gpu_s13e.sh", carry=[".carry/inputs"], timeout_s=200)
set -uo pipefail
source benchmarks/gpu_kernel_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 45 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_kv_write.py > "$OUT/cuda_tests_s13e.log" 2>&1
echo "== CUDA tests rc=$?: $(tail -1 "$OUT/cuda_tests_s13e.log") $SECONDS s"
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 110 python3 profile_engine.py --tokenizer ../.carry/inputs/tokenizer_multilingual.json \
  --audio ../.carry/inputs/clips.npz --runs large-v3:mixed_fp8 --out profile_engine_s13e_h200.json) 2>&1 \
  | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile.log"
echo "== profile rc=${PIPESTATUS[0]} $SECONDS s"; grep -A14 "^large\|^shape" "$OUT/profile.log" | head -24
