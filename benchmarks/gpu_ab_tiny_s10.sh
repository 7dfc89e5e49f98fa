# Session 10: same-call A/B of the tiny.en engine rows (flagged 1.13-1.29x by the guard) between this
# tree and session 9's (.carry/s9tree = git archive d08c8d0 streamer cuda_ops benchmarks), transformers as
# the host reference. After the two stage calls: run(bash benchmarks/gpu_ab_tiny_s10.sh, carry [.carry/tiny_b, .carry/s9tree]).
source benchmarks/gpu_assemble.sh || exit 2
for i in 1 2; do for tree in new old; do
  if [ $tree = new ]; then dir=$PWD; else dir=$S/s9tree; fi
  (cd $dir/benchmarks && PYTHONPATH=$dir:$T/site BENCH_RESULTS_DIR=$OUT timeout 150 python3 bench_engine.py \
    --tokenizer $INPUTS/tokenizer_multilingual.json --audio $INPUTS/clips.npz --real tiny.en=$TINY --shapes "" \
    --batches 1,32,128 --hf-batches 1,32,128 --precisions full_fp16 --out engine_tiny_${tree}_$i.json) 2>&1 \
    | grep -E "^(ours|transformers) " | sed "s/^/$tree$i /"
done; done
