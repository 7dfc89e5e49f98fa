#!/usr/bin/env bash
# The live-streaming load test on the H200 (issue 14): `streamer serve` as it runs in production
# (WORKERS gateway processes in front of one engine core process), tiny.en with real speech, the
# large-v3-turbo shape in its speed-only mode, and the one-process design (WORKERS=0) for comparison.
#
# Here first: python benchmarks/make_gpu_inputs.py --no-base   (builds .carry/, ignored by git)
# then three device calls back to back (the machine stays warm 30 s after a call):
#   1. run(command="bash benchmarks/gpu_stage.sh", carry=[".carry/tiny_a"], timeout_s=60)
#   2. run(command="bash benchmarks/gpu_stage.sh", carry=[".carry/wheels", ".carry/audio"], timeout_s=60)
#   3. run(command="bash benchmarks/gpu_loadtest.sh", carry=[".carry/tiny_b"], timeout_s=600)
# PLAN=full (default): tiny.en at CLIENTS, the turbo shape at TURBO_CLIENTS, one process at SINGLE_CLIENTS.
# PLAN=check: CUDA engine tests, tiny.en at 400/600/800 and the turbo shape at 200/400.
# PLAN=engine: the tiny.en engine rows rerun (full_fp16 first and last), then the engine-only live probe
#   (bench_live_engine.py) on the turbo shape: the policy's cadence at 200/400 sessions, without it at
#   200, and with OVERLAP_ENCODER at 200.
# PLAN=served: the served load with the live policy: turbo shape at 200/400, tiny.en at 400/600/800.
# PLAN=overlap: the encoder on its own stream (OVERLAP_ENCODER=1, decode steps not waiting for it):
#   its CUDA test, the engine-only probe on the turbo shape at 200/400, then served turbo 200/400 and
#   tiny.en 400/600.
# PLAN=ab: py-spy of the engine core at 400 tiny.en streams, then ENCODE_WHILE_FINALS=1 at 400 and 600
#   (tiny.en) and 200 (turbo shape): the share of other windows admitted per step while finals decode.
# PLAN=s8: session 8's check of the merged tree (CUDA tests, tiny.en 400-1000, turbo 200/400 overlapped,
#   tiny.en 600 overlapped, mixed_fp8 turbo 200).
# PLAN=s9: (next session) CUDA engine tests in one process, then tiny.en 600 x2 with and without acoustic context.
# PLAN=s9b: VAD in shared calls + one shared listening socket against both off (600 x2), 800, 1,000, turbo 400.
# PLAN=s10: the overlap test, tiny.en 1,000, turbo 600 (as s9), then profile_engine.py (256 file windows, three presets).
# PLAN=s8b: the failures of s8's CUDA tests in full, tiny.en 600 without acoustic context, 1,000 alone, gpu_attn7.sh.
# PLAN=s7a|s7c|s7d|s7e: session 7's steps (decode priority, pinned clips and a same-call A/B with session
#   5's tree in .carry/s5tree, one CPU thread + encoder graphs, the release fix); docs/benchmarks.md.
# Env: SECONDS_PER_CLIENT (15), WORKERS (default the server's), CLIENT_PROCS (4).
# Back in $OUT: bench_streaming_<name>_h200.json per run, loadtest.log, py-spy stacks (PLAN=ab).
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
ulimit -n 65536 2>/dev/null || ulimit -n 16384
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
SEC=${SECONDS_PER_CLIENT:-15}
PROCS=${CLIENT_PROCS:-4}
W=${WORKERS:-}
TURBO="shape:large-v3-turbo:$INPUTS/tokenizer_multilingual.json"
LOG=$OUT/loadtest.log
run() {  # run NAME TIMEOUT ARGS...
  local name=$1 t=$2; shift 2
  local s=$SECONDS
  echo "=== $name: $*" >> "$LOG"
  timeout "$t" python3 benchmarks/bench_streaming.py --spawn --device cuda --seconds "$SEC" --client-procs "$PROCS" \
    --out "$OUT/bench_streaming_${name}_h200.json" ${W:+--workers $W} "$@" 2>&1 | grep -v "INFO\|WARNING\|SyntaxWarning\|^  \"\"\"" >> "$LOG"
  echo "== $name rc=${PIPESTATUS[0]} $((SECONDS - s)) s"
  tail -16 "$LOG"
}
live() {  # live NAME TIMEOUT ARGS...
  local name=$1 tl=$2; shift 2; local s=$SECONDS
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout "$tl" python3 bench_live_engine.py --device cuda --seconds 20 \
    --model "$TURBO" --out "bench_live_engine_${name}_h200.json" "$@") 2>&1 | grep -v "INFO\|WARNING" > "$OUT/live_$name.log"
  echo "== live $name rc=${PIPESTATUS[0]} $((SECONDS - s)) s"; tail -4 "$OUT/live_$name.log"
}
old() {  # old NAME TIMEOUT ARGS...: bench_streaming.py of session 5's tree (.carry/s5tree), same env
  local name=$1 t=$2; shift 2
  local s=$SECONDS
  echo "=== $name (session 5 tree): $*" >> "$LOG"
  (cd "$S/s5tree" && PYTHONPATH="$S/s5tree:$T/site" timeout "$t" python3 benchmarks/bench_streaming.py --spawn --device cuda \
    --seconds "$SEC" --client-procs "$PROCS" --out "$OUT/bench_streaming_${name}_h200.json" ${W:+--workers $W} "$@") 2>&1 \
    | grep -v "INFO\|WARNING\|SyntaxWarning\|^  \"\"\"" >> "$LOG"
  echo "== $name rc=${PIPESTATUS[0]} $((SECONDS - s)) s"
  tail -8 "$LOG"
}
if [ "${PLAN:-full}" = s7a ]; then  # session 7: decode steps on a high-priority stream beside the encoder's
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token \
    tests/test_scheduler.py tests/test_live.py 2>&1 | tail -3 | tee -a "$LOG"
  live p0_short 90 --overlap-encoder --no-decode-priority --clip-seconds 2,8 --sessions 200
  live p1_short 100 --overlap-encoder --clip-seconds 2,8 --sessions 200,400
  live p1_all 110 --overlap-encoder --sessions 200,400
  nvidia-smi dmon -s u -d 1 > "$OUT/dmon_turbo.txt" 2>&1 & DMON=$!
  OVERLAP_ENCODER=1 run turbo_prio 150 --model "$TURBO" --clients 200,300 --profile-at 200
  kill $DMON 2>/dev/null
  OVERLAP_ENCODER=1 PRECISION=mixed_fp8 run turbo_prio_fp8 80 --model "$TURBO" --clients 200
  live p0_all 80 --overlap-encoder --no-decode-priority --sessions 200
