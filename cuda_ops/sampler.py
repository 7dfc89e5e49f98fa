"""A decode step's sampling in one kernel: the logit rules, log-softmax and the (Gumbel-)argmax.

`model/logits.py`'s `LogitRules.sample` is the reference: per-row rule flags applied with PyTorch
ops, then `log_softmax`, `argmax` and a gather. In a captured large-v3 step at 128 rows those are
~30 launches and ~10 passes over the [B, 51,866] float32 logits (each ~26 MB read and written):
~0.2 ms of a 10-ms step on the H200 (session 16, `profile_step.py`), ~0.4 ms at 256 rows, and a larger
share of small models' steps. Here one program per row reads the projection's output (fp16 or fp32,
any row stride) three times from L2 and writes only what the step needs:

1. (timestamp rules on) the masked logits' largest non-timestamp value and the timestamps'
   logsumexp: a timestamp must come next when their mass wins;
2. the final logits' max and sum of exponentials (online) and the argmax of the logits, or of
   logits / temperature + Gumbel noise for sampled rows (first index on ties, as torch.argmax);
3. every token's log-probability into the step's shared buffer (beam search reads it).

The masks are `LogitRules.apply`'s, rule for rule (suppressed and begin-suppressed ids, the
timestamp pairing, monotonicity, the first-timestamp limit, the mass rule); `tests/test_logit_rules.py`
checks the kernel against the reference (the CPU runs it through Triton's interpreter).
"""

from __future__ import annotations

import torch
from torch import Tensor

from cuda_ops._triton import jit, tl, triton

BLOCK = 2048
NUM_WARPS = 16


