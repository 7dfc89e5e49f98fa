#!/usr/bin/env bash
# Session 15's second call (issue 15), right after gpu_s15.sh on the same warm machine:
#   run(command="bash benchmarks/gpu_s15b.sh", carry=[".carry/tiny_b", ".carry/s13tree"], timeout_s=600)
# 1. the 4-bit cross cache's v2 decode kernel (packed fp16x2, 304 sm_90 thread-instructions a position
#    against FP8 v7's 736) against FP8 v7 and v1: sweep_int4_attention.py and the kernel tests on CUDA;
# 2. the engine at 256 large-v3 windows with the 4-bit cache through v2 (profile_engine.py), against
#    mixed_fp8's profile of gpu_s15.sh;
# 3. the second pair of the live tiny.en 1,000-stream A/B (this tree, session 13's).
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 240 python3 sweep_int4_attention.py --v1 64x4x3 \
  --out sweep_int4_attention_v2_h200.json) > "$OUT/sweep_int4_v2.log" 2>&1
echo "== sweep rc=$? $((SECONDS - START)) s"; grep -E "^B=|^best|Error|error" "$OUT/sweep_int4_v2.log" | head -24
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_cross_int4.py > "$OUT/cuda_tests_int4_v2.log" 2>&1
echo "== int4 tests rc=$? $(tail -1 "$OUT/cuda_tests_int4_v2.log") $((SECONDS - START)) s"
grep -E "^FAILED|^ERROR" "$OUT/cuda_tests_int4_v2.log" | head
(cd benchmarks && STREAMER_INT4_ATTN_KERNEL=v2 BENCH_RESULTS_DIR="$OUT" timeout 110 python3 profile_engine.py \
  --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" \
  --runs large-v3:mixed_fp8:cross_kv_cache=int4 --out profile_engine_s15_int4v2_h200.json) 2>&1 \
  | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile_int4v2.log"
echo "== profile int4 v2 rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; grep -A14 "^large" "$OUT/profile_int4v2.log" | head -16
if [ $((SECONDS - START)) -lt 400 ]; then
  load tiny15_new_2 75 --model tiny.en --clients 1000
  (cd .carry/s13tree && PYTHONPATH=$PWD:$T/site load tiny15_old_2 75 --model tiny.en --clients 1000)
fi
echo "== done $((SECONDS - START)) s"
