#!/usr/bin/env bash
# For session 17 (issue 15), after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s17.sh", carry=[".carry/tiny_b"], timeout_s=480)
# The fused sampler (cuda_ops/sampler.py, written in session 16 without a GPU; off unless
# STREAMER_FUSED_SAMPLER=1): its tests on CUDA, then one captured large-v3 step per row count with it and
# without (profile_step.py), then bench_engine (large-v3 at 1 / 32 / 128 / 256 windows, tiny.en's 41 clips:
# transcripts against transformers') with it and without, alternating; last, the encoder batch.
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
# The encoder batch for a file-only load (16 in every committed run; 256 windows admitted 16 a step
# decode 31 steps at part batch): 32 and 64 at 256 large-v3 windows, full_fp16.
for eb in 32 64 16; do
  [ $((SECONDS - START)) -gt 390 ] && break
  (cd benchmarks && BENCH_RESULTS_DIR=$OUT timeout 60 python3 bench_engine.py --tokenizer $INPUTS/tokenizer_multilingual.json \
    --audio $INPUTS/clips.npz --shapes large-v3 --batches 256 --hf-batches "" --precisions full_fp16 --encoder-batch $eb \
    --out engine_eb$eb.json) 2>&1 | grep -E "^ours " | sed "s/^/eb$eb /"
done
