#!/usr/bin/env bash
# Session 15's fifth call: gpu_s15d.sh found this tree's tiny.en engine walls slower than session 13's
# (steps equal). Bisect: this tree, session 14's final code (db4df79, .carry/s14tree) and session 13's.
#   run(command="bash benchmarks/gpu_s15e.sh", carry=[".carry/tiny_b", ".carry/s13tree", ".carry/s14tree"], timeout_s=300)
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
for i in 1 2; do
  for tree in new s14 s13; do
    if [ $tree = new ]; then dir=$PWD; else dir=$PWD/.carry/${tree}tree; fi
    (cd $dir/benchmarks && PYTHONPATH=$dir:$T/site BENCH_RESULTS_DIR=$OUT timeout 60 python3 bench_engine.py \
      --tokenizer $INPUTS/tokenizer_multilingual.json --audio $INPUTS/clips.npz --real tiny.en=$TINY --shapes "" \
      --batches 32,128 --hf-batches "" --precisions full_fp16,mixed_fp8 --out engine_tiny_${tree}_$i.json) 2>&1 \
      | grep -E "^ours " | sed "s/^/$tree$i /"
    echo "== $tree $i $((SECONDS - START)) s"
  done
done
