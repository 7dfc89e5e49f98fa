#!/usr/bin/env bash
# Sessions 24-25 (issue 15): the cross cache "auto" (session 25: the hybrid cache, absorbed where the
# tensor-core kernel runs, cuda_ops/cross_absorbed_mma.py, with fp16 K/V for steps of up to 16 rows), the
# candidate for full_fp16's default, against fp16 K/V, in one call.
# Needs the tree and .carry/inputs (python benchmarks/make_gpu_inputs.py --no-base):
#   run(command="bash benchmarks/gpu_s25.sh", carry=[".carry/inputs"], timeout_s=600, kind="nvidia-h200",
#       needs_h200=True)   # fp16 K/V of 256 large-v3 windows do not fit an H100's 78 GiB
# 1. CUDA tests: the absorbed kernels (mma with 2-tile spans, the prefill GEMMs) against the fp32 reference,
#    `cross_cache_format` on CUDA (the hybrid engine test on real weights and audio needs gpu_session.sh's
#    staging: TESTS="tests/test_fused.py -k engine_on_cuda" there);
# 2. bench_engine, large-v3 shape, 100 forced tokens a window, no transformers: full_fp16 (fp16 K/V) against
#    full_fp16:cross_kv_cache=auto (hybrid where the kernel runs) at BATCHES (H200: 1,8,16,32,128,256; else
#    1,8,16,32,128); on an H200 against every recorded bench_engine*_h200.json (--baseline: rows > 10 % slower flagged);
# 3. probe_absorbed.py at PROBE_ROWS (one layer: cuDNN over K/V against the absorbed path), if time is left.
# Env: BATCHES, HF_BATCHES (transformers' windows; none by default), PRECISIONS (full_fp16:cross_kv_cache=fp16,full_fp16: fp16 K/V against the default, which since session 28 is the hybrid for wide models), SHAPES (large-v3), PROBE_ROWS (256,128,32,8,1), SKIP_TESTS=1, BUDGET_S (570).
set -uo pipefail
source benchmarks/gpu_budget.sh
gpu_begin 570
gpu_tests 120 tests/kernels/test_cross_absorbed.py tests/test_fused.py -k "mma or gemm or auto_cross"
baselines=""
case $name in
  *H200*) batches=${BATCHES:-1,8,16,32,128,256}
          for f in benchmarks/results/bench_engine*_h200.json; do baselines="$baselines --baseline ../$f"; done ;;
  *) batches=${BATCHES:-1,8,16,32,128} ;;
esac
t=$SECONDS
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap 400 60) python3 bench_engine.py \
  --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --shapes "${SHAPES:-large-v3}" \
  --batches "$batches" --hf-batches "${HF_BATCHES:-}" --precisions "${PRECISIONS:-full_fp16:cross_kv_cache=fp16,full_fp16}" $baselines \
  --out "bench_engine_s25_${card:-gpu}.json") 2>&1 | grep -v "seem to have been set" > "$OUT/bench_engine.log"
echo "engine rc=${PIPESTATUS[0]} (3: rows > 10 % slower than a baseline) $((SECONDS - t)) s"
tail -45 "$OUT/bench_engine.log"
if (( $(left) > 50 )); then
  t=$SECONDS
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(( $(left) - 10 )) python3 probe_absorbed.py \
    --rows ${PROBE_ROWS:-256,128,32,8,1}) 2>&1 | tee "$OUT/probe_absorbed.log" | tail -12
  echo "probe $((SECONDS - t)) s"
fi
echo "=== $((SECONDS - START)) s in all"
