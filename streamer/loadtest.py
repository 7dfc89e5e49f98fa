"""`streamer loadtest ARGS`: the live-streaming load test, `benchmarks/bench_streaming.py`.

The benchmark reads the real recordings beside the source tree, so it runs from a checkout
(editable install), not from an installed wheel.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_streaming.py"


def main(argv: list[str] | None = None) -> int:
    if not SCRIPT.exists():
        print(f"streamer loadtest: {SCRIPT} not found; run it from a source checkout (pip install -e .)", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("bench_streaming", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script loads
    spec.loader.exec_module(module)
    return module.main(argv)
