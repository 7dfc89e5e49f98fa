#!/usr/bin/env bash
# Session 12 (issue 15): decode steps launched before the last is read back (ASYNC_STEPS, on with
# CUDA graphs). After the two stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s12b.sh", carry=[".carry/tiny_b"], timeout_s=600)
# 1. the engine tests on CUDA (the async test among them) and the logit rules;
# 2. profile_engine.py at 256 file windows: large-v3 mixed_fp8 with it and without (same call), turbo;
# 3. served tiny.en at 1,000 live streams with it and without (session 10: p95 0.92 s).
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
ulimit -n 65536 2>/dev/null || ulimit -n 16384
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_engine.py tests/test_logit_rules.py \
  > "$OUT/cuda_tests_s12.log" 2>&1
echo "== CUDA tests rc=$?: $(tail -1 "$OUT/cuda_tests_s12.log")"; grep -E "^FAILED|^ERROR" "$OUT/cuda_tests_s12.log" | head
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 230 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
  --audio "$INPUTS/clips.npz" --runs large-v3:mixed_fp8,large-v3:mixed_fp8:sync,large-v3-turbo:mixed_fp8 \
  --out profile_engine_s12_h200.json) 2>&1 | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile.log"
echo "== profile rc=${PIPESTATUS[0]}"; grep -v "^  \|^---" "$OUT/profile.log"
for v in 1 0; do
  s=$SECONDS
  ASYNC_STEPS=$v timeout 75 python3 benchmarks/bench_streaming.py --spawn --device cuda --seconds 15 --client-procs 4 \
    --model tiny.en --clients 1000 --out "$OUT/bench_streaming_tiny12_async${v}_h200.json" 2>&1 \
    | grep -v "INFO\|WARNING\|SyntaxWarning" > "$OUT/load_async$v.log"
  echo "== tiny.en 1000 ASYNC_STEPS=$v rc=${PIPESTATUS[0]} $((SECONDS - s)) s"; tail -6 "$OUT/load_async$v.log"
done
