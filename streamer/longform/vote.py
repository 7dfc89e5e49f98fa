"""A word-level majority vote (ROVER) over several transcripts of one recording.

Conditioned on its own earlier text, Whisper keeps the spelling it chose once for whole paragraphs
("5-0-0" for "500", "color" for "caller", number words for digits in Spanish and French), and which
spelling wins depends on the prompt, not on the audio (docs/notes/accuracy13.md). Transcripts
decoded without that prompt do not share its style flips, so where most transcripts agree on a word
the odd one out is overruled.

The hypotheses' words are aligned into one network of slots (the first hypothesis, the backbone,
first; each further one aligned to the network by edit distance on a normalised form of the words,
within `BAND_S` of each other); each run of slots where they disagree takes the phrase most hypotheses
say there, or slot by slot the form most have (a missing word is a candidate too), ties going to
the backbone. Pure and deterministic: the same hypotheses give the same words. `revise` applies
the outcome to the backbone's segments.
"""

from __future__ import annotations

import bisect
import re
import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from streamer.longform.transcript import TranscriptSegment

_STRIP = string.punctuation + "¿¡«»“”‘’…"
"""Punctuation around a word: "now." and "now" are one word to the vote."""
_JOINED = re.compile(r"(?<=[^\W\d_]{2})-(?=[^\W\d_]{2})")
"""A hyphen between two runs of two letters or more: "re-record" is "rerecord" written another
way, while "5-0-0" and "I-A-X" spell out what "500" and "IAX" say as one word."""


BAND_S = 10.0
"""Words of two hypotheses are aligned only when their times lie within this many seconds: the
alignment then grows with the recording's length, not with its square, and the vote can hand a
word over about four bands after every hypothesis has passed it (`VoteStream`). 30 s (a window)
until session 15; 10 s gives the same words on all 13 recordings of docs/notes/accuracy15.md, 5 s
changes two of them."""


@dataclass(frozen=True)
class VoteWord:
    """A word of a hypothesis: its text as written, the index of the segment it comes from and
    about when it is said (seconds; spread evenly over its segment)."""

    text: str
    segment: int
    time: float = 0.0

    @property
    def key(self) -> str:
        """What the vote compares: lower case without the punctuation around the word and without
        hyphens inside a word ("re-record" is "rerecord"); other inner marks stay ("5-0-0" is not
        "500", "I-A-X" not "IAX")."""
        return _JOINED.sub("", self.text.strip(_STRIP).lower())


def words_of(texts: list[str], spans: list[tuple[float, float]] | None = None, first: int = 0) -> list[VoteWord]:
    """The words of a hypothesis given as its segments' texts (and their (start, end) seconds), in
    order, split at white space; the segments are numbered from `first`."""
    out = []
    for i, text in enumerate(texts):
        words = [w for w in text.split() if w.strip(_STRIP)]
        start, end = spans[i] if spans else (0.0, 0.0)
        out += [VoteWord(w, first + i, start + (end - start) * (k + 0.5) / len(words)) for k, w in enumerate(words)]
    return out


Slot = list["VoteWord | None"]
"""One position of the network: an entry per hypothesis aligned so far (None: no word there)."""


