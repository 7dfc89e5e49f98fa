#!/usr/bin/env bash
# Session 33 (issue 15): one call, on whichever card comes (H200: the "2x transformers at 128" target).
#   run(command="bash benchmarks/gpu_s33.sh", carry=[".carry/inputs"], timeout_s=600, kind="nvidia-h200")
# 1. bench_engine, large-v3 shape, full_fp16 (files fill the batch first, the new default) at BATCHES with
#    transformers at HF_BATCHES, against the last recorded runs on this kind of card (--baseline);
# 2. the same preset with FILL_FILES_FIRST off (full_fp16+nofill) at AB_BATCHES, in a process of its own
#    (two large-v3 engines in one process ran out of memory on the H100 in session 31);
# 3. profile_engine at PROFILE_WINDOWS, fill on and off: the wall by part, kernel time by kind.
# Env: BATCHES (1,16,128,256), HF_BATCHES (128), AB_BATCHES (128,256; "" skips 2), PROFILE_WINDOWS (128; 0
# skips 3), BUDGET_S (570). Each bench_engine row is the fastest of 3 timed runs since session 33.
# The last call of session 33: AB_BATCHES= PROFILE_WINDOWS=0 bash benchmarks/gpu_s33.sh
set -uo pipefail
source benchmarks/gpu_budget.sh
gpu_begin 570
case $name in
  *H200*) files="benchmarks/results/bench_engine*_h200.json benchmarks/results/s30_h200/bench_engine*.json" ;;
  *) files="benchmarks/results/s28_h100/bench_engine*_h100.json benchmarks/results/s31_h100/call15_bench_engine*.json benchmarks/results/s33_h100/bench_engine_s33.json benchmarks/results/s33_h100/bench_engine_s33c.json" ;;
esac
baselines=""  # the last recorded runs on this kind of card (an H200's against an H100's would flag the card)
for f in $files; do [ -e "$f" ] && baselines="$baselines --baseline ../$f"; done
engine() {  # engine PRECISION BATCHES HF_BATCHES OUTNAME WANT_S KEEP_S
  local t=$SECONDS
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap $5 $6) python3 bench_engine.py \
    --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --shapes large-v3 \
    --batches "$2" --hf-batches "$3" --precisions "$1" $baselines --out "$4") 2>&1 \
    | grep -v "seem to have been set\|^\[transformers\]" > "$OUT/${4%.json}.log"
  echo "engine $1 rc=${PIPESTATUS[0]} (3: rows > 10 % slower than a baseline), $((SECONDS - t)) s"
  grep -E "^ours|^transformers|SLOWER|encoder:|Error" "$OUT/${4%.json}.log" | head -12
}
engine full_fp16 "${BATCHES:-1,16,128,256}" "${HF_BATCHES-128}" bench_engine_s33.json 240 200
[ -n "${AB_BATCHES-128,256}" ] && engine full_fp16+nofill "${AB_BATCHES-128,256}" "" bench_engine_s33_nofill.json 120 90
t=$SECONDS
w=${PROFILE_WINDOWS:-128}
(( w > 0 )) && (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap 120 5) python3 profile_engine.py \
  --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" \
  --runs large-v3:full_fp16,large-v3:full_fp16:nofill --windows $w --out profile_engine_s33_$w.json) \
  > "$OUT/profile_engine_s33_$w.log" 2>&1
grep -E "^large|kernel seconds|decode batch|admission parts" "$OUT/profile_engine_s33_$w.log" | head -12
echo "profile $((SECONDS - t)) s"
echo "=== $((SECONDS - START)) s in all"
