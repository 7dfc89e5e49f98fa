#!/usr/bin/env bash
# For session 17 (issue 15), after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s17.sh", carry=[".carry/tiny_b"], timeout_s=420)
# The fused sampler (cuda_ops/sampler.py, written in session 16 without a GPU; off unless
# STREAMER_FUSED_SAMPLER=1): its tests on CUDA, then one captured step per row count with it and without
# (profile_step.py), large-v3 and tiny.en's width via the turbo shape, then bench_engine large-v3 at
# 128 / 256 windows and tiny.en's 41 clips (transcripts against transformers') with it, alternating.
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
STREAMER_FUSED_SAMPLER=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_sampler.py \
  tests/test_logit_rules.py 2>&1 | tail -5
for fused in 1 0; do
  (cd benchmarks && STREAMER_FUSED_SAMPLER=$fused BENCH_RESULTS_DIR=$OUT timeout 100 python3 profile_step.py \
    --tokenizer $INPUTS/tokenizer_multilingual.json --presets full_fp16 --rows 1,8,32,128,256 \
    --out profile_step_sampler$fused.json) 2>&1 | grep -E "^== "
done
for i in 1 2; do
  for fused in 1 0; do
    [ $((SECONDS - START)) -gt 330 ] && break 2
    (cd benchmarks && STREAMER_FUSED_SAMPLER=$fused BENCH_RESULTS_DIR=$OUT timeout 100 python3 bench_engine.py \
      --tokenizer $INPUTS/tokenizer_multilingual.json --audio $INPUTS/clips.npz --real tiny.en=$TINY --shapes large-v3 \
      --batches 1,32,128,256 --hf-batches "" --precisions full_fp16,mixed_fp8 --out engine_sampler${fused}_$i.json) 2>&1 \
      | grep -E "^ours |equal" | sed "s/^/fused$fused.$i /"
  done
done
