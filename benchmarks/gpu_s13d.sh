#!/usr/bin/env bash
# Session 13 (issue 15): the 4-bit cross cache (cuda_ops/cross_int4.py) on the H200, after the two
# stage calls:
#   run(command="bash benchmarks/gpu_s13d.sh", carry=[".carry/tiny_b"], timeout_s=600)
# 1. its kernel tests on CUDA; 2. the launch sweep against the FP8 tile kernel
# (sweep_int4_attention.py), whose winner the rest of the call runs (STREAMER_INT4_ATTN_LAUNCH);
# 3. 256 large-v3 windows with the 4-bit cache (profile_engine.py; add ",large-v3:mixed_fp8" to
# --runs for FP8 in the same call). Session 13's earlier calls (s13b, s13c) are in git history.
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_cross_int4.py > "$OUT/cuda_tests_s13d.log" 2>&1
echo "== CUDA tests rc=$?: $(tail -1 "$OUT/cuda_tests_s13d.log") $((SECONDS - START)) s"; grep -E "^FAILED|^ERROR" "$OUT/cuda_tests_s13d.log" | head
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 150 python3 sweep_int4_attention.py --out sweep_int4_attention_s13d_h200.json) \
  > "$OUT/sweep_int4.log" 2>&1
echo "== sweep rc=$? $((SECONDS - START)) s"; grep -E "^B=|^best" "$OUT/sweep_int4.log"
BEST=$(grep "^best:" "$OUT/sweep_int4.log" | awk '{print $2}')
export STREAMER_INT4_ATTN_LAUNCH=${BEST:-64x4x3}
echo "launch $STREAMER_INT4_ATTN_LAUNCH"
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 200 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
  --audio "$INPUTS/clips.npz" --runs large-v3:mixed_fp8:cross_kv_cache=int4 \
  --out profile_engine_s13d_h200.json) 2>&1 | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile.log"
echo "== profile rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; grep "^large\|^kernel seconds\|admission parts" "$OUT/profile.log"
