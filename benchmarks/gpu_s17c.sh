#!/usr/bin/env bash
# Session 17: uploads `fast` at 32 (tiny.en) ran at 1,087 audio s/s against 2,279-2,541 in session 8: this
# tree against session 8's (518604a, .carry/s8tree = git archive 518604a streamer cuda_ops benchmarks), same
# call, alternating, ours only. After the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s17c.sh", carry=[".carry/tiny_b", ".carry/s8tree"], timeout_s=300)
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
up() {  # up NAME TREE
  (cd $2/benchmarks && PYTHONPATH=$2:$T/site BENCH_RESULTS_DIR="$OUT" timeout -k 10 100 python3 bench_uploads.py --device cuda \
    --model "tiny.en=$TINY" --uploads 32 --files 8 --minutes 2 --modes fast --systems ours --hf-dir /tmp/hf \
    --out "bench_uploads_$1.json") > "$OUT/uploads_$1.log" 2>&1
  echo "== $1 rc=$?"; grep -E "^tiny.en +ours" "$OUT/uploads_$1.log" | head -2
}
up new $PWD
up s8 $PWD/.carry/s8tree
up new_again $PWD
up s8_again $PWD/.carry/s8tree
