#!/usr/bin/env bash
# Session 32's H200 call: gpu_s31.sh (issue 15's last target, full_fp16 >= 2x transformers at 128 large-v3
# windows, with the leaner absorbed kernel) on an H200; on an H100 nothing (its rows were taken in s31/s32).
#   run(command="bash benchmarks/gpu_s32.sh", carry=[".carry/inputs"], timeout_s=420, kind="nvidia-h200")
set -uo pipefail
source benchmarks/gpu_budget.sh
gpu_begin 400
case $name in
  *H200*) SKIP_TESTS= BUDGET_S=$BUDGET exec bash benchmarks/gpu_s31.sh ;;
  *) echo "$name: not an H200, nothing to run" ;;
esac
