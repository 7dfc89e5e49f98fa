"""Disputed phrases decided by the model's likelihood instead of the majority (session 15, issue #12),
offline on the hypotheses cached by hyps14.py.

    python benchmarks/rescore15.py --specs messy-en-8-0,messy-en-15-0 --out acc15_rescore.json

The four transcripts (`acc`, `unp`, `fast`, `fastb5`) are aligned as `accurate`'s vote aligns them
(`streamer.longform.vote.align`). Each run of slots where they disagree has candidates: the distinct
phrases the transcripts say there (a transcript without words there: the empty phrase). The vote
takes the majority's; here each candidate is put into one context, the 30 s of audio from the
start of the backbone segment at least `LEAD_S` before the run, with the majority's text around it
(its words in that window before the run, the candidate, its words after the run up to
`TAIL_MARGIN_S` before the window's end), and scored by forced decoding with the real model: the
sum of the log-probabilities of the window's text tokens. Two contexts: `prompt` (the majority's
text before the window, last `PROMPT_TOKENS` tokens, as `<|startofprev|>`) and `bare` (no prompt).
The highest score wins; ties keep the majority's.
"""

from __future__ import annotations

import argparse
import time

import torch

from common import write_json

from bench_live_accuracy import recording
from vote14 import HELD_OUT, SPECS, errors, load

from streamer.audio import SAMPLE_RATE
from streamer.audio.features import log_mel_spectrogram
from streamer.longform.vote import _winner, align, vote, words_of
from streamer.model.weights import load_model
from streamer.model.whisper import PassCache

NAMES = ("acc", "unp", "fast", "fastb5")
LEAD_S = 5.0
"""The window opens on a backbone segment start at least this long before the disputed run."""
TAIL_MARGIN_S = 2.0
"""Words later than this before the window's end may be cut by it: left out of its text."""
PROMPT_TOKENS = 200
WINDOW_S = 30.0


def runs(slots) -> list[tuple[int, int]]:
    """[i, j) of each maximal run of slots where the transcripts disagree."""
    out, i = [], 0
    while i < len(slots):
        j = i
        while j < len(slots) and len({None if w is None else w.key for w in slots[j]}) > 1:
            j += 1
        if j > i:
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def majority(slots, i: int, j: int) -> list[str]:
    """The words the vote takes for run [i, j) (`VoteStream._decide`, equal weights, phrases)."""
    n = len(slots[0])
    said = ["".join(slots[k][h].key for k in range(i, j) if slots[k][h] is not None) for h in range(n)]
    if len(set(said)) < len(said):
        h = said.index(_winner(said, [1.0] * n))
        return [slots[k][h].text for k in range(i, j) if slots[k][h] is not None]
    out = []
    for k in range(i, j):
        keys = [None if w is None else w.key for w in slots[k]]
        key = _winner(keys, [1.0] * n)
        if key is not None:
            out.append(slots[k][keys.index(key)].text)
    return out


def candidates(slots, i: int, j: int) -> list[list[str]]:
    """The distinct phrases (by their joined keys) the transcripts say in run [i, j), in order of
    the transcripts."""
    seen, out = set(), []
    for h in range(len(slots[0])):
        words = [slots[k][h] for k in range(i, j) if slots[k][h] is not None]
        key = "".join(w.key for w in words)
        if key not in seen:
            seen.add(key)
            out.append([w.text for w in words])
    return out


def slot_time(slot) -> float:
    return next(w.time for w in slot if w is not None)


@torch.inference_mode()
def scores(loaded, features, language: str | None, prompt: list[int], texts: list[list[int]],
           timestamps: bool = False) -> list[float]:
    """Sum of log P(text tokens) of each of `texts` after the prompt, over one window's encoded audio
    (with `timestamps`, the head without `<|notimestamps|>`: texts then hold timestamp tokens too)."""
    tok, model = loaded.tokenizer, loaded.model
    head = ([tok.sot_prev] + prompt if prompt else []) + tok.sot_sequence(language, "transcribe", timestamps=timestamps)
    rows = [head + t for t in texts]
    length = max(len(r) for r in rows)
    tokens = torch.full((len(rows), length), tok.eot, dtype=torch.long)
    for b, r in enumerate(rows):
        tokens[b, :len(r)] = torch.tensor(r)
    audio = features.expand(len(rows), -1, -1)
    positions = torch.arange(length).expand(len(rows), length)
    hidden = model.decoder(tokens, positions, 0, PassCache(model.decoder, audio, length), length)
    logp = model.decoder.logits(hidden).float().log_softmax(-1)
    out = []
    for b, t in enumerate(texts):
        pred = logp[b, len(head) - 1:len(head) - 1 + len(t)]
        out.append(float(pred.gather(1, torch.tensor(t)[:, None]).sum()) if t else 0.0)
    return out


