#!/usr/bin/env bash
# Issue 15, branch int4: the 4-bit cross cache's v2 decode kernel (cuda_ops/cross_int4.py,
# decode_attention_int4_v2_triton: packed fp16x2 on the codes) against FP8 v7 and the v1 kernel on
# the H200, one call, no inputs to carry (random K/V of large-v3's cross-attention shape):
#   run(command="bash benchmarks/gpu_int4_15.sh", timeout_s=600)
# 1. the sweep, µs per call under CUDA graphs at B = 1, 8, 32, 128, 256 (FP8 tile as the engine runs
#    it, v1 at its default launch 64x4x3, v2 at 2/3/4 stages, K centred or not, 4/8/16 waves);
# 2. the kernel tests on CUDA (v1 and v2 against the fp32 reference, large-v3 shapes included);
# 3. the loops' SASS counts with the GPU's own Triton (benchmarks/int4_sass.py --quick).
# Each step has its own timeout; the whole is under ~8 minutes. Results in $OUT.
set -uo pipefail
START=$SECONDS
OUT=${OUT:-/tmp/int4_15_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
  2>&1 | tee "$OUT/env.txt"
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 270 python3 sweep_int4_attention.py --v1 64x4x3 \
  --out sweep_int4_attention_v2_h200.json) > "$OUT/sweep_int4_v2.log" 2>&1
echo "== sweep rc=$? $((SECONDS - START)) s"; grep -E "^B=|^best|Error|error" "$OUT/sweep_int4_v2.log" | head -20
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_cross_int4.py > "$OUT/cuda_tests_int4_v2.log" 2>&1
echo "== CUDA tests rc=$?: $(tail -1 "$OUT/cuda_tests_int4_v2.log") $((SECONDS - START)) s"
grep -E "^FAILED|^ERROR" "$OUT/cuda_tests_int4_v2.log" | head
timeout 90 python3 benchmarks/int4_sass.py --quick > "$OUT/int4_sass.log" 2>&1
echo "== sass rc=$? $((SECONDS - START)) s"; grep -v -i warn "$OUT/int4_sass.log" | tail -6
