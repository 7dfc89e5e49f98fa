#!/usr/bin/env bash
# Session 16's first call (issue 15), after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s16.sh", carry=[".carry/tiny_b", ".carry/s15tree"], timeout_s=600)
# Same-call A/B of this tree ("new") against session 15's (18a1317, `git archive 18a1317 streamer cuda_ops
# benchmarks` in .carry/s15tree): the decoder's residual adds inside the next LayerNorm and one StepIndex
# per call instead of per-layer lengths.
# 1. profile_step.py: one captured large-v3 step at 128 / 256 rows, kernel by kernel, per tree;
# 2. bench_engine.py: large-v3 at 128 / 256 windows, full_fp16 and mixed_fp8, alternating trees.
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
OLD=$PWD/.carry/s15tree
cp benchmarks/profile_step.py $OLD/benchmarks/
for tree in new old; do
  dir=$PWD; [ $tree = old ] && dir=$OLD
  (cd $dir/benchmarks && PYTHONPATH=$dir:$T/site BENCH_RESULTS_DIR=$OUT timeout 150 python3 profile_step.py \
    --tokenizer $INPUTS/tokenizer_multilingual.json --presets full_fp16,mixed_fp8 --rows 128,256 \
    --out profile_step_s16_${tree}_h200.json) > $OUT/profile_step_$tree.log 2>&1
  echo "== profile $tree rc=$? $((SECONDS - START)) s"; grep -E "^== " $OUT/profile_step_$tree.log
done
for i in 1 2; do
  for tree in new old; do
    [ $((SECONDS - START)) -gt 420 ] && break 2
    dir=$PWD; [ $tree = old ] && dir=$OLD
    (cd $dir/benchmarks && PYTHONPATH=$dir:$T/site BENCH_RESULTS_DIR=$OUT timeout 150 python3 bench_engine.py \
      --tokenizer $INPUTS/tokenizer_multilingual.json --audio $INPUTS/clips.npz --shapes large-v3 \
      --batches 128,256 --hf-batches "" --precisions full_fp16,mixed_fp8 --out engine_${tree}_$i.json) 2>&1 \
      | grep -E "^ours " | sed "s/^/$tree$i /"
    echo "== engine $tree $i $((SECONDS - START)) s"
  done
done
