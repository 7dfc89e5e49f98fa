"""Where `confirmed+guard` still loses to faster-whisper (session 18b, issue #12): per disputed run,
which of the five transcripts was right and why the rule did not take it.

    python benchmarks/analyse18b.py --specs messy-en-15-0,messy-en-8-3 --out acc18b_classes.json

For each file the rule's text is built as vote18.py builds it (`Confirmed(GUARD)`), and every
disputed run (slots between two where all five agree) is re-decided counterfactually: its words
taken from each of the five transcripts in turn, the rest as the rule has it. A run where another
choice gives fewer word errors (Whisper's normaliser, per prompt of the join, `messy.errors_by_prompt`)
is a *loss*; it is classed by the rule's decision there:

- `a-unconfirmed`: `plain` was right, no other transcript said its phrase, the four voted wrong;
- `a-guard`: `plain` was right and confirmed, but its word count tripped the guard;
- `b-conditioned`: `plain` was wrong and kept, confirmed by `acc` only (both conditioned chains);
- `b-other`: `plain` was wrong and kept, confirmed by an unconditioned transcript too;
- `e-vote`: `plain` wrong and replaced, one of the four right, but the four's vote chose wrong;
- `d-spelling`: `plain` kept, and a transcript that writes the run right says the same phrase to the
  vote's key (spacing, hyphens, case, outer punctuation) but writes it as the scorer wants ("prepending"
  against "pre-pending", "Mailbox" against "Mail box"): the backbone's writing is kept by design.

Against the binding competitor (the one of fw 5 beams, fw greedy, `fast` with the fewest errors on the
file), each prompt where the rule has more errors than it is a *passage*; its excess is put on the
loss runs in it, and what is left on `c-none` (no transcript has the prompt with fewer errors than
the rule) or `d-align` (some transcript has, but no single run's choice recovers it: the right words
are spread over runs or lost in the alignment). The 6-min file has no prompts: its reference is cut
at sentence ends instead.
"""

from __future__ import annotations

import argparse
import re

from common import normalizer, write_json

import vote18
import vote18b
from messy import errors_by_prompt
from vote14 import combine
from vote18 import GUARD, ORDER, Confirmed

from streamer.longform.vote import words_of

FAILING = ["messy-en-15-0", "messy-en-8-3", "messy-en-8-8", "messy-en-8-12",  # above fw
           "messy-en-8-0", "6min", "messy-en-8-6", "messy-en-8-10", "messy-es-5-3", "messy-en-8-14"]  # ties


def prompts(rec: dict) -> list[tuple[float, float, str]]:
    if rec["spans"] is not None:
        return rec["spans"]
    return [(0.0, 0.0, s) for s in re.split(r"(?<=[.?!])\s+", rec["reference"]) if s.strip()]


def per_prompt(spans, text: str, language: str) -> list[int]:
    """Word errors per prompt."""
    out = [0] * len(spans)
    for i, errs in errors_by_prompt(spans, text, language).items():
        for e in errs:
            if e[0] == "del" and not any(c.isalnum() for c in e[1]):
                continue  # a prompt whose normalised text is punctuation only (per-prompt normalising)
            out[i] += len(e[1].split()) if e[0] == "ins" else max(len(e[1].split()), len(e[2].split()))
    return out


def rule_runs(texts: dict[str, list[tuple]], guard=GUARD):
    """(stream, output words [(VoteWord, source)], runs [(i, j, said, counts, decision)])."""
    stream = Confirmed(guard)
    out = []
    for h, n in enumerate(ORDER):
        out += stream.add(h, words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]))
    slots, runs, i = stream.slots, [], 0

    def key(s, h):
        return None if s[h] is None else s[h].key

    while i < len(slots):
        if len({key(slots[i], h) for h in range(5)}) == 1:
            i += 1
            continue
        j = i
        while j < len(slots) and len({key(slots[j], h) for h in range(5)}) > 1:
            j += 1
        said = ["".join(slots[k][h].key for k in range(i, j) if slots[k][h] is not None) for h in range(5)]
        counts = [sum(slots[k][h] is not None for k in range(i, j)) for h in range(5)]
        confirmed = said[0] in said[1:]
        decision = ("kept" if confirmed and not stream.broken(counts) else "guard" if confirmed else "unconfirmed")
        runs.append((i, j, said, counts, decision))
        i = j
    return stream, out, runs


