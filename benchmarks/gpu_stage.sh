#!/usr/bin/env bash
# A stage call on the GPU machine: keep what this call carried under .carry/ in /tmp/stage/, which
# lasts while the machine stays warm (30 s after each call: make the next call at once).
# `python benchmarks/make_gpu_inputs.py` here prints which .carry/ folders go in which call.
set -euo pipefail
T=${GPU_TMP:-/tmp}  # elsewhere only for a dry run on a CPU machine
mkdir -p $T/stage
cp -r .carry/. $T/stage/
du -sh $T/stage/* | tr '\n' ' '
echo
