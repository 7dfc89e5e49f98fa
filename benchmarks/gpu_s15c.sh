#!/usr/bin/env bash
# Session 15's third call (issue 15), on the same warm machine after gpu_s15b.sh:
#   run(command="bash benchmarks/gpu_s15c.sh", carry=[".carry/tiny_b"], timeout_s=450)
# 1. the engine at 256 large-v3 windows with the 4-bit cache through v2 at 2 stages (the sweep's best);
# 2. bench_engine.py: tiny.en real weights on 41 real clips (transcripts for WER per preset) and large-v3
#    at 128 / 256 windows, full_fp16, mixed_fp8 and mixed_fp8 with the 4-bit cache (v2, 2 stages),
#    against every committed run (the guard).
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
export STREAMER_INT4_ATTN_KERNEL=v2 STREAMER_INT4_V2_STAGES=2
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 100 python3 profile_engine.py \
  --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" \
  --runs large-v3:mixed_fp8:cross_kv_cache=int4 --out profile_engine_s15_int4v2s2_h200.json) 2>&1 \
  | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile_int4v2s2.log"
echo "== profile int4 v2 s2 rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; grep -A6 "^large" "$OUT/profile_int4v2s2.log" | head -8
baselines=""
for f in benchmarks/results/bench_engine*_h200.json; do baselines="$baselines --baseline ../$f"; done
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $((400 - (SECONDS - START))) python3 bench_engine.py \
  --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --real tiny.en=$TINY \
  --shapes large-v3 --batches 128,256 --hf-batches "" \
  --precisions full_fp16,mixed_fp8,mixed_fp8:cross_kv_cache=int4 $baselines --out bench_engine_s15_h200.json) \
  2>&1 | grep -v "seem to have been set" > "$OUT/bench_engine.log"
echo "== engine rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; grep -v "^\s*$" "$OUT/bench_engine.log" | tail -45
