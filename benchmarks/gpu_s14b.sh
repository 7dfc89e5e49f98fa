#!/usr/bin/env bash
# Session 14 (issue 15), after gpu_session.sh while the stage is warm:
#   run(command="bash benchmarks/gpu_s14b.sh", carry=[".carry/tiny_b", ".carry/s13tree"], timeout_s=600)
# 1. the CUDA tests of this session's admission and compaction (gpu_session.sh's test stage ran out
#    of time in the kernel tests before them);
# 2. same-call A/B of the tiny.en engine rows the guard flagged (mixed_fp8 wall 1.32x at 32, 1.42x at
#    128 against session 13; transformers' own rows 1.23-1.36x slower, i.e. perhaps the host):
#    session 13's tree (.carry/s13tree) against this one, transformers as the host's reference;
# 3. the live path with the sync-free admission (live windows still read back at once): tiny.en
#    1,000 streams (session 13: p95 0.784 s). (~330 s: this session's device time was short.)
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -k "not cpu" \
  tests/test_engine.py::test_file_admission_makes_no_host_sync \
  tests/test_engine.py::test_steps_launched_before_the_last_is_read_change_no_token \
  tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token \
  tests/test_model.py::test_move_rows_copies_the_cross_buffers_whole_and_the_self_positions_asked > "$OUT/cuda_tests_s14b.log" 2>&1
echo "== tests rc=$? $(tail -1 "$OUT/cuda_tests_s14b.log") $((SECONDS - START)) s"
for tree in new old; do
  if [ $tree = new ]; then dir=$PWD; else dir=$PWD/.carry/s13tree; fi
  (cd $dir/benchmarks && PYTHONPATH=$dir:$T/site BENCH_RESULTS_DIR=$OUT timeout 80 python3 bench_engine.py \
    --tokenizer $INPUTS/tokenizer_multilingual.json --audio $INPUTS/clips.npz --real tiny.en=$TINY --shapes "" \
    --batches 1,32,128 --hf-batches 128 --precisions full_fp16,mixed_fp8 --out engine_tiny_${tree}.json) 2>&1 \
    | grep -E "^(ours|transformers) " | sed "s/^/$tree /"
  echo "== $tree $((SECONDS - START)) s"
done
source benchmarks/gpu_load.sh
load tiny14_1000 75 --model tiny.en --clients 1000
echo "== done $((SECONDS - START)) s"
