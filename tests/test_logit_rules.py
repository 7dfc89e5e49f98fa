"""The batched logit rules (`model/logits.py`) against a plain per-row reference of
openai/whisper's SuppressBlank, SuppressTokens and ApplyTimestampRules, on random logits and
random sampler states of odd batch sizes (the tiny.en tokenizer and vocabulary)."""

from __future__ import annotations

import math

import pytest
import torch

from streamer.model.logits import MAX_INITIAL_TIMESTAMP, LogitRules, SamplerState
from streamer.model.weights import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny.en")


def reference(logits: list[float], n: int, last: int, pen: int, last_ts: int, ts_on: bool, tok, suppress: set[int],
              begin: set[int]) -> list[float]:
    """One row, rule by rule, in Python floats, as openai/whisper writes them."""
    out = list(logits)
    inf = float("-inf")
    for t in suppress | (begin if n == 0 else set()):
        out[t] = inf
    if not ts_on:
        return out
    tb, v = tok.timestamp_begin, len(out)
    out[tok.no_timestamps] = inf
    if n >= 1 and last >= tb:  # the last token was a timestamp
        if n < 2 or pen >= tb:  # ... closing a pair: no timestamp now
            out[tb:] = [inf] * (v - tb)
        else:  # ... opening a segment: no text now
            out[:tok.eot] = [inf] * tok.eot
    if last_ts >= 0:  # timestamps never decrease (and a closed segment is not empty)
        lowest = last_ts if (n >= 1 and last >= tb and not (n < 2 or pen >= tb)) else last_ts + 1
        out[tb:lowest] = [inf] * max(0, lowest - tb)
    if n == 0:  # a timestamp first, within MAX_INITIAL_TIMESTAMP
        out[:tb] = [inf] * tb
        latest = tb + round(MAX_INITIAL_TIMESTAMP / 0.02)
        out[latest + 1:] = [inf] * (v - latest - 1)
    finite = [x for x in out if x != inf]
    if finite:
        top = max(finite)
        lse = top + math.log(sum(math.exp(x - top) for x in finite))
        ts = [x for x in out[tb:] if x != inf]
        ts_mass = (max(ts) + math.log(sum(math.exp(x - max(ts)) for x in ts)) - lse) if ts else inf
        best_other = max(out[:tb]) - lse
        if ts_mass > best_other:
            out[:tb] = [inf] * tb
    return out


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b", [1, 3, 7])
def test_rules_match_the_per_row_reference(tiny, b, device):
    tok, v = tiny.tokenizer, tiny.dims.n_vocab
    rules = LogitRules(tok, v, tiny.suppress_tokens, tiny.begin_suppress_tokens, device)
    suppress = set(torch.nonzero(rules.suppress).flatten().tolist())
    cpu_rules = rules if device == "cpu" else LogitRules(tok, v, tiny.suppress_tokens, tiny.begin_suppress_tokens, "cpu")
    begin = set(rules.begin_ids.tolist())
    tb = tok.timestamp_begin
    gen = torch.Generator().manual_seed(b)
    checked = 0
    for trial in range(40):
        st = SamplerState.allocate(b + 2, "cpu")  # more slots than rows: only rows 0..b-1 count
        n = torch.randint(0, 4, (b,), generator=gen)
        choices = torch.tensor([tok.eot - 5, 262, tb, tb + 3, tb + 40, tb + 120])  # text and timestamps
        last = choices[torch.randint(0, 6, (b,), generator=gen)]
        pen = choices[torch.randint(0, 6, (b,), generator=gen)]
        st.n_sampled[:b] = n
        st.last[:b] = torch.where(n >= 1, last, -1)
        st.penultimate[:b] = torch.where(n >= 2, pen, -1)
        stamps = torch.stack([torch.where(st.last[:b] >= tb, st.last[:b], -1),
                              torch.where(st.penultimate[:b] >= tb, st.penultimate[:b], -1)]).amax(0)
        st.last_timestamp[:b] = stamps
        st.timestamps[:b] = torch.rand(b, generator=gen) < 0.8
        # Logits scaled so that the timestamp-mass rule goes both ways over the trials.
        logits = torch.randn(b, v, generator=gen) * 3
        logits[:, tb:] += (trial % 5 - 2) * 2.0
        moved = SamplerState(*(getattr(st, f).to(device) for f in SamplerState.__dataclass_fields__))
        got = rules.apply(logits.to(device), moved).cpu()
        if device != "cpu":  # the same masks as on the CPU
            assert torch.equal(torch.isinf(got), torch.isinf(cpu_rules.apply(logits.clone(), st)))
        for row in range(b):
            want = reference(logits[row].tolist(), int(n[row]), int(st.last[row]), int(st.penultimate[row]),
                             int(st.last_timestamp[row]), bool(st.timestamps[row]), tok, suppress, begin)
            want = torch.tensor(want)
            assert torch.equal(torch.isinf(got[row]), torch.isinf(want)), (trial, row)
            finite = ~torch.isinf(want)
            assert torch.equal(got[row][finite], logits[row][finite])  # a rule only masks, never moves a logit
            checked += 1
    assert checked == 40 * b


def test_rules_without_timestamps_only_suppress(tiny):
    tok, v = tiny.tokenizer, tiny.dims.n_vocab
    rules = LogitRules(tok, v, tiny.suppress_tokens, tiny.begin_suppress_tokens, "cpu")
    st = SamplerState.allocate(2, "cpu")
    st.n_sampled[:] = torch.tensor([0, 3])
    logits = torch.randn(2, v)
    got = rules.apply(logits.clone(), st, timestamps=False)
    assert torch.isinf(got[0, tok.eot]) and not torch.isinf(got[1, tok.eot])  # EOT is blank only at the start
    assert torch.equal(torch.isinf(got[1]), rules.suppress)
    tokens, logprobs, _ = rules.sample(logits.clone(), st, None, timestamps=False)
    assert torch.equal(tokens, got.argmax(-1))
    torch.testing.assert_close(logprobs, got.log_softmax(-1).gather(1, tokens[:, None])[:, 0])
