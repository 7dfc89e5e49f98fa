"""Word timestamps: where each decoded word lies in its window's audio.

openai/whisper's method. A few cross-attention heads of the decoder (the model's
`alignment_heads`) look at the audio frames where the token being predicted is spoken. We rerun the
model once over a window's whole text (the encoder, then one full-sequence decoder pass with a
causal mask), keep those heads' attention weights, normalise them, and find the
cheapest monotonic path from the first token to the last through the token x frame matrix (dynamic
time warping). The frame where the path first reaches a token's row is when that token starts.

The pass is the model's own decoder (whichever blocks it holds) over a `PassCache` instead of
slots, asked for those heads' logits (`cross_qk_heads`). It must run on the model's thread: callers
go through `engine.call(find_word_timings, ...)`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from streamer.audio import HOP_LENGTH, SAMPLE_RATE
from streamer.audio.features import log_mel_spectrogram
from streamer.model.weights import LoadedModel
from streamer.model.whisper import PassCache
from streamer.model.timing import MAX_BATCH, MAX_WORD_S, AlignmentItem, WordTiming

FRAMES_PER_SECOND = SAMPLE_RATE // (2 * HOP_LENGTH)
"""Encoder frames per second (50: the encoder's second convolution halves the 100 mel frames)."""
SAMPLES_PER_FRAME = 2 * HOP_LENGTH
MEDIAN_FILTER_WIDTH = 7
"""Frames (140 ms) of the median filter over each head's weights: removes one-frame spikes."""
SENTENCE_END = ".。!！?？"
PREPEND_PUNCTUATION = "\"'“¿([{-"
"""Marks that belong to the word after them (opening quotes and brackets)."""
APPEND_PUNCTUATION = "\"'.。,，!！?？:：”)]}、"
"""Marks that belong to the word before them."""


@torch.inference_mode()
def find_word_timings(loaded: LoadedModel, items: list[AlignmentItem], language: str | None = "en",
                      task: str = "transcribe") -> list[list[WordTiming]]:
    """Word timings of each item's tokens; one forward pass per MAX_BATCH windows.

    `language` and `task` rebuild the start-of-transcript sequence the text was decoded after
    (multilingual models only). Items without tokens get no words.
    """
    out: list[list[WordTiming]] = [[] for _ in items]
    todo = [i for i, item in enumerate(items) if item.tokens]
    for k in range(0, len(todo), MAX_BATCH):
        batch = todo[k:k + MAX_BATCH]
        for i, timings in zip(batch, _align_batch(loaded, [items[i] for i in batch], language, task)):
            out[i] = timings
    return out


def _align_batch(loaded: LoadedModel, items: list[AlignmentItem], language: str | None, task: str) -> list[list[WordTiming]]:
    tok, model = loaded.tokenizer, loaded.model
    param = next(model.decoder.parameters())
    sot = tok.sot_sequence(language or "en", task, timestamps=False)  # ends with <|notimestamps|>
    rows = [sot + item.tokens + [tok.eot] for item in items]
    length = max(len(r) for r in rows)
    tokens = torch.full((len(rows), length), tok.eot, dtype=torch.long)
    for b, r in enumerate(rows):
        tokens[b, :len(r)] = torch.tensor(r)
    mel = log_mel_spectrogram([item.audio for item in items], loaded.dims.n_mels, device=param.device)
    weights, hidden = _cross_attention(loaded, mel.to(param.dtype), tokens.to(param.device))

    results = []
    first = len(sot) - 1  # the row that predicts the first text token (query at <|notimestamps|>)
    for b, item in enumerate(items):
        n_text = len(item.tokens)
        n_frames = max(1, min(len(item.audio) // SAMPLES_PER_FRAME, weights.shape[-1]))
        # Rows predicting each text token and then end-of-text: n_text + 1 rows.
        w = weights[b, :, first:first + n_text + 1, :n_frames].softmax(dim=-1)
        std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)
        w = median_filter((w - mean) / std.clamp_min(1e-8), MEDIAN_FILTER_WIDTH)
        matrix = w.mean(dim=0).double().cpu().numpy()  # [n_text + 1, n_frames]

        logits = model.decoder.logits(hidden[b, first:first + n_text])[:, :tok.eot]
        probs = logits.softmax(dim=-1).gather(1, torch.tensor(item.tokens, device=logits.device)[:, None])[:, 0]
        results.append(_word_timings(tok, matrix, item.tokens, probs.float().cpu().numpy()))
    return results


def _cross_attention(loaded: LoadedModel, mel: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Pre-softmax cross-attention logits of the alignment heads [B, A, T, 1500] (float32) and the
    decoder's hidden states [B, T, D], for `tokens` [B, T] over the windows' `mel` [B, n_mels, 3000].

    Rows are padded at the end; the causal mask keeps padding out of every real position.
    """
    model = loaded.model
    audio = model.encoder(mel)  # [B, 1500, D]
    b, t = tokens.shape
    positions = torch.arange(t, device=tokens.device).expand(b, t)
    hidden, qk = model.decoder(tokens, positions, 0, PassCache(model.decoder, audio, t), t,
                               cross_qk_heads=loaded.alignment_heads)
    return qk, hidden


def median_filter(x: Tensor, width: int) -> Tensor:
    """Median over a sliding window of `width` (odd) along the last axis, edges reflected."""
    pad = width // 2
    if x.shape[-1] <= pad:  # reflection needs more frames than the padding
        return x
    flat = x.reshape(-1, 1, x.shape[-1])
    padded = F.pad(flat, (pad, pad), mode="reflect")
    return padded.unfold(-1, width, 1).median(dim=-1).values.reshape(x.shape)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest path through `cost` [N, M] from (0, 0) to (N-1, M-1) that moves one row down,
    one column right, or both at each step: (row indices, column indices) along it.

    The accumulated cost obeys acc[i, j] = cost[i, j] + min(acc[i-1, j-1], acc[i-1, j], acc[i, j-1]).
    Within a row the last term chains left to right; unrolled, acc[i, j] is the prefix sum of the
    row up to j plus a running minimum of (best entry from the row above at k) - (prefix sum before
    k), so each row is a handful of vectorised numpy operations instead of M Python steps.
    """
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, n + 1):
        from_above = np.minimum(acc[i - 1, :-1], acc[i - 1, 1:])  # enter column j from row i-1
        prefix = np.concatenate(([0.0], np.cumsum(cost[i - 1])))
        acc[i, 1:] = prefix[1:] + np.minimum.accumulate(from_above - prefix[:-1])
    rows, cols = [], []
    i, j = n, m
    while i > 0 and j > 0:  # the borders are infinite except acc[0, 0]: the walk ends at (1, 1)
        rows.append(i - 1)
        cols.append(j - 1)
        diag, up, left = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        if diag <= up and diag <= left:
            i, j = i - 1, j - 1
        elif up <= left:
            i -= 1
        else:
            j -= 1
    return np.array(rows[::-1]), np.array(cols[::-1])


def _word_timings(tok, matrix: np.ndarray, tokens: list[int], probs: np.ndarray) -> list[WordTiming]:
    rows, cols = dtw(-matrix)
    entered = np.concatenate(([True], np.diff(rows) > 0))
    times = cols[entered] / FRAMES_PER_SECOND  # when the path reaches each row: [n_text + 1]
    words, groups = tok.split_words(tokens)
    bounds = np.cumsum([0] + [len(g) for g in groups])
    starts, ends = times[bounds[:-1]].copy(), times[bounds[1:]].copy()
    timings = [WordTiming(w, g, float(s), float(e), float(probs[a:b].mean()))
               for w, g, s, e, a, b in zip(words, groups, starts, ends, bounds[:-1], bounds[1:])]
    _trim_at_sentence_ends(timings)
    return merge_punctuation(timings)


def _trim_at_sentence_ends(timings: list[WordTiming]) -> None:
    """A pause after a sentence shows up as one very long word on either side of it (the attention
    has nothing to follow there); cap such words at twice the median word length."""
    durations = [t.end - t.start for t in timings if t.end > t.start]
    if not durations:
        return
    longest = 2 * min(MAX_WORD_S, float(np.median(durations)))
    for prev, cur in zip(timings, timings[1:]):
        if cur.end - cur.start > longest:
            if cur.word.strip() in SENTENCE_END:
                cur.end = cur.start + longest
            elif prev.word.strip() in SENTENCE_END:
                cur.start = cur.end - longest


def merge_punctuation(timings: list[WordTiming]) -> list[WordTiming]:
    """Attach standalone punctuation to its word: closing marks to the word before them, a spaced
    opening mark (` (`, ` "`) to the word after it, whose times it takes."""
    merged: list[WordTiming] = []
    for t in timings:
        if merged and not t.word.startswith(" ") and _only(t.word, APPEND_PUNCTUATION):
            p = merged[-1]
            merged[-1] = WordTiming(p.word + t.word, p.tokens + t.tokens, p.start, p.end, p.probability)
        elif merged and merged[-1].word.startswith(" ") and _only(merged[-1].word.strip(), PREPEND_PUNCTUATION):
            p = merged.pop()
            merged.append(WordTiming(p.word + t.word, p.tokens + t.tokens, t.start, t.end, t.probability))
        else:
            merged.append(t)
    return merged


def _only(text: str, marks: str) -> bool:
    return bool(text) and all(c in marks for c in text)
