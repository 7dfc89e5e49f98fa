"""A guarded `plain` backbone (session 18, issue #12): region-level selection, not a word majority.

The five cached transcripts of a recording, `plain` (the conditioned chain cut as openai/whisper
cuts, hyps16.py) first, then `acc`, `unp`, `fast`, `fastb5` (the product's four), are aligned into
one network of slots as `streamer.longform.vote` aligns them. The slots where all five say the same
word are anchors; each run of slots between two anchors is a region. In a region `plain`'s words
are kept unless `plain` looks broken there, judged without the reference:

- its word count against the median of the other four: more than `hi` times it, or less than `lo`
  times it, with at least `min_words` words of difference (a runaway, a loop, a long deletion,
  text where the others hear nothing);
- (with `rep`) its words there repeat a `rep`-gram that the others do not repeat (a loop).

A broken region takes the product's vote among the other four (phrase step, then word by word,
ties to `acc`), as `accurate` votes today.

    python benchmarks/vote18.py --rules product,plain,confirmed,confirmed+guard --out acc18_dev.json

Rules: `product` (acc+unp+fast+fastb5 voted, vote14.py), any vote14.py rule (`acc`, `plain`, ...),
`confirmed` (the rule fixed first: `plain`'s phrase in a disputed run stands when one of the other
four says it too, else the other four vote), `confirmed+guard` (rule 2: and not where `plain`'s word
count is off the others' median, `GUARD`), and `g:HI:LO:MIN[:REP[:MERGE[:U[:STYLE[:SUPPORT]]]]]`, the
guarded backbone explored first (MERGE: regions closer than this many anchors are judged together,
0 by default; U: in a region kept, a disputed run where U of the other four say one phrase other
than plain's takes that phrase, 5 (never) by default; STYLE: where that phrase differs from plain's
in punctuation only, the five-way winner; SUPPORT: override only where at most SUPPORT of the four
say plain's phrase, -1 counting `unp`/`fast`/`fastb5` only). docs/notes/accuracy18.md has the tables.
`--markdown RULES` prints the per-file table with the issue's criterion (fewer errors than fw 5
beams, fw greedy and `fast`) for RULES.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
from pathlib import Path

from common import write_json

import vote17
from vote14 import RESULTS, SPECS, combine, errors

from streamer.longform.vote import VoteStream, Voted, _winner, words_of

FRESH = ["messy-en-8-11", "messy-en-8-12", "messy-es-5-2", "messy-fr-5-2"]
"""Joins built in session 18 after the rule was fixed (seeds never used before)."""
FRESH2 = ["messy-en-8-13", "messy-en-8-14", "messy-es-5-3", "messy-fr-5-3"]
"""A second group of them, declared before any held-out evaluation."""
HELD_OUT = vote17.HELD_OUT + FRESH + FRESH2
FILES = vote17.FILES + ",acc18_hyps_fresh_tiny.json,acc18_hyps_fresh_base.json,acc18_hyps_fresh2_tiny.json,acc18_hyps_fresh2_base.json"
FW = {"fw5": ("acc18_fw5_fresh_tiny.json", "acc18_fw5_fresh_base.json", "acc18_fw5_fresh2_tiny.json",
              "acc18_fw5_fresh2_base.json", "acc18_fw5_issue_tiny.json", "acc18_fw5_issue_base.json", "acc18_fw5_held_tiny.json",
              "acc12_fwtrace_tiny.json", "acc12_fwtrace_es.json", "acc12_fwtrace_xbase.json",
              "acc12_fwtrace_xtiny.json", "acc16_fwtrace_held3.json"),
      "fw1": ("acc18_fw1_fresh_tiny.json", "acc18_fw1_fresh_base.json", "acc18_fw1_fresh2_tiny.json",
              "acc18_fw1_fresh2_base.json", "acc18_fw1_issue_tiny.json", "acc18_fw1_issue_base.json", "acc18_fw1_dev_tiny.json",
              "acc18_fw1_dev_base.json", "acc18_fw1_held_tiny.json")}
"""faster-whisper's sequential transcription, 5 beams and greedy (trace_fw.py), where run."""
ORDER = ["plain", "acc", "unp", "fast", "fastb5"]
GUARD = (1.5, 0.6, 4)
"""`confirmed+guard`'s region guard: the brief's figures, not tuned."""
CACHE = Path("/tmp/acc18_recordings.pkl")


def references(specs: list[str]) -> dict[str, dict]:
    """{spec: {'name', 'language', 'reference', 'spans'}}, cached on disk (building the joins is
    what takes the time)."""
    from bench_live_accuracy import recording

    cache = pickle.loads(CACHE.read_bytes()) if CACHE.exists() else {}
    for spec in specs:
        if spec not in cache:
            rec = recording(spec)
            cache[spec] = {k: rec[k] for k in ("name", "language", "reference", "spans")}
            CACHE.write_bytes(pickle.dumps(cache))
    return cache


