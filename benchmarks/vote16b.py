"""A position-weighted vote over the five cached transcripts (session 16, part C; issue #12).

Session 16 (docs/notes/accuracy16.md, A1) found that tiny.en writes "prepend"/"caller" when the
passage sits in the middle of its 30-s window after other speech, and "pre-pen"/"color" when it
sits in the window's last seconds or opens it. Here each transcript's say in a disputed run of the
vote (`streamer.longform.vote`) depends on where that run sits in the transcript's own window:

- a transcript is *central* for a run when the run's words lie in one of its windows, at least
  `--lead` s after the window's start and at least `--tail` s before the end of its 30-s frame;
  otherwise it is at an *edge*;
- a central transcript's weight is 1, an edge transcript's 0.2 (`EDGE_WEIGHT` / `CENTRAL_WEIGHT`: with five
  transcripts, four edge voices weigh less than one central one, so the vote counts central voices
  first, then edge voices, then goes to the backbone).

Windows are not in the cached transcripts; they are derived: for the chains (`acc`, `unp`, `plain`)
from their segments (a window opens at the first segment not yet placed and holds the segments that
end within 30 s of that), for `fast`/`fastb5` from the VAD as `fast.plan_windows` cuts them (the
recording's speech, `find_speech`; no model decoding). `--check` compares the derived chain windows
with the windows recorded by context16.py (acc16_context_trace*.json).

    python vote16b.py --grid --out acc16b_grid11.json          # the 11 files, a few constants
    python vote16b.py --rules 'plain+acc+unp+fast+fastb5@2/8' --out acc16b_rule11.json   # texts, runs
    python vote16b.py --rules 'plain+acc+unp+fast+fastb5@2/8' --specs <held out> --out acc16b_held.json
    python vote16b.py --flips 'plain+acc+unp+fast+fastb5@2/8' --out acc16b_flips.json    # what each change costs

A rule is vote14.py's (`+`-joined names, the first the backbone) with `@LEAD/TAIL` appended;
without `@` it is vote14's unweighted rule.
"""

from __future__ import annotations

import argparse
import json

from common import write_json
from vote14 import RESULTS, SPECS, combine, errors
from vote16 import HELD_OUT, load_all

from bench_live_accuracy import recording

from streamer.engine.request import SAMPLE_RATE
from streamer.longform.vote import VoteStream, _winner, words_of

FRAME_S = 30.0
CENTRAL_WEIGHT, EDGE_WEIGHT = 5.0, 1.0
"""An edge voice weighs 1/5 of a central one, below 1 / (transcripts - 1): any number of edge
voices weigh less than one central voice (integers, so that sums compare exactly)."""
LAST_S = 0.5
FAST = ("fast", "fastb5")


def chain_windows(segments: list[tuple]) -> list[tuple[float, float]]:
    """(start, end) s of a chain's windows, derived from its segments (start, end, text): a window
    opens at the first segment not yet placed and holds those after it that end within its 30 s,
    except (1) a last one that ends less than `LAST_S` before the window's end (it ran into the
    edge, was dropped as incomplete and decoded again in the next window) and (2) from a segment
    whose times' hundredths change parity on (a window's times are its start plus multiples of
    0.02 s: a new window opened at a VAD onset). `--check`: against context16.py's recorded acc
    windows, 1 of 16 (messy-en-8-0) and 2 of 30 (messy-en-15-0) starts more than 1.5 s off."""
    out, i = [], 0
    while i < len(segments):
        start, j = segments[i][0], i
        parity = round(start * 100) % 2
        while (j < len(segments) and segments[j][1] <= start + FRAME_S + 0.01
               and round(segments[j][0] * 100) % 2 == parity):
            j += 1
        if j > i + 1 and segments[j - 1][1] > start + FRAME_S - LAST_S:
            j -= 1
        out.append((start, start + FRAME_S))
        i = max(j, i + 1)
    return out


def fast_windows(audio) -> list[tuple[float, float]]:
    from streamer.longform.fast import plan_windows
    from streamer.longform.speech import find_speech

    return [(a / SAMPLE_RATE, a / SAMPLE_RATE + FRAME_S) for a, _ in plan_windows(find_speech(audio), len(audio))]


def central(windows: list[tuple[float, float]], t0: float, t1: float, lead: float, tail: float) -> bool:
    """Whether [t0, t1] lies in one window, `lead` s after its start and `tail` s before its end."""
    return any(s + lead <= t0 and t1 <= e - tail for s, e in windows if s <= t0 < e)


class PositionVote(VoteStream):
    """`VoteStream` whose weights are set per disputed run: a transcript's base weight, times
    `CENTRAL_WEIGHT` when the run is central in its windows, `EDGE_WEIGHT` when it is not (vote.py's
    `run_weights` hook); each disputed run logged in `log`."""

    def __init__(self, windows: list[list[tuple[float, float]]], lead: float, tail: float, phrases: bool = True,
                 unweighted: frozenset[int] = frozenset()):
        super().__init__(len(windows), None, phrases)
        self.windows, self.lead, self.tail = windows, lead, tail
        self.unweighted = unweighted
        """Disputed runs (by their number, `log`'s index) decided without the position weights."""
        self.log: list[dict] = []

    def run_weights(self, i: int, j: int, said: list[str]) -> list[float]:
        slots = self.slots
        times = [w.time for k in range(i, j) for w in slots[k] if w is not None]
        if len(self.log) in self.unweighted or not times:
            weights = list(self.weights)
        else:
            t0, t1 = min(times), max(times)
            weights = [b * (CENTRAL_WEIGHT if central(win, t0, t1, self.lead, self.tail) else EDGE_WEIGHT)
                       for b, win in zip(self.weights, self.windows)]
        self.log.append({"t": round(min(times, default=0), 1), "said": said, "weights": weights})
        return weights


