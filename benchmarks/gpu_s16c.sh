#!/usr/bin/env bash
# Session 16's third call (issue 15), after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s16c.sh", carry=[".carry/tiny_b"], timeout_s=580)
# 1. sweep_decode_linear.py: our split-K decode linear against cuBLAS at large-v3's decoder shapes,
#    writing the launch table ($OUT/decode_linear_table.json);
# 2. CUDA tests: the kernel's, test_fused with every decode linear through the kernel (rule launches:
#    full_fp16's greedy tokens must equal the plain model's), the engine's two-stream test;
# 3. bench_engine.py, large-v3 at 128 / 256 windows, with the table against cuBLAS ("off"), alternating;
# 4. tiny.en on 41 real clips with the rule launches (transcripts against transformers').
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
(cd benchmarks && BENCH_RESULTS_DIR=$OUT timeout 240 python3 sweep_decode_linear.py --widths 1280 --rows 1,8,32,64,128,256 \
  --out sweep_decode_linear_h200.json --table $OUT/decode_linear_table.json) > $OUT/sweep.log 2>&1
echo "== sweep rc=$? $((SECONDS - START)) s"; grep -E "rows:|wrote" $OUT/sweep.log | tail -30
cat $OUT/decode_linear_table.json 2>/dev/null | tr -d ' \n'; echo
STREAMER_DECODE_LINEAR=rule timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_linear.py \
  tests/test_fused.py 2>&1 | tail -15 > $OUT/cuda_tests.log
echo "== tests (rule) $((SECONDS - START)) s"; tail -4 $OUT/cuda_tests.log
timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token \
  2>&1 | grep -E "^E |assert|passed|failed" | head -20 > $OUT/two_stream_test.log
echo "== two-stream test $((SECONDS - START)) s"; cat $OUT/two_stream_test.log
[ -s $OUT/decode_linear_table.json ] || exit 1
for i in 1 2; do
  for mode in table off; do
    [ $((SECONDS - START)) -gt 470 ] && break 2
    m=$mode; [ $mode = table ] && m=$OUT/decode_linear_table.json
    (cd benchmarks && STREAMER_DECODE_LINEAR=$m BENCH_RESULTS_DIR=$OUT timeout 100 python3 bench_engine.py \
      --tokenizer $INPUTS/tokenizer_multilingual.json --audio $INPUTS/clips.npz --shapes large-v3 \
      --batches 128,256 --hf-batches "" --precisions full_fp16,mixed_fp8 --out engine_${mode}_$i.json) 2>&1 \
      | grep -E "^ours " | sed "s/^/$mode$i /"
    echo "== engine $mode $i $((SECONDS - START)) s"
  done
done
[ $((SECONDS - START)) -gt 500 ] && exit 0
(cd benchmarks && STREAMER_DECODE_LINEAR=rule BENCH_RESULTS_DIR=$OUT timeout $((560 - (SECONDS - START))) python3 bench_engine.py \
  --tokenizer $INPUTS/tokenizer_multilingual.json --audio $INPUTS/clips.npz --real tiny.en=$TINY --shapes "" \
  --batches 32,128 --hf-batches 32 --precisions full_fp16 --out engine_tiny_rule.json) 2>&1 \
  | grep -E "^ours |transcripts equal" | sed "s/^/rule /"
echo "== tiny rule $((SECONDS - START)) s"
