"""The progressive vote (session 15) on the hypotheses cached by hyps14.py, offline in seconds.

    python benchmarks/vote15.py --band 10 --step 5 --against f1cb654 --out acc15_vote_lag.json

Per recording: whether the vote's words (text, source, segment) equal those of session 14's vote
(`vote.py` at the commit `--against`, 30-s band), both on the whole transcripts and fed piece by
piece to `VoteStream` at random paces; and the lag of `SegmentVote`: the four transcripts advance
together by `--step` seconds of audio (each hands on its segments that start before the clock),
and a backbone segment's lag is the clock when it is handed on minus its end.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from common import write_json

from vote14 import load

import streamer.longform.vote as V
from streamer.longform.transcript import TranscriptSegment

NAMES = ("acc", "unp", "fast", "fastb5")


def old_vote(commit: str):
    """`streamer/longform/vote.py` as it was at `commit`, as a module."""
    source = subprocess.run(["git", "show", f"{commit}:streamer/longform/vote.py"], capture_output=True, text=True,
                            check=True, cwd=Path(__file__).parent).stdout
    path = Path(tempfile.mkdtemp()) / "vote_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("vote_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vote_before"] = module
    spec.loader.exec_module(module)
    return module


def pieces(segs, seed: int):
    """The words of each transcript fed at random paces: (h, words, until), then each complete."""
    rng, idx, clock = random.Random(seed), [0] * len(segs), 0.0
    end = max(b for s in segs for _, b, _ in s) + 1
    while clock < end:
        clock += rng.uniform(1, 10)
        for h in rng.sample(range(len(segs)), len(segs)):
            until, words = clock - rng.uniform(0, 20), []
            while idx[h] < len(segs[h]) and segs[h][idx[h]][0] < until:
                a, b, x = segs[h][idx[h]]
                words += V.words_of([x], [(a, b)], first=idx[h])
                idx[h] += 1
            yield h, words, until
    for h in range(len(segs)):
        words = []
        for k in range(idx[h], len(segs[h])):
            a, b, x = segs[h][k]
            words += V.words_of([x], [(a, b)], first=k)
        yield h, words, float("inf")


def lag(segs, step: float) -> dict:
    voter = V.SegmentVote(len(segs), lambda text: [])
    idx, clock, lags, first = [0] * len(segs), 0.0, [], None
    end = max(b for s in segs for _, b, _ in s) + step
    while True:
        clock += step
        done = clock >= end
        for h in range(len(segs)):
            piece = []
            while idx[h] < len(segs[h]) and (done or segs[h][idx[h]][0] < clock):
                a, b, x = segs[h][idx[h]]
                piece.append(TranscriptSegment(0, 0, a, b, x, [], 0, 0, 0, 0) if h == 0 else (a, b, x))
                idx[h] += 1
            for s in voter.add(h, piece, float("inf") if done else clock):
                first = clock if first is None else first
                if not done:
                    lags.append(clock - s.end)
        if done:
            break
    lags.sort()
    return {"audio_s": round(end - step), "first_s": first, "segments": voter.given[0], "before_end": len(lags),
            "lag_p50_s": round(lags[len(lags) // 2], 1) if lags else None, "lag_max_s": round(lags[-1], 1) if lags else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--band", type=float, default=V.BAND_S)
    parser.add_argument("--step", type=float, default=5.0)
    parser.add_argument("--against", default="f1cb654")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    before = old_vote(args.against)
    V.BAND_S = args.band
    data = load("acc13_main", "acc14_hyps")
    rows = []
    for name, texts in sorted(data.items()):
        if not all(k in texts for k in NAMES):
            continue
        segs = [texts[k] for k in NAMES]
        key = lambda voted: [(v.word.text, v.source, v.segment) for v in voted]  # noqa: E731
        then = key(before.vote([before.words_of([x for _, _, x in s], [(a, b) for a, b, _ in s]) for s in segs]))
        now = key(V.vote([V.words_of([x for _, _, x in s], [(a, b) for a, b, _ in s]) for s in segs]))
        stream = V.VoteStream(len(segs))
        fed = key([v for h, words, until in pieces(segs, 0) for v in stream.add(h, words, until)])
        row = {"file": name, "words": len(now), "same_as_before": now == then, "fed_same": fed == now, **lag(segs, args.step)}
        rows.append(row)
        print(row, flush=True)
    if args.out:
        print("wrote", write_json(args.out, {"band_s": args.band, "step_s": args.step, "against": args.against, "rows": rows}))


if __name__ == "__main__":
    main()
