#!/usr/bin/env bash
# Session 12, first call (issue 15): the encoder on an SM partition (green context) beside decode
# steps, and a decode step kernel by kernel. Random weights only: carry .carry/inputs alone.
#   run(command="bash benchmarks/gpu_s12.sh", carry=[".carry/inputs"], timeout_s=600)
set -uo pipefail
source benchmarks/gpu_kernel_env.sh
export BENCH_RESULTS_DIR=$OUT
IN=$PWD/.carry/inputs
python3 -c "import torch.cuda.green_contexts as g; print('torch green contexts:', g.SUPPORTED, [a for a in dir(g.GreenContext) if not a.startswith('_')])"
cd benchmarks
timeout 150 python3 probe_green.py --tokenizer $IN/tokenizer_multilingual.json --shape large-v3 --preset mixed_fp8 \
  --rows 256,64 --encoder-sms 96,112,120 --out probe_green_fp8.json 2>&1 | tee $OUT/probe_fp8.log | grep -v "^Warning"
echo "== probe rc=${PIPESTATUS[0]}"
prof() {  # prof NAME RUNS
  timeout 120 python3 profile_engine.py --tokenizer $IN/tokenizer_multilingual.json --audio $IN/clips.npz \
    --runs $2 --windows 256 --out profile_$1.json > $OUT/prof_$1.log 2>&1
  echo "== $1 ($2) rc=$?"; grep -E "^\| *large|^large|rtf|Error|error" $OUT/prof_$1.log | head -12
}
prof v3_fp8 large-v3:mixed_fp8
prof v3_fp8_sms112 large-v3:mixed_fp8:sms112
prof v3_fp8_sms96 large-v3:mixed_fp8:sms96
prof v3_fp16_sms112 large-v3:full_fp16:sms112
