#!/usr/bin/env bash
# Session 15's last call: the turbo shape with mixed_fp8's new 4-bit cross cache against the FP8 one,
# same call (target: rtf >= 5,000 at 256). After one stage call carrying .carry/inputs:
#   run(command="bash benchmarks/gpu_s15f.sh", carry=[".carry/wheels"], timeout_s=200)
set -uo pipefail
S=/tmp/stage
mkdir -p $S && cp -r .carry/. $S/
PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $S/wheels/*.whl || exit 2
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 170 python3 bench_engine.py \
  --tokenizer $S/inputs/tokenizer_multilingual.json --audio $S/inputs/clips.npz --shapes large-v3-turbo \
  --batches 128,256 --hf-batches "" --precisions mixed_fp8,mixed_fp8:cross_kv_cache=fp8 \
  --baseline results/bench_engine_s14_h200.json --out bench_engine_s15_turbo_h200.json 2>&1 \
  | grep -v "seem to have been set" | grep -v "^\s*$" | tail -30
