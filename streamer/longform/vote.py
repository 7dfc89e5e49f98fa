"""A word-level majority vote (ROVER) over several transcripts of one recording.

Conditioned on its own earlier text, Whisper keeps the spelling it chose once for whole paragraphs
("5-0-0" for "500", "color" for "caller", number words for digits in Spanish and French), and which
spelling wins depends on the prompt, not on the audio (docs/notes/accuracy13.md). Transcripts
decoded without that prompt do not share its style flips, so where most transcripts agree on a word
the odd one out is overruled.

The hypotheses' words are aligned into one network of slots (the first hypothesis, the backbone,
first; each further one aligned to the network by edit distance on a normalised form of the words,
within 30 s of each other); each run of slots where they disagree takes the phrase most hypotheses
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


BAND_S = 30.0
"""Words of two hypotheses are aligned only when their times lie within this many seconds (a
window's length): the alignment then grows with the recording's length, not with its square."""


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


def words_of(texts: list[str], spans: list[tuple[float, float]] | None = None) -> list[VoteWord]:
    """The words of a hypothesis given as its segments' texts (and their (start, end) seconds), in
    order, split at white space."""
    out = []
    for i, text in enumerate(texts):
        words = [w for w in text.split() if w.strip(_STRIP)]
        start, end = spans[i] if spans else (0.0, 0.0)
        out += [VoteWord(w, i, start + (end - start) * (k + 0.5) / len(words)) for k, w in enumerate(words)]
    return out


Slot = list["VoteWord | None"]
"""One position of the network: an entry per hypothesis aligned so far (None: no word there)."""


def _align(network: list[Slot], words: list[VoteWord], width: int) -> list[Slot]:
    """`network` (`width` entries a slot) with `words` aligned to it as one more entry per slot:
    the alignment of least edit cost, where a word matches a slot for free when some hypothesis
    has the same form there, and a hypothesis without a word at a slot costs nothing where another
    also has none there. Only words within `BAND_S` of a slot's time are considered for it."""
    n, m = len(network), len(words)
    keys = [{w.key for w in slot if w is not None} for slot in network]
    gap = [0 if any(w is None for w in slot) else 1 for slot in network]
    wkeys = [w.key for w in words]
    times, t = [], float("-inf")
    for w in words:
        t = max(t, w.time)
        times.append(t)
    # Row i (i slots aligned) holds j (words aligned) in [lo[i], hi[i]]: the words said more than
    # BAND_S before slot i - 1 are behind it, those more than BAND_S after it still ahead. Every
    # row overlaps the one before; the last row reaches every word, those past its band only as
    # words in new slots, so the last cell is always reachable.
    lo, hi, band, t = [0] * (n + 1), [m] * (n + 1), [m] * (n + 1), float("-inf")
    for i, slot in enumerate(network, start=1):
        t = max(t, next(w.time for w in slot if w is not None))
        band[i] = bisect.bisect_right(times, t + BAND_S)
        hi[i] = m if i == n else band[i]
        lo[i] = min(bisect.bisect_left(times, t - BAND_S), hi[i - 1])
        if i == 1:
            hi[0] = band[1]
    inf = n + m + 1
    # cost[i][j - lo[i]]: aligning the first i slots with the first j words; moves: 0 diagonal,
    # 1 slot without a word, 2 word in a new slot. Ties prefer the diagonal, then a skipped slot.
    cost = [list(range(hi[0] + 1))]
    move = [bytearray([1] + [2] * hi[0])]
    for i in range(1, n + 1):
        prev, plo, phi = cost[i - 1], lo[i - 1], hi[i - 1]
        k, g, l0 = keys[i - 1], gap[i - 1], lo[i]
        row, mrow = [0] * (hi[i] - l0 + 1), bytearray(hi[i] - l0 + 1)
        for j in range(l0, hi[i] + 1):
            best, how = inf, 0
            if 0 < j <= band[i] and plo <= j - 1 <= phi:
                best = prev[j - 1 - plo] + (0 if wkeys[j - 1] in k else 1)
            if plo <= j <= min(phi, band[i]) and prev[j - plo] + g < best:
                best, how = prev[j - plo] + g, 1
            if j > l0 and row[j - 1 - l0] + 1 < best:
                best, how = row[j - 1 - l0] + 1, 2
            row[j - l0], mrow[j - l0] = best, how
        cost.append(row)
        move.append(mrow)
    out: list[Slot] = []
    i, j = n, m
    while i or j:
        how = move[i][j - lo[i]] if i else 2
        if how == 0:
            out.append(network[i - 1] + [words[j - 1]])
            i, j = i - 1, j - 1
        elif how == 1:
            out.append(network[i - 1] + [None])
            i -= 1
        else:
            out.append([None] * width + [words[j - 1]])
            j -= 1
    out.reverse()
    return out


def align(hypotheses: list[list[VoteWord]]) -> list[Slot]:
    """The hypotheses' words aligned into slots, one entry per hypothesis in each, in order."""
    network: list[Slot] = [[w] for w in hypotheses[0]]
    for width, words in enumerate(hypotheses[1:], start=1):
        network = _align(network, words, width)
    return network


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


def vote(hypotheses: list[list[VoteWord]], weights: list[float] | None = None, phrases: bool = True) -> list[Voted]:
    """The majority words, in order. Per slot the form (or the absence of a word) with the most
    weight (`weights`, one per hypothesis, 1 each by default) wins, written as the first
    hypothesis that has it wrote it; a tie goes to the form of the first hypothesis, the backbone.

    With `phrases`, each run of slots where the hypotheses disagree is first voted on as a whole:
    a hypothesis's words there, joined without spaces, are one phrase, so that "voice over IP",
    "voiceover IP" and "VoiceOverIP" agree (word by word they split three ways and the vote dropped
    "voice"). When two hypotheses or more say the same phrase, the phrase with the most weight
    (ties to the backbone's) is taken as its hypothesis wrote it; when every phrase differs, the run
    is voted on word by word. A phrase that differs from the backbone's by spacing only keeps the
    backbone's words."""
    weights = weights or [1.0] * len(hypotheses)
    slots = align(hypotheses)
    # The backbone segment of each slot: its own word's, else the one before (after, at the start).
    segment, last = [], next((w.segment for w in hypotheses[0]), 0)
    for slot in slots:
        last = slot[0].segment if slot[0] is not None else last
        segment.append(last)
    out: list[Voted] = []

    def take(h: int, k: int) -> None:
        out.append(Voted(slots[k][h], h, segment[k]))

    i = 0
    while i < len(slots):
        j = i
        while j < len(slots) and len({None if w is None else w.key for w in slots[j]}) > 1:
            j += 1
        if j == i:  # every hypothesis has this word
            take(0, i)
            i += 1
            continue
        said = ["".join(slots[k][h].key for k in range(i, j) if slots[k][h] is not None) for h in range(len(weights))]
        if phrases and len(set(said)) < len(said):
            h = said.index(_winner(said, weights))
            for k in range(i, j):
                if slots[k][h] is not None:
                    take(h, k)
        else:
            for k in range(i, j):
                keys = [None if w is None else w.key for w in slots[k]]
                key = _winner(keys, weights)
                if key is not None:
                    take(keys.index(key), k)
        i = j
    return out


def revise(segments: list[TranscriptSegment], others: list[list[tuple[float, float, str]]],
           encode: Callable[[str], list[int]]) -> None:
    """Rewrite `segments` (the backbone's, in order) in place to the vote's outcome over them and
    `others` (each another hypothesis's segments as (start s, end s, text), in order). A segment
    whose words changed gets the new text and its tokens (`encode`; no token log-probabilities any
    more); one that lost every word gets an empty text, for the caller to drop. Times stay."""
    hypotheses = [words_of([s.text for s in segments], [(s.start, s.end) for s in segments]),
                  *(words_of([t for _, _, t in h], [(a, b) for a, b, _ in h]) for h in others)]
    words: list[list[str]] = [[] for _ in segments]
    for v in vote(hypotheses):
        words[v.segment].append(v.word.text)
    for seg, new in zip(segments, words):
        if new != [w.text for w in words_of([seg.text])]:
            seg.text = " " + " ".join(new) if new else ""
            seg.tokens = encode(seg.text) if new else []
            seg.token_logprobs = []
