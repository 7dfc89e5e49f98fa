#!/usr/bin/env bash
# Session 18, third lease: the decode step and the encoder on disjoint SM partitions (probe_green.py
# --split), large-v3 full_fp16. Needs only the tokenizer (no stage calls):
#   run(command="bash benchmarks/gpu_s18c.sh", carry=[".carry/inputs"], timeout_s=240)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 220 python3 probe_green.py --tokenizer ../.carry/inputs/tokenizer_multilingual.json \
  --shape large-v3 --preset full_fp16 --rows 256,128 --encoder-sms 96 --split 48,64,80 --out probe_green_split.json 2>&1 \
  | grep -v "^Warning" | grep -v "^  [ 0-9.]* [ 0-9]*  " | tail -40
