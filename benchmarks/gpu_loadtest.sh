#!/usr/bin/env bash
# The live-streaming load test on the GPU machine, in three back-to-back device calls:
#   1. carry .carry/tiny_a            : cp .carry/tiny_a/model.bin.part1 /tmp/tiny_a/
#   2. carry .whl_gpu                 : mkdir -p /tmp/whl && cp .whl_gpu/*.whl /tmp/whl/   (bash benchmarks/gpu_wheels.sh here first)
#   3. carry .carry/tiny_b .carry/audio : bash benchmarks/gpu_loadtest.sh
source benchmarks/gpu_setup.sh
# First-token latency of windows whose prompts differ in length, with and without cuDNN attention.
STREAMER_AUDIO_DIR=$PWD/.carry/audio BENCH_RESULTS_DIR="$OUT" timeout 120 python3 benchmarks/bench_prefill.py \
  --model /tmp/tiny --device cuda 2>&1 | tail -6 | tee "$OUT/prefill.log"
STREAMER_AUDIO_DIR=$PWD/.carry/audio timeout ${LOAD_TIMEOUT:-400} python3 benchmarks/bench_streaming.py --spawn \
  --model /tmp/tiny --device cuda --clients ${CLIENTS:-1,32,64,96,128,160} --seconds ${SECONDS_PER_CLIENT:-15} \
  --out "$OUT/bench_streaming_h200.json" 2>&1 | tee "$OUT/loadtest.log"
