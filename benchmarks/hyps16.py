"""A fifth hypothesis for `accurate`'s vote, cached as hyps14.py caches the other four (session 16,
issue #12): the conditioned chain with its windows cut as openai/whisper and faster-whisper cut them
(`_sequential(by_speech=False)`, `plain`), text and segments per file; and `accurate-vote`, the
product as the tree runs it. (`late`, in commit b2467cb only: the chain cut by the VAD with a
window's last segment decoded again at the start of the next window when it ended within 5 s of
the window's end; negative on messy-en-8-0, removed.)

    python benchmarks/hyps16.py --model tiny.en --files messy-en-8-0 --systems plain --out acc16_hyps_tiny.json

Systems: hyps14.py's (which runs this), `plain` by default.
"""

from __future__ import annotations

from hyps14 import main

if __name__ == "__main__":
    main(__doc__, files="messy-en-8-0", systems="plain", out="hyps16.json")