def weighted(texts: dict[str, list[tuple]], fast: list[tuple[float, float]], rule: str,
             unweighted: frozenset[int] = frozenset()) -> tuple[str | None, list]:
    """The text of `rule` (`names@LEAD/TAIL`) over `texts`, and the decided runs (those numbered in
    `unweighted` decided as without the weights)."""
    if "@" not in rule:
        return combine(texts, rule), []
    names, consts = rule.split("@")
    names = names.split("+")
    lead, tail = (float(x) for x in consts.split("/"))
    if any(n not in texts for n in names):
        return None, []
    windows = [fast if n in FAST else chain_windows(texts[n]) for n in names]
    stream = PositionVote(windows, lead, tail, unweighted=unweighted)
    hyps = [words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]) for n in names]
    words = [v for h, ws in enumerate(hyps) for v in stream.add(h, ws)]
    return " ".join(v.word.text for v in words), stream.log


def flipped(run: dict) -> bool:
    """Whether the weights changed the winner of a logged run (phrase step only)."""
    said, weights = run["said"], run["weights"]
    if len(set(said)) == len(said):
        return False
    return _winner(said, weights) != _winner(said, [1.0] * len(said))


def flips(data: dict, specs: list[str], rule: str) -> list[dict]:
    """Each run the weights decided otherwise, and the word errors it adds (decided as without the
    weights, that run alone)."""
    out = []
    for spec in specs:
        rec = recording(spec)
        texts, fast = data[rec["name"]], fast_windows(rec["audio"])
        text, log = weighted(texts, fast, rule)
        base = errors(rec["reference"], text, rec["language"])[0]
        for k, run in enumerate(log):
            if flipped(run):
                other = weighted(texts, fast, rule, frozenset({k}))[0]
                delta = base - errors(rec["reference"], other, rec["language"])[0]
                out.append({"spec": spec, "t": run["t"], "said": run["said"], "weights": run["weights"],
                            "winner": _winner(run["said"], run["weights"]), "errors_added": delta})
                print(f"{spec:14s} {run['t']:7.1f} {delta:+d}  {out[-1]['winner'][:30]!r:32s} "
                      + " ".join(f"{p[:16]}:{w:g}" for p, w in zip(run["said"], run["weights"])), flush=True)
    return out


def check() -> None:
    """Derived chain windows against those context16.py recorded."""
    for f in ("acc16_context_trace.json", "acc16_context_trace15.json"):
        for r in json.loads((RESULTS / f).read_text())["runs"]:
            true = [w["start_s"] for w in r["windows"]]
            derived = [s for s, _ in chain_windows([tuple(s) for s in r["segments"]])]
            off = [min(abs(d - t) for t in true) for d in derived]
            print(f"{r['spec']:14s} {r['system']:9s} windows {len(true):3d} derived {len(derived):3d} "
                  f"off>1.5s {sum(o > 1.5 for o in off):3d}  off>3s {sum(o > 3 for o in off):3d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", default="plain+acc+unp+fast+fastb5,plain+acc+unp+fast+fastb5@1/8")
    parser.add_argument("--grid", action="store_true", help="the rules of the 11-file choice (see the notes); errors only")
    parser.add_argument("--specs", default=",".join(SPECS))
    parser.add_argument("--plain", default="acc16_hyps_tiny.json,acc16_hyps_base.json,acc16_hyps_held_tiny.json")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--flips", default="", help="a weighted rule: the runs it decides otherwise and their cost")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.check:
        return check()
    if args.flips:
        out = flips(load_all(args.plain.split(",")), args.specs.split(","), args.flips)
        print("errors added, total:", sum(f["errors_added"] for f in out))
        if args.out:
            print("wrote", write_json(args.out, {"rule": args.flips, "flips": out}))
        return None
    rules = args.rules.split(",")
    if args.grid:
        rules = ["acc+unp+fast+fastb5", "plain+acc+unp+fast+fastb5"]
        rules += [f"{b}@{lead:g}/{tail:g}" for b in ("plain+acc+unp+fast+fastb5", "acc+plain+unp+fast+fastb5")
                  for lead in (0, 1, 2) for tail in (3, 5, 8)]
    data = load_all(args.plain.split(","))
    totals = {r: 0 for r in rules}
    rows = []
    for spec in args.specs.split(","):
        rec = recording(spec)
        texts = data.get(rec["name"], {})
        fast = fast_windows(rec["audio"])
        row = {"file": rec["name"], "spec": spec, "group": "held out" if spec in HELD_OUT else "11"}
        for rule in rules:
            text, log = weighted(texts, fast, rule)
            if text is None:
                continue
            e, n = errors(rec["reference"], text, rec["language"])
            row[rule] = {"errors": e, "words": n} if args.grid else {"errors": e, "words": n, "text": text, "runs": log}
            totals[rule] += e
        rows.append(row)
        print(f"{spec:14s}" + " ".join(f"{row[r]['errors']:4d}" if r in row else "   -" for r in rules), flush=True)
    for r in rules:
        print(f"{totals[r]:5d}  {r}")
    if args.out:
        print("wrote", write_json(args.out, {"rules": rules, "edge_weight": EDGE_WEIGHT / CENTRAL_WEIGHT, "totals": totals, "rows": rows}))


if __name__ == "__main__":
    main()
