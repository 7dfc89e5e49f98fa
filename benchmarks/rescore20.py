"""`confirmed+guard` whose overrule of an unconfirmed backbone phrase is checked by the model's
likelihood (session 20, issue #12), offline on the cached transcripts.

    python benchmarks/rescore20.py --specs dev --rules cg,lp:0,lb:0,both:0 --out acc20_dev.json

`accurate` votes `confirmed+guard` over [plain, acc, unp, fast, fastb5] (`VoteStream(confirm=GUARD)`):
a disputed run (slots between two where all five agree) keeps `plain`'s phrase P when another
transcript says it too; otherwise (P in the guard's bounds) the other four vote a phrase V. That
overrule is where `plain` alone right ("caller" against four "color") is lost (accuracy18b.md, A,
class (a)). Here only those runs are rescored: P and V, each put into the same 30-s window of audio
(opening on a backbone segment start at least `LEAD_S` before the run) between the rule's text
before the run (decided so far) and the five-way majority of each slot after it (up to
`TAIL_MARGIN_S` before the window's end), scored by forced decoding with the real model (tiny.en
for English, base for es/fr): the sum of the log-probabilities of the window's text tokens, as
rescore15.py scores. P is kept where its score beats V's by more than MARGIN nats.

Rules:
- `cg`: `confirmed+guard` (checked equal to `vote(..., confirm=GUARD)`'s text);
- `lp:M`: the rule's text before the window as `<|startofprev|>` prompt (last 200 tokens);
- `lb:M`: no prompt;
- `both:M`: P kept only where it wins by M in both contexts;
- `ob:M` / `op:M`: the window is the backbone's own (the one `plain` decoded P in: hyps20.py's window
  starts), its text the rule's words of that window's backbone segments before the run and the
  five-way majority after it; `ot:M` / `otp:M`: the same window and text with the backbone's segment
  timestamps around each segment's words, scored with timestamps as the chain decodes (without /
  with the prompt); `pt:M` / `ptp:M`: as `ot`/`otp` with the backbone's own words around the run
  and its own text before the window as prompt (its window as it decoded it, with the run edited);
  `ob` without a prompt (does the backbone's reading hold without the
  prompt that may have carried a style into it?), `op` with the rule's text before the window;
- `jw:M` / `jwp:M` (`decide_joint`): the overruled runs of one backbone window decided together, all
  back to the backbone's phrases or none, scored as `ot` (without / with the rule's prompt);
- `pair…`: `lb`, `lp`, `both` with `p` after the name (`lpp:M`, ...): also the mirror runs, P confirmed by
  `acc` alone while `unp`, `fast`, `fastb5` say one other phrase U: P replaced by U where U beats it
  by more than M (the "Three to" / "3D" shape, class (b)).
Every rescored run is recorded (time, P, V, scores, and the errors of the file's text with each).
`--specs dev` (the eleven development files), `held` (vote18's fourteen), `fresh3`, `fresh4`
(joins decoded in session 20, acc20_*_fresh4_*), or comma-separated specs.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from common import write_json

import rescore15
import vote18
import vote18b
from vote14 import RESULTS, SPECS, errors
from vote16 import add_runs

from bench_live_accuracy import recording

from streamer.audio import SAMPLE_RATE
from streamer.audio.features import log_mel_spectrogram
from streamer.longform.vote import VoteStream, _winner, vote, words_of
from streamer.model.weights import load_model

FRESH4 = ["messy-en-8-17", "messy-en-8-18", "messy-es-5-5", "messy-fr-5-5"]
"""Joins built in session 20 (seeds never used before), decoded before any rule was evaluated."""
FRESH4_FILES = {kind: [f"acc20_{kind}_fresh4_{tag}.json" for tag in ("tiny", "base")] for kind in ("hyps", "fw5", "fw1")}
LEAD_S = rescore15.LEAD_S
TAIL_MARGIN_S = rescore15.TAIL_MARGIN_S
PROMPT_TOKENS = rescore15.PROMPT_TOKENS
WINDOW_S = rescore15.WINDOW_S
SEEKS: dict[str, list] = {}
"""{file: hyps20.py's `plain` segments (window start s, start, end, text)}."""


def load() -> dict[str, dict[str, list[tuple]]]:
    data = vote18b.load()
    names = {"accurate": "acc", "unprompted": "unp", "fast": "fast", "fast-b5": "fastb5", "plain": "plain"}
    add_runs(data, FRESH4_FILES["hyps"], names)
    for fw in ("fw5", "fw1"):
        for f in FRESH4_FILES[fw]:
            path = RESULTS / f
            if path.exists():
                for r in json.loads(path.read_text())["runs"]:
                    data.setdefault(r["file"], {})[fw] = [(s[1], s[2], s[-1]) for s in r["segments"]]
    return data


def network(texts: dict[str, list[tuple]]) -> VoteStream:
    """The five transcripts aligned by the product's streamed vote (`confirm=GUARD`), whole."""
    stream = VoteStream(len(vote18.ORDER), confirm=vote18.GUARD)
    for h, n in enumerate(vote18.ORDER):
        stream.add(h, words_of([t for _, _, t in texts[n]], [(a, b) for a, b, _ in texts[n]]))
    return stream


def others_vote(slots, i: int, j: int, said: list[str]) -> list:
    """The words the other four's vote gives run [i, j) (`VoteStream._decide`'s phrase step, then
    word by word, ties to `acc`)."""
    voters = list(range(1, len(said)))
    phrase = [said[h] for h in voters]
    if len(set(phrase)) < len(phrase):
        h = voters[phrase.index(_winner(phrase, [1.0] * len(voters)))]
        return [slots[k][h] for k in range(i, j) if slots[k][h] is not None]
    out = []
    for k in range(i, j):
        keys = [None if slots[k][h] is None else slots[k][h].key for h in voters]
        key = _winner(keys, [1.0] * len(voters))
        if key is not None:
            out.append(slots[k][voters[keys.index(key)]])
    return out


def majority_word(slot):
    """The five-way winner of one slot (ties to the backbone), or None."""
    keys = [None if w is None else w.key for w in slot]
    key = _winner(keys, [1.0] * len(keys))
    return None if key is None else slot[keys.index(key)]


def slot_time(slot) -> float:
    return next(w.time for w in slot if w is not None)


def record(rule: str, case: str, t: float, ws: float, options: list[str], gain: dict, win: bool, said: list) -> dict:
    """One rescored run as the results file keeps it."""
    return {"rule": rule, "case": case, "time": round(t, 1), "window": ws, "rule_phrase": options[0],
            "alternative": options[1], "gain_prompt": round(gain["prompt"], 2), "gain_bare": round(gain["bare"], 2),
            "taken": win, "said": said}


def run_end(slots: list, i: int) -> int:
    """The end of the disputed run (slots where the five transcripts differ) from slot i; i where they agree."""
    j = i
    while j < len(slots) and len({None if w is None else w.key for w in slots[j]}) > 1:
        j += 1
    return j


def said_in(slots: list, i: int, j: int, n: int) -> list[str]:
    """What each of the n transcripts says in slots [i, j), as one key string each."""
    return ["".join(slots[k][h].key for k in range(i, j) if slots[k][h] is not None) for h in range(n)]


def timed_tokens(tok, words: list[tuple[int, str]], spans: dict, ws: float) -> list[int]:
    """(segment, word) pairs as the chain decodes them in a window starting at `ws`: each segment's
    words between its start and end timestamp tokens (`spans[segment]` = (start, end) seconds)."""
    out, k = [], 0
    while k < len(words):
        g, text = words[k][0], []
        while k < len(words) and words[k][0] == g:
            text.append(words[k][1])
            k += 1
        a, b = spans[g]
        out += [tok.timestamp_token(a - ws)] + tok.encode(" " + " ".join(text)) + [tok.timestamp_token(b - ws)]
    return out


def scores_timed(loaded, features, language: str | None, prompt: list[int], texts: list[list[int]]) -> list[float]:
    """rescore15.scores with timestamps: every token of each text (words and timestamps) scored."""
    return rescore15.scores(loaded, features, language, prompt, texts, timestamps=True)


class Scorer:
    """Forced-decoding scores of candidate phrases in one window, the window's audio encoded once."""

    def __init__(self, loaded, audio, language: str):
        self.loaded, self.audio = loaded, audio
        self.language = language if loaded.tokenizer.multilingual else None
        self.encoded: dict[float, torch.Tensor] = {}
        self.calls = 0

    def features(self, ws: float) -> torch.Tensor:
        if ws not in self.encoded:
            clip = self.audio[int(ws * SAMPLE_RATE):int((ws + WINDOW_S) * SAMPLE_RATE)]
            self.encoded[ws] = self.loaded.model.encoder(log_mel_spectrogram(clip, self.loaded.dims.n_mels))
        return self.encoded[ws]

    def timed(self, ws: float, previous: str, bodies: list[list[int]]) -> dict[str, list[float]]:
        """As `__call__`, the bodies given as tokens with timestamps (decoded as the chain decodes)."""
        self.calls += 1
        tok = self.loaded.tokenizer
        prompt = tok.encode(" " + previous)[-PROMPT_TOKENS:] if previous else []
        feats = self.features(ws)
        return {"prompt": scores_timed(self.loaded, feats, self.language, prompt, bodies),
                "bare": scores_timed(self.loaded, feats, self.language, [], bodies)}

    def __call__(self, ws: float, previous: str, before: str, options: list[str], after: str) -> dict[str, list[float]]:
        tok = self.loaded.tokenizer
        self.calls += 1
        bodies = [tok.encode(" " + " ".join(x for x in (before, o, after) if x)) for o in options]
        prompt = tok.encode(" " + previous)[-PROMPT_TOKENS:] if previous else []
        feats = self.features(ws)
        return {"prompt": rescore15.scores(self.loaded, feats, self.language, prompt, bodies),
                "bare": rescore15.scores(self.loaded, feats, self.language, [], bodies)}


def decide(texts: dict[str, list[tuple]], scorer: Scorer | None, rules: list[str], starts: list[float],
           seeks: list[float] | None = None, spans: list[tuple[float, float]] | None = None) -> dict:
    """{rule: text} for `cg` and the rescoring rules, and the rescored runs. One pass over the runs
    per rule (each rule's earlier decisions make its later prompts)."""
    stream = network(texts)
    slots = stream.slots
    n = len(vote18.ORDER)
    out, records = {}, []
    for rule in rules:
        name, _, m = rule.partition(":")
        margin = float(m) if m else 0.0
        pair = name in ("lpp", "lbp", "bothp", "obp", "opp", "otpp", "ptpp")
        kind = name[:-1] if pair else name
        segs: list[int] = []  # the backbone segment of each of `words`' slots
        flips = []  # (record, position in `words`, the rule's words there, the other choice's)
        words: list = []  # the rule's words so far (VoteWord)
        i = 0
        while i < len(slots):
            j = run_end(slots, i)
            if j == i:
                words.append(slots[i][0])
                segs.append(stream.segment[i])
                i += 1
                continue
            said = said_in(slots, i, j, n)
            own = [slots[k][0] for k in range(i, j) if slots[k][0] is not None]
            keep = stream.keeps_backbone(i, j, said)
            deviates = stream._deviates(i, j)
            voted = own if keep else others_vote(slots, i, j, said)
            chosen = voted
            case = None
            if kind != "cg" and scorer is not None:
                if not keep and not deviates:
                    case, alt = "a", own  # unconfirmed P against the others' V: P needs the model
                elif pair and keep and said[1] == said[0] and said[0] not in said[2:] and said[2] == said[3] == said[4]:
                    case, alt = "b", [slots[k][2] for k in range(i, j) if slots[k][2] is not None]  # U against P
            if case is not None and kind in ("ot", "otp", "pt", "ptp"):  # the backbone's own window, with its timestamps
                t = slot_time(slots[i])
                mine = next((w.segment for w in own), stream.segment[i])
                ws = seeks[mine]
                tok = scorer.loaded.tokenizer
                if kind in ("pt", "ptp"):  # the backbone's own words around the run: its window as it decoded it
                    head = [(stream.segment[k], slots[k][0].text) for k in range(i) if slots[k][0] is not None and seeks[stream.segment[k]] == ws]
                    tail = [(stream.segment[k], slots[k][0]) for k in range(j, len(slots)) if seeks[stream.segment[k]] == ws]
                else:
                    head = [(g, w.text) for w, g in zip(words, segs) if seeks[g] == ws]
                    tail = [(stream.segment[k], majority_word(slots[k])) for k in range(j, len(slots)) if seeks[stream.segment[k]] == ws]
                tail = [(g, w.text) for g, w in tail if w is not None]
                slot_of = {id(slots[k][h]): k for k in range(i, j) for h in range(n) if slots[k][h] is not None}

                def body(run: list) -> list[int]:
                    return timed_tokens(tok, head + [(stream.segment[slot_of[id(w)]], w.text) for w in run] + tail,
                                        spans, ws)
                if kind in ("pt", "ptp"):
                    previous = " ".join(slots[k][0].text for k in range(i) if slots[k][0] is not None and seeks[stream.segment[k]] < ws)
                else:
                    previous = " ".join(w.text for w, g in zip(words, segs) if seeks[g] < ws)
                options = [" ".join(w.text for w in voted), " ".join(w.text for w in alt)]
                s_ = scorer.timed(ws, previous, [body(voted), body(alt)])
                gain = {c: s_[c][1] - s_[c][0] for c in s_}
                win = gain["prompt" if kind in ("otp", "ptp") else "bare"] > margin
                chosen = alt if win else voted
                flips.append((len(records), len(words), chosen, voted if win else alt))
                records.append(record(rule, case, t, ws, options, gain, win, said))
                case = None  # decided
            if case is not None and kind in ("ob", "op"):  # the backbone's own window
                t = slot_time(slots[i])
                mine = next((w.segment for w in own), stream.segment[i])
                ws = seeks[mine]
                before = " ".join(w.text for w, g in zip(words, segs) if seeks[g] == ws)
                previous = " ".join(w.text for w, g in zip(words, segs) if seeks[g] < ws)
                after_words = [majority_word(slots[k]) for k in range(j, len(slots)) if seeks[stream.segment[k]] == ws]
                after = " ".join(w.text for w in after_words if w is not None)
            elif case is not None:
                t = slot_time(slots[i])
                ws = max([s for s in starts if s <= t - LEAD_S] or [0.0])
                if t - ws > WINDOW_S - TAIL_MARGIN_S - LEAD_S:  # a long backbone segment: open LEAD_S before the run
                    ws = max(0.0, t - LEAD_S)
                before = " ".join(w.text for w in words if w.time >= ws)
                previous = " ".join(w.text for w in words if w.time < ws)
                after_words = [majority_word(slots[k]) for k in range(j, len(slots))]
                after = " ".join(w.text for w in after_words if w is not None and w.time < ws + WINDOW_S - TAIL_MARGIN_S)
            if case is not None:
                options = [" ".join(w.text for w in voted), " ".join(w.text for w in alt)]
                s = scorer(ws, previous, before, options, after)
                gain = {c: s[c][1] - s[c][0] for c in s}  # the alternative's advantage over the rule's choice
                win = {"lp": gain["prompt"] > margin, "lb": gain["bare"] > margin,
                       "op": gain["prompt"] > margin, "ob": gain["bare"] > margin,
                       "both": gain["prompt"] > margin and gain["bare"] > margin}[kind]
                chosen = alt if win else voted
                flips.append((len(records), len(words), chosen, voted if win else alt))
                records.append(record(rule, case, t, ws, options, gain, win, said))
            words += chosen
            slot_of = {id(slots[k][h]): k for k in range(i, j) for h in range(n) if slots[k][h] is not None}
            segs += [stream.segment[slot_of[id(w)]] for w in chosen]
            i = j
        out[rule] = " ".join(w.text for w in words)
        for r, pos, mine, other in flips:  # the file's text with this one run decided the other way
            records[r]["flipped_text"] = " ".join(w.text for w in words[:pos] + other + words[pos + len(mine):])
    cg = " ".join(v.word.text for v in vote([words_of([t for _, _, t in texts[nm]], [(a, b) for a, b, _ in texts[nm]])
                                             for nm in vote18.ORDER], confirm=vote18.GUARD))
    if "cg" in out:
        assert out["cg"] == cg, "the offline pass here is not the product's vote"
    return {"texts": out, "records": records}


def decide_joint(texts: dict[str, list[tuple]], scorer: Scorer, rule: str, seeks: list[float],
                 spans: list[tuple[float, float]]) -> tuple[str, list[dict]]:
    """`jw:M` / `jwp:M`: the runs where `confirmed+guard` overrules an unconfirmed backbone phrase
    (in bounds), decided together per backbone window: the window's text as the rule has it, and the
    same with every such run of the window back to the backbone's phrase, each with the backbone's
    segment timestamps, scored in the backbone's window (`jw` without a prompt, `jwp` with the
    rule's text before the window); the backbone's phrases come back where they win by more than M.
    Joint, because one run scored alone in a window whose other runs say the others' word is judged
    by its consistency with them ("caller" once among four "color")."""
    name, _, m = rule.partition(":")
    margin = float(m) if m else 0.0
    stream = network(texts)
    slots, n = stream.slots, len(vote18.ORDER)
    pieces: list[list[tuple[int, object]]] = []  # the rule's words, per agreed slot or run: (slot, word)
    cases: list[tuple[int, list, float]] = []  # (piece, the backbone's words there, its window)
    i = 0
    while i < len(slots):
        j = run_end(slots, i)
        if j == i:
            pieces.append([(i, slots[i][0])])
            i += 1
            continue
        said = said_in(slots, i, j, n)
        own = [(k, slots[k][0]) for k in range(i, j) if slots[k][0] is not None]
        keep = stream.keeps_backbone(i, j, said)
        slot_of = {id(slots[k][h]): k for k in range(i, j) for h in range(n) if slots[k][h] is not None}
        voted = own if keep else [(slot_of[id(w)], w) for w in others_vote(slots, i, j, said)]
        if not keep and not stream._deviates(i, j):
            seg = next((w.segment for _, w in own), stream.segment[i])
            cases.append((len(pieces), own, seeks[seg]))
        pieces.append(voted)
        i = j
    tok = scorer.loaded.tokenizer
    records = []
    for ws in sorted({c[2] for c in cases}):
        group = [c for c in cases if c[2] == ws]

        def body(choice: dict[int, list]) -> list[int]:
            words = [(stream.segment[k], w.text) for p, piece in enumerate(pieces) for k, w in choice.get(p, piece)
                     if seeks[stream.segment[k]] == ws]
            return timed_tokens(tok, words, spans, ws)
        previous = " ".join(w.text for piece in pieces for k, w in piece if seeks[stream.segment[k]] < ws)
        back = {p: own for p, own, _ in group}
        s_ = scorer.timed(ws, previous, [body({}), body(back)])
        gain = {c: s_[c][1] - s_[c][0] for c in s_}
        win = gain["prompt" if name == "jwp" else "bare"] > margin
        records.append({"rule": rule, "case": "a", "window": ws, "runs": len(group),
                        "rule_phrase": " | ".join(" ".join(w.text for _, w in pieces[p]) for p, _, _ in group),
                        "alternative": " | ".join(" ".join(w.text for _, w in own) for _, own, _ in group),
                        "gain_prompt": round(gain["prompt"], 2), "gain_bare": round(gain["bare"], 2), "taken": win,
                        "flipped_pieces": {p: own for p, own, _ in group}})
        if win:
            for p, own, _ in group:
                pieces[p] = own
    text = " ".join(w.text for piece in pieces for _, w in piece)
    for r in records:  # the file's text with this window decided the other way
        flip = r.pop("flipped_pieces")
        r["flipped_text"] = None if r["taken"] else " ".join(
            w.text for p, piece in enumerate(pieces) for _, w in flip.get(p, piece))
    return text, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", default="cg,lp:0,lb:0,both:0")
    parser.add_argument("--specs", default="dev")
    parser.add_argument("--out", default="")
    parser.add_argument("--seeks", default="acc20_plain_seeks_dev_tiny.json,acc20_plain_seeks_dev_base.json,"
                        "acc20_plain_seeks_held_tiny.json,acc20_plain_seeks_held_base.json",
                        help="hyps20.py's `plain` with window starts (for `ob`/`op`)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    specs = {"dev": SPECS, "held": vote18.HELD_OUT, "fresh3": vote18b.FRESH3, "fresh4": FRESH4}.get(args.specs) or args.specs.split(",")
    rules = args.rules.split(",")
    data = load()
    for f in args.seeks.split(","):
        if f and (RESULTS / f).exists():
            SEEKS.update({r["file"]: r["segments"] for r in json.loads((RESULTS / f).read_text())["runs"]})
    models: dict[str, object] = {}
    rows, totals = [], {r: 0 for r in rules}
    for spec in specs:
        rec = recording(spec)
        texts = data[rec["name"]]
        name = "tiny.en" if rec["language"] == "en" else "base"
        loaded = models.get(name) or models.setdefault(name, load_model(name))
        starts = sorted({a for a, _, t in texts["plain"] if t.strip()})
        seeks = SEEKS.get(rec["name"])
        if seeks is not None:  # each cached segment's window: the latest re-decoded window start at or before it
            # (the same segments where the re-decode gives the cached text; 4 files of 29 differ a little)
            opens = sorted({s_[0] for s_ in seeks})
            seeks = [max([o for o in opens if o <= a + 1e-6] or [0.0]) for a, _, _ in texts["plain"]]
        t0 = time.perf_counter()
        scorer = Scorer(loaded, rec["audio"], rec["language"])
        spans = [(a, b) for a, b, _ in texts["plain"]]
        got = decide(texts, scorer, [r for r in rules if not r.startswith("jw")], starts, seeks, spans)
        for r in rules:
            if r.startswith("jw"):
                got["texts"][r], extra = decide_joint(texts, scorer, r, seeks, spans)
                for x in extra:
                    if x["flipped_text"] is None:
                        x["flipped_text"] = got["texts"][r]  # not recomputed for taken windows
                got["records"] += extra
        wall = time.perf_counter() - t0
        bars = {c: errors(rec["reference"], " ".join(t for _, _, t in texts[c]), rec["language"])[0]
                for c in ("fw5", "fw1", "fast") if c in texts}
        row = {"file": rec["name"], "spec": spec, "bars": bars, "wall_s": round(wall, 1), "windows": len(scorer.encoded),
               "scored": scorer.calls}
        # each record's counterfactual: the file's text with the run decided the other way
        for r in got["records"]:
            r["errors_if_flipped"] = errors(rec["reference"], r.pop("flipped_text"), rec["language"])[0]
        line = f"{spec:16s}"
        for rule in rules:
            e = errors(rec["reference"], got["texts"][rule], rec["language"])[0]
            row[rule] = {"errors": e, "criterion": all(c in bars and e < bars[c] for c in ("fw5", "fw1", "fast")),
                         "text": got["texts"][rule]}
            totals[rule] += e
            line += f" {rule} {e:3d}"
        for r in got["records"]:
            r["flip_gain"] = row[r["rule"]]["errors"] - r["errors_if_flipped"]  # > 0: the other choice was better
        row["records"] = got["records"]
        rows.append(row)
        print(line + "  bars " + " ".join(f"{c} {v}" for c, v in bars.items()) + f"  ({row['wall_s']} s, {scorer.calls} scored)", flush=True)
        if args.out:
            write_json(args.out, {"rules": rules, "specs": specs, "totals": totals, "rows": rows})
    print("total", totals)
    print("criterion met", {r: sum(row[r]["criterion"] for row in rows) for r in rules})


if __name__ == "__main__":
    main()