def load() -> dict[str, dict[str, list[tuple]]]:
    data = vote17.load_all(FILES.split(","))
    for name, files in FW.items():
        for f in files:
            path = RESULTS / f
            if path.exists():
                for r in json.loads(path.read_text())["runs"]:
                    data.setdefault(r["file"], {})[name] = [tuple(s[-3:]) for s in r["segments"]]
    return data


def _letters(phrase: str) -> str:
    """A phrase's letters and digits only: "6-0-0" and "600" are one content written two ways."""
    return "".join(c for c in phrase if c.isalnum())


def repeats(keys: list[str], n: int) -> int:
    """How many of the `n`-grams of `keys` occur earlier in them too."""
    seen, out = set(), 0
    for k in range(len(keys) - n + 1):
        g = tuple(keys[k:k + n])
        out += g in seen
        seen.add(g)
    return out


class Guarded(VoteStream):
    """The vote over [plain, acc, unp, fast, fastb5] whose disputed runs keep `plain`'s words unless
    `broken` says otherwise, then take the other four's vote. `regions` records each judged region:
    (first slot, end slot, plain's words, the others' counts, broken?)."""

    def __init__(self, hi: float, lo: float, min_words: int, rep: int = 0, merge: int = 0, unanimous: int = 5,
                 style: int = 0, support: int = 4):
        super().__init__(len(ORDER))
        self.hi, self.lo, self.min_words, self.rep, self.merge = hi, lo, min_words, rep, merge
        self.unanimous, self.style, self.support = unanimous, style, support
        self.regions: list[tuple] = []

    def broken(self, words: list[list[str]]) -> bool:
        n0, others = len(words[0]), [len(w) for w in words[1:]]
        med = statistics.median(others)
        if n0 - med >= self.min_words and n0 > self.hi * med:
            return True
        if med - n0 >= self.min_words and n0 < self.lo * med:
            return True
        if self.rep and len(words[0]) >= self.min_words:
            mine = repeats(words[0], self.rep)
            if mine >= self.min_words and mine > max(repeats(w, self.rep) for w in words[1:]):
                return True
        return False

    def _decide(self) -> list[Voted]:
        if not self.closed:
            return []  # whole transcripts only: regions are judged once every slot is known
        slots, out, n = self.slots, [], len(self.weights)
        # regions: maximal runs of disputed slots, merged across fewer than `merge` anchors
        runs, i = [], 0
        while i < len(slots):
            if len({None if w is None else w.key for w in slots[i]}) == 1:
                i += 1
                continue
            j = i
            while j < len(slots) and len({None if w is None else w.key for w in slots[j]}) > 1:
                j += 1
            if runs and self.merge and i - runs[-1][1] < self.merge:
                runs[-1] = (runs[-1][0], j)
            else:
                runs.append((i, j))
            i = j
        take_from: dict[int, int | None] = {}  # slot -> hypothesis whose word is taken (None: none)
        for a, b in runs:
            words = [[slots[k][h].key for k in range(a, b) if slots[k][h] is not None] for h in range(n)]
            bad = self.broken(words)
            self.regions.append((a, b, " ".join(words[0]), [len(w) for w in words[1:]], bad))
            if not bad:
                for k in range(a, b):
                    take_from[k] = 0 if slots[k][0] is not None else None
                # a disputed run inside where `unanimous` of the other four say one phrase that is not plain's
                k = a
                while k < b:
                    if len({None if w is None else w.key for w in slots[k]}) == 1:
                        k += 1
                        continue
                    m = k
                    while m < b and len({None if w is None else w.key for w in slots[m]}) > 1:
                        m += 1
                    said = ["".join(slots[q][h].key for q in range(k, m) if slots[q][h] is not None) for h in range(n)]
                    top = max(said[1:], key=said[1:].count)
                    if self.style and _letters(top) == _letters(said[0]):  # a spelling of plain's words
                        h = said.index(_winner(said, self.weights))
                        for q in range(k, m):
                            take_from[q] = h if slots[q][h] is not None else None
                    elif (top != said[0] and said[1:].count(top) >= self.unanimous
                          and (said[1:].count(said[0]) <= self.support if self.support >= 0
                               else said[2:].count(said[0]) == 0 if self.support == -1
                               else said[2:].count(said[0]) == 0 and (said[1] != said[0] or said[2:].count(top) == 3))):
                        h = said.index(top, 1)
                        for q in range(k, m):
                            take_from[q] = h if slots[q][h] is not None else None
                    k = m
                continue
            # the other four's vote over this region's disputed runs, as VoteStream._decide votes
            k = a
            while k < b:
                if len({None if w is None else w.key for w in slots[k][1:]}) == 1:
                    take_from[k] = 1 if slots[k][1] is not None else None
                    k += 1
                    continue
                m = k
                while m < b and len({None if w is None else w.key for w in slots[m][1:]}) > 1:
                    m += 1
                said = ["".join(slots[q][h].key for q in range(k, m) if slots[q][h] is not None) for h in range(1, n)]
                if len(set(said)) < len(said):
                    h = 1 + said.index(_winner(said, self.weights[1:]))
                    for q in range(k, m):
                        take_from[q] = h if slots[q][h] is not None else None
                else:
                    for q in range(k, m):
                        keys = [None if w is None else w.key for w in slots[q][1:]]
                        key = _winner(keys, self.weights[1:])
                        take_from[q] = None if key is None else 1 + keys.index(key)
                k = m
        for k in range(self.decided, len(slots)):
            h = take_from.get(k, 0)
            if h is not None and slots[k][h] is not None:
                out.append(Voted(slots[k][h], h, self.segment[k]))
        self.decided = len(slots)
        return out


