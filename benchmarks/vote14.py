"""Combination rules over cached hypotheses (session 14, issue #12), offline in seconds: word errors
and WER per file and rule, against the reference of each recording.

    python benchmarks/vote14.py --rules acc+unp+fast,acc+unp+fastb5 --out acc14_vote.json

Hypotheses: `acc` (accurate as main runs it: acc13_main_*.json), `unp`, `fast`, `fastb5` (hyps14.py:
acc14_hyps_*.json), `fw5` (faster-whisper 5 beams, acc12_fwtrace_*.json; reference only), `r10`, `r5`, `c128`, `dual` (session 13's prompt policies,
acc13_*.json).
A rule is `+`-joined names, each with an optional `*WEIGHT`; the first is the backbone (ties go to it);
the prefix `w:` votes word by word only (no phrase step).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import normalizer, write_json

from bench_live_accuracy import recording

from streamer.longform.vote import vote, words_of

RESULTS = Path(__file__).parent / "results"
SPECS = ["messy-en-8-0", "messy-en-8-1", "messy-en-8-2", "messy-en-15-0", "6min", "messy-es-5-0", "messy-fr-5-0",
         "messy-es-5-1", "messy-fr-5-1", "messy-en-8-3", "messy-en-8-4"]
ISSUE = SPECS[:7]
HELD_OUT = ["messy-en-8-5", "messy-en-8-6"]
"""Joins added in session 14 after the rule was chosen: evidence, not tuning."""


def load(acc: str, hyps: str, extra: tuple[str, ...] = ()) -> dict[str, dict[str, list[tuple]]]:
    """{file name: {system: [(start, end, text)] per segment}}."""
    out: dict[str, dict[str, list[tuple]]] = {}

    def add(path: Path, system: str | None = None) -> None:
        if not path.exists():
            return
        for r in json.loads(path.read_text())["runs"]:
            name = system or {"accurate": "acc", "unprompted": "unp", "fast": "fast", "fast-b5": "fastb5",
                                     "accurate-vote": "vote"}.get(r["system"])
            out.setdefault(r["file"], {})[name] = [(s[-3], s[-2], s[-1]) for s in r["segments"]]
    for tag in ("tiny", "base"):
        add(RESULTS / f"{acc}_{tag}.json")
        add(RESULTS / f"{hyps}_{tag}.json")
        add(RESULTS / f"{hyps}_held_{tag}.json")
    for variant, name in (("reset10", "r10"), ("reset5", "r5"), ("cap128", "c128"), ("dual", "dual")):
        for tag in ("tiny", "base"):
            add(RESULTS / f"acc13_{variant}_{tag}.json", name)
    for f in ("acc12_fwtrace_tiny.json", "acc12_fwtrace_es.json", "acc12_fwtrace_xbase.json", "acc12_fwtrace_xtiny.json"):
        add(RESULTS / f, "fw5")
    for f in extra:
        add(RESULTS / f)
    return out


def errors(reference: str, hypothesis: str, language: str) -> tuple[int, int]:
    """(word errors, reference words) after Whisper's normaliser."""
    import jiwer

    norm = normalizer(language)
    out = jiwer.process_words(norm(reference), norm(hypothesis))
    return out.substitutions + out.deletions + out.insertions, len(norm(reference).split())


def combine(texts: dict[str, list[tuple]], rule: str) -> str | None:
    parts = rule.removeprefix("w:").split("+")
    names = [n.split("*")[0] for n in parts]
    weights = [float(n.split("*")[1]) if "*" in n else 1.0 for n in parts]
    if any(n not in texts for n in names):
        return None
    if len(names) == 1:
        return " ".join(t for _, _, t in texts[names[0]])
    hyps = [words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]) for n in names]
    return " ".join(v.word.text for v in vote(hyps, weights, phrases=not rule.startswith("w:")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--acc", default="acc13_main")
    parser.add_argument("--hyps", default="acc14_hyps")
    parser.add_argument("--rules", default="acc,unp,fast,fastb5,fw5,acc+unp+fast,acc+unp+fastb5,acc+fast+fastb5,acc+unp+fast+fastb5")
    parser.add_argument("--specs", default=",".join(SPECS + HELD_OUT))
    parser.add_argument("--extra", default="", help="more result files (hyps14.py's format), comma-separated")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    data = load(args.acc, args.hyps, tuple(f for f in args.extra.split(",") if f))
    rules = args.rules.split(",")
    rows, totals, totals7, held = [], {r: 0 for r in rules}, {r: 0 for r in rules}, {r: 0 for r in rules}
    complete = {r: True for r in rules}
    print("file".ljust(18) + "".join(r.rjust(22) for r in rules))
    for spec in args.specs.split(","):
        rec = recording(spec)
        texts = data.get(rec["name"], {})
        line, row = rec["name"].ljust(18), {"file": rec["name"], "spec": spec}
        for rule in rules:
            t0 = time.perf_counter()
            text = combine(texts, rule)
            if text is None:
                line += "-".rjust(22)
                complete[rule] = False
                continue
            e, n = errors(rec["reference"], text, rec["language"])
            row[rule] = {"errors": e, "words": n, "wer_%": round(100 * e / n, 2), "vote_s": round(time.perf_counter() - t0, 2),
                         "text": text}
            if spec in HELD_OUT:
                held[rule] += e
            else:
                totals[rule] += e
            if spec in ISSUE:
                totals7[rule] += e
            line += f"{100 * e / n:6.2f} ({e:3d})".rjust(22)
        rows.append(row)
        print(line, flush=True)
    print("total (11)".ljust(18) + "".join((str(totals[r]) + ("" if complete[r] else "*")).rjust(22) for r in rules))
    print("issue 7".ljust(18) + "".join(str(totals7[r]).rjust(22) for r in rules))
    print("held out".ljust(18) + "".join(str(held[r]).rjust(22) for r in rules))
    if args.out:
        print("wrote", write_json(args.out, {"rules": rules, "totals_11": totals, "totals_issue7": totals7, "totals_held_out": held,
                                                   "rows": rows}))


if __name__ == "__main__":
    main()