def analyse(spec: str, rec: dict, texts: dict[str, list[tuple]]) -> dict:
    lang = rec["language"]
    spans = prompts(rec)
    stream, out, runs = rule_runs(texts)
    slot_of = {id(s[h]): k for k, s in enumerate(stream.slots) for h in range(5) if s[h] is not None}
    chosen = [(slot_of[id(v.word)], v.word.text) for v in out]
    base = per_prompt(spans, " ".join(t for _, t in chosen), lang)
    comp = {c: combine(texts, c) for c in ("fw5", "fw1", "fast") if c in texts}
    comp_err = {c: sum(per_prompt(spans, t, lang)) for c, t in comp.items()}
    bar = min(comp_err, key=lambda c: (comp_err[c], c != "fw5"))
    bar_pp = per_prompt(spans, comp[bar], lang)
    single = {n: per_prompt(spans, " ".join(t for _, _, t in texts[n]), lang) for n in ORDER}
    losses = []
    for i, j, said, counts, decision in runs:
        before = [(k, t) for k, t in chosen if k < i]
        after = [(k, t) for k, t in chosen if k >= j]
        alts = {}
        for h in range(5):
            mine = [t for k, t in chosen if i <= k < j]
            theirs = [stream.slots[k][h].text for k in range(i, j) if stream.slots[k][h] is not None]
            if [w.lower() for w in theirs] == [w.lower() for w in mine]:
                alts[h] = base
                continue
            text = " ".join([t for _, t in before] + theirs + [t for _, t in after])
            alts[h] = per_prompt(spans, text, lang)
        tot = {h: sum(v) for h, v in alts.items()}
        best = min(tot.values())
        if best >= sum(base):
            continue
        right = [ORDER[h] for h in range(5) if tot[h] == best]
        if decision == "kept":
            confirmers = [ORDER[h] for h in range(1, 5) if said[h] == said[0]]
            if any(said[ORDER.index(n)] == said[0] for n in right):
                cls = "d-spelling"  # the right words are plain's phrase to the vote's key, written otherwise
            else:
                cls = "b-conditioned" if confirmers == ["acc"] else "b-other"
        elif "plain" in right:
            cls = "a-guard" if decision == "guard" else "a-unconfirmed"
            confirmers = [ORDER[h] for h in range(1, 5) if said[h] == said[0]]
        else:
            cls, confirmers = "e-vote", []
        h_best = ORDER.index(right[0])
        touched = [p for p in range(len(spans)) if alts[h_best][p] != base[p]]
        losses.append({"slots": [i, j], "class": cls, "gain": sum(base) - best, "right": right,
                       "confirmers": confirmers, "counts": counts, "prompts": touched,
                       "said": {ORDER[h]: " ".join(stream.slots[k][h].text for k in range(i, j)
                                                   if stream.slots[k][h] is not None) for h in range(5)},
                       "gain_by_prompt": {p: base[p] - alts[h_best][p] for p in touched}})
    passages = []
    for p in range(len(spans)):
        excess = base[p] - bar_pp[p]
        if excess <= 0:
            continue
        left, parts = excess, []
        for loss in losses:
            g = loss["gain_by_prompt"].get(p, 0)
            if g > 0 and left > 0:
                parts.append((loss["class"], min(g, left)))
                left -= min(g, left)
        if left > 0:
            best_single = min(single[n][p] for n in ORDER)
            parts.append(("d-align" if best_single < base[p] else "c-none", left))
        passages.append({"prompt": p, "reference": spans[p][2], "rule_errors": base[p], f"{bar}_errors": bar_pp[p],
                         "single_errors": {n: single[n][p] for n in ORDER}, "excess": excess, "classes": parts,
                         "rule_errs": errors_by_prompt(spans, " ".join(t for _, t in chosen), lang).get(p, [])})
    return {"spec": spec, "name": rec["name"], "rule": sum(base), "bar": bar, "bar_errors": comp_err[bar],
            "competitors": comp_err, "losses": losses, "passages": passages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", default=",".join(FAILING))
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    specs = args.specs.split(",")
    refs, data = vote18.references(specs), vote18b.load()
    rows, totals = [], {}
    for spec in specs:
        row = analyse(spec, refs[spec], data[refs[spec]["name"]])
        rows.append(row)
        print(f"== {spec}: rule {row['rule']} (per-prompt count), {row['bar']} {row['bar_errors']}, "
              f"all {row['competitors']}")
        for loss in row["losses"]:
            print(f"   loss {loss['class']:14s} gain {loss['gain']} right {loss['right']} prompts {loss['prompts']} "
                  f"counts {loss['counts']} | " + " | ".join(f"{k}: {v}" for k, v in loss["said"].items()))
        for ps in row["passages"]:
            print(f"   passage #{ps['prompt']} excess {ps['excess']} {ps['classes']} singles {ps['single_errors']} "
                  f"rule errs {ps['rule_errs']}")
            for c, n in ps["classes"]:
                totals.setdefault(c, [0, 0])
                totals[c][0] += 1
                totals[c][1] += n
    print("classes (passages, excess errors):", totals)
    if args.out:
        print("wrote", write_json(args.out, {"guard": GUARD, "classes": totals, "rows": rows}))


if __name__ == "__main__":
    main()
