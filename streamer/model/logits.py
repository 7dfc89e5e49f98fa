"""Decoding rules as batched tensor operations: suppression, timestamp rules, sampling.

Every rule reads per-row state tensors (`SamplerState`), never Python lists, so that a whole
decoder step, sampling included, runs on the device and can be captured in a CUDA graph; only the
sampled ids and their log-probabilities come back to the host. The options and the verdict on a
result are in `decoding.py` (no torch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from cuda_ops._triton import triton_usable
from cuda_ops import sampler as fused_sampler
from streamer.model.tokenizer import MAX_INITIAL_TIMESTAMP, Tokenizer

NEG_INF = float("-inf")
FUSED_SAMPLER = os.environ.get("STREAMER_FUSED_SAMPLER", "1") == "1"
"""`sample` on CUDA through cuda_ops/sampler.py's one kernel instead of ~30 PyTorch launches: a captured
large-v3 step 0.05-0.38 ms shorter at 1-256 rows on the H200, the same transcripts (session 17,
`gpu_s17.sh`, benchmarks/README.md). STREAMER_FUSED_SAMPLER=0 for the PyTorch path (A/B)."""


@dataclass
class SamplerState:
    """Per-row (slot) state of the logit rules, [S] tensors on the model's device."""

    n_sampled: Tensor  # tokens sampled so far (0 before the first)
    last: Tensor  # last sampled token (or -1)
    penultimate: Tensor  # the one before (or -1)
    last_timestamp: Tensor  # largest timestamp token sampled (or -1)
    timestamps: Tensor  # bool: timestamp rules on for this row
    temperature: Tensor  # float32; 0 is greedy

    @classmethod
    def allocate(cls, n: int, device) -> "SamplerState":
        long = dict(dtype=torch.long, device=device)
        return cls(torch.zeros(n, **long), torch.full((n,), -1, **long), torch.full((n,), -1, **long),
                   torch.full((n,), -1, **long), torch.zeros(n, dtype=torch.bool, device=device),
                   torch.zeros(n, dtype=torch.float32, device=device))

    def rows(self, s: slice) -> "SamplerState":
        return SamplerState(*(getattr(self, f)[s] for f in self.__dataclass_fields__))

    def reset(self, s: slice, timestamps: Tensor, temperature: Tensor) -> None:
        """Rows `s` start a new sequence; `timestamps` (bool) and `temperature` are per row, [len]
        tensors on the state's device (copied there without a host sync by the caller)."""
        self.n_sampled[s] = 0
        self.last[s] = -1
        self.penultimate[s] = -1
        self.last_timestamp[s] = -1
        self.timestamps[s] = timestamps
        self.temperature[s] = temperature

    def follow(self, row: int, tokens: list[int], timestamp_begin: int) -> None:
        """Row `row` goes on after forced `tokens` (a prefix) as if it had sampled them, so that the
        timestamp rules hold across the join (pairs, no decrease) and the first-token rules do not
        apply again."""
        if not tokens:
            return
        stamps = [t for t in tokens if t >= timestamp_begin]
        self.n_sampled[row] = len(tokens)
        self.last[row] = tokens[-1]
        self.penultimate[row] = tokens[-2] if len(tokens) > 1 else -1
        self.last_timestamp[row] = max(stamps) if stamps else -1

    def move_rows(self, src, dst) -> None:
        """Copy rows `src` (a tensor of indices) into rows `dst` (disjoint from them)."""
        for f in self.__dataclass_fields__:
            t = getattr(self, f)
            t[dst] = t[src]

    def advance(self, tokens: Tensor, timestamp_begin: int) -> None:
        """Record the sampled `tokens` [B] (rows 0..B-1), in place."""
        b = tokens.shape[0]
        self.penultimate[:b] = self.last[:b]
        self.last[:b] = tokens
        self.n_sampled[:b] += 1
        ts = torch.where(tokens >= timestamp_begin, tokens, torch.full_like(tokens, -1))
        self.last_timestamp[:b] = torch.maximum(self.last_timestamp[:b], ts)


def gumbel_(row: Tensor, generator: torch.Generator) -> Tensor:
    """Fill `row` in place with Gumbel(0, 1) draws from `generator`: -log(-log(u)), u uniform."""
    return row.uniform_(generator=generator).clamp_min_(1e-20).log_().neg_().log_().neg_()


