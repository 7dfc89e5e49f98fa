"""Beam selection (`engine/beam.py`) against openai/whisper's rule written plainly: candidates keyed
by their whole token sequence, the best score per sequence, ranked, finished ones (end of text)
collected up to beam_size * patience, the first `beam_size` unfinished kept."""

import random

from streamer.engine.beam import BeamGroup, Hypothesis

EOT = 0


def reference_select(beams, top_logprobs, top_ids, beam_size, finished, max_finished):
    scores: dict[tuple[int, ...], float] = {}
    for beam, lps, ids in zip(beams, top_logprobs, top_ids):
        for lp, token in zip(lps, ids):
            sequence = tuple(beam.tokens) + (token,)
            scores[sequence] = max(scores.get(sequence, float("-inf")), beam.sum_logprob + lp)
    chosen = []
    for sequence, score in sorted(scores.items(), key=lambda kv: kv[1], reverse=True):
        if sequence[-1] == EOT:
            if len(finished) < max_finished:
                finished.append((list(sequence), score))
        else:
            chosen.append((list(sequence), score))
            if len(chosen) == beam_size:
                break
    return chosen


def test_selection_equals_the_plain_rule_on_random_beams():
    """Random groups of distinct beams (as a group's always are), ties in score, end of text among
    the candidates, finished ones already collected, patience 1 and 2; `source` names the beam
    whose tokens each new beam continues (the runner copies that row's K/V), and `last_timestamp`
    is the largest timestamp token of the new beam's tokens."""
    rng = random.Random(0)
    for _ in range(3000):
        vocab, beam_size = rng.choice([5, 8, 50]), rng.choice([2, 3, 5])
        tb = rng.choice([vocab // 2, vocab])  # timestamp tokens from tb up (none when tb == vocab)
        prefix = [rng.randrange(1, vocab) for _ in range(rng.randrange(6))]
        tokens = [prefix]
        for _ in range(rng.choice([0, beam_size - 1])):
            t = prefix + [rng.randrange(1, vocab) for _ in range(rng.randrange(1, 4))]
            if t not in tokens:
                tokens.append(t)
        sums = [rng.choice([-1.0, -2.0, round(rng.uniform(-5, 0), 1)]) for _ in tokens]
        ids = [rng.sample(range(vocab), min(6, vocab)) for _ in tokens]
        lps = [[round(rng.uniform(-3, 0), 1) for _ in i] for i in ids]
        group = BeamGroup(beam_size, EOT, 224, patience=rng.choice([1.0, 2.0]), timestamp_begin=tb)
        done = [([1], -0.5)] * rng.randrange(3)
        group.finished = [Hypothesis(list(t), s) for t, s in done]
        beams = [Hypothesis(list(t), s, last_timestamp=max([x for x in t if x >= tb], default=-1))
                 for t, s in zip(tokens, sums)]
        got = group.select(beams, lps, ids)
        finished = list(done)
        want = reference_select([Hypothesis(list(t), s) for t, s in zip(tokens, sums)], lps, ids, beam_size, finished,
                                group.max_finished)
        assert [(h.tokens, h.sum_logprob) for h in got] == want
        assert [(h.tokens, h.sum_logprob) for h in group.finished] == finished
        for h in got:
            assert h.source == tokens.index(h.tokens[:-1])
            assert h.last_timestamp == max([x for x in h.tokens if x >= tb], default=-1)


def test_first_beams_are_the_best_distinct_tokens():
    """After the prompt every slot of a group holds the same prefix: `first` expands one beam."""
    group = BeamGroup(3, EOT, 224, timestamp_begin=10)
    beams = group.first([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6], [12, EOT, 4, 11, 5, 6])
    assert [(h.tokens, h.last_timestamp) for h in beams] == [([12], 12), ([4], -1), ([11], 11)]
    assert [(h.tokens, h.sum_logprob) for h in group.finished] == [([EOT], -0.2)]
