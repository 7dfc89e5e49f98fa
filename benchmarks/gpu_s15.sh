#!/usr/bin/env bash
# For session 15's first call (issue 15), after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s15.sh", carry=[".carry/tiny_b", ".carry/s13tree"], timeout_s=600)
# (.carry/s13tree = `git archive efd5ef6 streamer cuda_ops benchmarks`, session 13's tree.)
# 1. session 14's open finding: live tiny.en 1,000 streams p95 1.14 s against session 13's 0.784 s on a
#    lease with a slower host. Same-call A/B, alternating, this tree against session 13's; the old
#    tree runs from its own directory (from the repo root Python imports the root's `streamer` first).
# 2. the side-stream test, relaxed in session 14 (one window may differ by <= 3 token edits);
# 3. a full_fp16 profile at 256 large-v3 windows with whole kernel names (which strided elementwise
#    op is `elementwise_kernel<128, 4, gpu_kernel_impl_nocast<...>`, 0.118 s in session 14).
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
for i in 1 2; do
  load tiny15_new_$i 75 --model tiny.en --clients 1000
  (cd .carry/s13tree && PYTHONPATH=$PWD:$T/site load tiny15_old_$i 75 --model tiny.en --clients 1000)
done
timeout 60 python3 -m pytest -q -p no:cacheprovider --tb=short \
  tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token > "$OUT/cuda_tests_s15.log" 2>&1
echo "== tests rc=$? $(tail -1 "$OUT/cuda_tests_s15.log") $((SECONDS - START)) s"
left=$((570 - (SECONDS - START)))
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $left python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
  --audio "$INPUTS/clips.npz" --runs large-v3:full_fp16 --out profile_engine_s15_h200.json) 2>&1 \
  | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile.log"
echo "== profile rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; grep -A20 "^large" "$OUT/profile.log" | head -24