def rescore(loaded, rec: dict, texts: dict[str, list[tuple]]) -> dict[str, str]:
    """{'vote': the majority's text, 'prompt': rescored with a prompt, 'bare': without; with
    `loaded` None, 'oracle': each run's candidate chosen against the reference instead (one pass
    in order, each run taking the candidate with the fewest word errors of the whole text, ties to
    the majority): the best any choice among the candidates can do, a bound, not a system}."""
    tok = loaded.tokenizer if loaded is not None else None
    language = rec["language"] if tok is not None and tok.multilingual else None
    hyps = [words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]) for n in NAMES]
    starts = sorted({a for a, _, t in texts["acc"] if t.strip()})
    slots = align(hyps)
    disputed = runs(slots)
    # The majority's text as pieces in slot order: (time, words) per agreed slot or run.
    pieces, decided, r = [], {}, 0
    k = 0
    while k < len(slots):
        if r < len(disputed) and disputed[r][0] == k:
            i, j = disputed[r]
            decided[r] = len(pieces)
            pieces.append((slot_time(slots[i]), majority(slots, i, j)))
            k, r = j, r + 1
        else:
            pieces.append((slot_time(slots[k]), [slots[k][0].text]))
            k += 1
    choice = {"prompt": {}, "bare": {}}
    out = {"vote": " ".join(w for _, ws_ in pieces for w in ws_), "runs": len(disputed)}
    assert out["vote"] == " ".join(v.word.text for v in vote(hyps)), "the majority here is not the vote's"
    if loaded is None:
        chosen = {}

        def text() -> str:
            return " ".join(w for p, (_, ws_) in enumerate(pieces) for w in chosen.get(p, ws_))
        for r, (i, j) in enumerate(disputed):
            p, best = decided[r], None
            for option in candidates(slots, i, j):
                chosen[p] = option
                e = errors(rec["reference"], text(), rec["language"])[0]
                if best is None or e < best[0] or (e == best[0] and option == pieces[p][1]):
                    best = (e, option)
            chosen[p] = best[1]
        out["oracle"] = text()
        return out
    encoded: dict[float, torch.Tensor] = {}
    for r, (i, j) in enumerate(disputed):
        options = candidates(slots, i, j)
        if len(options) < 2:
            continue
        p = decided[r]
        t = pieces[p][0]
        ws = max([s for s in starts if s <= t - LEAD_S] or [0.0])
        if ws not in encoded:
            clip = rec["audio"][int(ws * SAMPLE_RATE):int((ws + WINDOW_S) * SAMPLE_RATE)]
            encoded[ws] = loaded.model.encoder(log_mel_spectrogram(clip, loaded.dims.n_mels))
        before = " ".join(w for tm, ws_ in pieces[:p] if tm >= ws for w in ws_)
        after = " ".join(w for tm, ws_ in pieces[p + 1:] if tm < ws + WINDOW_S - TAIL_MARGIN_S for w in ws_)
        previous = " ".join(w for tm, ws_ in pieces[:p] if tm < ws for w in ws_)
        bodies = [tok.encode(" " + " ".join(x for x in (before, " ".join(o), after) if x)) for o in options]
        prompt = tok.encode(" " + previous)[-PROMPT_TOKENS:] if previous else []
        for name, context in (("prompt", prompt), ("bare", [])):
            s = scores(loaded, encoded[ws], language, context, bodies)
            best = max(range(len(options)), key=lambda c: (s[c], options[c] == pieces[p][1]))
            choice[name][p] = options[best]
    for name in ("prompt", "bare"):
        out[name] = " ".join(w for p, (_, ws_) in enumerate(pieces) for w in choice[name].get(p, ws_))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", default=",".join(SPECS + HELD_OUT))
    parser.add_argument("--extra", default="", help="more hypothesis files (hyps14.py's format), comma-separated")
    parser.add_argument("--held-out", default=",".join(HELD_OUT), help="specs counted apart")
    parser.add_argument("--oracle", action="store_true", help="the bound instead of the model (no model runs)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load("acc13_main", "acc14_hyps", tuple(f for f in args.extra.split(",") if f))
    held_out = args.held_out.split(",")
    models: dict[str, object] = {}
    rows, totals = [], {}
    for spec in args.specs.split(","):
        rec = recording(spec)
        name = "tiny.en" if rec["language"] == "en" else "base"
        loaded = None if args.oracle else models.get(name) or models.setdefault(name, load_model(name))
        t0 = time.perf_counter()
        texts = rescore(loaded, rec, data[rec["name"]])
        row = {"file": rec["name"], "spec": spec, "model": name, "runs": texts["runs"], "wall_s": round(time.perf_counter() - t0, 1)}
        line = f"{spec:16s} runs {texts['runs']:4d}"
        for system in ("vote", "oracle") if args.oracle else ("vote", "prompt", "bare"):
            e, n = errors(rec["reference"], texts[system], rec["language"])
            row[system] = {"errors": e, "words": n, "text": texts[system]}
            group = "held" if spec in held_out else "11"
            totals[(group, system)] = totals.get((group, system), 0) + e
            line += f"  {system} {e:3d}"
        rows.append(row)
        print(line + f"  ({row['wall_s']} s)", flush=True)
        if args.out:
            write_json(args.out, {"rows": rows, "totals": {f"{g}:{s}": v for (g, s), v in totals.items()}})
    print({f"{g}:{s}": v for (g, s), v in totals.items()})


if __name__ == "__main__":
    main()
