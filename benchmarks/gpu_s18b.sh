#!/usr/bin/env bash
# Session 18, second lease, after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s18b.sh", carry=[".carry/tiny_b"], timeout_s=300)
# 1. HBM bandwidth and matmul rate per SM count (probe_sm_bandwidth.py): can a decode step's
#    cross-attention read at full bandwidth on part of the SMs, leaving the rest to the encoder?
# 2. live: the large-v3-turbo shape (random weights, latency only) at 600 streams (last run: session 13).
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 150 python3 probe_sm_bandwidth.py) 2>&1 | tail -14
OVERLAP_ENCODER=1 load turbo18_600 90 --model "shape:large-v3-turbo:$INPUTS/tokenizer_multilingual.json" --clients 600
