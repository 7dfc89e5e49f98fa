#!/usr/bin/env bash
# For session 13 (issue 15), one call after the two stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s13.sh", carry=[".carry/tiny_b"], timeout_s=600)
# 1. the live paths after session 12's decode-step changes (top-k only with beams, Gumbel per sampled
#    row, padded vocabulary, fp16 self-attention 32 x 1): tiny.en 1,000 streams and the turbo shape
#    at 600 (session 10: p95 0.92 / 0.81 s; session 12's mid-session tiny.en run, before them: 1.14 s);
# 2. the self-attention sweep below B = 16 (live steps at low load; session 12 swept 16-256);
# 3. one more FP8 site at 256 large-v3 windows (profile_engine.py): the cross-K/V projection (the
#    encoder attention output was measured a loss in session 5), against mixed_fp8 in the same call (WER: bench_engine --real with
#    fp8_min_width=0 in the next call if it pays);
# 4. bench_engine.py against every committed run, with its corrected floor (valid self positions).
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
load tiny13_1000 75 --model tiny.en --clients 1000
OVERLAP_ENCODER=1 load turbo13_600 65 --model "shape:large-v3-turbo:$INPUTS/tokenizer_multilingual.json" --clients 600
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 60 python3 sweep_self_attention.py --batches 1,4,8 \
  --out sweep_self_attention_small_s13_h200.json) > "$OUT/sweep_small.log" 2>&1
echo "== sweep B<16 rc=$?"; grep "^B=" "$OUT/sweep_small.log"
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 170 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
  --audio "$INPUTS/clips.npz" --runs large-v3:mixed_fp8,large-v3:mixed_fp8:cross_kv_proj=fp8 \
  --out profile_engine_s13_h200.json) 2>&1 | grep -v "seem to have been set\|_warn_once\|Profiler clears" > "$OUT/profile.log"
echo "== profile rc=${PIPESTATUS[0]} $((SECONDS - START)) s"; grep "^large" "$OUT/profile.log"
baselines=""
for f in benchmarks/results/bench_engine*_h200.json; do baselines="$baselines --baseline ../$f"; done
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $((570 - (SECONDS - START))) python3 bench_engine.py \
  --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --real tiny.en=$TINY \
  --shapes large-v3,large-v3-turbo --batches 1,32,128,256 --hf-batches 1,32,128 --precisions full_fp16,mixed_fp8 \
  $baselines --out bench_engine_s13_h200.json) 2>&1 | grep -v "seem to have been set" > "$OUT/bench_engine.log"
echo "== engine rc=${PIPESTATUS[0]} $((SECONDS - START)) s"
(cd benchmarks && python3 gpu_summary.py "$OUT/bench_engine_s13_h200.json") 2>&1 | tee "$OUT/summary.txt" | head -40