class _Stage:
    """One step of the alignment, built as its inputs arrive: the slots of the network so far
    (`width` entries each) and the words of one more hypothesis, aligned by the least edit cost,
    where a word matches a slot for free when some hypothesis has the same form there, and a
    hypothesis without a word at a slot costs nothing where another also has none there. Only
    words within `BAND_S` of a slot's time are considered for it.

    The table is filled row by row (a row per slot) as soon as a row can no longer change: its
    slot and the next are known and so is every word said up to `BAND_S` after it (`until`). Then,
    as in an online Viterbi decoder, the path back from every cell of the last row is traced: where
    all of them have met, the final path will pass too (a later row reaches this one only through
    its cells), so the slots behind that cell are handed over (`advance`), exactly those the whole
    table gives at the end."""

    def __init__(self, width: int):
        self.width = width
        self.slots: list[Slot] = []
        self.slots_closed = False
        self.words: list[VoteWord] = []
        self.keys: list[str] = []
        self.times: list[float] = []
        """Of `words`: the latest time so far, so that the band's bounds are found by bisection."""
        self.until = float("-inf")
        """Every word said before this time has arrived (inf: every word)."""
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.band: list[int] = []
        # cost[i][j - lo[i]]: aligning the first i slots with the first j words; moves: 0 diagonal,
        # 1 slot without a word, 2 word in a new slot. Ties prefer the diagonal, then a skipped slot.
        self.cost: list[list[int]] = []
        self.move: list[bytearray] = []
        self.slot_time = float("-inf")
        self.done = (0, 0)
        """The cell of the final path up to which the slots have been handed over."""
        self.finished = False

    def add_words(self, words: list[VoteWord], until: float) -> None:
        t = self.times[-1] if self.times else float("-inf")
        for w in words:
            t = max(t, w.time)
            self.times.append(t)
        self.words += words
        self.keys += [w.key for w in words]
        self.until = until

    def advance(self) -> list[Slot]:
        """The slots that have become final since the last call, in order."""
        if self.finished:
            return []
        grew = False
        while self._add_row():
            grew = True
        n = len(self.slots)
        if self.slots_closed and len(self.cost) == n + 1:  # the whole table: the path from its last cell
            self.finished = True
            return self._handover((n, len(self.words)))
        if not grew or len(self.cost) < 2:
            return []
        return self._handover(self._meeting())

    def _add_row(self) -> bool:
        i, n, m = len(self.cost), len(self.slots), len(self.words)
        complete = self.until == float("inf")
        if i == 0:  # row 0 spans the words of slot 1's band (all of them without slots)
            if n == 0:
                if not (self.slots_closed and complete):
                    return False
                hi0 = m
            else:
                t = next(w.time for w in self.slots[0] if w is not None)
                if not (complete or self.until > t + BAND_S):
                    return False
                hi0 = bisect.bisect_right(self.times, t + BAND_S)
            self.lo.append(0)
            self.hi.append(hi0)
            self.band.append(m)
            self.cost.append(list(range(hi0 + 1)))
            self.move.append(bytearray([1] + [2] * hi0))
            return True
        if i > n:
            return False
        last = i == n
        if last and not (self.slots_closed and complete):
            return False  # the last row spans every word: wait for them all
        slot = self.slots[i - 1]
        t = max(self.slot_time, next(w.time for w in slot if w is not None))
        if not (complete or self.until > t + BAND_S):
            return False
        self.slot_time = t
        band = bisect.bisect_right(self.times, t + BAND_S)
        hi = m if last else band
        lo = min(bisect.bisect_left(self.times, t - BAND_S), self.hi[i - 1])
        keys = {w.key for w in slot if w is not None}
        gap = 0 if any(w is None for w in slot) else 1
        prev, plo, phi, wkeys = self.cost[i - 1], self.lo[i - 1], self.hi[i - 1], self.keys
        inf = n + m + 1
        row, mrow = [0] * (hi - lo + 1), bytearray(hi - lo + 1)
        for j in range(lo, hi + 1):
            best, how = inf, 0
            if 0 < j <= band and plo <= j - 1 <= phi:
                best = prev[j - 1 - plo] + (0 if wkeys[j - 1] in keys else 1)
            if plo <= j <= min(phi, band) and prev[j - plo] + gap < best:
                best, how = prev[j - plo] + gap, 1
            if j > lo and row[j - 1 - lo] + 1 < best:
                best, how = row[j - 1 - lo] + 1, 2
            row[j - lo], mrow[j - lo] = best, how
        self.lo.append(lo)
        self.hi.append(hi)
        self.band.append(band)
        self.cost.append(row)
        self.move.append(mrow)
        return True

    def _back(self, cell: tuple[int, int]) -> tuple[int, int]:
        i, j = cell
        how = self.move[i][j - self.lo[i]] if i else 2
        return (i - 1, j - 1) if how == 0 else (i - 1, j) if how == 1 else (i, j - 1)

    def _meeting(self) -> tuple[int, int]:
        """The latest cell that the paths back from every cell of the last row all pass."""
        r = len(self.cost) - 1
        path, joins = [], {}  # the first start's path to `done`; the index where each cell meets it
        cell = (r, self.lo[r])
        while cell != self.done:
            if cell[0] < self.done[0] or cell[1] < self.done[1]:
                raise AssertionError(f"a path passed {self.done} by")
            joins[cell] = len(path)
            path.append(cell)
            cell = self._back(cell)
        joins[self.done] = len(path)
        path.append(self.done)
        meet = 0
        for j in range(self.lo[r] + 1, self.hi[r] + 1):
            walked, cell = [], (r, j)
            while cell not in joins:
                if cell[0] < self.done[0] or cell[1] < self.done[1]:
                    raise AssertionError(f"a path passed {self.done} by")
                walked.append(cell)
                cell = self._back(cell)
            k = joins[cell]
            for c in walked:
                joins[c] = k
            meet = max(meet, k)
        return path[meet]

    def _handover(self, cell: tuple[int, int]) -> list[Slot]:
        """The slots of the path from `cell` back to `done`, in order; `cell` is the new `done`."""
        out: list[Slot] = []
        stop, self.done = self.done, cell
        while cell != stop:
            i, j = cell
            back = self._back(cell)
            if back == (i - 1, j - 1):
                out.append(self.slots[i - 1] + [self.words[j - 1]])
            elif back == (i - 1, j):
                out.append(self.slots[i - 1] + [None])
            else:
                out.append([None] * self.width + [self.words[j - 1]])
            cell = back
        return out[::-1]