def sample_triton(logits: Tensor, suppress: Tensor, begin_ids: Tensor, n_sampled: Tensor, last: Tensor,
                  penultimate: Tensor, last_timestamp: Tensor, timestamps_on: Tensor, temperature: Tensor,
                  gumbel: Tensor | None, eot: int, timestamp_begin: int, no_timestamps: int, latest_initial: int,
                  timestamps: bool = True, logprobs_out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(tokens [B] int64, their log-probabilities [B] float32, every token's [B, V] float32) for the
    rows of `logits` [B, V] (any float dtype, columns contiguous) and the per-row state tensors
    (`SamplerState`'s fields, rows 0..B-1), as `LogitRules.sample` returns them."""
    B, V = logits.shape
    if logits.stride(1) != 1 or suppress.shape != (V,):
        raise ValueError(f"need logits [B, {V}] with contiguous columns and a suppress mask [{V}]")
    every = torch.empty(B, V, dtype=torch.float32, device=logits.device) if logprobs_out is None else logprobs_out
    if every.shape != (B, V) or every.stride(1) != 1:
        raise ValueError(f"logprobs_out must be [{B}, {V}] float32 with contiguous columns")
    tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
    token_lp = torch.empty(B, dtype=torch.float32, device=logits.device)
    g = gumbel if gumbel is not None else every  # a placeholder, never read
    _sample_kernel[(B,)](
        logits, logits.stride(0), g, g.stride(0), suppress.view(torch.uint8), begin_ids,
        n_sampled, last, penultimate, last_timestamp, timestamps_on.view(torch.uint8), temperature,
        tokens, token_lp, every, every.stride(0), V, eot, timestamp_begin, no_timestamps, latest_initial,
        N_BEGIN=begin_ids.numel(), TIMESTAMPS=timestamps, HAS_GUMBEL=gumbel is not None, BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return tokens, token_lp, every


if triton is not None:

    @jit
    def _masked(row, suppress_ptr, begin_ptr, cols, V, at_begin, eot, tb, no_ts, late, ts_on, after_pair,
                text_off, begin, decr_on, lower, N_BEGIN: tl.constexpr, TIMESTAMPS: tl.constexpr):
        """The logits of columns `cols` after LogitRules.apply's masks (before the mass rule), fp32."""
        ok = cols < V
        x = tl.load(row + cols, mask=ok, other=float("-inf")).to(tl.float32)
        off = (tl.load(suppress_ptr + cols, mask=ok, other=1) != 0) | (cols >= V)
        for j in tl.static_range(N_BEGIN):
            off = off | (at_begin & (cols == tl.load(begin_ptr + j)))
        if TIMESTAMPS:
            is_ts = cols >= tb
            off = off | ((cols < eot) & text_off) | ((cols >= eot) & (cols < tb) & begin)
            off = off | ((cols == no_ts) & ts_on)
            off = off | (is_ts & (after_pair | (decr_on & (cols < lower)) | (begin & (cols > late))))
        return tl.where(off, float("-inf"), x)

    # The per-row state is read at the slots' offset (a prefill's rows start at any slot): no
    # variant per pointer alignment, which would compile (~1 s) the first time a new one comes.
    @jit(do_not_specialize=["n_ptr", "last_ptr", "pen_ptr", "last_ts_ptr", "ts_on_ptr", "temp_ptr"])
    def _sample_kernel(
        logits_ptr, stride_l, gumbel_ptr, stride_g, suppress_ptr, begin_ptr,
        n_ptr, last_ptr, pen_ptr, last_ts_ptr, ts_on_ptr, temp_ptr,
        tokens_ptr, token_lp_ptr, lp_ptr, stride_lp, V, eot, tb, no_ts, late,
        N_BEGIN: tl.constexpr, TIMESTAMPS: tl.constexpr, HAS_GUMBEL: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        row = logits_ptr + b.to(tl.int64) * stride_l
        n = tl.load(n_ptr + b)
        at_begin = n == 0
        ts_on = tl.load(ts_on_ptr + b) != 0
        last = tl.load(last_ptr + b)
        pen = tl.load(pen_ptr + b)
        last_ts = tl.load(last_ts_ptr + b)
        last_ts_tok = (n >= 1) & (last >= tb)
        pen_ts_tok = (n < 2) | (pen >= tb)
        after_pair = ts_on & last_ts_tok & pen_ts_tok  # a segment just closed: text or EOT next
        open_seg = last_ts_tok & (pen_ts_tok == 0)  # a lone timestamp: another one must follow
        begin = ts_on & at_begin
        text_off = (ts_on & open_seg) | begin
        decr_on = ts_on & (last_ts >= 0)
        lower = tl.where(open_seg, last_ts, last_ts + 1)
        offs = tl.arange(0, BLOCK)
        neg = float("-inf")

        ts_first = n < 0  # False: no mass rule without the timestamp rules
        if TIMESTAMPS:  # 1. the timestamp-mass rule's two sides
            top_other = tl.full((BLOCK,), neg, tl.float32)
            m_ts = tl.full((BLOCK,), neg, tl.float32)
            s_ts = tl.zeros((BLOCK,), tl.float32)
            for c0 in range(0, V, BLOCK):
                cols = c0 + offs
                v = _masked(row, suppress_ptr, begin_ptr, cols, V, at_begin, eot, tb, no_ts, late, ts_on, after_pair,
                            text_off, begin, decr_on, lower, N_BEGIN, TIMESTAMPS)
                top_other = tl.maximum(top_other, tl.where(cols < tb, v, neg))
                t = tl.where(cols >= tb, v, neg)
                m_new = tl.maximum(m_ts, t)
                shift = tl.where(m_new == neg, 0.0, m_new)  # an all -inf lane stays at sum 0
                s_ts = s_ts * tl.exp(m_ts - shift) + tl.exp(t - shift)
                m_ts = m_new
            m_row = tl.max(m_ts, axis=0)
            m_row = tl.where(m_row == neg, 0.0, m_row)
            total = tl.sum(s_ts * tl.exp(m_ts - m_row), axis=0)
            lse_ts = tl.where(total > 0, m_row + tl.log(total), neg)
            ts_first = ts_on & (lse_ts > tl.max(top_other, axis=0))

        # 2. log-softmax statistics and the argmax
        temp = tl.load(temp_ptr + b)
        hot = HAS_GUMBEL & (temp > 0)
        t_div = tl.maximum(temp, 1e-6)
        m_all = tl.full((BLOCK,), neg, tl.float32)
        s_all = tl.zeros((BLOCK,), tl.float32)
        best = tl.full((BLOCK,), neg, tl.float32)
        best_col = tl.full((BLOCK,), 2147483647, tl.int32)
        for c0 in range(0, V, BLOCK):
            cols = c0 + offs
            v = _masked(row, suppress_ptr, begin_ptr, cols, V, at_begin, eot, tb, no_ts, late, ts_on, after_pair,
                        text_off, begin, decr_on, lower, N_BEGIN, TIMESTAMPS)
            v = tl.where(ts_first & (cols < tb), neg, v)
            m_new = tl.maximum(m_all, v)
            shift = tl.where(m_new == neg, 0.0, m_new)
            s_all = s_all * tl.exp(m_all - shift) + tl.exp(v - shift)
            m_all = m_new
            score = v
            if HAS_GUMBEL:
                g = tl.load(gumbel_ptr + b.to(tl.int64) * stride_g + cols, mask=cols < V, other=0.0)
                score = tl.where(hot, tl.div_rn(v, t_div) + g, v)  # IEEE division, as the reference
            better = score > best  # each lane sees its columns in increasing order: the first max wins
            best_col = tl.where(better, cols, best_col)
            best = tl.where(better, score, best)
        m_row = tl.max(m_all, axis=0)
        m_row = tl.where(m_row == neg, 0.0, m_row)
        lse = m_row + tl.log(tl.sum(s_all * tl.exp(m_all - m_row), axis=0))
        top = tl.max(best, axis=0)
        token = tl.min(tl.where(best == top, best_col, 2147483647), axis=0)
        token = tl.where(token == 2147483647, 0, token)  # every column masked (never in practice): 0, as argmax
        tok_v = _masked(row, suppress_ptr, begin_ptr, token, V, at_begin, eot, tb, no_ts, late, ts_on, after_pair,
                        text_off, begin, decr_on, lower, N_BEGIN, TIMESTAMPS)
        tok_v = tl.where(ts_first & (token < tb), neg, tok_v)
        tl.store(tokens_ptr + b, token.to(tl.int64))
        tl.store(token_lp_ptr + b, tok_v - lse)

        # 3. every token's log-probability
        out = lp_ptr + b.to(tl.int64) * stride_lp
        for c0 in range(0, V, BLOCK):
            cols = c0 + offs
            v = _masked(row, suppress_ptr, begin_ptr, cols, V, at_begin, eot, tb, no_ts, late, ts_on, after_pair,
                        text_off, begin, decr_on, lower, N_BEGIN, TIMESTAMPS)
            v = tl.where(ts_first & (cols < tb), neg, v)
            tl.store(out + cols, v - lse, mask=cols < V)
