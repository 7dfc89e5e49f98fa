#!/usr/bin/env bash
# Session 20, second part: eager prefills without cuBLAS's per-shape lookups and with PyTorch's
# cheaper launches (decode_linear.row_bucket + Runner.warm_linears; _triton.eager_small for LayerNorm
# and GELU). After the three stage calls of gpu_session.sh, with .carry/s20a built from 9355c59
# (git archive 9355c59 streamer cuda_ops pyproject.toml benchmarks/*.py benchmarks/*.sh | tar -x -C .carry/s20a):
#   run(command="bash benchmarks/gpu_s20b.sh", carry=[".carry/tiny_b", ".carry/s20a"], timeout_s=600)
# 1. probe_launch.py (host cost per call: new vs seen cuBLAS shapes, bucketed, Triton vs torch ops);
# 2. bench_prefill.py (first token of live finals with new prompt lengths) this tree vs 9355c59;
# 3. `accurate` uploads (tiny.en, 32) this tree vs 9355c59, alternating; `fast` once (s18: 2,526);
# 4. the CUDA tests of the changed ops and the engine.
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 60 python3 probe_launch.py --width 1280 --calls 300) 2>&1 | tail -14
for tree in new old; do
  dir=$PWD; [ $tree = old ] && dir=$PWD/.carry/s20a
  (cd $dir/benchmarks && PYTHONPATH=$dir:$T/site BENCH_RESULTS_DIR="$OUT" timeout 90 python3 bench_prefill.py --model "$TINY" \
    --device cuda) > "$OUT/prefill_$tree.log" 2>&1
  echo "== prefill $tree rc=$?"; tail -5 "$OUT/prefill_$tree.log" | grep -v wrote
  mv "$OUT/bench_prefill_cuda.json" "$OUT/bench_prefill_cuda_$tree.json" 2>/dev/null
done
uploads acc_new $PWD accurate
uploads acc_old $PWD/.carry/s20a accurate
uploads acc_new_again $PWD accurate
uploads fast_new $PWD fast
timeout 170 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_decode_linear.py tests/kernels/test_layernorm.py \
  tests/kernels/test_fp8.py tests/test_fused.py tests/test_engine.py 2>&1 | tail -6 | tee "$OUT/cuda_tests_b.log"