def _winner(keys: list, weights: list[float]):
    """The key with the most weight; a tie goes to the first entry's key."""
    score: dict = {}
    for k, weight in zip(keys, weights):
        score[k] = score.get(k, 0.0) + weight
    top = max(score.values())
    return keys[0] if score[keys[0]] == top else next(k for k in keys if score[k] == top)


@dataclass(frozen=True)
class Voted:
    """A word of the vote's outcome: as `source` (the index of a hypothesis) wrote it, and the
    backbone segment it belongs to (its slot's backbone word's segment; for a word the backbone
    lacks, that of the backbone word before it, or after it at the very start)."""

    word: VoteWord
    source: int
    segment: int


class VoteStream:
    """The vote over `hypotheses` transcripts given piece by piece as they are decoded (`add`),
    handing over each word as soon as no later piece can change it: the words that `vote` gives on
    the whole transcripts, in the same order, whatever the pieces. Pure: no I/O, no clock.

    The first hypothesis (the backbone) becomes the network's first slots; each further hypothesis
    is aligned to the slots handed over by the one before (`_Stage`); a run of slots where the
    hypotheses disagree is decided once a slot where they all agree (or the end) closes it."""

    def __init__(self, hypotheses: int, weights: list[float] | None = None, phrases: bool = True,
                 confirm: tuple[float, float, int] | None = None, overrule: int = 1,
                 speech: Callable[[float, float], float] | None = None, skip: tuple[int, float] = (4, 1.0)):
        self.weights = weights or [1.0] * hypotheses
        self.phrases = phrases
        self.confirm = confirm
        """None: the majority decides every disputed run. (HI, LO, MIN): the backbone keeps its
        phrase in a run where another hypothesis says the same phrase and its word count there is
        neither above HI x nor below LO x the median of the others' (by MIN words at least); any
        other run takes the other hypotheses' vote (docs/notes/accuracy18.md, `confirmed+guard`)."""
        self.overrule = overrule
        """With `confirm`: how many of the other hypotheses must say one same phrase to replace an
        unconfirmed backbone phrase (within the bounds). 1: any vote replaces it (session 18);
        `hypotheses - 1`: only a unanimous opposition does. A phrase out of the bounds is replaced
        whatever the others say."""
        self.speech = speech
        """Seconds of speech (by the VAD) between two times (s), or None. With it, the vote never
        drops a stretch of the backbone's words that the other transcripts skip over speech
        (`skip`, `_kept_over_speech`)."""
        self.skip = skip
        """(MIN words, S seconds): a dropped stretch of at least MIN consecutive backbone words with
        S seconds of speech or more between its first and last word, and another hypothesis's words
        in half its slots, is kept (docs/notes/accuracy31.md: chosen on the development files)."""
        self.stages = [_Stage(width) for width in range(1, hypotheses)]
        self.first_segment: int | None = None
        """The backbone segment of its first word: that of words before it."""
        self.slots: list[Slot] = []
        """The final slots, in order, an entry per hypothesis in each."""
        self.closed = False
        self.segment: list[int] = []
        """The backbone segment of each final slot: its own word's, else the one before (after, at
        the start)."""
        self.decided = 0
        """The final slots decided so far."""

    def add(self, h: int, words: list[VoteWord], until: float = float("inf")) -> list[Voted]:
        """Hypothesis `h`'s next `words`, in order; every word it says before `until` (seconds) is
        now given (inf: its transcript is complete). Returns the newly decided words, in order."""
        if h == 0:
            if self.first_segment is None and words:
                self.first_segment = words[0].segment
            slots = [[w] for w in words]
            if self.stages:
                self.stages[0].slots += slots
                self.stages[0].slots_closed = until == float("inf")
            else:
                self._receive(slots, until == float("inf"))
        else:
            self.stages[h - 1].add_words(words, until)
        for k, stage in enumerate(self.stages):
            slots = stage.advance()
            if k + 1 < len(self.stages):
                self.stages[k + 1].slots += slots
                self.stages[k + 1].slots_closed = stage.finished
            else:
                self._receive(slots, stage.finished)
        return self._decide()

    @property
    def decided_segment(self) -> int | None:
        """The backbone segment of the last decided slot: later words go to it or after it."""
        return self.segment[self.decided - 1] if self.decided else None

    def _receive(self, slots: list[Slot], closed: bool) -> None:
        for slot in slots:
            if slot[0] is not None:
                last = slot[0].segment
            else:
                last = self.segment[-1] if self.segment else self.first_segment or 0
            self.segment.append(last)
        self.slots += slots
        self.closed = closed

    def run_weights(self, i: int, j: int, said: list[str]) -> list[float]:
        """The hypotheses' weights for the disputed run of slots [i, j) (each one's phrase in `said`):
        `weights`, whatever the run (a measurement may weigh runs otherwise: session 16's vote16b.py, benchmarks/README.md)."""
        return self.weights

    def _decide(self) -> list[Voted]:
        slots, out = self.slots, []

        def take(h: int, k: int) -> None:
            out.append(Voted(slots[k][h], h, self.segment[k]))

        def decided(i: int, j: int, picks: dict[int, int]) -> None:  # the run's outcome: slot -> hypothesis
            if self.speech is not None:
                picks.update(self._kept_over_speech(i, j, picks))
            for k in sorted(picks):
                take(picks[k], k)

        i = self.decided
        while i < len(slots):
            j = i
            while j < len(slots) and len({None if w is None else w.key for w in slots[j]}) > 1:
                j += 1
            if j == i:  # every hypothesis has this word
                take(0, i)
                i += 1
                continue
            if j == len(slots) and not self.closed:
                break  # the run may go on
            said = ["".join(slots[k][h].key for k in range(i, j) if slots[k][h] is not None) for h in range(len(self.weights))]
            weights = self.run_weights(i, j, said)
            voters = list(range(len(self.weights)))
            if self.confirm is not None:
                if self.keeps_backbone(i, j, said):
                    decided(i, j, {k: 0 for k in range(i, j) if slots[k][0] is not None})
                    i = j
                    continue
                voters = voters[1:]  # the backbone's phrase stands alone (or deviates): the others decide
            phrase, weight = [said[h] for h in voters], [weights[h] for h in voters]
            picks: dict[int, int] = {}
            if self.phrases and len(set(phrase)) < len(phrase):
                h = voters[phrase.index(_winner(phrase, weight))]
                picks = {k: h for k in range(i, j) if slots[k][h] is not None}
            else:
                for k in range(i, j):
                    keys = [None if slots[k][h] is None else slots[k][h].key for h in voters]
                    key = _winner(keys, weight)
                    if key is not None:
                        picks[k] = voters[keys.index(key)]
            decided(i, j, picks)
            i = j
        self.decided = i
        return out

    def _kept_over_speech(self, i: int, j: int, picks: dict[int, int]) -> dict[int, int]:
        """The backbone's words of run [i, j) that its outcome `picks` drops but that stay: each
        stretch of `skip`[0] consecutive dropped backbone words or more (no word picked in between)
        with `skip`[1] seconds of speech or more between its first and last word, where another
        hypothesis has words in half its slots or more.

        Why: four of the five transcripts (the two chains cut at the VAD's onsets and both `fast`
        runs) open windows at the same places, and three of them decode with 5 beams. Where such a
        window opens before a pause, beam search can skip the sentences after it (faster-whisper
        does the same on that cut), and three correlated empty phrases outvote the backbone and
        `fast` greedy, which wrote them (base, French: the first 17 s of speech lost;
        docs/notes/accuracy31.md). A skip over audio where the VAD hears speech, contradicted by a
        second transcript, is not a runaway. A runaway or loop of the backbone has no second voice
        in its slots and still goes."""
        least, seconds = self.skip
        slots, kept = self.slots, {}
        k = i
        while k < j:
            if slots[k][0] is None or k in picks:
                k += 1
                continue
            stretch = [k]
            k += 1
            while k < j and k not in picks:
                if slots[k][0] is not None:
                    stretch.append(k)
                k += 1
            voice = max(sum(slots[q][h] is not None for q in stretch) for h in range(1, len(self.weights)))
            if (len(stretch) >= least and 2 * voice >= len(stretch)
                    and self.speech(slots[stretch[0]][0].time, slots[stretch[-1]][0].time) >= seconds):
                kept.update((q, 0) for q in stretch)
        return kept

    def keeps_backbone(self, i: int, j: int, said: list[str]) -> bool:
        """With `confirm`: whether the disputed run of slots [i, j) keeps the backbone's phrase
        (`said`: each hypothesis's phrase there): another hypothesis says it too, or fewer than
        `overrule` of the others say one same phrase; and its word count is within the bounds."""
        others = said[1:]
        confirmed = said[0] in others or max(others.count(p) for p in others) < self.overrule
        return confirmed and not self._deviates(i, j)

    def _deviates(self, i: int, j: int) -> bool:
        """Whether the backbone's word count in slots [i, j) is out of `confirm`'s bounds against
        the median of the other hypotheses' (a runaway, a loop, a deleted passage)."""
        hi, lo, least = self.confirm
        counts = sorted(sum(self.slots[k][h] is not None for k in range(i, j)) for h in range(1, len(self.weights)))
        mid = len(counts) // 2
        median = counts[mid] if len(counts) % 2 else (counts[mid - 1] + counts[mid]) / 2
        own = sum(self.slots[k][0] is not None for k in range(i, j))
        return (own - median >= least and own > hi * median) or (median - own >= least and own < lo * median)


