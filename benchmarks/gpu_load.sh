# Sourced by the GPU session scripts after gpu_assemble.sh: `load NAME TIMEOUT ARGS...` runs the live
# load test (bench_streaming.py, spawned server, 4 client processes, 15 s) with ARGS, writes
# $OUT/bench_streaming_NAME_h200.json and $OUT/load_NAME.log, and prints its result row.
ulimit -n 65536 2>/dev/null || ulimit -n 16384
load() {
  local name=$1 t=$2; shift 2; local s=$SECONDS
  timeout "$t" python3 benchmarks/bench_streaming.py --spawn --device cuda --seconds 15 --client-procs 4 \
    --out "$OUT/bench_streaming_${name}_h200.json" "$@" 2>&1 | grep -v "INFO\|WARNING\|SyntaxWarning" > "$OUT/load_$name.log"
  echo "== $name rc=${PIPESTATUS[0]} $((SECONDS - s)) s"; grep -A2 "^clients  failed" "$OUT/load_$name.log" | head -3
}
# `uploads NAME TREE [MODE]`: 32 concurrent tiny.en uploads (MODE: fast, or accurate) through TREE's server
# and bench_uploads.py (TREE: this checkout, or an older one under .carry/), $OUT/bench_uploads_NAME.json
# and uploads_NAME.log.
uploads() {
  (cd $2/benchmarks && PYTHONPATH=$2:$T/site BENCH_RESULTS_DIR="$OUT" timeout -k 10 150 python3 bench_uploads.py --device cuda \
    --model "tiny.en=$TINY" --uploads 32 --files 8 --minutes 2 --modes ${3:-fast} --systems ours --hf-dir /tmp/hf \
    --out "bench_uploads_$1.json") > "$OUT/uploads_$1.log" 2>&1
  echo "== $1 rc=$?"; grep -E "^tiny.en +ours|server up" "$OUT/uploads_$1.log" | head -2
}
