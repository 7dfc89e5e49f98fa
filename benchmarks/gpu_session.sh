#!/usr/bin/env bash
# The engine session on the H200 (issue 15): first-token latency of new prompt lengths, the engine
# benchmark per preset against transformers and against every committed engine run (--baseline),
# and the CUDA tests, in one call of at most BUDGET_S seconds (default 540, under the call's 600).
#
# Here first, in the repo root of the checkout that makes the calls:
#   python benchmarks/make_gpu_inputs.py --no-base     # builds .carry/ (ignored by git), ~5 s
# then four device calls back to back (the machine stays warm 30 s after a call; /tmp/stage keeps
# what the stage calls brought; if it went back, the last says what is missing: redo 1-3):
#   1. run(command="bash benchmarks/gpu_stage.sh", carry=[".carry/tiny_a"], timeout_s=60)
#   2. run(command="bash benchmarks/gpu_stage.sh", carry=[".carry/wheels"], timeout_s=60)
#   3. run(command="bash benchmarks/gpu_stage.sh", carry=[".carry/audio", ".carry/wheels_b", ".carry/inputs"], timeout_s=60)
#   4. run(command="bash benchmarks/gpu_session.sh", carry=[".carry/tiny_b"], timeout_s=600)
# A second full run while the machine is warm: call 3 again, with env vars in front, e.g.
#   run(command="SKIP_TESTS=1 PRECISIONS=full_fp16 bash benchmarks/gpu_session.sh", carry=[".carry/tiny_b"], timeout_s=600)
# Env: SHAPES (large-v3,large-v3-turbo; "" for none: real weights only), BATCHES (1,32,128,256), HF_BATCHES (1,32,128; "" for none),
#   PRECISIONS (full_fp16,mixed_fp8), REAL (tiny.en; "" for none), TESTS (the pytest targets),
#   SKIP_TESTS=1, SKIP_PREFILL=1, ENGINE_OUT (bench_engine_issue15_h200.json), BUDGET_S (540).
# Back in $OUT (flat): $ENGINE_OUT, bench_prefill_cuda.json, bench_engine.log, prefill.log,
#   cuda_tests.log, summary.txt. To record them: cp FILES_AT/$ENGINE_OUT FILES_AT/bench_prefill_cuda.json
#   benchmarks/results/ (a committed bench_engine*_h200.json joins every later run's baselines).
# Expected: ~20 s set-up, ~25 s prefill, ~140-240 s engine, ~260 s tests (session 16: 200 s stopped them at
# ~77 %): 7-9 min.
set -uo pipefail
START=$SECONDS
BUDGET=${BUDGET_S:-540}
source benchmarks/gpu_budget.sh
source benchmarks/gpu_assemble.sh || exit 2
ENGINE_OUT=${ENGINE_OUT:-bench_engine_issue15_h200.json}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cudnn', torch.backends.cudnn.version())"
echo "set-up $((SECONDS - START)) s"

if [ -z "${SKIP_PREFILL:-}" ]; then  # ~30 s: the live-final latency the no-cuDNN prefill keeps
  t=$SECONDS
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap 90 300) python3 bench_prefill.py --model "$TINY" --device cuda) \
    > "$OUT/prefill.log" 2>&1
  echo "prefill rc=$? $((SECONDS - t)) s"; tail -5 "$OUT/prefill.log"
fi

t=$SECONDS
baselines=""
for f in benchmarks/results/bench_engine*_h200.json; do baselines="$baselines --baseline ../$f"; done
real=${REAL-tiny.en}
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap 400 $([ -z "${SKIP_TESTS:-}" ] && echo 280 || echo 20)) \
  python3 bench_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" \
  ${real:+--real $real=$TINY} --shapes "${SHAPES-large-v3,large-v3-turbo}" --batches "${BATCHES:-1,32,128,256}" \
  --hf-batches "${HF_BATCHES-1,32,128}" --precisions "${PRECISIONS:-full_fp16,mixed_fp8}" $baselines --out "$ENGINE_OUT") \
  2>&1 | grep -v "seem to have been set" > "$OUT/bench_engine.log"
echo "engine rc=${PIPESTATUS[0]} (3: rows > 10 % slower than the baseline) $((SECONDS - t)) s"

if [ -z "${SKIP_TESTS:-}" ]; then
  t=$SECONDS
  timeout $(cap 280 15) python3 -m pytest -q -p no:cacheprovider -m "not slow" ${TESTS:-tests/test_sdpa_paths.py \
    tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token tests/test_fused.py tests/kernels} \
    2>&1 | tail -40 > "$OUT/cuda_tests.log"
  echo "tests rc=${PIPESTATUS[0]} $((SECONDS - t)) s"
fi

echo "=== summary ($((SECONDS - START)) s in all) ==="
(cd benchmarks && python3 gpu_summary.py "$OUT/$ENGINE_OUT" "$OUT/bench_prefill_cuda.json" results/bench_prefill_cuda.json \
  "$OUT/cuda_tests.log") 2>&1 | tee "$OUT/summary.txt"
