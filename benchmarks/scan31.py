# Session 31 (issue #12). Needs the scripts of 9a247b6:benchmarks (vote14, vote16-18b, rescore20, ...) on PYTHONPATH.
"""Scan cached five transcripts: product vote (VoteStream confirm=GUARD) errors, and the backbone's
longest stretches of words that the vote drops."""
import sys
import rescore20, vote18, vote18b
from vote16 import add_runs
from vote14 import SPECS, errors
from streamer.longform.vote import VoteStream, words_of

ALL = SPECS + vote18.HELD_OUT + vote18b.FRESH3 + rescore20.FRESH4
NAMES = {"accurate": "acc", "unprompted": "unp", "fast": "fast", "fast-b5": "fastb5", "plain": "plain"}

def load():
    data = rescore20.load()
    now = add_runs({}, ["acc20_hyps_now_tiny.json", "acc20_hyps_now_base.json"], NAMES)
    for k, v in now.items():
        data[k].update(v)
    return data

def stream_of(texts, cls=VoteStream, **kw):
    s = cls(5, confirm=vote18.GUARD, **kw)
    out = []
    for h, n in enumerate(vote18.ORDER):
        out += s.add(h, words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]))
    return s, out

if __name__ == "__main__":
    specs = sys.argv[1].split(",") if len(sys.argv) > 1 else ALL
    data = load(); refs = vote18.references(specs)
    for spec in specs:
        rec = refs[spec]; t = data[rec["name"]]
        s, out = stream_of(t)
        text = " ".join(v.word.text for v in out)
        e = errors(rec["reference"], text, rec["language"])[0]
        taken = {id(v.word) for v in out}
        # longest run of backbone words dropped
        best, run = (0, None), []
        for slot in s.slots:
            w = slot[0]
            if w is None: continue
            if id(w) in taken:
                if len(run) > best[0]: best = (len(run), run)
                run = []
            else: run.append(w)
        if len(run) > best[0]: best = (len(run), run)
        n, r = best
        bars = {k: errors(rec["reference"], " ".join(x[-1] for x in t[k]), rec["language"])[0] for k in ("plain", "fast", "fw5", "fw1") if k in t}
        print(f"{spec:14s} cg {e:3d} {bars}  longest dropped backbone run {n}" + (f" at {r[0].time:.1f}-{r[-1].time:.1f}s: {' '.join(w.text for w in r)[:150]}" if r else ""), flush=True)
