"""How to decode a window (`DecodeOptions`) and the one verdict on what came back (`judge`):
silence, repetition loop, poor decode, whether to retry hotter, and whether the text may prompt
the next window. No torch here: the scheduler and the sessions read these types on the CPU alone.
The batched logit rules that run on the device are in `logits.py`.

Every consumer (the engine's temperature fallback, live prompts, long-form seeking) reads the
`Verdict` carried on the result (`Result.verdict`) instead of judging again with its own copy of
the thresholds; the thresholds are the request's own (`DecodeOptions`).
"""

from __future__ import annotations

import string
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamer.model.tokenizer import Tokenizer

TASKS = ("transcribe", "translate")

# Above this no-speech probability a window of at most SILENCE_WORDS words is silence even when its
# text is confidently decoded: Whisper's classic hallucination on silence ("you", "Thank you.")
# comes with a high log-prob (digital silence: 0.95). Longer text is kept: tiny.en scores some clear
# speech of long recordings at 0.77-0.91, so the probability alone would drop real words.
NO_SPEECH_CERTAIN = 0.9
SILENCE_WORDS = 2
# A phrase repeated back to back this many times, over at least this many words, is a loop even
# when the decode ended by itself: the gzip ratio needs a few hundred bytes to see a repetition, a
# live utterance's text is often shorter ("Montreal forced a liner." x 3 compresses to 1.9).
# Speech repeats phrases too, but rarely three times in a row.
REPEAT_MIN_TIMES = 3
REPEAT_MIN_WORDS = 8
CONDITION_MAX_TEMPERATURE = 0.5
"""openai/whisper's rule: text that needed a hotter retry than this does not prompt the next window."""
STYLE_PUNCTUATION = frozenset(".,?!¿¡;:")
"""Marks of Whisper's written style in cased scripts (`unstyled`)."""


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode one window; the defaults are openai/whisper's `transcribe()` defaults."""

    task: str = "transcribe"
    """`transcribe` in the spoken language, or `translate` to English."""
    language: str | None = None
    """Language code such as `en`; None detects it from the audio."""
    prompt: str | None = None
    """Previous text to condition on (Whisper's `<|startofprev|>` context)."""
    prompt_tokens: tuple[int, ...] | None = None
    """Previous tokens fed verbatim after `<|startofprev|>` instead of `prompt` (the last 223 are
    kept), timestamp tokens included, as openai/whisper's long-form loop feeds its own output back."""
    prefix: str | None = None
    """Text forced at the start of this window's output."""
    prefix_tokens: tuple[int, ...] | None = None
    """Tokens forced at the start of this window's output, timestamps included, as if the decoder
    had sampled them: the timestamp rules continue after them and the result holds only what
    follows (a live final decoded inside the stream's preceding audio, `streaming/session.py`)."""
    timestamps: bool = False
    """Predict segment timestamp tokens instead of `<|notimestamps|>`."""
    word_timestamps: bool = False
    """Align each word to the audio through the cross-attention heads."""
    beam_size: int = 1
    """1 is greedy; more keeps that many hypotheses, each in its own decoder slot."""
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    """Tried in order: the next one is used when a result fails the checks below."""
    seed: int | None = None
    """Seed of the sampled (temperature > 0) attempts; None derives it from the audio, so that the
    same window always gives the same text (`attempt_seed`)."""
    max_new_tokens: int | None = None
    """Token limit for the window; None uses the engine's limit."""
    compression_ratio_threshold: float | None = 2.4
    """A gzip compression ratio above this means a repetition loop: retry hotter."""
    logprob_threshold: float | None = -1.0
    """An average log-probability below this means a poor decode: retry hotter."""
    no_speech_threshold: float | None = 0.6
    """A no-speech probability above this (with a low log-probability) means silence: no text."""
    suppress_blank: bool = True
    """Forbid a blank or end-of-text as the first sampled token."""
    suppress_tokens: str = "-1"
    """Comma-separated token ids never sampled; `-1` stands for the model's non-speech symbols."""
    length_penalty: float | None = None
    """Beam ranking: None divides log-probability by length, alpha uses Google NMT's penalty."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, not {self.task!r}")
        if self.prompt_tokens is not None:
            if self.prompt:
                raise ValueError("give prompt or prompt_tokens, not both")
            # Which ids a model takes is the tokenizer's to say (Engine.submit checks).
            object.__setattr__(self, "prompt_tokens", tuple(int(t) for t in self.prompt_tokens))
        if self.prefix_tokens is not None:
            if self.prefix:
                raise ValueError("give prefix or prefix_tokens, not both")
            object.__setattr__(self, "prefix_tokens", tuple(int(t) for t in self.prefix_tokens))
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, not {self.beam_size}")
        # A list would make the options unhashable; take any sequence and keep a tuple.
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        if not self.temperatures:
            raise ValueError("temperatures must not be empty")
        if any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0, not {self.temperatures}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {self.max_new_tokens}")


@dataclass(frozen=True)
class InitialTokens:
    """What the decoder is fed before it samples: the `<|startofprev|>` prompt, the SOT sequence and
    the forced prefix, built once from the options when the window is submitted (openai/whisper's
    `DecodingTask._get_initial_tokens`), so that the model thread tokenizes nothing."""

    tokens: tuple[int, ...]
    sot_index: int
    """Position of `<|startoftranscript|>`: the no-speech probability is read from its logits."""
    language_index: int | None = None
    """Position of the language token to set once the language is detected (a multilingual
    model and no language given; a placeholder stands there until then); None otherwise."""

    def with_language(self, token: int) -> list[int]:
        """The tokens with the detected language's `token` in place (as they are when none is to be detected)."""
        tokens = list(self.tokens)
        if self.language_index is not None:
            tokens[self.language_index] = token
        return tokens


