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


@dataclass
class Hypothesis:
    tokens: list[int]
    sum_logprob: float


@dataclass
class BeamGroup:
    beam_size: int
    eot: int
    max_new: int
    patience: float = 1.0
    length_penalty: float | None = None
    finished: list[Hypothesis] = field(default_factory=list)

    @property
    def max_finished(self) -> int:
        return max(1, round(self.beam_size * self.patience))

    def first(self, top_logprobs: list[float], top_ids: list[int]) -> list[Hypothesis]:
        """The beams after the first sampled token: the `beam_size` best distinct tokens."""
        return self.select([Hypothesis([], 0.0)], [top_logprobs], [top_ids])

    def select(self, beams: list[Hypothesis], top_logprobs: list[list[float]], top_ids: list[list[int]]) -> list[Hypothesis]:
        """Next beams (one per slot, best first) from each current beam's top candidates."""
        candidates: dict[tuple[int, ...], float] = {}
        for beam, lps, ids in zip(beams, top_logprobs, top_ids):
            for lp, token in zip(lps, ids):
                key = tuple(beam.tokens) + (token,)
                score = beam.sum_logprob + lp
                if candidates.get(key, float("-inf")) < score:
                    candidates[key] = score
        chosen = []
        for tokens, score in sorted(candidates.items(), key=lambda kv: kv[1], reverse=True):
            if tokens[-1] == self.eot:
                if len(self.finished) < self.max_finished:
                    self.finished.append(Hypothesis(list(tokens), score))
            else:
                chosen.append(Hypothesis(list(tokens), score))
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
