# Session 31 (issue #12). Needs the scripts of 9a247b6:benchmarks (vote14, vote16-18b, rescore20, ...) on PYTHONPATH.
"""Offline: the product's vote (confirmed+guard) over five cached transcripts, without and with the
skip-over-speech rule (MIN words, S seconds), per file; bars fw5, fw1, fast."""
import argparse, json, pickle
from pathlib import Path
import vote18
from vote14 import errors
from scan31 import ALL, load, NAMES
from vote16 import add_runs
from streamer.engine.request import SAMPLE_RATE
from streamer.longform.speech import find_speech, speech_seconds
from streamer.longform.vote import VoteStream, words_of

SPEECH = Path("/tmp/acc31_speech.pkl")

def speech_of(specs):
    from bench_live_accuracy import recording
    cache = pickle.loads(SPEECH.read_bytes()) if SPEECH.exists() else {}
    for spec in specs:
        if spec not in cache:
            cache[spec] = find_speech(recording(spec)["audio"])
            SPEECH.write_bytes(pickle.dumps(cache))
    return cache

def voted(texts, speech=None, skip=(4, 1.0)):
    f = None if speech is None else (lambda a, b: speech_seconds(speech, round(a * SAMPLE_RATE), round(b * SAMPLE_RATE)))
    s = VoteStream(5, confirm=vote18.GUARD, speech=f, skip=skip)
    out = []
    for h, n in enumerate(vote18.ORDER):
        out += s.add(h, words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]))
    return " ".join(v.word.text for v in out)

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--specs", default=",".join(ALL))
    p.add_argument("--rules", default="4:1.0")
    p.add_argument("--hyps", default="", help="extra hyps14 files overriding the cache")
    p.add_argument("--out", default="")
    a = p.parse_args()
    specs = a.specs.split(",")
    data = load()
    if a.hyps:
        for k, v in add_runs({}, a.hyps.split(","), NAMES).items():
            data.setdefault(k, {}).update(v)
    refs = vote18.references(specs); sp = speech_of(specs)
    rules = a.rules.split(",")
    rows, tot = [], {}
    for spec in specs:
        rec = refs[spec]; t = data[rec["name"]]
        e = lambda text: errors(rec["reference"], text, rec["language"])[0]
        row = {"spec": spec, "cg": e(voted(t))}
        for r in rules:
            mode, m, s = r.split(":")
            row[r] = e(voted(t, sp[spec], (int(m), float(s))))
        for k in ("plain", "fast", "fw5", "fw1"):
            if k in t:
                row[k] = e(" ".join(x[-1] for x in t[k]))
        for k in ["cg"] + rules:
            tot[k] = tot.get(k, 0) + row[k]
        row["meets"] = {k: all(row[k] < row[b] for b in ("fast", "fw5", "fw1") if b in row) for k in ["cg"] + rules}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("total", tot, "meets", {k: sum(r["meets"][k] for r in rows) for k in ["cg"] + rules})
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "totals": tot}, indent=1))
