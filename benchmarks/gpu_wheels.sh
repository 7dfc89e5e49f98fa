#!/usr/bin/env bash
# Wheels the GPU machine's image lacks (it has torch, triton, transformers, numpy, tokenizers, onnxruntime,
# anyio, click, h11, prometheus-client, uvloop: ../.library/device/KINDS.md), for
# Python 3.12 manylinux, into .whl_gpu/ (ignored by git; carry it in a device call, then
# `cp .whl_gpu/*.whl /tmp/whl/` so that later calls find them). Run here, not there.
#   bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl_gpu/' .git/info/exclude || echo '/.whl_gpu/' >> .git/info/exclude
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms="$platforms --platform $p"
done
# Within the tested ranges of pyproject.toml; one version of each (two stop the install there).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
  -d .whl_gpu "av>=12,<19" "silero-vad>=6.2.3,<7" "starlette>=0.40,<2" "uvicorn>=0.30,<1" "websockets>=13,<18" \
  "python-multipart>=0.0.9,<0.1" "jiwer>=3,<5" rapidfuzz "whisper-normalizer>=0.0.10,<0.2" more-itertools sniffio
ls -la .whl_gpu && du -sh .whl_gpu