def align(hypotheses: list[list[VoteWord]]) -> list[Slot]:
    """The hypotheses' words aligned into slots, one entry per hypothesis in each, in order."""
    stream = VoteStream(len(hypotheses))
    for h, words in enumerate(hypotheses):
        stream.add(h, words)
    return stream.slots


def vote(hypotheses: list[list[VoteWord]], weights: list[float] | None = None, phrases: bool = True,
         confirm: tuple[float, float, int] | None = None, speech: Callable[[float, float], float] | None = None) -> list[Voted]:
    """The majority words, in order. Per slot the form (or the absence of a word) with the most
    weight (`weights`, one per hypothesis, 1 each by default) wins, written as the first
    hypothesis that has it wrote it; a tie goes to the form of the first hypothesis, the backbone.

    With `phrases`, each run of slots where the hypotheses disagree is first voted on as a whole:
    a hypothesis's words there, joined without spaces, are one phrase, so that "voice over IP",
    "voiceover IP" and "VoiceOverIP" agree (word by word they split three ways and the vote dropped
    "voice"). When two hypotheses or more say the same phrase, the phrase with the most weight
    (ties to the backbone's) is taken as its hypothesis wrote it; when every phrase differs, the run
    is voted on word by word. A phrase that differs from the backbone's by spacing only keeps the
    backbone's words. With `confirm`, the backbone's phrase in a disputed run stands when another
    hypothesis says it too (and its length there is not off, `VoteStream.confirm`); otherwise the
    other hypotheses vote on the run as above. With `speech` (seconds of VAD speech between two
    times), a long stretch of backbone words that the outcome drops over speech, with no other word
    there, is kept (`VoteStream._kept_over_speech`)."""
    stream = VoteStream(len(hypotheses), weights, phrases, confirm, speech=speech)
    return [v for h, words in enumerate(hypotheses) for v in stream.add(h, words)]


