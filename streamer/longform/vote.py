"""A word-level majority vote (ROVER) over several transcripts of one recording.

Conditioned on its own earlier text, Whisper keeps the spelling it chose once for whole paragraphs
("5-0-0" for "500", "color" for "caller", number words for digits in Spanish and French), and which
spelling wins depends on the prompt, not on the audio (docs/notes/accuracy13.md). Transcripts
decoded without that prompt do not share its style flips, so where most transcripts agree on a word
the odd one out is overruled.

The hypotheses' words are aligned into one network of slots (the first hypothesis, the backbone,
first; each further one aligned to the network by edit distance on a normalised form of the words);
each slot then takes the form most hypotheses have there (a missing word is a candidate too), ties
going to the backbone. Pure and deterministic: the same hypotheses give the same words.
"""

from __future__ import annotations

import string
from collections import Counter
from dataclasses import dataclass

_STRIP = string.punctuation + "¿¡«»“”‘’…"


@dataclass(frozen=True)
class VoteWord:
    """A word of a hypothesis: its text as written and the index of the segment it comes from."""

    text: str
    segment: int

    @property
    def key(self) -> str:
        """What the vote compares: lower case without the punctuation around the word (inner
        hyphens and apostrophes stay: "5-0-0" is not "500")."""
        return self.text.strip(_STRIP).lower()


def words_of(texts: list[str]) -> list[VoteWord]:
    """The words of a hypothesis given as its segments' texts, in order, split at white space."""
    return [VoteWord(w, i) for i, text in enumerate(texts) for w in text.split() if w.strip(_STRIP)]


Slot = list["VoteWord | None"]
"""One position of the network: an entry per hypothesis aligned so far (None: no word there)."""


def _align(network: list[Slot], words: list[VoteWord], width: int) -> list[Slot]:
    """`network` (`width` entries a slot) with `words` aligned to it as one more entry per slot: the alignment of least
    edit cost, where a word matches a slot for free when some hypothesis has the same form there,
    and a hypothesis without a word at a slot costs nothing where another also has none there."""
    n, m = len(network), len(words)
    keys = [{w.key for w in slot if w is not None} for slot in network]
    gap = [0 if any(w is None for w in slot) else 1 for slot in network]
    wkeys = [w.key for w in words]
    # cost[i][j]: aligning the first i slots with the first j words; moves: 0 diagonal, 1 slot
    # without a word, 2 word in a new slot. Ties prefer the diagonal, then a skipped slot.
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    move = [[0] * (m + 1) for _ in range(n + 1)]
    for j in range(1, m + 1):
        cost[0][j], move[0][j] = j, 2
    for i in range(1, n + 1):
        row, prev, k, g = cost[i], cost[i - 1], keys[i - 1], gap[i - 1]
        mrow = move[i]
        row[0], mrow[0] = prev[0] + g, 1
        for j in range(1, m + 1):
            best, how = prev[j - 1] + (0 if wkeys[j - 1] in k else 1), 0
            c = prev[j] + g
            if c < best:
                best, how = c, 1
            c = row[j - 1] + 1
            if c < best:
                best, how = c, 2
            row[j], mrow[j] = best, how
    out: list[Slot] = []
    i, j = n, m
    while i or j:
        how = move[i][j]
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


def vote(hypotheses: list[list[VoteWord]]) -> list[tuple[int, VoteWord]]:
    """The majority words, in order, each with the index of the hypothesis whose word it is (the
    lowest that has the winning form). Per slot the form (or the absence of a word) most
    hypotheses have wins; a tie goes to the form of the first hypothesis, the backbone."""
    out = []
    for slot in align(hypotheses):
        counts = Counter(None if w is None else w.key for w in slot)
        first = None if slot[0] is None else slot[0].key
        top = max(counts.values())
        winner = first if counts[first] == top else next(k for k in (None if w is None else w.key for w in slot)
                                                          if counts[k] == top)
        if winner is not None:
            h = next(h for h, w in enumerate(slot) if w is not None and w.key == winner)
            out.append((h, slot[h]))
    return out
