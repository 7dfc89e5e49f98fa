#!/usr/bin/env bash
# Session 12, last call: the async-steps test as committed (file windows only; a live final and a
# beam search turn it off) on CUDA. After the two stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s12c.sh", carry=[".carry/tiny_b"], timeout_s=300)
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short \
  "tests/test_engine.py::test_steps_launched_before_the_last_is_read_change_no_token" \
  tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token > "$OUT/cuda_tests_s12c.log" 2>&1
echo "== CUDA tests rc=$?: $(tail -1 "$OUT/cuda_tests_s12c.log")"; grep -E "^FAILED|^E " "$OUT/cuda_tests_s12c.log" | head
