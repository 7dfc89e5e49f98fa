"""Decoding rules as batched tensor operations: suppression, timestamp rules, sampling, and the
checks that drive temperature fallback.

Every rule reads per-row state tensors (`SamplerState`), never Python lists, so that a whole
decoder step, sampling included, runs on the device and can be captured in a CUDA graph; only the
sampled ids and their log-probabilities come back to the host.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from torch import Tensor

from streamer.model.tokenizer import Tokenizer

MAX_INITIAL_TIMESTAMP = 1.0  # seconds: the first timestamp may not be later (openai's default)
# Above this no-speech probability a window of at most SILENCE_WORDS words is silence even when its
# text is confidently decoded: Whisper's classic hallucination on silence ("you", "Thank you.")
# comes with a high log-prob (digital silence: 0.95). Longer text is kept: tiny.en scores some clear
# speech of long recordings at 0.77-0.91, so the probability alone would drop real words.
NO_SPEECH_CERTAIN = 0.9
SILENCE_WORDS = 2
NEG_INF = float("-inf")


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

    def reset(self, s: slice, timestamps: list[bool], temperature: list[float]) -> None:
        self.n_sampled[s] = 0
        self.last[s] = -1
        self.penultimate[s] = -1
        self.last_timestamp[s] = -1
        self.timestamps[s] = torch.tensor(timestamps, device=self.timestamps.device)
        self.temperature[s] = torch.tensor(temperature, dtype=torch.float32, device=self.temperature.device)

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


class LogitRules:
    """Which tokens may come next, for a batch of rows, from the tokenizer and model config."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int, suppress: list[int], begin_suppress: list[int], device):
        tok = tokenizer
        self.eot, self.ts_begin = tok.eot, tok.timestamp_begin
        self.no_timestamps = tok.no_timestamps
        ids = torch.arange(n_vocab, device=device)
        # Control tokens are never sampled: they would derail the transcript.
        specials = [tok.sot, tok.sot_prev, tok.translate, tok.transcribe, tok.no_speech, tok.sot_lm]
        always = set(suppress or tok.non_speech_tokens) | {t for t in specials if t is not None}
        self.suppress = torch.zeros(n_vocab, dtype=torch.bool, device=device)
        self.suppress[sorted(always)] = True
        self.begin_suppress = torch.zeros(n_vocab, dtype=torch.bool, device=device)
        self.begin_suppress[begin_suppress or tok.blank_tokens] = True
        self.is_timestamp = ids >= self.ts_begin
        self.is_text = ids < self.eot
        self.late_initial = ids > self.ts_begin + round(MAX_INITIAL_TIMESTAMP / 0.02)
        self.ids = ids

    def apply(self, logits: Tensor, st: SamplerState, timestamps: bool = True) -> Tensor:
        """Masked copy of `logits` [B, V] (float32) for rows in state `st` (rows 0..B-1).

        `timestamps=False` promises that no row has timestamp rules on, and skips them.
        """
        b = logits.shape[0]
        n, last, pen, last_ts = st.n_sampled[:b, None], st.last[:b, None], st.penultimate[:b, None], st.last_timestamp[:b, None]
        ts_on = st.timestamps[:b, None]
        at_begin = n == 0
        forbid = self.suppress[None] | (at_begin & self.begin_suppress[None])
        if not timestamps:
            return logits.masked_fill(forbid, NEG_INF)

        # Timestamp rules (openai/whisper's ApplyTimestampRules, vectorised): timestamps come in
        # pairs, never decrease, each segment is non-empty, and the first one comes within 1 s.
        last_ts_tok = (n >= 1) & (last >= self.ts_begin)
        pen_ts_tok = (n < 2) | (pen >= self.ts_begin)
        forbid_ts = last_ts_tok & pen_ts_tok
        forbid_text = last_ts_tok & ~pen_ts_tok
        lower = torch.where(last_ts_tok & ~pen_ts_tok, last_ts, last_ts + 1)
        decreasing = (last_ts >= 0) & self.is_timestamp[None] & (self.ids[None] < lower)
        ts_forbid = ((forbid_ts & self.is_timestamp[None]) | (forbid_text & self.is_text[None]) | decreasing
                     | (at_begin & (~self.is_timestamp[None] | self.late_initial[None])))
        ts_forbid = ts_forbid | (self.ids[None] == self.no_timestamps)
        forbid = forbid | (ts_on & ts_forbid)
        logits = logits.masked_fill(forbid, NEG_INF)

        # If the timestamps together are likelier than any text token, a timestamp comes next.
        logprobs = torch.log_softmax(logits, dim=-1)
        ts_mass = logprobs.masked_fill(~self.is_timestamp[None], NEG_INF).logsumexp(-1, keepdim=True)
        best_text = logprobs.masked_fill(self.is_timestamp[None], NEG_INF).amax(-1, keepdim=True)
        return logits.masked_fill(ts_on & (ts_mass > best_text) & ~self.is_timestamp[None], NEG_INF)

    def sample(self, logits: Tensor, st: SamplerState, noise: Tensor | None, timestamps: bool = True,
               top_k: int = 0) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
        """(tokens [B], their log-probabilities [B], top-k (log-probs, ids) [B, k] or None) after the
        rules; greedy where temperature is 0; the top-k candidates feed beam search.

        `noise` [B, V] uniform(0, 1) draws (made outside any CUDA graph) for the Gumbel-max trick.
        """
        b = logits.shape[0]
        logits = self.apply(logits, st, timestamps)
        logprobs = torch.log_softmax(logits, dim=-1)
        temp = st.temperature[:b, None]
        if noise is None:
            tokens = logits.argmax(-1)
        else:
            gumbel = -torch.log(-torch.log(noise.clamp_min(1e-20)))
            scores = torch.where(temp > 0, logits / temp.clamp_min(1e-6) + gumbel, logits)
            tokens = scores.argmax(-1)
        top = logprobs.topk(top_k, dim=-1) if top_k else None
        return tokens, logprobs.gather(1, tokens[:, None])[:, 0], (tuple(top) if top is not None else None)


