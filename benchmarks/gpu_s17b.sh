#!/usr/bin/env bash
# Session 17's second call: live tiny.en at 1,000 streams with the fused sampler (now the default) and
# without, alternating in one call (the live decode step samples through it too), after the three stage
# calls of gpu_session.sh:
#   run(command="bash benchmarks/gpu_s17b.sh", carry=[".carry/tiny_b"], timeout_s=400)
set -uo pipefail
source benchmarks/gpu_assemble.sh || exit 2
source benchmarks/gpu_load.sh
STREAMER_FUSED_SAMPLER=1 load tiny17_sampler1 90 --model tiny.en --clients 1000
STREAMER_FUSED_SAMPLER=0 load tiny17_sampler0 90 --model tiny.en --clients 1000
STREAMER_FUSED_SAMPLER=1 load tiny17_sampler1_again 90 --model tiny.en --clients 1000
STREAMER_FUSED_SAMPLER=0 load tiny17_sampler0_again 90 --model tiny.en --clients 1000
