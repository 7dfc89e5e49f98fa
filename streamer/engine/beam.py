"""Beam search bookkeeping for one request whose beams occupy several decoder slots.

Pure host-side logic (openai/whisper's BeamSearchDecoder rules): from each beam's top
candidates keep the `beam_size` best unfinished continuations, collect finished ones (end of
text) until `beam_size * patience` are in, rank them with the length penalty. The runner moves
the winners' K/V into the group's slots; this class only says which beam continues from which.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Candidates read per beam each step: one more than the widest beam, so a beam that ends can
# still be replaced by an unfinished continuation.
MAX_BEAM = 5
TOPK = MAX_BEAM + 1


def _score(candidate: tuple[float, int, int]) -> float:
    return candidate[0]


@dataclass
class Hypothesis:
    tokens: list[int]
    sum_logprob: float
    source: int = 0  # from `select`: the current beam whose tokens this one continues
    last_timestamp: int = -1  # the largest timestamp token in `tokens` (the sampler's rules read it)


@dataclass
class BeamGroup:
    beam_size: int
    eot: int
    max_new: int
    patience: float = 1.0
    length_penalty: float | None = None
    timestamp_begin: int | None = None  # the first timestamp token (None: no timestamps to track)
    finished: list[Hypothesis] = field(default_factory=list)

    @property
    def max_finished(self) -> int:
        return max(1, round(self.beam_size * self.patience))

    def first(self, top_logprobs: list[float], top_ids: list[int]) -> list[Hypothesis]:
        """The beams after the first sampled token: the `beam_size` best distinct tokens."""
        return self.select([Hypothesis([], 0.0)], [top_logprobs], [top_ids])

    def select(self, beams: list[Hypothesis], top_logprobs: list[list[float]], top_ids: list[list[int]]) -> list[Hypothesis]:
        """Next beams (one per slot, best first) from each current beam's top candidates.

        `beams` hold distinct token sequences, as a group's always do (`first` starts from one
        beam, and each step extends distinct beams by distinct tokens), so every (beam, token) is
        a distinct candidate: no sequence keys to build (this runs for every beam group at every
        step, on the engine thread). Ties keep the candidates' order, beam by beam."""
        candidates = sorted(
            ((beam.sum_logprob + lp, source, token)
             for source, (beam, lps, ids) in enumerate(zip(beams, top_logprobs, top_ids))
             for lp, token in zip(lps, ids)),
            key=_score, reverse=True)
        chosen = []
        tb = self.timestamp_begin
        for score, source, token in candidates:
            parent = beams[source]
            if token == self.eot:
                if len(self.finished) < self.max_finished:
                    self.finished.append(Hypothesis(parent.tokens + [token], score, source, parent.last_timestamp))
                continue
            last = parent.last_timestamp
            if tb is not None and token >= tb and token > last:
                last = token
            chosen.append(Hypothesis(parent.tokens + [token], score, source, last))
            if len(chosen) == self.beam_size:
                break
        return chosen

    def done(self, beams: list[Hypothesis]) -> bool:
        return len(self.finished) >= self.max_finished or not beams or len(beams[0].tokens) >= self.max_new

    def best(self, beams: list[Hypothesis]) -> Hypothesis:
        pool = self.finished or beams
        return max(pool, key=lambda h: h.sum_logprob / self._length(len(h.tokens)))

    def _length(self, n: int) -> float:
        if self.length_penalty is None:
            return max(1, n)
        return ((5 + n) / 6) ** self.length_penalty
