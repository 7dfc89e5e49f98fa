"""Vote rules with the chain with acoustic context (session 17, issue #12): vote16.py's transcripts
(`acc`, `unp`, `fast`, `fastb5`, `plain`, `fw5` where traced) plus `ctx`, `ctx8`, `ctx12` from
hyps17.py's files, on the eleven files and, apart, on the six held-out joins messy-en-8-5..8-10.

    python benchmarks/vote17.py --rules acc,ctx,acc+unp+fast+fastb5,ctx+unp+fast+fastb5 --out acc17_vote11.json

Transcripts of messy-en-8-9/8-10 (built at the end of session 16): acc16_hyps_held3_tiny.json
(`acc`, `unp`, `fast`, `fastb5`), acc16_hyps_held3_plain_tiny.json (`plain`) and
acc16_fwtrace_held3.json (`fw5`). Rules as in vote14.py (first name the backbone).
"""

from __future__ import annotations

import argparse
import json

from common import write_json

import vote16
from bench_live_accuracy import recording
from vote14 import RESULTS, SPECS, combine, errors

HELD_OUT = vote16.HELD_OUT + ["messy-en-8-9", "messy-en-8-10"]
CTX = {"ctx": "ctx", "ctx8": "ctx8", "ctx12": "ctx12", "ctxtail": "ctxtail"}
HYPS = {"accurate": "acc", "unprompted": "unp", "fast": "fast", "fast-b5": "fastb5", "accurate-vote": "vote",
        "plain": "plain", "fw-beam5": "fw5", **CTX}
PLAIN = "acc16_hyps_tiny.json,acc16_hyps_base.json,acc16_hyps_held_tiny.json"
FILES = ("acc16_hyps_held3_tiny.json,acc16_hyps_held3_plain_tiny.json,acc16_fwtrace_held3.json,"
         "acc17_hyps_tiny.json,acc17_hyps_base.json,acc17_hyps_held_tiny.json")


def load_all(files: list[str]) -> dict[str, dict[str, list[tuple]]]:
    """{file name: {system: [(start, end, text)]}}: vote16's transcripts and the `files`'."""
    data = vote16.load_all(PLAIN.split(","))
    for f in files:
        path = RESULTS / f
        if not path.exists():
            continue
        for r in json.loads(path.read_text())["runs"]:
            if r["system"] in HYPS:
                data.setdefault(r["file"], {})[HYPS[r["system"]]] = [tuple(s[-3:]) for s in r["segments"]]
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", default="acc,ctx,acc+unp+fast+fastb5,ctx+unp+fast+fastb5")
    parser.add_argument("--specs", default=",".join(SPECS))
    parser.add_argument("--files", default=FILES)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    data = load_all(args.files.split(","))
    rules = args.rules.split(",")
    groups = {"11": SPECS, "held out": HELD_OUT}
    totals = {g: {r: 0 for r in rules} for g in groups}
    missing = {g: {r: False for r in rules} for g in groups}
    rows = []
    width = {r: max(8, len(r) + 2) for r in rules}
    print("file".ljust(18) + "".join(r.rjust(width[r]) for r in rules) + "fw5".rjust(6))
    for spec in args.specs.split(","):
        rec = recording(spec)
        group = "held out" if spec in HELD_OUT else "11"
        texts = data.get(rec["name"], {})
        row, line = {"file": rec["name"], "spec": spec, "group": group}, rec["name"].ljust(18)
        for rule in rules:
            text = combine(texts, rule)
            if text is None:
                missing[group][rule] = True
                line += "-".rjust(width[rule])
                continue
            e, n = errors(rec["reference"], text, rec["language"])
            row[rule] = {"errors": e, "words": n, "wer_%": round(100 * e / n, 2), "text": text}
            totals[group][rule] += e
            line += str(e).rjust(width[rule])
        fw = combine(texts, "fw5")
        if fw is not None:
            row["fw5"] = errors(rec["reference"], fw, rec["language"])[0]
        rows.append(row)
        print(line + str(row.get("fw5", "-")).rjust(6), flush=True)
    for g in groups:
        if any(s in groups[g] for s in args.specs.split(",")):
            print(f"total {g}".ljust(18) + "".join((str(totals[g][r]) + ("*" if missing[g][r] else "")).rjust(width[r])
                                                   for r in rules))
    if args.out:
        print("wrote", write_json(args.out, {"rules": rules, "totals": totals, "incomplete": missing, "rows": rows}))


if __name__ == "__main__":
    main()
