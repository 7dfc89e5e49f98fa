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
    source: int = 0  # from `select`: the first of the current beams whose tokens this one continues


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
        """Next beams (one per slot, best first) from each current beam's top candidates.

        A candidate is a token sequence (beams with equal tokens propose the same ones: the best
        score counts), keyed here by (the first beam with its prefix, token): one tuple per beam,
        not one per candidate (this runs for every beam group at every step, on the engine thread)."""
        first: dict[tuple[int, ...], int] = {}
        sources = [first.setdefault(tuple(beam.tokens), i) for i, beam in enumerate(beams)]
        candidates: dict[tuple[int, int], float] = {}
        for source, beam, lps, ids in zip(sources, beams, top_logprobs, top_ids):
            for lp, token in zip(lps, ids):
                key = (source, token)
                score = beam.sum_logprob + lp
                if candidates.get(key, float("-inf")) < score:
                    candidates[key] = score
        chosen = []
        for (source, token), score in sorted(candidates.items(), key=lambda kv: kv[1], reverse=True):
            tokens = beams[source].tokens + [token]
            if token == self.eot:
                if len(self.finished) < self.max_finished:
                    self.finished.append(Hypothesis(tokens, score, source))
            else:
                chosen.append(Hypothesis(tokens, score, source))
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
