#!/usr/bin/env bash
# Issue 19 on `nvidia-h200-x2`: one engine core per GPU behind the gateways, against one GPU, in the
# same call. Stage calls as in gpu_session.sh (kind="nvidia-h200-x2" on the first), then:
#   run(command="PLAN=live bash benchmarks/gpu_x2.sh", carry=[".carry/tiny_b"], timeout_s=600)
#   run(command="PLAN=uploads bash benchmarks/gpu_x2.sh", carry=[".carry/tiny_b"], timeout_s=400)
# live: tiny.en streams on one GPU (DEVICE cuda:0) and on both (DEVICE cuda: a core per GPU), rising
#   until p95 finalisation passes 1 s, then the large-v3-turbo shape (latency-only mode) the same way;
#   each row carries core_busy (every core's share of the run in steps: the routing check).
# uploads: N concurrent tiny.en uploads (fast) on one GPU and on both, audio seconds per second.
# Target (issue 19): two GPUs / one >= 1.8x for streams held and for upload throughput.
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
TURBO="shape:large-v3-turbo:$INPUTS/tokenizer_multilingual.json"
case "${PLAN:-live}" in
  live)
    load x2_tiny_one 170 --model tiny.en --device cuda:0 --clients 1000,1300 --client-procs 8
    load x2_tiny_two 230 --model tiny.en --device cuda --clients 1300,1800,2200 --client-procs 8
    load x2_turbo_one 90 --model "$TURBO" --device cuda:0 --clients 400
    load x2_turbo_two 90 --model "$TURBO" --device cuda --clients 800
    ;;
  uploads)
    for dev in cuda:0 cuda cuda:0 cuda; do
      (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout -k 10 90 python3 bench_uploads.py --device $dev \
        --model "tiny.en=$TINY" --uploads 32,64 --files 8 --minutes 2 --modes fast --systems ours --hf-dir /tmp/hf \
        --out "bench_uploads_x2_${dev/:/}_$SECONDS.json") > "$OUT/uploads_x2_${dev/:/}_$SECONDS.log" 2>&1
      echo "== uploads $dev rc=$?"; grep -E "^tiny.en +ours" "$OUT"/uploads_x2_${dev/:/}_*.log | tail -2
    done
    ;;
esac
