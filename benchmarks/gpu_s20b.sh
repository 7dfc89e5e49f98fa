#!/usr/bin/env bash
# Session 20's lean eager ops, never run on a GPU (the lease ended first): STREAMER_EAGER_OPS=lean
# runs prefills' cuBLAS linears at bucketed row counts, looked up before serving
# (decode_linear.row_bucket, Runner.warm_linears), and small eager LayerNorm/GELU through PyTorch's
# ops (_triton.eager_small); the default "kernels" is the code as before. After the three stage
# calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s20b.sh", carry=[".carry/tiny_b"], timeout_s=600)
#   run(command="PART=2 bash benchmarks/gpu_s20b.sh", carry=[".carry/tiny_b"], timeout_s=600)   (at once after)
# 1. probe_launch.py (host cost per call: new vs seen cuBLAS shapes, bucketed, Triton vs torch ops;
#    session 20 measured 283 vs 20 us, and Triton 51-99 vs PyTorch 10-31 us);
# 2. bench_prefill.py (first token of live finals with new prompt lengths; s11: 10.9 ms p50), lean vs kernels;
# 3. `accurate` uploads (tiny.en, 32), lean vs kernels alternating (s20: 433-487 with kernels); `fast` lean once;
# 4. the CUDA tests of the changed ops and the engine, with lean on;
# PART=2: bench_prefill on the large-v3 shape (random weights, 192 decoder linears), lean vs kernels.
# If lean wins and the tests pass, make it _triton.EAGER_OPS's default.
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
prefill() {  # prefill NAME MODEL: bench_prefill.py lean vs kernels -> $OUT/bench_prefill_cuda_NAME_{lean,kernels}.json
  for ops in lean kernels; do
    (cd benchmarks && STREAMER_EAGER_OPS=$ops BENCH_RESULTS_DIR="$OUT" timeout 150 python3 bench_prefill.py --model "$2" \
      --device cuda) > "$OUT/prefill_$1_$ops.log" 2>&1
    echo "== prefill $1 $ops rc=$?"; tail -5 "$OUT/prefill_$1_$ops.log" | grep -v wrote
    mv "$OUT/bench_prefill_cuda.json" "$OUT/bench_prefill_cuda_$1_$ops.json" 2>/dev/null
  done
}
if [ "${PART:-1}" = 2 ]; then
  prefill large-v3 "shape:large-v3:$INPUTS/tokenizer_multilingual.json"
  exit 0
fi
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 60 python3 probe_launch.py --width 1280 --calls 300) 2>&1 | tail -14
prefill tiny "$TINY"
STREAMER_EAGER_OPS=lean uploads acc_lean $PWD accurate
uploads acc_kernels $PWD accurate
STREAMER_EAGER_OPS=lean uploads acc_lean_again $PWD accurate
STREAMER_EAGER_OPS=lean uploads fast_lean $PWD fast
STREAMER_EAGER_OPS=lean timeout 170 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_decode_linear.py \
  tests/kernels/test_layernorm.py tests/kernels/test_fp8.py tests/test_fused.py tests/test_engine.py 2>&1 | tail -6 | tee "$OUT/cuda_tests_lean.log"
