#!/usr/bin/env bash
# Session 11: the encoder overlapped with FP8 decode steps failed with "an illegal instruction"
# (profile_engine.py, large-v3:mixed_fp8:overlap, 256 windows; the same without overlap passed).
# Each variant in its own process (a CUDA error ends the context): which presets and sizes fail,
# and the failing kernel under CUDA_LAUNCH_BLOCKING=1. After the two stage calls:
#   run(command="bash benchmarks/gpu_s11b.sh", carry=[".carry/tiny_b"], timeout_s=600)
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
one() {  # one NAME WINDOWS RUN [ENV...]
  local name=$1 n=$2 spec=$3; shift 3
  (cd benchmarks && env "$@" BENCH_RESULTS_DIR="$OUT" timeout 110 python3 profile_engine.py --tokenizer "$INPUTS/tokenizer_multilingual.json" \
    --audio "$INPUTS/clips.npz" --runs $spec --windows $n --out profile_$name.json) > "$OUT/$name.log" 2>&1
  echo "== $name ($spec @$n $*) rc=$?"
  grep -E "^(large|shape)|illegal|Error|error" "$OUT/$name.log" | grep -v "^Search\|For debugging\|TORCH_USE" | sort | uniq -c | head -8
}
one turbo_fp8_ov 256 large-v3-turbo:mixed_fp8:overlap X=1
one v3_fp16_ov 256 large-v3:full_fp16:overlap X=1
one v3_fp8_ov_64 64 large-v3:mixed_fp8:overlap X=1
one v3_fp8_ov_blocking 256 large-v3:mixed_fp8:overlap CUDA_LAUNCH_BLOCKING=1
grep -B30 "illegal" "$OUT/v3_fp8_ov_blocking.log" | grep "File \|Error" | head -30