def compression_ratio(text: str) -> float:
    """Bytes over zlib-compressed bytes: above ~2.4 the text repeats itself (a decoding loop)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def needs_fallback(ratio: float, avg_logprob: float, no_speech_prob: float, options, truncated: bool = True) -> bool:
    """openai/whisper's rule: retry hotter when the text loops (gzip compression `ratio` of the
    whole decoded text) or is improbable, unless it is silence.

    One change: a high compression ratio counts as a loop only when the decode ran to its token
    limit (`truncated`). Prompts, menus and meetings repeat whole phrases, and text that ended by
    itself is then speech, not a loop; retrying it hotter swapped it for samples that skip
    sentences (measured on the shared English prompts: docs/longform.md)."""
    if options.no_speech_threshold is not None and no_speech_prob > options.no_speech_threshold \
            and options.logprob_threshold is not None and avg_logprob < options.logprob_threshold:
        return False  # silence: an empty result is right, retrying would invent words
    if options.logprob_threshold is not None and avg_logprob < options.logprob_threshold:
        return True
    return truncated and options.compression_ratio_threshold is not None \
        and ratio > options.compression_ratio_threshold


def best_attempt(attempts: list, compression_ratio_threshold: float | None):
    """The result to keep when every temperature failed the fallback checks: the likeliest
    (average log-probability) of the attempts that do not look like a repetition loop, i.e. whose
    compression ratio is under the threshold or whose text ended by itself before the token limit
    (a loop runs to the limit; phrases that legitimately repeat end). faster-whisper keeps the best
    attempt too; openai/whisper keeps the last, hottest one."""
    threshold = compression_ratio_threshold
    unlooped = [r for r in attempts if threshold is None or r.compression_ratio <= threshold or not r.truncated]
    return max(unlooped or attempts, key=lambda r: r.avg_logprob)


def is_silence(avg_logprob: float, no_speech_prob: float, options, text: str | None = None) -> bool:
    """No speech: the no-speech probability is high and the text is not confidently decoded, or
    the no-speech probability is near certain and the text a word or two."""
    if options.no_speech_threshold is None or no_speech_prob <= options.no_speech_threshold:
        return False
    if text is not None and no_speech_prob > max(NO_SPEECH_CERTAIN, options.no_speech_threshold) \
            and len(text.split()) <= SILENCE_WORDS:
        return True
    return options.logprob_threshold is None or avg_logprob < options.logprob_threshold


def split_segments(tokens: list[int], tokenizer: Tokenizer, duration: float) -> list[tuple[float, float, list[int]]]:
    """(start, end, text tokens) per segment, from sampled tokens with timestamp pairs.

    Without timestamps the whole window is one segment of `duration` seconds.
    """
    tb = tokenizer.timestamp_begin
    if not any(t >= tb for t in tokens):
        return [(0.0, duration, [t for t in tokens if t < tokenizer.eot])] if tokens else []
    segments, start, text = [], None, []
    for prev, t in zip([None] + tokens[:-1], tokens):
        if t >= tb:
            if start is None:
                start = tokenizer.time_of(t)
            elif prev is not None and prev >= tb:
                start = tokenizer.time_of(t)  # a pair <|a|><|b|> closes nothing new: b opens the next
            else:
                segments.append((start, tokenizer.time_of(t), text))
                start, text = tokenizer.time_of(t), []
        elif t < tokenizer.eot:
            if start is None:
                start = 0.0
            text.append(t)
    if text:  # text after the last timestamp: it runs to the end of the audio
        segments.append((start or 0.0, max(duration, start or 0.0), text))
    return segments