elif [ "${PLAN:-full}" = s7c ]; then  # session 7: + encoder CUDA graphs and pinned uploads of the clips
  timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_engine.py -k "encoder_graphs or second_stream or warm_up" \
    2>&1 | tail -30 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}; NOEG=""
  if [ "$rc" != 0 ]; then echo "CUDA tests failed: the rest without encoder graphs"; export ENCODER_GRAPHS=0; NOEG=--no-encoder-graphs; fi
  s=$SECONDS
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 120 py-spy record --threads -r 100 -f raw -o "$OUT/probe_p2_all.txt" -- \
    python3 bench_live_engine.py --device cuda --seconds 20 --model "$TURBO" --overlap-encoder --sessions 200,400 $NOEG \
    --out bench_live_engine_p2_all_h200.json) 2>&1 | grep -v "INFO\|WARNING" > "$OUT/live_p2_all.log"
  echo "== live p2_all rc=${PIPESTATUS[0]} $((SECONDS - s)) s"; tail -4 "$OUT/live_p2_all.log"
  OVERLAP_ENCODER=1 run turbo_g 110 --model "$TURBO" --clients 200,300 --profile-at 200
  old tiny_s5 80 --model tiny.en --clients 600
  run tiny_s7 80 --model tiny.en --clients 600
  OVERLAP_ENCODER=1 run tiny_s7_g 160 --model tiny.en --clients 600,800,1000
elif [ "${PLAN:-full}" = s7d ]; then  # session 7: + the model thread's CPU ops on one thread, encoder graphs on
  timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_engine.py -k "encoder_graphs or second_stream" \
    2>&1 | tail -30 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}; NOEG=""
  if [ "$rc" != 0 ]; then echo "CUDA tests failed: the rest without encoder graphs"; export ENCODER_GRAPHS=0; NOEG=--no-encoder-graphs; fi
  OVERLAP_ENCODER=1 run turbo_t1 100 --model "$TURBO" --clients 200,300 --profile-at 200
  run tiny_t1 110 --model tiny.en --clients 600,800,1000
  live p3_all 90 --overlap-encoder --sessions 200,400 $NOEG
  OVERLAP_ENCODER=1 ENCODER_GRAPHS=0 run turbo_t1_noeg 60 --model "$TURBO" --clients 200
