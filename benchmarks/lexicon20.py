"""`confirmed+guard` with a recording's own vocabulary as evidence (session 20, issue #12), offline on
the cached transcripts; no model.

    python benchmarks/lexicon20.py --specs dev --out acc20_dev_lexicon.json

`lex`: as `confirmed+guard` (`VoteStream(confirm=GUARD)` over [plain, acc, unp, fast, fastb5]), except
that an unconfirmed backbone phrase P (in the guard's bounds) stands against the others' vote V where
every word of P was said by all five transcripts somewhere earlier in the recording (an anchor slot)
and some word of V never was: the recording has already agreed on P's words ("You are currently
caller number" before "send this caller to voicemail"), not on V's ("color"). Causal (only slots
before the run), so it streams as the vote does. `--specs`: dev, held (vote18's fourteen + fresh3 +
fresh4), or comma-separated specs.
"""

from __future__ import annotations

import argparse

from common import write_json

import rescore20
import vote18
import vote18b
from vote14 import SPECS, errors

from streamer.longform.vote import VoteStream, words_of


class Lexicon(VoteStream):
    def __init__(self):
        super().__init__(len(vote18.ORDER), confirm=vote18.GUARD)
        self.seen: set[str] = set()
        self.scanned = 0
        self.kept: list[tuple[float, str, str]] = []

    def keeps_backbone(self, i: int, j: int, said: list[str]) -> bool:
        if super().keeps_backbone(i, j, said):
            return True
        if self._deviates(i, j):
            return False
        for k in range(self.scanned, i):  # anchors before the run
            keys = {None if w is None else w.key for w in self.slots[k]}
            if len(keys) == 1 and None not in keys:
                self.seen |= keys
        self.scanned = max(self.scanned, i)
        own = [self.slots[k][0].key for k in range(i, j) if self.slots[k][0] is not None]
        voted = [w.key for w in rescore20.others_vote(self.slots, i, j, said)]
        keep = bool(own) and all(w in self.seen for w in own) and any(w not in self.seen for w in voted)
        if keep:
            t = next(w.time for w in self.slots[i] if w is not None)
            self.kept.append((round(t, 1), " ".join(own), " ".join(voted)))
        return keep


def text_of(texts):
    stream = Lexicon()
    out = []
    for h, n in enumerate(vote18.ORDER):
        out += stream.add(h, words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]))
    return " ".join(v.word.text for v in out), stream.kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", default="dev")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    held = vote18.HELD_OUT + vote18b.FRESH3 + rescore20.FRESH4
    specs = {"dev": SPECS, "held": held}.get(args.specs) or args.specs.split(",")
    data, refs = rescore20.load(), vote18.references(specs)
    rows, totals = [], {"cg": 0, "lex": 0}
    for spec in specs:
        rec = refs[spec]
        texts = data[rec["name"]]
        cg = vote18.text_of(texts, "confirmed+guard")
        lex, kept = text_of(texts)
        e = {"cg": errors(rec["reference"], cg, rec["language"])[0], "lex": errors(rec["reference"], lex, rec["language"])[0]}
        bars = {c: errors(rec["reference"], " ".join(t for _, _, t in texts[c]), rec["language"])[0] for c in ("fw5", "fw1", "fast") if c in texts}
        for r in totals:
            totals[r] += e[r]
        rows.append({"spec": spec, "file": rec["name"], **e, "bars": bars, "kept": kept})
        print(f"{spec:15s} cg {e['cg']:3d} lex {e['lex']:3d}  bars {bars}  kept {kept}", flush=True)
    print("total", totals)
    if args.out:
        write_json(args.out, {"specs": specs, "totals": totals, "rows": rows})


if __name__ == "__main__":
    main()
