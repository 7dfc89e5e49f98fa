#!/usr/bin/env bash
# Session 33, second call (issue 15): on an H200 first gpu_s33.sh (the targets); on any card then the
# fill-first A/B with a held step leaving the step in flight: profile_engine at 128 large-v3 windows,
# full_fp16 with FILL_FILES_FIRST on and off, alternated (ABAB) in one process per pair.
#   run(command="bash benchmarks/gpu_s33b.sh", carry=[".carry/inputs"], timeout_s=600, kind="nvidia-h200")
set -uo pipefail
source benchmarks/gpu_budget.sh
gpu_begin 570
case $name in
  *H200*) BUDGET_S=330 bash benchmarks/gpu_s33.sh ;;
esac
t=$SECONDS
w=${PROFILE_WINDOWS:-128}
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap 200 5) python3 profile_engine.py \
  --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --windows $w \
  --runs large-v3:full_fp16,large-v3:full_fp16:nofill,large-v3:full_fp16,large-v3:full_fp16:nofill \
  --out profile_engine_s33b_$w.json) > "$OUT/profile_engine_s33b_$w.log" 2>&1
grep -E "^large|decode batch" "$OUT/profile_engine_s33b_$w.log" | head -12
echo "profile A/B $((SECONDS - t)) s"
echo "=== $((SECONDS - START)) s in all"
