#!/usr/bin/env bash
# Session 16's second call (issue 15), after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s16b.sh", carry=[".carry/tiny_b"], timeout_s=600)
# 1. profile_step.py on this tree: one captured large-v3 step at 128 / 256 rows, kernel by kernel;
# 2. the guard (gpu_session.sh: prefill latency, bench_engine against every committed run, CUDA tests)
#    with mixed_fp8 now meaning the 4-bit cache, into bench_engine_s16_h200.json.
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
(cd benchmarks && BENCH_RESULTS_DIR=$OUT timeout 100 python3 profile_step.py --tokenizer $INPUTS/tokenizer_multilingual.json \
  --presets full_fp16,mixed_fp8 --rows 128,256 --out profile_step_s16_h200.json) > $OUT/profile_step.log 2>&1
echo "== profile rc=$? $((SECONDS - START)) s"; grep -v "Warning\|_warn_once" $OUT/profile_step.log | head -150
ENGINE_OUT=bench_engine_s16_h200.json BUDGET_S=$((585 - (SECONDS - START))) bash benchmarks/gpu_session.sh
