"""Vote rules with the chain with acoustic context (session 17, issue #12): vote16.py's transcripts
(`acc`, `unp`, `fast`, `fastb5`, `plain`, `fw5` where traced) plus `ctx`, `ctx8`, `ctx12` from
hyps17.py's files, on the eleven files and, apart, on the six held-out joins messy-en-8-5..8-10.

    python benchmarks/vote18.py --rules acc,ctx,acc+unp+fast+fastb5,ctx+unp+fast+fastb5 --out acc17_vote11.json

(Session 17's tables came from this file's own `main`; since session 18 it holds only the cached
transcripts' loader, and vote18.py, which loads them through it, prints any vote14.py rule.)

Transcripts of messy-en-8-9/8-10 (built at the end of session 16): acc16_hyps_held3_tiny.json
(`acc`, `unp`, `fast`, `fastb5`), acc16_hyps_held3_plain_tiny.json (`plain`) and
acc16_fwtrace_held3.json (`fw5`). Rules as in vote14.py (first name the backbone).
"""

from __future__ import annotations

import vote16

HELD_OUT = vote16.HELD_OUT + ["messy-en-8-9", "messy-en-8-10"]
CTX = {"ctx": "ctx", "ctx8": "ctx8", "ctx12": "ctx12", "ctxtail": "ctxtail"}
HYPS = {"accurate": "acc", "unprompted": "unp", "fast": "fast", "fast-b5": "fastb5", "accurate-vote": "vote",
        "plain": "plain", "fw-beam5": "fw5", **CTX}
PLAIN = "acc16_hyps_tiny.json,acc16_hyps_base.json,acc16_hyps_held_tiny.json"
FILES = ("acc16_hyps_held3_tiny.json,acc16_hyps_held3_plain_tiny.json,acc16_fwtrace_held3.json,"
         "acc17_hyps_tiny.json,acc17_hyps_base.json,acc17_hyps_held_tiny.json")


def load_all(files: list[str]) -> dict[str, dict[str, list[tuple]]]:
    """{file name: {system: [(start, end, text)]}}: vote16's transcripts and the `files`'."""
    return vote16.add_runs(vote16.load_all(PLAIN.split(",")), files, HYPS)
