#!/usr/bin/env bash
# Session 16's fourth call: live tiny.en at 1,000 streams with mixed_fp8 (its 4-bit cross cache applies at
# every width) beside full_fp16 (the default), same call, after the three stage calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s16d.sh", carry=[".carry/tiny_b"], timeout_s=220)
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
PRECISION=mixed_fp8 load tiny16_mixed_fp8 80 --model tiny.en --clients 1000
PRECISION=full_fp16 load tiny16_full_fp16 80 --model tiny.en --clients 1000
