#!/usr/bin/env bash
# Session 13, second call (issue 15): the 4-bit cross cache (cuda_ops/cross_int4.py) on the H200.
#   after the two stage calls: run(command="bash benchmarks/gpu_s13b.sh", carry=[".carry/tiny_b"], timeout_s=600)
# 1. its kernel tests and the fused-model tests on CUDA;
# 2. decode attention over it against the FP8 tile cache (bench_attention.py, cross rows only);
# 3. 256 large-v3 windows, mixed_fp8 against mixed_fp8 with the 4-bit cache (profile_engine.py);
# 4. bench_engine.py with the 4-bit cache: large-v3 and turbo shapes, tiny.en's real weights (transcripts
#    for WER against the references, computed on the CPU afterwards).
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_cross_int4.py tests/test_fused.py \
  > "$OUT/cuda_tests_s13b.log" 2>&1
echo "== CUDA tests rc=$?: $(tail -1 "$OUT/cuda_tests_s13b.log") $((SECONDS - START)) s"; grep -E "^FAILED|^ERROR" "$OUT/cuda_tests_s13b.log" | head
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 120 python3 bench_attention.py --no-self --batches 1,8,32,128,256 \
  --out bench_attention_int4_s13_h200.json) > "$OUT/attention.log" 2>&1
echo "== attention rc=$? $((SECONDS - START)) s"; grep -A8 "^FP8 cross" "$OUT/attention.log"
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 200 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
  --audio "$INPUTS/clips.npz" --runs large-v3:mixed_fp8,large-v3:mixed_fp8:cross_kv_cache=int4 \
  --out profile_engine_s13b_h200.json) 2>&1 | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile.log"
echo "== profile rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; grep "^large\|^kernel seconds\|admission parts" "$OUT/profile.log"
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $((560 - (SECONDS - START))) python3 bench_engine.py \
  --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --real tiny.en=$TINY \
  --shapes large-v3,large-v3-turbo --batches 1,32,128,256 --hf-batches 1 --precisions mixed_fp8:cross_kv_cache=int4 \
  --out bench_engine_int4_s13_h200.json) 2>&1 | grep -v "seem to have been set" > "$OUT/bench_engine.log"
echo "== engine rc=${PIPESTATUS[0]} $((SECONDS - START)) s"
grep -E "^(tiny|large)" "$OUT/bench_engine.log" | head -24
