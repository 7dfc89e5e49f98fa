#!/usr/bin/env bash
# Session 23 (issue 15): the tensor-core absorbed cross-attention (cuda_ops/cross_absorbed_mma.py, CUDA C++
# compiled with NVRTC at first use) on the GPU. Needs only the tree and .carry/inputs
# (python benchmarks/make_gpu_inputs.py --no-base):
#   run(command="bash benchmarks/gpu_s23.sh", carry=[".carry/inputs"], timeout_s=600, kind="nvidia-h200",
#       needs_h200=True)   # full_fp16's fp16 K/V of 256 large-v3 windows do not fit an H100's 78 GiB
# 1. the absorbed kernels' CUDA tests (the mma kernel and the prefill GEMMs against the fp32 reference);
# 2. probe_absorbed.py (one layer's cross-attention at the large-v3 width: cuDNN over K/V, the Triton
#    kernel, the mma kernel and its spans a row);
# 3. profile_engine, large-v3 shape, WINDOWS windows x 100 forced tokens, same call: full_fp16 (cuDNN over
#    the fp16 K/V cache) against full_fp16:cross_kv_cache=absorbed (the mma kernel) [and RUNS_TRITON=1: the
#    absorbed cache through the Triton kernel]. H200 @256 recorded: s19 2,315 rtf, s20 2,274 (full_fp16).
# PART=3: bench_engine, both caches at BATCHES (1,8,32,128), no transformers, no baselines (any card).
# PART=2: the bench_engine guard (gpu_s22.sh PART=2) with both caches, against every bench_engine*_h200.json.
# Env: WINDOWS (256 on an H200, else 128: full_fp16's K/V of 256 large-v3 windows do not fit an H100),
# RUNS (the profiled runs), SKIP_TESTS=1, SKIP_PROBE=1, SKIP_PROFILE=1, BUDGET_S (560).
set -uo pipefail
START=$SECONDS
BUDGET=${BUDGET_S:-560}
source benchmarks/gpu_budget.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 INPUTS=$PWD/.carry/inputs
gpu_facts
if [ "${PART:-1}" = 2 ]; then
  ENGINE_OUT=bench_engine_s23_${card:-gpu}.json exec bash benchmarks/gpu_s22.sh
fi
if [ "${PART:-1}" = 3 ]; then  # both caches over the batch sizes, any card (no baselines: those are H200 runs)
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(( $(left) - 10 )) python3 bench_engine.py \
    --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --shapes "${SHAPES:-large-v3,large-v3-turbo}" \
    --batches "${BATCHES:-1,8,32,128}" --hf-batches "" --precisions full_fp16,full_fp16:cross_kv_cache=absorbed \
    --out "bench_engine_s23_small_${card:-gpu}.json") 2>&1 | grep -v "seem to have been set" > "$OUT/bench_engine_small.log"
  echo "engine rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; tail -30 "$OUT/bench_engine_small.log"
  exit 0
fi
case $name in *H200*) windows=${WINDOWS:-256} ;; *) windows=${WINDOWS:-128} ;; esac
if [ -z "${SKIP_TESTS:-}" ]; then
  t=$SECONDS
  timeout $(cap 150 400) python3 -m pytest -q -p no:cacheprovider --tb=short -x tests/kernels/test_cross_absorbed.py \
    -k "mma or gemm" 2>&1 | tail -15 | tee "$OUT/cuda_tests_absorbed.log"
  echo "tests $((SECONDS - t)) s"
fi
if [ -z "${SKIP_PROBE:-}" ]; then
  t=$SECONDS
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap 120 300) python3 probe_absorbed.py --rows ${PROBE_ROWS:-256,128,64,32,8,1}) 2>&1 \
    | tee "$OUT/probe_absorbed.log" | tail -12
  echo "probe $((SECONDS - t)) s"
fi
[ -n "${SKIP_PROFILE:-}" ] && exit 0
runs=${RUNS:-large-v3:full_fp16 large-v3:full_fp16:cross_kv_cache=absorbed}
[ -n "${RUNS_TRITON:-}" ] && runs="$runs triton:large-v3:full_fp16:cross_kv_cache=absorbed"
for run in $runs; do
  t=$SECONDS
  kernel=mma
  case $run in triton:*) run=${run#triton:}; kernel=triton ;; esac
  name=$(echo "${run}_${kernel}_$windows" | tr ':=/' '___')
  (cd benchmarks && STREAMER_ABSORBED_KERNEL=$kernel BENCH_RESULTS_DIR="$OUT" timeout $(cap 170 20) python3 profile_engine.py \
    --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --runs "$run" --windows $windows \
    --out "profile_s23_$name.json") 2>&1 | grep -v "Warning\|warn" | tail -52 > "$OUT/profile_$name.log"
  echo "== $run ($kernel) @$windows $((SECONDS - t)) s"; grep -A2 "^shape" "$OUT/profile_$name.log" | cut -c1-200
  grep "kernel seconds\|admission parts" "$OUT/profile_$name.log"; grep -m3 "s  " "$OUT/profile_$name.log"
  grep -i "error\|Traceback" "$OUT/profile_$name.log" | head -5
done
echo "=== $((SECONDS - START)) s in all"