elif [ "${PLAN:-full}" = s7e ]; then  # session 7: s7d's settings with the release fix, turbo to 400, tiny.en 400/600
  OVERLAP_ENCODER=1 run turbo_e 130 --model "$TURBO" --clients 200,300,400
  run tiny_e 90 --model tiny.en --clients 400,600
elif [ "${PLAN:-full}" = s8 ]; then  # session 8: the merged tree (acoustic context on, protocols, _admit split)
  timeout 130 python3 -m pytest -q -p no:cacheprovider -m "not slow" tests/test_engine.py tests/test_fused.py \
    tests/test_sdpa_paths.py 2>&1 | tail -4 | tee -a "$LOG"
  run tiny8 150 --model tiny.en --clients 400,600,800,1000
  OVERLAP_ENCODER=1 run turbo8 110 --model "$TURBO" --clients 200,400
  OVERLAP_ENCODER=1 run tiny8_ov 60 --model tiny.en --clients 600
  OVERLAP_ENCODER=1 PRECISION=mixed_fp8 run turbo8_fp8 50 --model "$TURBO" --clients 200
elif [ "${PLAN:-full}" = s9 ]; then  # next: the thread_local captures' CUDA tests in one process (they failed in
  # session 8 when run after other tests), then 600 tiny.en twice per acoustic-context setting, alternated
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m "not slow" --tb=short tests/test_engine.py tests/test_sdpa_paths.py \
    tests/test_fused.py > "$OUT/cuda_tests_s9.log" 2>&1
  echo "== CUDA tests rc=$?: $(tail -1 "$OUT/cuda_tests_s9.log")"; grep -E "^(FAILED|ERROR)" "$OUT/cuda_tests_s9.log" | head
  for i in 1 2; do
    run tiny9_ctx$i 60 --model tiny.en --clients 600
    ACOUSTIC_CONTEXT=0 run tiny9_noctx$i 60 --model tiny.en --clients 600
  done
  run tiny9_800 80 --model tiny.en --clients 800 --profile-at 800  # py-spy of the core and one gateway at 800
elif [ "${PLAN:-full}" = s10 ]; then  # session 10: prefill inputs before the encoder pass (runner), the
  # overlap test made robust to batch-size rounding, the served ceilings of s9 again, then where 256 file windows go
  timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short \
    tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token > "$OUT/cuda_test_s10.log" 2>&1
  echo "== CUDA test rc=$?: $(tail -1 "$OUT/cuda_test_s10.log")"
  run tiny10_1000 70 --model tiny.en --clients 1000
  OVERLAP_ENCODER=1 run turbo10_600 60 --model "$TURBO" --clients 600
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 200 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
    --audio "$INPUTS/clips.npz" --out profile_engine_s10_h200.json) 2>&1 | grep -v "seem to have been set\|_warn_once\|Profiler clears" \
    > "$OUT/profile.log"
  echo "== profile rc=${PIPESTATUS[0]}"; cat "$OUT/profile.log" | grep -v "^  "
elif [ "${PLAN:-full}" = s9b ]; then  # session 9: the gateway's VAD in shared calls (VAD_BATCH_MS) and one shared
  # listening socket (GATEWAY_ACCEPT=shared) against both off, alternated at 600; then 800/1000 and turbo 400
  timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short \
    tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token > "$OUT/cuda_test_s9b.log" 2>&1
  echo "== CUDA test rc=$?: $(tail -1 "$OUT/cuda_test_s9b.log")"
  for i in 1 2; do
    run tiny9b_new$i 60 --model tiny.en --clients 600
    VAD_BATCH_MS=0 GATEWAY_ACCEPT=reuseport run tiny9b_old$i 60 --model tiny.en --clients 600
  done
  run tiny9b_800 70 --model tiny.en --clients 800 --profile-at 800
  run tiny9b_1000 70 --model tiny.en --clients 1000
  OVERLAP_ENCODER=1 run turbo9b 60 --model "$TURBO" --clients 400
elif [ "${PLAN:-full}" = s8b ]; then  # session 8: the CUDA failures of s8 in full, what acoustic context costs at
  # tiny.en 600, tiny.en 1,000 alone (the bench stops raising N after a level with failures), then gpu_attn7.sh
  timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=long -x tests/test_engine.py \
    -k "speed_only_shape or second_stream_changes_no_token" > "$OUT/cuda_fail_s8.log" 2>&1
  echo "== CUDA failures rc=$?"; grep -E "^E |Error|assert|passed|failed" "$OUT/cuda_fail_s8.log" | head -30
  ACOUSTIC_CONTEXT=0 run tiny8_noctx 60 --model tiny.en --clients 600
  run tiny8_1000 60 --model tiny.en --clients 1000
  OUT="$OUT" BUDGET_S=$(( 560 - (SECONDS - START) )) bash benchmarks/gpu_attn7.sh
