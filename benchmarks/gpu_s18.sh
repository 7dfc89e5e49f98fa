#!/usr/bin/env bash
# For session 18, after the three stage calls of gpu_session.sh (call 3 carries .carry/audio and
# .carry/wheels_b) and with .carry/s8tree built (git archive 518604a streamer cuda_ops benchmarks
# pyproject.toml | tar -x -C .carry/s8tree):
#   run(command="bash benchmarks/gpu_s18.sh", carry=[".carry/tiny_b", ".carry/s8tree"], timeout_s=420)
# 1. uploads tiny.en fast at 32: this tree (gateways take one connection at a time, /health waits for
#    every gateway) against session 8's, alternating: session 17 measured 953 against 2,182 audio s/s;
# 2. live tiny.en at 1,000 streams (the accept change touches every connection);
# 3. the encoder's attention per SDPA backend (bench_encoder_attention.py).
# Then the full uploads benchmark: run(command="bash benchmarks/gpu_uploads.sh", carry=[".carry/tiny_b"], ...).
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
uploads new $PWD
uploads s8 $PWD/.carry/s8tree
uploads new_again $PWD
load tiny18_full_fp16 90 --model tiny.en --clients 1000
(cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout 120 python3 bench_encoder_attention.py --batches 8,16,32) 2>&1 | tail -12
# 4. the sampler's compile-ahead (session 17, not yet run on a GPU)
timeout 90 python3 -m pytest -q -p no:cacheprovider \
  "tests/kernels/test_sampler.py::test_the_engine_compiles_every_sampler_variant_before_it_serves" 2>&1 | tail -5
