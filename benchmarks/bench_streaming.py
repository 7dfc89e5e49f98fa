"""The live-streaming load test from a checkout: `streamer.loadtest.client` (`streamer loadtest`)
with this repository's recordings (../shared/audio) and results directory as defaults.

    python benchmarks/bench_streaming.py --spawn                 # start a local server (tiny.en)
    python benchmarks/bench_streaming.py --url ws://host:8000 --clients 1,2,4,8,16
"""

from __future__ import annotations

import sys

from common import AUDIO_DIR, RESULTS

from streamer.loadtest.client import main

if __name__ == "__main__":
    sys.exit(main(prog="bench_streaming.py", results_dir=RESULTS, audio_dir=AUDIO_DIR))
