#!/usr/bin/env bash
# One device call: engine benchmark on the GPU (large-v3 / turbo shapes, real tiny.en weights).
# Needs in .carry/: clips.npz, tokenizer_multilingual.json, tiny_b/ (config, tokenizer, model.bin.part2);
# model.bin.part1 was copied to /tmp/tiny_a by the previous call.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/tiny && cp .carry/tiny_b/config.json .carry/tiny_b/tokenizer.json /tmp/tiny/
cat /tmp/tiny_a/model.bin.part1 .carry/tiny_b/model.bin.part2 > /tmp/tiny/model.bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
cd benchmarks
timeout 520 python3 bench_engine.py --tokenizer ../.carry/tokenizer_multilingual.json --audio ../.carry/clips.npz \
  --real tiny.en=/tmp/tiny --out bench_engine_h200.json 2>&1 | tee "$OUT/bench_engine.log"
cp results/bench_engine_h200.json "$OUT/" 2>/dev/null
