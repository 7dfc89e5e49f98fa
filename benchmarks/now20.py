"""The development files' five transcripts decoded again with the code as it is (session 20, issue #12):
how far the cached transcripts that sessions 16-20 voted offline are from the product's text.

    python benchmarks/hyps14.py --model tiny.en --files <en dev> --systems accurate,unprompted,fast,fast-b5,plain --out acc20_hyps_now_tiny.json
    python benchmarks/hyps14.py --model base --files <es/fr dev> --systems accurate,unprompted,fast,fast-b5,plain --out acc20_hyps_now_base.json
    python benchmarks/now20.py --out acc20_now.json

Per file: word errors of each system cached and now, and of `confirmed+guard` (`vote(...,
confirm=GUARD)`, the product's rule) over the cached five and over the five now; fw 5 beams, fw
greedy and `fast` (now) as the issue's bars.
"""

from __future__ import annotations

import argparse

from common import write_json

import rescore20
import vote18
from vote14 import RESULTS, SPECS, errors
from vote16 import add_runs

NAMES = {"accurate": "acc", "unprompted": "unp", "fast": "fast", "fast-b5": "fastb5", "plain": "plain"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default="acc20_hyps_now_tiny.json,acc20_hyps_now_base.json")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    cached = rescore20.load()
    now = add_runs({}, args.files.split(","), NAMES)
    refs = vote18.references(SPECS)
    rows, tot = [], {}
    for spec in SPECS:
        rec = refs[spec]
        old, new = cached[rec["name"]], now.get(rec["name"])
        if new is None or any(n not in new for n in vote18.ORDER):
            continue
        row = {"spec": spec}
        for n in vote18.ORDER:
            row[n] = [errors(rec["reference"], " ".join(t for *_, t in x[n]), rec["language"])[0] for x in (old, new)]
        row["cg"] = [errors(rec["reference"], vote18.text_of(x, "confirmed+guard"), rec["language"])[0] for x in (old, new)]
        row["bars"] = {"fw5": errors(rec["reference"], " ".join(t for *_, t in old["fw5"]), rec["language"])[0],
                       "fw1": errors(rec["reference"], " ".join(t for *_, t in old["fw1"]), rec["language"])[0],
                       "fast": row["fast"][1]}
        row["criterion"] = [all(e < row["bars"][c] if c != "fast" else e < f for c in ("fw5", "fw1", "fast"))
                            for e, f in zip(row["cg"], row["fast"])]
        for k in vote18.ORDER + ["cg"]:
            tot[k] = [a + b for a, b in zip(tot.get(k, [0, 0]), row[k])]
        rows.append(row)
        print(f"{spec:15s} " + "  ".join(f"{k} {row[k][0]:3d}->{row[k][1]:3d}" for k in vote18.ORDER + ["cg"])
              + f"  fw5 {row['bars']['fw5']} fw1 {row['bars']['fw1']}  criterion {row['criterion']}", flush=True)
    print("total " + "  ".join(f"{k} {v[0]}->{v[1]}" for k, v in tot.items()))
    if args.out:
        print("wrote", write_json(args.out, {"rows": rows, "totals": tot}))


if __name__ == "__main__":
    main()
