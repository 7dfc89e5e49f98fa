#!/usr/bin/env bash
# Session 18, last lease: a step of R rows against two steps of R/2 rows side by side on two streams
# (probe_two_halves.py), large-v3 full_fp16. Needs only the tokenizer (no stage calls):
#   run(command="bash benchmarks/gpu_s18d.sh", carry=[".carry/inputs"], timeout_s=170)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 160 python3 probe_two_halves.py --tokenizer ../.carry/inputs/tokenizer_multilingual.json \
  --shape large-v3 --preset full_fp16 --rows 256,128 2>&1 | grep -v "^Warning" | tail -20
