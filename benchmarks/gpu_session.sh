#!/usr/bin/env bash
# One device call: engine benchmark on the GPU for each precision preset (real tiny.en weights on
# real audio first, then the large-v3 shape with random weights), against stock transformers.
# Needs in .carry/: clips.npz, tokenizer_multilingual.json, tiny_b/ (config, tokenizer, model.bin.part2);
# model.bin.part1 was copied to /tmp/tiny_a by the previous call.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/tiny && cp .carry/tiny_b/config.json .carry/tiny_b/tokenizer.json /tmp/tiny/
cat /tmp/tiny_a/model.bin.part1 .carry/tiny_b/model.bin.part2 > /tmp/tiny/model.bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
cd benchmarks
BENCH_RESULTS_DIR="$OUT" timeout ${BENCH_TIMEOUT:-420} python3 bench_engine.py --tokenizer ../.carry/tokenizer_multilingual.json \
  --audio ../.carry/clips.npz --real tiny.en=/tmp/tiny --shapes ${SHAPES:-large-v3} --batches ${BATCHES:-1,32,128} \
  --hf-batches 1,32,128 --precisions ${PRECISIONS:-none,full_fp16,full_fp16+overlap,mixed_fp8,mixed_fp8+overlap,aggressive_fp8} \
  --out bench_engine_presets_h200.json 2>&1 | grep -v "seem to have been set" | tee "$OUT/bench_engine.log"
