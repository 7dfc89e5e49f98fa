"""The fused sampler (cuda_ops/sampler.py, through `LogitRules.sample_fused`) against
`LogitRules.sample`'s PyTorch path on the CPU (CUDA, or Triton's interpreter on the CPU): the real
tiny.en tokenizer and vocabulary, random logits (fp16 and fp32, a padded row stride as the
projection leaves them) and random sampler states of odd batch sizes, with and without the
timestamp rules, greedy and sampled rows (Gumbel noise): the same tokens, the same masks, the same
log-probabilities to float32 rounding."""

from __future__ import annotations

import pytest
import torch

from streamer.model.logits import LogitRules, SamplerState
from streamer.model.weights import load_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny.en")


def _state(b, tok, gen):
    tb = tok.timestamp_begin
    st = SamplerState.allocate(b + 2, "cpu")
    n = torch.randint(0, 4, (b,), generator=gen)
    choices = torch.tensor([tok.eot - 5, 262, tb, tb + 3, tb + 40, tb + 120])
    st.n_sampled[:b] = n
    st.last[:b] = torch.where(n >= 1, choices[torch.randint(0, 6, (b,), generator=gen)], -1)
    st.penultimate[:b] = torch.where(n >= 2, choices[torch.randint(0, 6, (b,), generator=gen)], -1)
    st.last_timestamp[:b] = torch.stack([torch.where(st.last[:b] >= tb, st.last[:b], -1),
                                         torch.where(st.penultimate[:b] >= tb, st.penultimate[:b], -1)]).amax(0)
    st.timestamps[:b] = torch.rand(b, generator=gen) < 0.8
    st.temperature[:b] = torch.where(torch.rand(b, generator=gen) < 0.5, 0.0, torch.rand(b, generator=gen) + 0.2)
    return st


@pytest.mark.parametrize("b,dtype,timestamps,hot", [(1, torch.float32, True, False), (3, torch.float16, True, True),
                                                   (5, torch.float32, False, True), (4, torch.float16, False, False)])
def test_fused_sampler_equals_the_reference(tiny, b, dtype, timestamps, hot):
    tok, v = tiny.tokenizer, tiny.dims.n_vocab
    ref_rules = LogitRules(tok, v, tiny.suppress_tokens, tiny.begin_suppress_tokens, "cpu")
    rules = LogitRules(tok, v, tiny.suppress_tokens, tiny.begin_suppress_tokens, DEVICE)
    gen = torch.Generator().manual_seed(b * 10 + timestamps)
    tb = tok.timestamp_begin
    mass_first = 0
    for trial in range(6):
        st = _state(b, tok, gen)
        padded = torch.randn(b, v + 40, generator=gen) * 3  # a wider row: the projection's padded output
        padded[:, tb:v] += (trial % 3 - 1) * 3.0  # the timestamp-mass rule both ways
        logits = padded.to(dtype)[:, :v]
        gumbel = -torch.log(-torch.log(torch.rand(b, v, generator=gen).clamp_min(1e-20))) if hot else None
        want_tok, want_lp, want_every = ref_rules.sample(logits.clone(), st, gumbel, timestamps)
        moved = SamplerState(*(getattr(st, f).to(DEVICE) for f in SamplerState.__dataclass_fields__))
        out = torch.full((b, v), 7.0, device=DEVICE)
        got_tok, got_lp, got_every = rules.sample_fused(padded.to(dtype).to(DEVICE)[:, :v], moved,
                                                        None if gumbel is None else gumbel.to(DEVICE), timestamps,
                                                        logprobs_out=out)
        assert got_every.data_ptr() == out.data_ptr()
        assert torch.equal(got_tok.cpu(), want_tok), (trial, got_tok, want_tok)
        got_every = got_every.cpu()
        assert torch.equal(torch.isinf(got_every), torch.isinf(want_every))  # the same masks
        finite = ~torch.isinf(want_every)
        torch.testing.assert_close(got_every[finite], want_every[finite], rtol=0, atol=2e-5)
        torch.testing.assert_close(got_lp.cpu(), want_lp, rtol=0, atol=2e-5)
        mass_first += int(torch.isinf(want_every[:, :tb]).all(-1).sum())
    if timestamps:
        assert mass_first > 0  # some row had its text masked by the rules (the mass rule or a begin)


def test_the_reference_path_upcasts_fp16_logits(tiny):
    rules = LogitRules(tiny.tokenizer, tiny.dims.n_vocab, tiny.suppress_tokens, tiny.begin_suppress_tokens, "cpu")
    st = SamplerState.allocate(2, "cpu")
    logits = torch.randn(2, tiny.dims.n_vocab).half()  # fp16 logits: the reference path upcasts
    tokens, lp, every = rules.sample(logits, st, None)
    assert every.dtype == torch.float32 and torch.equal(tokens, every.argmax(-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused sampler runs on CUDA (Triton JIT)")
def test_the_engine_compiles_every_sampler_variant_before_it_serves():
    """Each Triton variant compiles on first use (~1 s, the engine thread and every stream waiting):
    `Runner.warmup` samples in every form a step or a prefill may take, so none compiles later."""
    import triton

    from streamer.config import ModelConfig
    from streamer.engine.engine import Engine

    engine = Engine.load(ModelConfig(model="tiny.en", device="cuda"))
    runner = engine.runner
    compiled = []
    triton.knobs.runtime.jit_post_compile_hook = lambda *a, **k: compiled.append(repr((a, k)))
    try:
        dec, V = runner.model.decoder, runner.dims.n_vocab
        hidden = torch.randn(2, dec.token_embedding.weight.shape[1], device="cuda").to(dec.token_embedding.weight.dtype)
        # logits as a step and a prefill leave them, the state's rows at slots of every alignment
        for logits in (dec.logits(hidden, upcast=False), dec.logits(hidden)):
            for lo in (0, 1, 2, 3, 4):
                for timestamps in (True, False):
                    for gumbel in (None, torch.randn(2, V, device="cuda")):
                        runner.rules.sample(logits, runner.state.rows(slice(lo, lo + 2)), gumbel, timestamps)
        assert not [c for c in compiled if "_sample_kernel" in c], compiled
        # the hook does see a compile: a form no step takes (bfloat16 logits) compiles here
        runner.rules.sample(torch.randn(2, V, device="cuda").to(torch.bfloat16), runner.state.rows(slice(0, 2)), None, True)
        assert [c for c in compiled if "_sample_kernel" in c]
    finally:
        triton.knobs.runtime.jit_post_compile_hook = None
        engine.close()