class LogitRules:
    """Which tokens may come next, for a batch of rows, from the tokenizer and model config."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int, suppress: list[int], begin_suppress: list[int], device):
        tok = tokenizer
        self.eot, self.ts_begin = tok.eot, tok.timestamp_begin
        self.no_timestamps = tok.no_timestamps
        # Control tokens are never sampled: they would derail the transcript.
        specials = [tok.sot, tok.sot_prev, tok.translate, tok.transcribe, tok.no_speech, tok.sot_lm]
        always = set(suppress or tok.non_speech_tokens) | {t for t in specials if t is not None}
        self.suppress = torch.zeros(n_vocab, dtype=torch.bool, device=device)
        self.suppress[sorted(always)] = True
        self.begin_ids = torch.tensor(sorted(set(begin_suppress or tok.blank_tokens)), device=device)
        # The timestamp tokens' ids [1, T], and which of them may not come first (later than 1 s).
        self.ts_ids = torch.arange(self.ts_begin, n_vocab, device=device)[None]
        self.latest_initial = self.ts_begin + round(MAX_INITIAL_TIMESTAMP / 0.02)
        self.late_initial = self.ts_ids > self.latest_initial

    def apply(self, logits: Tensor, st: SamplerState, timestamps: bool = True) -> Tensor:
        """Masked copy of `logits` [B, V] (float32) for rows in state `st` (rows 0..B-1).

        `timestamps=False` promises that no row has timestamp rules on, and skips them.
        Each rule is a per-row flag applied to the column range it concerns (text, specials, or the
        1,501 timestamps), so that a step makes few passes over the vocabulary: on the CPU every
        [B, V] pass costs about as much as a decoder layer.
        """
        b = logits.shape[0]
        n = st.n_sampled[:b, None]
        at_begin = n == 0
        logits = logits.masked_fill(self.suppress, NEG_INF)
        begin_cols = self.begin_ids.expand(b, -1)  # gather/scatter: no host sync inside a CUDA graph
        logits.scatter_(1, begin_cols, logits.gather(1, begin_cols).masked_fill(at_begin, NEG_INF))
        if not timestamps:
            return logits

        # Timestamp rules (openai/whisper's ApplyTimestampRules, vectorised): timestamps come in
        # pairs, never decrease, each segment is non-empty, and the first one comes within 1 s.
        tb = self.ts_begin
        last, pen, last_ts = st.last[:b, None], st.penultimate[:b, None], st.last_timestamp[:b, None]
        ts_on = st.timestamps[:b, None]
        last_ts_tok = (n >= 1) & (last >= tb)
        pen_ts_tok = (n < 2) | (pen >= tb)
        after_pair = ts_on & last_ts_tok & pen_ts_tok  # a segment just closed: text or EOT next
        open_segment = last_ts_tok & ~pen_ts_tok  # a lone timestamp: another one must follow
        begin = ts_on & at_begin  # the first token is a timestamp
        lower = torch.where(open_segment, last_ts, last_ts + 1)
        logits[:, :self.eot].masked_fill_((ts_on & open_segment) | begin, NEG_INF)
        logits[:, self.eot:tb].masked_fill_(begin, NEG_INF)
        logits[:, self.no_timestamps].masked_fill_(ts_on[:, 0], NEG_INF)
        ts = logits[:, tb:]
        decreasing = ts_on & (last_ts >= 0) & (self.ts_ids < lower)
        ts.masked_fill_(after_pair | decreasing | (begin & self.late_initial), NEG_INF)

        # If the timestamps together are likelier than any other token, a timestamp comes next
        # (compared in logits: log-probabilities differ from them by the same normaliser).
        others = logits[:, :tb]
        ts_first = ts_on & (ts.logsumexp(-1, keepdim=True) > others.amax(-1, keepdim=True))
        others.masked_fill_(ts_first, NEG_INF)
        return logits

    def sample(self, logits: Tensor, st: SamplerState, gumbel: Tensor | None, timestamps: bool = True,
               logprobs_out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(tokens [B], their log-probabilities [B], every token's log-probability [B, V]) after the
        rules; greedy where temperature is 0. The caller takes top-k candidates (beam search) from
        the last, and only when it needs them: a top-k over the vocabulary was ~0.2 ms of every
        captured large-v3 step at 256 rows (H200), beams or not.

        `gumbel` [B, V]: Gumbel(0, 1) draws (`gumbel_`, made outside any CUDA graph) for the
        rows sampled at a temperature (the Gumbel-max trick); other rows' values are ignored.
        `logprobs_out` ([B, V] float32): where the log-probabilities go (a buffer shared by every
        captured step), instead of a new tensor.
        """
        b = logits.shape[0]
        if FUSED_SAMPLER and logits.is_cuda and triton_usable(logits.device):
            return self.sample_fused(logits, st, gumbel, timestamps, logprobs_out)
        logits = self.apply(logits.float(), st, timestamps)
        logprobs = torch.log_softmax(logits, dim=-1, out=logprobs_out)
        temp = st.temperature[:b, None]
        if gumbel is None:
            tokens = logits.argmax(-1)
        else:
            tokens = torch.where(temp > 0, logits / temp.clamp_min(1e-6) + gumbel, logits).argmax(-1)
        return tokens, logprobs.gather(1, tokens[:, None])[:, 0], logprobs

    def sample_fused(self, logits: Tensor, st: SamplerState, gumbel: Tensor | None, timestamps: bool = True,
                     logprobs_out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """`sample` through cuda_ops/sampler.py's kernel (on CUDA, or the CPU under TRITON_INTERPRET=1):
        logits in any float dtype, read once per pass instead of ~10 PyTorch passes."""
        b = logits.shape[0]
        return fused_sampler.sample_triton(logits, self.suppress, self.begin_ids, st.n_sampled[:b], st.last[:b], st.penultimate[:b],
                             st.last_timestamp[:b], st.timestamps[:b], st.temperature[:b], gumbel, self.eot,
                             self.ts_begin, self.no_timestamps, self.latest_initial, timestamps, logprobs_out)