def initial_tokens(options: DecodeOptions, tokenizer: "Tokenizer", n_text_ctx: int) -> InitialTokens:
    """The initial tokens of a window decoded with `options`: a prompt of at most half the text
    context, the SOT sequence (language, task, `<|notimestamps|>`) and the prefix. Raises
    ValueError for prompt tokens the model cannot take."""
    if options.prompt_tokens:
        prompt = tokenizer.prompt_from_tokens(options.prompt_tokens, n_text_ctx // 2)
    else:
        prompt = tokenizer.prompt_tokens(options.prompt, n_text_ctx // 2)
    detect = tokenizer.multilingual and options.language is None
    # English stands in for a language still to be detected (the runner sets it before prefill).
    sot = tokenizer.sot_sequence("en" if detect else options.language, options.task, options.timestamps)
    if options.prefix:
        prefix = tokenizer.encode(" " + options.prefix.strip())
    else:  # tokens forced as the start of the output (a live final's acoustic context), timestamps kept
        prefix = list(options.prefix_tokens or ())
    return InitialTokens(tuple(prompt + sot + prefix), sot_index=len(prompt),
                         language_index=len(prompt) + 1 if detect else None)


@dataclass(frozen=True)
class Verdict:
    """What a decode is, judged once (`judge`) with the request's thresholds."""

    silence: bool = False
    """No speech (`is_silence`): the result carries no text."""
    loop: bool = False
    """A repetition loop by openai's measure: the text compresses above the threshold, and the
    decode ran to its token limit (text that ended by itself is repeated speech, not a loop)."""
    repetition: bool = False
    """The text repeats a phrase back to back (`repeats_itself`), which short windows show and the
    compression ratio misses."""
    poor: bool = False
    """Improbable: the average log-probability is under the threshold, and it is not silence."""
    fallback: bool = False
    """openai/whisper's rule (`needs_fallback`): retry at the next temperature."""
    temperature: float = 0.0
    """Temperature of the attempt judged."""

    @property
    def ok(self) -> bool:
        """Speech, decoded well: nothing to retry, nothing to hide."""
        return not (self.silence or self.loop or self.repetition or self.poor)

    @property
    def conditions(self) -> bool:
        """The text may prompt the next window (openai/whisper's rules, plus the repetition check)."""
        return self.ok and self.temperature <= CONDITION_MAX_TEMPERATURE


def judge(text: str, avg_logprob: float, no_speech_prob: float, ratio: float, truncated: bool, options,
          temperature: float = 0.0) -> Verdict:
    """The verdict on one attempt's decoded `text` (all of it, before silence removes it)."""
    silence = is_silence(avg_logprob, no_speech_prob, options, text)
    poor = not silence and options.logprob_threshold is not None and avg_logprob < options.logprob_threshold
    loop = truncated and options.compression_ratio_threshold is not None and ratio > options.compression_ratio_threshold
    return Verdict(silence=silence, loop=loop, repetition=repeats_itself(text), poor=poor,
                   fallback=needs_fallback(ratio, avg_logprob, no_speech_prob, options, truncated),
                   temperature=temperature)


def compression_ratio(text: str) -> float:
    """Bytes over zlib-compressed bytes: above ~2.4 the text repeats itself (a decoding loop)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def repeats_itself(text: str) -> bool:
    """Some phrase of the text (1 word or more) comes REPEAT_MIN_TIMES times or more back to back,
    the run covering REPEAT_MIN_WORDS words or more (case and punctuation ignored)."""
    words = [w for w in (w.strip(string.punctuation).lower() for w in text.split()) if w]
    for n in range(1, len(words) // REPEAT_MIN_TIMES + 1):
        run = 0  # how many words in a row equal the word n further on
        for i in range(len(words) - n):
            run = run + 1 if words[i] == words[i + n] else 0
            times = run // n + 1
            if times >= REPEAT_MIN_TIMES and times * n >= REPEAT_MIN_WORDS:
                return True
    return False


def unstyled(text: str) -> bool:
    """Text in a cased script written with no upper-case letter and no punctuation ("and so am i
    fell america"): Whisper's caption-like register, which tiny.en falls into on narrowband audio.
    Only text whose letters all have case is judged: Chinese or Japanese (even with a Latin word
    in it) is never unstyled, nor is text with no letters."""
    letters = [c for c in text if c.isalpha()]
    if not letters or not all(c.islower() or c.isupper() for c in letters):
        return False
    return not any(c.isupper() for c in letters) and not any(c in STYLE_PUNCTUATION for c in text)


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


def attempt_seed(options: DecodeOptions, payload, attempt: int) -> int:
    """Seed of a sampled attempt: from `options.seed`, else from the window's bytes (`payload`:
    its audio or features), and the attempt's index. The same window so gives the same samples in
    every run, whatever else the engine decodes beside it."""
    base = options.seed if options.seed is not None else zlib.crc32(memoryview(payload).cast("B"))
    return (base * 1_000_003 + attempt) % (1 << 63)


def split_segments(tokens: list[int], tokenizer: "Tokenizer", duration: float) -> list[tuple[float, float, list[int]]]:
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


def __getattr__(name: str):
    # The tensor rules lived here before: old imports keep working (and only they load torch).
    if name == "MAX_INITIAL_TIMESTAMP":  # a tokenizer constant now: no torch for it
        from streamer.model.tokenizer import MAX_INITIAL_TIMESTAMP

        return MAX_INITIAL_TIMESTAMP
    if name in ("LogitRules", "SamplerState", "NEG_INF"):
        from streamer.model import logits

        return getattr(logits, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
