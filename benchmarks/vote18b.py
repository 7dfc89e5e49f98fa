"""`confirmed+guard` with an overrule threshold (session 18b, issue #12), offline on the cached transcripts.

    python benchmarks/vote18b.py --rules product,confirmed+guard,cg:o1,cg:o4 --out acc18b_dev.json

Rules: anything vote18.py knows, and `cg:oK`: the product's streamed vote (`VoteStream` with
`confirm=vote18.GUARD`, `overrule=K`) over [plain, acc, unp, fast, fastb5]: a disputed run keeps
`plain`'s phrase when another transcript says it too, or when fewer than K of the other four say one
same phrase (no opposition strong enough to overrule it); a phrase out of the guard's bounds is
replaced whatever the others say. `cg:o1` is `confirmed+guard` as adopted in session 18.
`cg:pair` (`PairOverruled`): `cg:o1`, and a `plain` phrase that only `acc` confirms is replaced where
`unp`, `fast` and `fastb5` all say one other phrase. `cg+NAME`: `confirmed+guard` over the five and a
sixth cached transcript (`cg+fw1`: a proxy for a greedy `plain` chain, not a candidate).
Files, groups, fw figures and the table as vote18.py (its loader and references); `--specs fresh3`
is the joins decoded in session 18b (acc18b_hyps_fresh3_{tiny,base}.json, acc18b_fw{5,1}_fresh3_{tiny,base}.json).
"""

from __future__ import annotations

import argparse
import json

from common import write_json

import vote18
from vote14 import RESULTS, SPECS, errors
from vote16 import add_runs

from streamer.longform.vote import VoteStream, words_of

FRESH3 = ["messy-en-8-15", "messy-en-8-16", "messy-es-5-4", "messy-fr-5-4"]
"""Joins built in session 18b (seeds never used before), evaluated only after the rule was fixed in
accuracy18b.md."""
FRESH3_FILES = {kind: [f"acc18b_{kind}_fresh3_{tag}.json" for tag in ("tiny", "base")] for kind in ("hyps", "fw5", "fw1")}


def load() -> dict[str, dict[str, list[tuple]]]:
    data = vote18.load()
    names = {"accurate": "acc", "unprompted": "unp", "fast": "fast", "fast-b5": "fastb5", "plain": "plain"}
    add_runs(data, FRESH3_FILES["hyps"], names)
    for fw in ("fw5", "fw1"):
        for f in list(vote18.FW[fw]) + FRESH3_FILES[fw]:
            path = RESULTS / f
            if path.exists():  # trace_fw.py's segments: (seek, start, end, temperature, avg_logprob, text)
                for r in json.loads(path.read_text())["runs"]:
                    data.setdefault(r["file"], {})[fw] = [(s[1], s[2], s[-1]) if len(s) == 6 else tuple(s[-3:])
                                                          for s in r["segments"]]
    return data


class PairOverruled(VoteStream):
    """`cg:pair`: as `confirmed+guard`, and a `plain` phrase confirmed by `acc` alone (the two
    conditioned chains) is replaced where the three unconditioned transcripts (`unp`, `fast`,
    `fastb5`) all say one other phrase: the conditioned decoder's shared style or error against
    three decodes that do not share its prompt."""

    def keeps_backbone(self, i: int, j: int, said: list[str]) -> bool:
        if not super().keeps_backbone(i, j, said):
            return False
        only_acc = said[1] == said[0] and said[0] not in said[2:]
        return not (only_acc and said[2] == said[3] == said[4])


def overruled(texts: dict[str, list[tuple]], k: int, pair: bool = False) -> str | None:
    if any(n not in texts for n in vote18.ORDER):
        return None
    stream = (PairOverruled if pair else VoteStream)(len(vote18.ORDER), confirm=vote18.GUARD, overrule=k)
    out = []
    for h, n in enumerate(vote18.ORDER):
        out += stream.add(h, words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]))
    return " ".join(v.word.text for v in out)


def with_sixth(texts: dict[str, list[tuple]], sixth: str) -> str | None:
    """`confirmed+guard` (`VoteStream(confirm=GUARD)`) over the five and a sixth transcript, last:
    a proxy, not a candidate (`cg+fw1`: faster-whisper's greedy sequential transcription standing
    in for a greedy `plain` chain, which `accurate` does not decode; accuracy18b.md, D)."""
    names = vote18.ORDER + [sixth]
    if any(n not in texts for n in names):
        return None
    stream = VoteStream(len(names), confirm=vote18.GUARD)
    out = []
    for h, n in enumerate(names):
        out += stream.add(h, words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]))
    return " ".join(v.word.text for v in out)


def text_of(texts: dict[str, list[tuple]], rule: str) -> str | None:
    if rule.startswith("cg+"):
        return with_sixth(texts, rule[3:])
    if rule.startswith("cg:o"):
        return overruled(texts, int(rule[4:]))
    if rule == "cg:pair":
        return overruled(texts, 1, pair=True)
    return vote18.text_of(texts, rule)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", default="product,confirmed+guard,cg:o1,cg:o4")
    parser.add_argument("--specs", default="dev", help="dev, held, fresh3, or comma-separated specs")
    parser.add_argument("--base", default="confirmed+guard", help="the rule the others are compared with per file")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    specs = {"dev": SPECS, "held": vote18.HELD_OUT, "fresh3": FRESH3}.get(args.specs) or args.specs.split(",")
    refs, data, rules = vote18.references(specs), load(), args.rules.split(",")
    totals, worst, met, rows = {r: 0 for r in rules}, {r: 0 for r in rules}, {r: 0 for r in rules}, []
    w = {r: max(8, len(r) + 2) for r in rules}
    print("file".ljust(18) + "".join(r.rjust(w[r]) for r in rules) + "fw5".rjust(6) + "fw1".rjust(6) + "fast".rjust(6))
    for spec in specs:
        rec = refs[spec]
        texts = data.get(rec["name"], {})
        row = {"file": rec["name"], "spec": spec}
        bars = {}  # the bars: fw 5 beams, fw greedy, `fast` (a rule may be named `fast` too)
        for fw in ("fw5", "fw1", "fast"):
            if fw in texts:
                bars[fw] = errors(rec["reference"], " ".join(t for _, _, t in texts[fw]), rec["language"])[0]
        row["bars"] = bars
        line = rec["name"].ljust(18)
        for rule in rules:
            scored = vote18.score(rec, text_of(texts, rule))
            if scored is None:
                line += "-".rjust(w[rule])
                continue
            e = scored["errors"]
            row[rule] = {**scored, "criterion": all(c in bars and e < bars[c] for c in ("fw5", "fw1", "fast"))}
            totals[rule] += e
            met[rule] += row[rule]["criterion"]
            line += str(e).rjust(w[rule])
        if args.base in row:
            for rule in rules:
                if rule in row:
                    worst[rule] = max(worst[rule], row[rule]["errors"] - row[args.base]["errors"])
        rows.append(row)
        print(line + "".join(str(bars.get(c, "-")).rjust(6) for c in ("fw5", "fw1", "fast")), flush=True)
    print("total".ljust(18) + "".join(str(totals[r]).rjust(w[r]) for r in rules))
    print(f"worst vs {args.base}".ljust(18) + "".join(f"{worst[r]:+d}".rjust(w[r]) for r in rules))
    print("criterion met".ljust(18) + "".join(str(met[r]).rjust(w[r]) for r in rules))
    if args.out:
        print("wrote", write_json(args.out, {"rules": rules, "specs": specs, "totals": totals, "worst_vs_base": worst,
                                             "criterion_met": met, "rows": rows}))


if __name__ == "__main__":
    main()