class Confirmed(VoteStream):
    """The rule fixed in session 18 (`confirmed`): the vote over [plain, acc, unp, fast, fastb5];
    in each disputed run (the slots between two where all five say the same word) `plain`'s phrase
    is kept when at least one of the other four says the same phrase there; otherwise the run takes
    the other four's vote as the product votes (phrase step, then word by word, ties to `acc`).
    Whole transcripts only."""

    def __init__(self, guard: tuple[float, float, int] | None = None):
        super().__init__(len(ORDER))
        self.guard = guard
        """(HI, LO, MIN): a run where `plain`'s word count is above HI x or below LO x the median of
        the other four's, by MIN words at least, is replaced even where confirmed (`confirmed+guard`)."""
        self.kept = self.replaced = 0

    def broken(self, said_words: list[int]) -> bool:
        if self.guard is None:
            return False
        hi, lo, least = self.guard
        n0, med = said_words[0], statistics.median(said_words[1:])
        return (n0 - med >= least and n0 > hi * med) or (med - n0 >= least and n0 < lo * med)

    def _decide(self) -> list[Voted]:
        if not self.closed:
            return []
        slots, out, n, w = self.slots, [], len(self.weights), self.weights[1:]

        def key(s, h):
            return None if s[h] is None else s[h].key

        def take(h, k):
            if slots[k][h] is not None:
                out.append(Voted(slots[k][h], h, self.segment[k]))

        i = self.decided
        while i < len(slots):
            if len({key(slots[i], h) for h in range(n)}) == 1:
                take(0, i)
                i += 1
                continue
            j = i
            while j < len(slots) and len({key(slots[j], h) for h in range(n)}) > 1:
                j += 1
            said = ["".join(slots[k][h].key for k in range(i, j) if slots[k][h] is not None) for h in range(n)]
            counts = [sum(slots[k][h] is not None for k in range(i, j)) for h in range(n)]
            if said[0] in said[1:] and not self.broken(counts):
                self.kept += 1
                for k in range(i, j):
                    take(0, k)
            else:
                self.replaced += 1
                if len(set(said[1:])) < n - 1:
                    h = 1 + said[1:].index(_winner(said[1:], w))
                    for k in range(i, j):
                        take(h, k)
                else:
                    for k in range(i, j):
                        keys = [key(slots[k], h) for h in range(1, n)]
                        win = _winner(keys, w)
                        if win is not None:
                            take(1 + keys.index(win), k)
            i = j
        self.decided = i
        return out


def confirmed(texts: dict[str, list[tuple]], guard: tuple[float, float, int] | None = None) -> str | None:
    """The `confirmed` rule's text (with `guard`: `confirmed+guard`), or None when a transcript is
    missing."""
    if any(n not in texts for n in ORDER):
        return None
    stream = Confirmed(guard)
    out = []
    for h, n in enumerate(ORDER):
        out += stream.add(h, words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]))
    return " ".join(v.word.text for v in out)


def guarded(texts: dict[str, list[tuple]], rule: str) -> tuple[str, list[tuple]] | None:
    """The guarded backbone's text and its regions, or None when a transcript is missing."""
    if any(n not in texts for n in ORDER):
        return None
    params = rule.split(":")[1:]
    stream = Guarded(float(params[0]), float(params[1]), int(params[2]), *(int(p) for p in params[3:]))
    # g:HI:LO:MIN:REP:MERGE:U:STYLE:SUPPORT
    hyps = [words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]) for n in ORDER]
    out = []
    for h, words in enumerate(hyps):
        out += stream.add(h, words)
    return " ".join(v.word.text for v in out), stream.regions


