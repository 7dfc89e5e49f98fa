#!/usr/bin/env bash
# Session 15's fourth and fifth calls: the guard flagged tiny.en mixed_fp8 @128 wall 0.202 s against
# session 13's 0.133 (steps equal). Same-call A/B, alternating, tiny.en real weights only, over the trees
# in TREES: "new" (this tree), "s14" (db4df79, .carry/s14tree), "s13" (efd5ef6, .carry/s13tree).
#   fourth: run(command="TREES='new s13' bash benchmarks/gpu_s15e.sh", carry=[".carry/tiny_b", ".carry/s13tree"], timeout_s=300)
#   fifth:  run(command="bash benchmarks/gpu_s15e.sh", carry=[".carry/tiny_b", ".carry/s13tree", ".carry/s14tree"], timeout_s=300)
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
for i in 1 2; do
  for tree in ${TREES:-new s14 s13}; do
    if [ $tree = new ]; then dir=$PWD; else dir=$PWD/.carry/${tree}tree; fi
    (cd $dir/benchmarks && PYTHONPATH=$dir:$T/site BENCH_RESULTS_DIR=$OUT timeout 60 python3 bench_engine.py \
      --tokenizer $INPUTS/tokenizer_multilingual.json --audio $INPUTS/clips.npz --real tiny.en=$TINY --shapes "" \
      --batches 32,128 --hf-batches "" --precisions full_fp16,mixed_fp8 --out engine_tiny_${tree}_$i.json) 2>&1 \
      | grep -E "^ours " | sed "s/^/$tree$i /"
    echo "== $tree $i $((SECONDS - START)) s"
  done
done