elif [ "${PLAN:-full}" = check ]; then  # after an engine change: its CUDA tests, then the load at and past the target
  timeout 120 python3 -m pytest -q -x -m "not slow" tests/test_engine.py tests/test_fused.py tests/test_sdpa_paths.py \
    2>&1 | tail -3 | tee -a "$LOG"
  run tiny 130 --model tiny.en --clients 400,600,800
  run turbo 110 --model "$TURBO" --clients 200,400
elif [ "${PLAN:-full}" = engine ]; then
  t=$SECONDS
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 120 python3 bench_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
    --audio "$INPUTS/clips.npz" --real tiny.en=$TINY --shapes "" --batches 1,32,128 --hf-batches "" \
    --precisions full_fp16,mixed_fp8,full_fp16 --out bench_engine_tiny_rerun_h200.json) 2>&1 \
    | grep -v "seem to have been set" > "$OUT/bench_engine_tiny.log"
  echo "== tiny engine rows rc=${PIPESTATUS[0]} $((SECONDS - t)) s"; grep -A8 "encoder:" "$OUT/bench_engine_tiny.log" | head -40
  live turbo_cadence 130 --sessions 200,400
  live turbo_nocadence 80 --sessions 200 --no-cadence
  live turbo_overlap 80 --sessions 200 --overlap-encoder
elif [ "${PLAN:-full}" = overlap ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token \
    tests/test_scheduler.py tests/test_live.py 2>&1 | tail -3 | tee -a "$LOG"
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 110 python3 bench_live_engine.py --device cuda --seconds 20 \
    --model "$TURBO" --overlap-encoder --sessions 200,400 --out bench_live_engine_turbo_async_h200.json) 2>&1 \
    | grep -v "INFO\|WARNING" > "$OUT/live_turbo_async.log"
  echo "== live turbo_async rc=${PIPESTATUS[0]}"; tail -4 "$OUT/live_turbo_async.log"
  OVERLAP_ENCODER=1 run turbo_async 120 --model "$TURBO" --clients 200,400
  OVERLAP_ENCODER=1 run tiny_async 110 --model tiny.en --clients 400,600
elif [ "${PLAN:-full}" = tune ]; then  # the async encoder with smaller batches, then also sparser partials
  OVERLAP_ENCODER=1 MAX_ENCODER_BATCH=4 run turbo_async_b4 80 --model "$TURBO" --clients 200
  OVERLAP_ENCODER=1 MAX_ENCODER_BATCH=4 PARTIAL_INTERVAL_MAX_S=8 FINAL_BUDGET_S=0.2 run turbo_async_b4_sparse 80 --model "$TURBO" --clients 200,300
  OVERLAP_ENCODER=1 run tiny_async_800 80 --model tiny.en --clients 800
elif [ "${PLAN:-full}" = served ]; then
  timeout 120 python3 -m pytest -q -x -m "not slow" tests/test_engine.py tests/test_scheduler.py tests/test_live.py \
    2>&1 | tail -3 | tee -a "$LOG"
  run turbo_policy 120 --model "$TURBO" --clients 200,400
  run tiny_policy 140 --model tiny.en --clients 400,600,800
elif [ "${PLAN:-full}" = ab ]; then
  run tiny_profile 100 --model tiny.en --clients 400 --profile-at 400
  ENCODE_WHILE_FINALS=1 run tiny_ewf1 130 --model tiny.en --clients 400,600
  ENCODE_WHILE_FINALS=1 run turbo_ewf1 110 --model "$TURBO" --clients 200
else
  CLIENTS=${CLIENTS-1,100,200,400,600,800,1000}
  [ -n "$CLIENTS" ] && run tiny 300 --model tiny.en --clients "$CLIENTS"
  TURBO_CLIENTS=${TURBO_CLIENTS-1,100,200,400}
  [ -n "$TURBO_CLIENTS" ] && run turbo 200 --model "$TURBO" --clients "$TURBO_CLIENTS"
  SINGLE_CLIENTS=${SINGLE_CLIENTS-128}
  [ -n "$SINGLE_CLIENTS" ] && W=0 run single 90 --model tiny.en --clients "$SINGLE_CLIENTS"
fi
echo "total $((SECONDS - START)) s"
