#!/usr/bin/env bash
# Session 22 (issue 15): the absorbed cross-attention (cuda_ops/cross_absorbed.py; the cache holds each
# window's encoder states once, the step folds W_k into the query and W_v into the output) on the GPU.
# Needs only the tree and .carry/inputs (python benchmarks/make_gpu_inputs.py --no-base):
#   run(command="bash benchmarks/gpu_s22.sh", carry=[".carry/inputs"], timeout_s=600, kind="nvidia-h200")
# 1. the kernel's tests on CUDA (against the fp32 reference, odd shapes, both launch orientations);
# 2. probe_absorbed.py --sweep (one layer's cross-attention, cuDNN over K/V vs absorbed, each launch);
# 3. profile_engine, large-v3 shape, WINDOWS windows x 100 forced tokens: full_fp16 against
#    full_fp16:cross_kv_cache=absorbed, and that with the sweep's best launch, same call (H200 @256:
#    s19 2,315 rtf, s20 2,274).
# PART=3 (same carry): ncu on one launch of the engine's absorbed kernel (stall reasons, occupancy, spills).
# PART=2 (same carry): bench_engine over the shapes and batches with full_fp16 and the absorbed cache against
# every recorded bench_engine*_h200.json (--baseline: rows > 10 % slower flagged) and transformers.
# Env: WINDOWS (128: full_fp16's K/V of 256 large-v3 windows do not fit an H100), RUNS (the two; then the
# absorbed cache again with the sweep's best launch at BEST_AT rows, 128), SKIP_SWEEP=1, SWEEP_ROWS (256,128,32), BUDGET_S (560); PART=2: PRECISIONS,
# SHAPES, BATCHES, HF_BATCHES as gpu_session.sh.
set -uo pipefail
START=$SECONDS
BUDGET=${BUDGET_S:-560}
source benchmarks/gpu_budget.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 INPUTS=$PWD/.carry/inputs
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
if [ "${PART:-1}" = 3 ]; then  # why the absorbed kernel runs at half the bandwidth: Nsight Compute on one launch
  (cd benchmarks && timeout $(( $(left) - 15 )) ncu --clock-control none --kernel-name regex:_absorbed_kernel \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats --section SourceCounters \
    python3 probe_absorbed.py --rows ${NCU_ROWS:-256} --calls 2) > "$OUT/ncu_absorbed.txt" 2>&1
  echo "ncu rc=$?"; grep -iE "Duration|Throughput|Registers|Occupancy|Stall|Spill|Shared Memory|Warp Cycles" "$OUT/ncu_absorbed.txt" | head -60
  exit 0
fi
if [ "${PART:-1}" = 2 ]; then
  baselines=""
  for f in benchmarks/results/bench_engine*_h200.json; do baselines="$baselines --baseline ../$f"; done
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(( $(left) - 15 )) python3 bench_engine.py \
    --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" \
    --shapes "${SHAPES:-large-v3,large-v3-turbo}" --batches "${BATCHES:-1,32,128,256}" --hf-batches "${HF_BATCHES:-1,32,128}" \
    --precisions "${PRECISIONS:-full_fp16,full_fp16:cross_kv_cache=absorbed}" $baselines --out "${ENGINE_OUT:-bench_engine_s22_h200.json}") \
    2>&1 | grep -v "seem to have been set" > "$OUT/bench_engine.log"
  echo "engine rc=${PIPESTATUS[0]} (3: rows > 10 % slower than the baseline) $((SECONDS - START)) s"
  tail -60 "$OUT/bench_engine.log"
  exit 0
fi
t=$SECONDS
timeout $(cap 150 400) python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_cross_absorbed.py 2>&1 | tail -6 \
  | tee "$OUT/cuda_tests_absorbed.log"
echo "tests $((SECONDS - t)) s"
best=""
if [ -z "${SKIP_SWEEP:-}" ]; then
  t=$SECONDS
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap 200 200) python3 probe_absorbed.py --rows ${SWEEP_ROWS:-256,128,32} \
    --sweep) 2>&1 | tee "$OUT/probe_absorbed.log" | grep -v "^sweep" | tail -6
  echo "sweep $((SECONDS - t)) s"
  best=$(python3 -c "import json; r=json.load(open('$OUT/probe_absorbed.json'))['rows']; print(next(x['launch'] for x in r if x['rows']==${BEST_AT:-128}))")
  echo "best launch at ${BEST_AT:-128} rows: $best"
fi
runs=${RUNS:-large-v3:full_fp16 large-v3:full_fp16:cross_kv_cache=absorbed}
for run in $runs ${best:+best:large-v3:full_fp16:cross_kv_cache=absorbed}; do
  t=$SECONDS
  launch=""
  case $run in best:*) run=${run#best:}; launch=$best ;; esac
  name=$(echo "$run${launch:+_$launch}" | tr ':=/' '___')
  (cd benchmarks && STREAMER_ABSORBED_LAUNCH=${launch:-16/32/0/8/2} BENCH_RESULTS_DIR="$OUT" timeout $(cap 120 20) python3 profile_engine.py \
    --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --runs "$run" --windows ${WINDOWS:-128} \
    --out "profile_s22_$name.json") 2>&1 | grep -v "Warning\|warn" | tail -52 > "$OUT/profile_$name.log"
  echo "== $run ${launch:+launch $launch} $((SECONDS - t)) s"; grep -A2 "^shape" "$OUT/profile_$name.log" | cut -c1-200
  grep "kernel seconds\|admission parts" "$OUT/profile_$name.log"; grep -m3 "s  " "$OUT/profile_$name.log"
  grep -i "error\|Traceback" "$OUT/profile_$name.log" | head -5
done
echo "=== $((SECONDS - START)) s in all"