class SegmentVote:
    """`revise` piece by piece: the backbone's segments (h = 0) and the other hypotheses' (h > 0;
    (start s, end s, text)) are given as they are decoded, and each backbone segment is handed back,
    rewritten, once no later piece can change it. Pure: the segments handed back, in order, are
    those `revise` gives on the whole transcripts."""

    def __init__(self, hypotheses: int, encode: Callable[[str], list[int]], confirm: tuple[float, float, int] | None = None,
                 speech: Callable[[float, float], float] | None = None):
        self.stream = VoteStream(hypotheses, confirm=confirm, speech=speech)
        self.encode = encode
        self.given = [0] * hypotheses
        """Segments given per hypothesis: the index of the next one."""
        self.complete = [False] * hypotheses
        self.segments: list[TranscriptSegment] = []
        self.words: dict[int, list[str]] = {}
        """Voted words of backbone segments not handed back yet."""
        self.returned = 0

    def add(self, h: int, segments: list, until: float = float("inf")) -> list[TranscriptSegment]:
        """Hypothesis `h`'s next `segments`, in order; every segment it has that starts before
        `until` (seconds) is now given (inf: all). Returns the backbone segments now final, in
        order, rewritten in place (one that lost every word has an empty text, for the caller to
        drop)."""
        spans = [(s.start, s.end, s.text) for s in segments] if h == 0 else list(segments)
        words = words_of([t for _, _, t in spans], [(a, b) for a, b, _ in spans], first=self.given[h])
        self.given[h] += len(spans)
        self.complete[h] = until == float("inf")
        if h == 0:
            self.segments += segments
        for v in self.stream.add(h, words, until):
            self.words.setdefault(v.segment, []).append(v.word.text)
        decided = self.stream.decided_segment
        final = len(self.segments) if all(self.complete) else decided if decided is not None else 0
        out = []
        for k in range(self.returned, final):
            seg, new = self.segments[k], self.words.pop(k, [])
            if new != [w.text for w in words_of([seg.text])]:
                seg.text = " " + " ".join(new) if new else ""
                seg.tokens = self.encode(seg.text) if new else []
                seg.token_logprobs = []
            out.append(seg)
        self.returned = max(self.returned, final)
        return out


def revise(segments: list[TranscriptSegment], others: list[list[tuple[float, float, str]]],
           encode: Callable[[str], list[int]], confirm: tuple[float, float, int] | None = None) -> None:
    """Rewrite `segments` (the backbone's, in order) in place to the vote's outcome over them and
    `others` (each another hypothesis's segments as (start s, end s, text), in order). A segment
    whose words changed gets the new text and its tokens (`encode`; no token log-probabilities any
    more); one that lost every word gets an empty text, for the caller to drop. Times stay."""
    voter = SegmentVote(1 + len(others), encode, confirm)
    voter.add(0, segments)
    for h, spans in enumerate(others, start=1):
        voter.add(h, spans)