def text_of(texts: dict[str, list[tuple]], rule: str) -> str | None:
    if rule == "product":
        return combine(texts, "acc+unp+fast+fastb5")
    if rule == "confirmed":
        return confirmed(texts)
    if rule == "confirmed+guard":
        return confirmed(texts, GUARD)
    if rule.startswith("g:"):
        got = guarded(texts, rule)
        return None if got is None else got[0]
    return combine(texts, rule)


def score(rec: dict, text: str | None) -> dict | None:
    """A rule's text of a recording and its word errors against `rec`'s reference (None when the
    rule had no text: a transcript it needs is not cached)."""
    if text is None:
        return None
    e, n = errors(rec["reference"], text, rec["language"])
    return {"errors": e, "words": n, "wer_%": round(100 * e / n, 2), "text": text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", default="product,plain,g:1.5:0.6:4")
    parser.add_argument("--specs", default=",".join(SPECS))
    parser.add_argument("--regions", action="store_true", help="print the regions judged broken")
    parser.add_argument("--markdown", default="", help="rules whose criterion (fewer errors than fw5, fw1 and fast) "
                                                     "to print as a markdown table, comma-separated")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    specs = args.specs.split(",")
    refs = references(specs)
    data = load()
    rules = args.rules.split(",")
    groups = {"11": SPECS, "held out (old 6)": vote17.HELD_OUT, "fresh": FRESH, "fresh 2": FRESH2,
              "held out (all)": HELD_OUT}
    totals = {g: {r: 0 for r in rules} for g in groups}
    worst = {r: 0 for r in rules}
    rows = []
    width = {r: max(8, len(r) + 2) for r in rules}
    print("file".ljust(18) + "".join(r.rjust(width[r]) for r in rules) + "fw5".rjust(6) + "fw1".rjust(6))
    for spec in specs:
        rec = refs[spec]
        group = next(g for g in groups if spec in groups[g])
        texts = data.get(rec["name"], {})
        row, line = {"file": rec["name"], "spec": spec, "group": group}, rec["name"].ljust(18)
        for rule in rules:
            row[rule] = score(rec, text_of(texts, rule))
            if row[rule] is None:
                del row[rule]
                line += "-".rjust(width[rule])
                continue
            e = row[rule]["errors"]
            totals[group][rule] += e
            if spec in HELD_OUT:
                totals["held out (all)"][rule] += e
            line += str(e).rjust(width[rule])
            if args.regions and rule.startswith("g:"):
                for a, b, plain, others, bad in guarded(texts, rule)[1]:
                    if bad:
                        print(f"   {rule} slots {a}-{b}: plain {len(plain.split())} others {others}: {plain[:150]}")
        if "product" in row:
            for rule in rules:
                if rule in row:
                    worst[rule] = max(worst[rule], row[rule]["errors"] - row["product"]["errors"])
        for fw in ("fw5", "fw1"):
            if fw in texts:
                row[fw] = errors(rec["reference"], combine(texts, fw), rec["language"])[0]
        rows.append(row)
        print(line + str(row.get("fw5", "-")).rjust(6) + str(row.get("fw1", "-")).rjust(6), flush=True)
    for g in groups:
        if any(s in groups[g] for s in specs):
            print(f"total {g}".ljust(18) + "".join(str(totals[g][r]).rjust(width[r]) for r in rules))
    print("worst vs product".ljust(18) + "".join(f"{worst[r]:+d}".rjust(width[r]) for r in rules))
    if args.markdown:
        crit = args.markdown.split(",")
        print("| file | " + " | ".join(rules) + " | fw 5 beams | fw greedy | " + " | ".join(f"{r} < fw5, fw1, fast" for r in crit) + " |")
        print("|" + " --- |" * (len(rules) + 3 + len(crit)))
        for row in rows:
            cells = [str(row[r]["errors"]) if r in row else "" for r in rules]
            cells += [str(row.get("fw5", "")), str(row.get("fw1", ""))]
            for r in crit:
                e, bars = row[r]["errors"], [row.get("fw5"), row.get("fw1"), row["fast"]["errors"] if "fast" in row else None]
                cells.append("yes" if all(b is not None and e < b for b in bars) else
                             "no" if any(b is not None and e >= b for b in bars) else "?")
            print(f"| {row['spec']} | " + " | ".join(cells) + " |")
        for g in groups:
            if any(s in groups[g] for s in specs):
                print(f"| total, {g} | " + " | ".join(str(totals[g][r]) for r in rules) + " |" + " |" * (2 + len(crit)))
    if args.out:
        print("wrote", write_json(args.out, {"rules": rules, "totals": totals, "worst_vs_product": worst, "rows": rows}))


if __name__ == "__main__":
    main()
