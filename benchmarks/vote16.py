"""Vote rules with a fifth hypothesis (session 16, issue #12): vote14.py's rules over the cached
transcripts plus `plain` (the conditioned chain cut without the VAD, hyps16.py), on the eleven
files and, apart, on the four held-out joins messy-en-8-5..8-8.

    python benchmarks/vote16.py --rules acc+unp+fast+fastb5,acc+plain+unp+fast+fastb5 --out acc16_vote.json

Transcripts: as vote14.py (`acc`, `unp`, `fast`, `fastb5`, `fw5`; for messy-en-8-7/8-8 `acc` from
acc14_product_held2_tiny.json and the other three from acc15_hyps_held2_tiny.json), `plain` and
`vote5` (the product run with the fifth hypothesis, `accurate-vote`) from the acc16_hyps*.json /
acc16_product*.json files named in `--plain`. Rules as in vote14.py (first name the backbone,
`*WEIGHT`, `w:`).
"""

from __future__ import annotations

import argparse
import json

from common import write_json

from bench_live_accuracy import recording
from vote14 import RESULTS, SPECS, combine, errors, load

HELD_OUT = ["messy-en-8-5", "messy-en-8-6", "messy-en-8-7", "messy-en-8-8"]
"""Joins not used to choose a rule: messy-en-8-5/8-6 (session 14) and 8-7/8-8 (session 15)."""
HELD_EXTRA = ("acc14_product_held2_tiny.json", "acc15_hyps_held2_tiny.json")
NAMES = {"plain": "plain", "late": "late", "accurate-vote": "vote5"}


def add_runs(data: dict[str, dict[str, list[tuple]]], files: list[str], names: dict[str, str]) -> dict:
    """Add to `data` the runs of the result `files` (hyps14.py's format) whose system `names` maps
    to a short name (files that do not exist are skipped)."""
    for f in files:
        path = RESULTS / f
        if not path.exists():
            continue
        for r in json.loads(path.read_text())["runs"]:
            if r["system"] in names:
                data.setdefault(r["file"], {})[names[r["system"]]] = [tuple(s[-3:]) for s in r["segments"]]
    return data


def load_all(plain_files: list[str]) -> dict[str, dict[str, list[tuple]]]:
    """{file name: {system: [(start, end, text)]}}: vote14's transcripts and this session's."""
    return add_runs(load("acc13_main", "acc14_hyps", HELD_EXTRA), plain_files, NAMES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", default="acc,plain,acc+unp+fast+fastb5,acc+plain+unp+fast+fastb5")
    parser.add_argument("--specs", default=",".join(SPECS + HELD_OUT))
    parser.add_argument("--plain", default="acc16_hyps_tiny.json,acc16_hyps_base.json,acc16_hyps_held_tiny.json")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    data = load_all(args.plain.split(","))
    rules = args.rules.split(",")
    groups = {"11": SPECS, "held out": HELD_OUT}
    totals = {g: {r: 0 for r in rules} for g in groups}
    missing = {g: {r: False for r in rules} for g in groups}
    rows = []
    print("file".ljust(18) + "".join(r.rjust(max(12, len(r) + 2)) for r in rules))
    for spec in args.specs.split(","):
        rec = recording(spec)
        group = "held out" if spec in HELD_OUT else "11"
        row, line = {"file": rec["name"], "spec": spec, "group": group}, rec["name"].ljust(18)
        for rule in rules:
            text = combine(data.get(rec["name"], {}), rule)
            width = max(12, len(rule) + 2)
            if text is None:
                missing[group][rule] = True
                line += "-".rjust(width)
                continue
            e, n = errors(rec["reference"], text, rec["language"])
            row[rule] = {"errors": e, "words": n, "wer_%": round(100 * e / n, 2), "text": text}
            totals[group][rule] += e
            line += str(e).rjust(width)
        rows.append(row)
        print(line, flush=True)
    for g in groups:
        print(f"total {g}".ljust(18) + "".join((str(totals[g][r]) + ("*" if missing[g][r] else "")).rjust(max(12, len(r) + 2))
                                               for r in rules))
    if args.out:
        print("wrote", write_json(args.out, {"rules": rules, "totals": totals, "incomplete": missing, "rows": rows}))


if __name__ == "__main__":
    main()
