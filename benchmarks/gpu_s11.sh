#!/usr/bin/env bash
# Session 11 on the H200, after the two stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s11.sh", carry=[".carry/tiny_b", ".carry/s9tree"], timeout_s=600)
# 1. the logit rules (rewritten: per-row flags over column ranges) on CUDA, and the engine tests
#    that replay them in CUDA graphs;
# 2. bench_prefill.py, this tree against session 9's (.carry/s9tree = git archive d08c8d0 streamer
#    cuda_ops benchmarks), alternated twice: session 10 measured 10.9 ms against the committed 9.6;
# 3. profile_engine.py at 256 large-v3 windows with the encoder on its own stream and without
#    (session 9: overlap did not pay for uploads; why).
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_logit_rules.py tests/test_engine.py \
  tests/test_model.py > "$OUT/cuda_tests_s11.log" 2>&1
echo "== CUDA tests rc=$?: $(tail -1 "$OUT/cuda_tests_s11.log")"
for i in 1 2; do for tree in new old; do
  if [ $tree = new ]; then dir=$PWD; else dir=$S/s9tree; fi
  (cd $dir/benchmarks && PYTHONPATH=$dir:$T/site BENCH_RESULTS_DIR=$OUT/prefill_${tree}_$i timeout 90 python3 bench_prefill.py \
    --model "$TINY" --device cuda) > "$OUT/prefill_${tree}_$i.log" 2>&1
  echo "== prefill $tree $i rc=$?"; tail -4 "$OUT/prefill_${tree}_$i.log"
done; done
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 300 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
  --audio "$INPUTS/clips.npz" --runs large-v3:mixed_fp8,large-v3:mixed_fp8:overlap,large-v3:full_fp16:overlap \
  --out profile_engine_s11_h200.json) 2>&1 | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile.log"
echo "== profile rc=${PIPESTATUS[0]}"; grep -v "^  " "$OUT/profile.log"
