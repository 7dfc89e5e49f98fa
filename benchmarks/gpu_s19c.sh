#!/usr/bin/env bash
# Session 19: where `accurate` spends the engine's time at 32 tiny.en recordings on the GPU (345
# audio s/s in gpu_s19.sh, core busy 0.94), after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s19c.sh", carry=[".carry/tiny_b"], timeout_s=300)
# profile_accurate.py under py-spy (raw stacks of every thread, 100 Hz) -> $OUT/accurate_stacks.txt
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 240 py-spy record --threads -r 100 -f raw -o "$OUT/accurate_stacks.txt" -- \
  python3 profile_accurate.py --device cuda --model tiny.en --uploads 32 --files 8 --minutes 2 --out profile_accurate_h200.json) 2>&1 \
  | grep -v "INFO\|WARNING" | tail -8
ls -la "$OUT"
