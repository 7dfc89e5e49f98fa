#!/usr/bin/env bash
# Session 15's first call (issue 15), after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s15.sh", carry=[".carry/tiny_b", ".carry/s13tree"], timeout_s=600)
# (.carry/s13tree = `git archive efd5ef6 streamer cuda_ops benchmarks`, session 13's tree.)
# 1. CUDA tests: the FP8 kernels (bias + GELU now with A&S erf through rcp/ex2.approx PTX), the fused
#    encoder, the side-stream test relaxed in session 14;
# 2. profiles at 256 large-v3 windows, full_fp16 and mixed_fp8, with whole kernel names (against
#    session 14's profile_engine_s14_new_*: fp16 cross K/V copied as words, residual adds inside the
#    encoder's LayerNorms, the cheaper GELU);
# 3. session 14's open finding: live tiny.en 1,000 streams p95 1.14 s against session 13's 0.784 s on a
#    lease with a slower host. Same-call A/B, alternating, this tree against session 13's; the old
#    tree runs from its own directory (from the repo root Python imports the root's `streamer` first).
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_fp8.py tests/test_fused.py \
  tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token > "$OUT/cuda_tests_s15.log" 2>&1
echo "== tests rc=$? $(tail -1 "$OUT/cuda_tests_s15.log") $((SECONDS - START)) s"
for run in large-v3:full_fp16 large-v3:mixed_fp8; do
  tag=${run#*:}
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 120 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
    --audio "$INPUTS/clips.npz" --runs $run --out profile_engine_s15_${tag}_h200.json) 2>&1 \
    | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile_$tag.log"
  echo "== profile $tag rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; grep -A14 "^large" "$OUT/profile_$tag.log" | head -16
done
for i in 1; do  # the second pair runs in gpu_s15b.sh
  [ $((SECONDS - START)) -lt 420 ] || break
  load tiny15_new_$i 75 --model tiny.en --clients 1000
  [ $((SECONDS - START)) -lt 500 ] || break
  (cd .carry/s13tree && PYTHONPATH=$PWD:$T/site load tiny15_old_$i 75 --model tiny.en --clients 1000)
done
echo "== done $((SECONDS - START)) s"
