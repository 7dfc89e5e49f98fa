#!/usr/bin/env bash
# Session 19, after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s19b.sh", carry=[".carry/tiny_b"], timeout_s=600)
# 1. test_encoder_on_a_second_stream_changes_no_token three times: it failed in gpu_s19.sh and twice
#    more (one window of twelve 8 tokens apart, in the SM-partition variant once and in the eager
#    pipeline once); it now asks the first differing token to be a near-tie in both runs;
# 2. the CUDA tests of gpu_session.sh and the rest of test_engine.py (cap 420 s).
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
for i in 1 2 3; do
  timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short \
    "tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token" 2>&1 | grep -E "^E |passed|failed" | head -12
done
timeout 420 python3 -m pytest -q -p no:cacheprovider -m "not slow" --tb=short tests/test_sdpa_paths.py tests/test_engine.py \
  tests/test_fused.py tests/kernels 2>&1 | tail -25 | tee "$OUT/cuda_tests.log"
