#!/usr/bin/env bash
# N concurrent uploads through one engine on the GPU (issue 5), in three back-to-back device calls
# (the machine stays warm 30 s between them; /tmp survives until it goes back):
#   1. carry .carry/tiny_a  : mkdir -p /tmp/tiny_a && cp .carry/tiny_a/model.bin.part1 /tmp/tiny_a/
#   2. carry .whl_gpu       : mkdir -p /tmp/whl && cp .whl_gpu/*.whl /tmp/whl/   (made here by gpu_wheels.sh)
#   3. carry .carry/tiny_b .carry/audio : bash benchmarks/gpu_longform.sh
# .carry/audio holds the shared manifest.jsonl and long/asterisk_en_6min.ogg.
source benchmarks/gpu_setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
# The CUDA-only tests (second-stream encoder, kernels against their references) on this GPU first.
STREAMER_AUDIO_DIR=$PWD/.carry/audio timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider \
  tests/test_engine.py::test_encoder_on_a_second_stream_changes_no_token tests/test_fused.py tests/kernels 2>&1 | tail -25 | tee "$OUT/cuda_tests.log"
cd benchmarks
STREAMER_AUDIO_DIR=$PWD/../.carry/audio BENCH_RESULTS_DIR="$OUT" timeout ${LONGFORM_TIMEOUT:-420} \
  python3 bench_longform.py --model /tmp/tiny --device cuda --systems none --minutes "" \
  --concurrent ${UPLOADS:-8,32,64} --out bench_longform_h200.json 2>&1 | tee "$OUT/longform.log"
