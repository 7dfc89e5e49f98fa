#!/usr/bin/env bash
# The live-streaming load test on the H200 (issue 14): `streamer serve` as it runs in production
# (WORKERS gateway processes in front of one engine core process), tiny.en with real speech, then
# the large-v3-turbo shape in its speed-only mode, then the one-process design (WORKERS=0) at the
# load where it broke, for the comparison in one run.
#
# Here first: python benchmarks/make_gpu_inputs.py --no-base   (builds .carry/, ignored by git)
# then three device calls back to back (the machine stays warm 30 s after a call):
#   1. run(command="bash benchmarks/gpu_stage.sh", carry=[".carry/tiny_a", ".carry/inputs"], timeout_s=60)
#   2. run(command="bash benchmarks/gpu_stage.sh", carry=[".carry/wheels", ".carry/audio"], timeout_s=60)
#   3. run(command="bash benchmarks/gpu_loadtest.sh", carry=[".carry/tiny_b"], timeout_s=600)
# Env: CLIENTS (tiny.en sweep), TURBO_CLIENTS, SINGLE_CLIENTS ("" skips a part), SECONDS_PER_CLIENT (15),
#   WORKERS (gateway processes; default the server's), CLIENT_PROCS (4).
# Back in $OUT: bench_streaming_h200.json, bench_streaming_turbo_h200.json, bench_streaming_single_h200.json, logs.
set -uo pipefail
START=$SECONDS
source benchmarks/gpu_assemble.sh || exit 2
ulimit -n 65536 2>/dev/null || ulimit -n 16384
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
nproc
SEC=${SECONDS_PER_CLIENT:-15}
PROCS=${CLIENT_PROCS:-4}
W=${WORKERS:-}
run() {  # run NAME TIMEOUT ARGS...
  local name=$1 t=$2; shift 2
  local s=$SECONDS
  timeout "$t" python3 benchmarks/bench_streaming.py --spawn --device cuda --seconds "$SEC" --client-procs "$PROCS" \
    --out "$OUT/bench_streaming_${name}_h200.json" "$@" > "$OUT/loadtest_${name}.log" 2>&1
  echo "== $name rc=$? $((SECONDS - s)) s"
  grep -v "INFO\|WARNING" "$OUT/loadtest_${name}.log" | tail -22
}
CLIENTS=${CLIENTS-1,100,200,400,600,800,1000}
[ -n "$CLIENTS" ] && run tiny 300 --model tiny.en --clients "$CLIENTS" ${W:+--workers $W}
TURBO_CLIENTS=${TURBO_CLIENTS-1,100,200,400}
[ -n "$TURBO_CLIENTS" ] && run turbo 200 --model "shape:large-v3-turbo:$INPUTS/tokenizer_multilingual.json" \
  --clients "$TURBO_CLIENTS" ${W:+--workers $W}
SINGLE_CLIENTS=${SINGLE_CLIENTS-128}
[ -n "$SINGLE_CLIENTS" ] && run single 90 --model tiny.en --clients "$SINGLE_CLIENTS" --workers 0
echo "total $((SECONDS - START)) s"
