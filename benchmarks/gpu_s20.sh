#!/usr/bin/env bash
# Session 20, after the three stage calls of gpu_session.sh and with .carry/s19tree built
# (git archive e7ba554 streamer cuda_ops pyproject.toml benchmarks/*.py benchmarks/*.sh | tar -x -C .carry/s19tree):
#   run(command="PART=1 bash benchmarks/gpu_s20.sh", carry=[".carry/tiny_b", ".carry/s19tree"], timeout_s=600)
#   run(command="PART=2 bash benchmarks/gpu_s20.sh", carry=[".carry/tiny_b"], timeout_s=600)   (at once after)
# 1. `accurate` uploads (tiny.en, 32 at once): this tree (beam selection without sequence keys, the
#    last timestamp carried, candidates read back for grouped rows only; 2.5x less host time a group
#    step on the CPU) against session 19's tree, alternating (s19: 345 / 309 / 318 audio s/s);
# 2. the CUDA tests the beam change touches, and the GELU-epilogue kernel test;
# 3. profile_engine, large-v3 full_fp16 at 256 windows, with and without STREAMER_GELU_EPILOGUE=tanh
#    (fc1 + GELU in one cuBLASLt GEMM), its top 40 kernels (what the 0.10 s of copies are), then the
#    presets test with the epilogue on (full_fp16's tokens against the plain model's).
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
if [ "${PART:-1}" = 1 ]; then
uploads new $PWD accurate
uploads s19 $PWD/.carry/s19tree accurate
uploads new_again $PWD accurate
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_beam.py tests/test_engine.py \
  tests/kernels/test_decode_linear.py 2>&1 | tail -6 | tee "$OUT/cuda_tests.log"
exit 0
fi
for gelu in off tanh; do
  (cd benchmarks && STREAMER_GELU_EPILOGUE=$gelu BENCH_RESULTS_DIR="$OUT" timeout 150 python3 profile_engine.py \
    --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" --runs large-v3:full_fp16 --windows 256 \
    --out "profile_engine_s20_gelu_$gelu.json") 2>&1 | grep -v "Warning\|warn" | tail -52 > "$OUT/profile_gelu_$gelu.log"
  echo "== gelu $gelu"; grep -A2 "^shape" "$OUT/profile_gelu_$gelu.log"; grep "kernel seconds" "$OUT/profile_gelu_$gelu.log"
done
STREAMER_GELU_EPILOGUE=tanh timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short \
  "tests/test_fused.py::test_presets_transcribe_like_the_plain_model" 2>&1 | tail -4
