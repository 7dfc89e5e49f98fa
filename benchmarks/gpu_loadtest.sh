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
# PLAN=overlap: the encoder on its own stream (OVERLAP_ENCODER=1, decode steps not waiting for it):
#   its CUDA test, the engine-only probe on the turbo shape at 200/400, then served turbo 200/400 and
#   tiny.en 400/600.
# PLAN=ab: py-spy of the engine core at 400 tiny.en streams, then ENCODE_WHILE_FINALS=1 at 400 and 600
#   (tiny.en) and 200 (turbo shape): the share of other windows admitted per step while finals decode.
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
if [ "${PLAN:-full}" = check ]; then  # after an engine change: its CUDA tests, then the load at and past the target
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
