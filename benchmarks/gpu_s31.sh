#!/usr/bin/env bash
# Session 31 (issue 15, "full_fp16 >= 2x transformers at 128 windows"): the absorbed kernel's block shapes
# (positions a tile x stages x warps, cuda_ops/cross_absorbed_mma.Tile). One call:
#   run(command="bash benchmarks/gpu_s31.sh", carry=[".carry/inputs"], timeout_s=600, kind="nvidia-h200", needs_h200=True)
# 1. CUDA tests of the kernel, every tile against the fp32 reference (tests/kernels/test_cross_absorbed.py);
# 2. probe_absorbed.py --rows 128,256 --tiles TILES: the kernel alone per tile; the fastest (summed over the
#    rows) becomes STREAMER_ABSORBED_TILE for
# 3. bench_engine, large-v3 shape, full_fp16 (the hybrid cross cache), BATCHES and transformers at HF_BATCHES,
#    against the last recorded runs on the same kind of card (--baseline);
# 4. Nsight Compute's view of the kernel at 128 rows (benchmarks/ncu_absorbed.py), if time is left.
# Env: TILES (32x2,16x5,16x3), BATCHES (1,16,128,256), HF_BATCHES (128), SKIP_TESTS=1, BUDGET_S (570).
set -uo pipefail
source benchmarks/gpu_budget.sh
gpu_begin 570
gpu_tests 150 tests/kernels/test_cross_absorbed.py -k "mma or tile" || { echo "kernel tests failed: no benchmark"; exit 1; }
t=$SECONDS
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout $(cap 120 300) python3 probe_absorbed.py --rows 128,256 \
  --tiles "${TILES:-32x2,16x5,16x3}" --prefill-tokens 0 --calls 20) > "$OUT/probe_absorbed.log" 2>&1
grep -E "tile|mma rows" "$OUT/probe_absorbed.log" | tail -14
echo "probe $((SECONDS - t)) s"
best=$(python3 - "$OUT/probe_absorbed.json" <<'PY'
import collections, json, sys
try:
    sweep = json.load(open(sys.argv[1]))["sweep"]
except (OSError, ValueError, KeyError):
    sys.exit()
total, seen = collections.Counter(), collections.Counter()
for e in sweep:
    if "tile" in e and "kernel_ms" in e:
        total[e["tile"]] += e["kernel_ms"]
        seen[e["tile"]] += 1
full = [t for t in total if seen[t] == max(seen.values())]
print(min(full, key=total.get) if full else "")
PY
)
echo "fastest tile: ${best:-none (the default)}"
baselines=""  # the last recorded runs on this kind of card (an H200's against an H100's would flag the card)
case $name in
  *H200*) files="benchmarks/results/bench_engine*_h200.json benchmarks/results/s30_h200/bench_engine*.json" ;;
  *) files="benchmarks/results/s28_h100/bench_engine*_h100.json benchmarks/results/s31_h100/call15_bench_engine*.json" ;;
esac
for f in $files; do [ -e "$f" ] && baselines="$baselines --baseline ../$f"; done
engine() {  # engine TILE BATCHES HF_BATCHES OUTNAME
  (cd benchmarks && STREAMER_ABSORBED_TILE=$1 BENCH_RESULTS_DIR="$OUT" timeout $(cap 260 10) python3 bench_engine.py \
    --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --shapes large-v3 \
    --batches "$2" --hf-batches "$3" --precisions full_fp16 $baselines --out "$4") 2>&1 \
    | grep -v "seem to have been set\|^\[transformers\]" > "$OUT/${4%.json}.log"
  echo "engine tile ${1:-default} rc=${PIPESTATUS[0]} (3: rows > 10 % slower than a baseline)"
  grep -E "^ours|^transformers|SLOWER|encoder:" "$OUT/${4%.json}.log" | head -12
}
t=$SECONDS
engine "$best" "${BATCHES:-1,16,128,256}" "${HF_BATCHES-128}" bench_engine_s31_tile.json
echo "engine $((SECONDS - t)) s"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
if (( $(left) > 60 )) && [ -n "$NCU" ]; then
  timeout $(cap 40 5) $NCU --kernel-name regex:absorbed_mma --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis \
    python3 benchmarks/ncu_absorbed.py --rows 128 > "$OUT/ncu_128.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Issued Ipc|Eligible Warps|Issued Instructions  |highest-utilized" "$OUT/ncu_128.txt"
fi
echo "=== $((SECONDS - START)) s in all"
