#!/usr/bin/env bash
# Session 12, last engine call (issue 15), after the two stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s12d.sh", carry=[".carry/tiny_b"], timeout_s=600)
# 1. the self-attention launch sweep (fp16 cache, lengths <= 32 / 104 / 224); its fastest launch in
#    sum over every batch and length is exported (STREAMER_FP16_ATTN_LAUNCH) for what follows;
# 2. CUDA tests: the kernels against their references, the engine's async/beam/sampled paths, the
#    fused blocks (the padded vocabulary), the logit rules (top-k now outside the captured step);
# 3. bench_engine.py against every committed run (the guard), tiny.en real weights vs transformers;
# 4. profile_engine.py, large-v3 mixed_fp8 at 256 windows.
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 100 python3 sweep_self_attention.py --out sweep_self_attention_s12_h200.json) \
  > "$OUT/sweep.log" 2>&1
echo "== sweep rc=$? $((SECONDS - START)) s"; grep "^B=" "$OUT/sweep.log"
best=$(python3 - "$OUT/sweep_self_attention_s12_h200.json" <<'PY'
import json, sys
from collections import defaultdict
rows = json.load(open(sys.argv[1]))["rows"]
total = defaultdict(float)
for r in rows:
    total[(r["block_t"], r["num_warps"])] += r["us"]
(bt, w), us = min(total.items(), key=lambda kv: kv[1])
print(f"{bt}x{w}")
print(f"sum over batches and lengths: {bt}x{w} {us:.0f} us, 128x4 {total[(128, 4)]:.0f} us", file=sys.stderr)
PY
)
export STREAMER_FP16_ATTN_LAUNCH=${best:-128x4}
echo "== self-attention launch: $STREAMER_FP16_ATTN_LAUNCH"
timeout 140 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_attention.py tests/test_fused.py \
  tests/test_logit_rules.py "tests/test_engine.py::test_steps_launched_before_the_last_is_read_change_no_token" \
  tests/test_engine.py::test_beam_search_shares_steps_with_greedy tests/test_engine.py::test_a_sampled_fallback_gives_the_same_text_every_run \
  tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token > "$OUT/cuda_tests_s12d.log" 2>&1
echo "== CUDA tests rc=$?: $(tail -1 "$OUT/cuda_tests_s12d.log") $((SECONDS - START)) s"; grep -E "^FAILED|^ERROR" "$OUT/cuda_tests_s12d.log" | head
baselines=""
for f in benchmarks/results/bench_engine*_h200.json; do baselines="$baselines --baseline ../$f"; done
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 210 python3 bench_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
  --audio "$INPUTS/clips.npz" --real tiny.en=$TINY --shapes large-v3,large-v3-turbo --batches 1,32,128,256 \
  --hf-batches 1,32,128 --precisions full_fp16,mixed_fp8 $baselines --out bench_engine_s12b_h200.json) \
  2>&1 | grep -v "seem to have been set" > "$OUT/bench_engine.log"
echo "== engine rc=${PIPESTATUS[0]} (3: rows > 10 % slower than a baseline) $((SECONDS - START)) s"
(cd benchmarks && python3 gpu_summary.py "$OUT/bench_engine_s12b_h200.json") 2>&1 | tee "$OUT/summary.txt" | head -60
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 80 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
  --audio "$INPUTS/clips.npz" --runs large-v3:mixed_fp8 --out profile_engine_s12b_h200.json) 2>&1 \
  | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile.log"
echo "== profile rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; grep -v "^---" "$OUT/profile.log" | head -30
