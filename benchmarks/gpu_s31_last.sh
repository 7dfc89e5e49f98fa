#!/usr/bin/env bash
# Session 31's last call: on an H200, gpu_s31.sh (the leaner absorbed kernel against the H200's baselines:
# the numbers issue 15's targets are set in); on an H100, the rows its table lacks (mixed_fp8 never ran
# on an H100), large-v3 and turbo at 128 and 256 windows, no transformers.
#   run(command="bash benchmarks/gpu_s31_last.sh", carry=[".carry/inputs"], timeout_s=420, kind="nvidia-h200")
set -uo pipefail
source benchmarks/gpu_budget.sh
gpu_begin 330
case $name in
  *H200*) SKIP_TESTS= BUDGET_S=$BUDGET exec bash benchmarks/gpu_s31.sh ;;
esac
for f in benchmarks/results/s28_h100/bench_engine*_h100.json benchmarks/results/s31_h100/call15_bench_engine*.json; do
  baselines="${baselines:-} --baseline ../$f"; done
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap 300 10) python3 bench_engine.py \
  --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --shapes large-v3,large-v3-turbo \
  --batches 128,256 --hf-batches "" --precisions mixed_fp8 $baselines --out bench_engine_s31_h100_presets.json) \
  2>&1 | grep -v "seem to have been set\|^\[transformers\]" > "$OUT/bench_engine_presets.log"
echo "engine rc=${PIPESTATUS[0]}"
grep -E "^large|^ours|SLOWER|precision" "$OUT/bench_engine_presets.log" | head -40
echo "=== $((SECONDS - START)) s in all"
