#!/usr/bin/env bash
# For session 19 (issue 15, full_fp16 rtf 2,500 at 256 large-v3 windows): the SM partition in the
# engine (STEP_SMS, session 18, never run on a GPU yet). After the three stage calls of
# gpu_session.sh:
#   run(command="bash benchmarks/gpu_s19.sh", carry=[".carry/tiny_b"], timeout_s=600)
# 1. the CUDA test of the pipeline, now with an "SM partition" variant (tokens as without it);
# 2. profile_engine.py at 256 windows: full_fp16 plain, with the encoder pipeline, and with the
#    pipeline and 48 / 64 SMs for the steps while a pass runs (rtf, steps, admission split, GPU busy).
# Session 18's probe: a step on 48 SMs beside an encoder pass on the other 84 takes 0.85x of the two
# one after the other; whether the engine keeps that depends on the steps it runs beside the passes
# (small batches while windows trickle in).
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
timeout 150 python3 -m pytest -q -p no:cacheprovider \
  "tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token" 2>&1 | tail -5
for runs in large-v3:full_fp16,large-v3:full_fp16:overlap:sms48 large-v3:full_fp16:overlap,large-v3:full_fp16:overlap:sms64; do
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 200 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
    --audio "$INPUTS/clips.npz" --runs $runs --windows 256 --out "profile_engine_s19_${runs//[:,]/_}.json") 2>&1 \
    | grep -A3 "^shape" | grep -v "^--"
done
# 3. `accurate` uploads (tiny.en, 32): session 18 made a beam step's host work ~3x cheaper (one copy per
#    step, not three per group; selection 76 -> 21 us a group) after measuring 208 audio s/s, engine busy 0.96
UPLOADS=32 SKIP_PRESETS=1 MODELS=tiny.en MODES=accurate UPLOAD_ARGS="--systems ours" BUDGET_S=150 WANT_S=140 \
  bash benchmarks/gpu_uploads.sh 2>&1 | grep -A3 "^model"
# 4. the guard's full_fp16 rows with the partition, if step 2 shows a gain (rtf at 256 against 2,275):
#    (cd benchmarks && BENCH_RESULTS_DIR="$OUT" python3 bench_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
#      --audio "$INPUTS/clips.npz" --shapes large-v3 --batches 128,256 --hf-batches "" --precisions full_fp16,full_fp16+overlap48)
