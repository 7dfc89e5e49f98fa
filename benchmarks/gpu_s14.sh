#!/usr/bin/env bash
# Session 14 (issue 15), first call, random weights only (nothing staged):
#   run(command="bash benchmarks/gpu_s14.sh", carry=[".carry/inputs", ".carry/s13tree"], timeout_s=600)
# A/B in one call, 256 large-v3 windows (profile_engine.py), session 13's tree (.carry/s13tree =
# `git archive efd5ef6 streamer cuda_ops benchmarks`) against this one, mixed_fp8 then full_fp16:
# this tree's admission makes no host sync where file windows alone decode (pinned copies, first
# tokens read back with the next step's) and compaction copies 8-byte words, self K/V only up to
# the positions written. Session 13 measured GPU idle 0.18-0.26 s of a 2.6-s mixed_fp8 run and an
# index kernel of 0.087 s.
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_kernel_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
INPUTS=$PWD/.carry/inputs
[ -d .carry/s13tree/streamer ] || { echo "missing .carry/s13tree"; exit 2; }
profile() {  # profile TREE TAG RUNS TIMEOUT
  local tree=$1 tag=$2 runs=$3 t=$4 s=$SECONDS
  (cd "$tree/benchmarks" && PYTHONPATH="$(cd .. && pwd)" BENCH_RESULTS_DIR="$OUT" timeout "$t" python3 profile_engine.py \
    --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --runs "$runs" \
    --out "profile_engine_s14_${tag}_h200.json") 2>&1 | grep -v "seem to have been set\|_warn_once\|Profiler clears" \
    > "$OUT/profile_$tag.log"
  echo "== $tag rc=${PIPESTATUS[0]} $((SECONDS - s)) s (at $((SECONDS - START)) s)"
  grep -A3 "^shape\|^large" "$OUT/profile_$tag.log" | grep "^large\|kernel seconds\|admission parts" | head -6
  grep "index_elementwise\|_decode_v7" "$OUT/profile_$tag.log" | head -3
}
profile . new_fp8 large-v3:mixed_fp8 130
profile .carry/s13tree old_fp8 large-v3:mixed_fp8 130
profile . new_fp16 large-v3:full_fp16 130
profile .carry/s13tree old_fp16 large-v3:full_fp16 130
echo "== done $((SECONDS - START)) s"
