#!/usr/bin/env bash
# Session 19: py-spy of the engine core process while 32 `accurate` tiny.en uploads run through the
# server (bench_uploads.py), after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s19d.sh", carry=[".carry/tiny_b"], timeout_s=300)
# (NAME=s20 names the uploads' JSON bench_uploads_accurate_s20.json; session 20 reran it on its tree)
# -> $OUT/core_stacks.txt (raw stacks, every thread of the core, 100 Hz, 20 s), the upload table.
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout -k 20 200 python3 bench_uploads.py --device cuda --model "tiny.en=$TINY" \
  --uploads 32 --files 8 --minutes 2 --modes accurate --systems ours --out bench_uploads_accurate_${NAME:-s19}.json > "$OUT/uploads.log" 2>&1) &
core=""
for i in $(seq 1 120); do
  for p in $(pgrep -f spawn_main); do grep -q libcuda /proc/$p/maps 2>/dev/null && core=$p; done
  [ -n "$core" ] && break; sleep 1
done
echo "core pid $core after $i s"
for i in $(seq 1 90); do  # until the engine thread steps (after loading, graphs, the warm-up's start)
  py-spy dump --pid "$core" 2>/dev/null | grep -q "Runner.execute" && break; sleep 1
done
echo "engine stepping after $i more s"
py-spy record --pid "$core" --threads -r 100 -d 20 -f raw -o "$OUT/core_stacks.txt" 2>&1 | tail -2
wait
grep -A3 "^model" "$OUT/uploads.log"
