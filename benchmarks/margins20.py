"""What a margin would do to rescore20.py's rules on the development files (session 20, issue #12).

    python benchmarks/margins20.py acc20_dev_rescore.json acc20_dev_own.json acc20_dev_rescore2.json

For each rule `K:0` recorded and each margin M, the change in word errors against `confirmed+guard`
if only the backbone phrases that won by more than M nats were taken back: the sum of the recorded
runs' `flip_gain` (each run's one-at-a-time counterfactual, so an estimate where runs interact), and
the worst and best file. Context: `bare` for lb/ob/ot/pt/jw, the lower of both for `both`, else
`prompt`. (`jw`'s taken windows have no counterfactual recorded: its totals are in the results.)
"""

import json
import sys

from vote14 import RESULTS

BARE = ("lb", "ob", "ot", "pt", "jw")


def main() -> None:
    for f in sys.argv[1:]:
        d = json.loads((RESULTS / f).read_text())
        for rule in d["rules"]:
            kind = rule.split(":")[0]
            if kind in ("cg", "jw", "jwp"):
                continue
            recs = [(row["spec"], r) for row in d["rows"] for r in row["records"] if r["rule"] == rule and r["case"] == "a"]
            line = f"{rule:8s} runs {len(recs):3d}"
            for m in (0, 1, 2, 3, 4, 6, 8):
                per: dict[str, int] = {}
                for spec, r in recs:
                    g = min(r["gain_bare"], r["gain_prompt"]) if kind == "both" else r["gain_bare" if kind in BARE else "gain_prompt"]
                    if g > m and r["taken"]:
                        per[spec] = per.get(spec, 0) + r["flip_gain"]
                line += f"  M{m} {sum(per.values()):+d} ({max(per.values(), default=0):+d}/{min(per.values(), default=0):+d})"
            print(line)


if __name__ == "__main__":
    main()
