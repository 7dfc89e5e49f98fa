"""The bound of any choice among the hypotheses' phrases (rescore15.py's `--oracle`) with a fifth
hypothesis (session 16, issue #12): each disputed run of the alignment of `--names` takes the
phrase that leaves the fewest word errors against the reference. A bound, not a system. With
`--rescore`, the runs are decided instead by rescore15.py's likelihood (session 15's contexts and
constants, unchanged: `prompt` and `bare`), the candidates now including the fifth hypothesis's.

    python benchmarks/oracle16.py --names plain,acc,unp,fast,fastb5 --out acc16_oracle.json
    python benchmarks/oracle16.py --rescore --out acc16_rescore.json
"""

from __future__ import annotations

import argparse

import rescore15
from common import write_json
from vote14 import SPECS, errors
from vote16 import HELD_OUT, load_all

from bench_live_accuracy import recording


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", default="plain,acc,unp,fast,fastb5")
    parser.add_argument("--specs", default=",".join(SPECS + HELD_OUT))
    parser.add_argument("--plain", default="acc16_hyps_tiny.json,acc16_hyps_base.json,acc16_hyps_held_tiny.json")
    parser.add_argument("--rescore", action="store_true", help="the model's likelihood instead of the bound")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rescore15.NAMES = tuple(args.names.split(","))  # the transcripts `rescore` aligns, the first the backbone
    data = load_all(args.plain.split(","))
    rows, totals, models = [], {}, {}
    systems = ("vote", "prompt", "bare") if args.rescore else ("vote", "oracle")
    for spec in args.specs.split(","):
        rec = recording(spec)
        model = "tiny.en" if rec["language"] == "en" else "base"
        loaded = models.get(model) or models.setdefault(model, rescore15.load_model(model)) if args.rescore else None
        texts = rescore15.rescore(loaded, rec, data[rec["name"]])
        group = "held out" if spec in HELD_OUT else "11"
        row = {"file": rec["name"], "spec": spec, "group": group, "runs": texts["runs"]}
        for system in systems:
            row[system] = errors(rec["reference"], texts[system], rec["language"])[0]
            totals[f"{group}:{system}"] = totals.get(f"{group}:{system}", 0) + row[system]
        rows.append(row)
        print(f"{spec:16s} runs {row['runs']:4d}  " + "  ".join(f"{s} {row[s]:3d}" for s in systems), flush=True)
    print(totals)
    if args.out:
        print("wrote", write_json(args.out, {"names": rescore15.NAMES, "rows": rows, "totals": totals}))


if __name__ == "__main__":
    main()
