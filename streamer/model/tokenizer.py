"""Whisper's tokenizer over a shipped `tokenizer.json`: text BPE plus special, language, task and
timestamp tokens.

Special ids are read from the file by content, never assumed: English-only and multilingual
vocabularies place them differently. Older `tokenizer.json` files stop at `<|notimestamps|>`; the
1501 timestamp tokens `<|0.00|>`..`<|30.00|>` always follow it, so their ids are derived from it.
"""

from __future__ import annotations

import functools
import string
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

# Language codes Whisper knows, with their names (the order of the language tokens).
LANGUAGES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian", "ko": "korean",
    "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish", "pl": "polish", "ca": "catalan",
    "nl": "dutch", "ar": "arabic", "sv": "swedish", "it": "italian", "id": "indonesian", "hi": "hindi",
    "fi": "finnish", "vi": "vietnamese", "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay",
    "cs": "czech", "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian", "la": "latin",
    "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak", "te": "telugu", "fa": "persian",
    "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani", "sl": "slovenian", "kn": "kannada",
    "et": "estonian", "mk": "macedonian", "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian",
    "ne": "nepali", "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer", "sn": "shona",
    "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan", "ka": "georgian", "be": "belarusian",
    "tg": "tajik", "sd": "sindhi", "gu": "gujarati", "am": "amharic", "yi": "yiddish", "lo": "lao",
    "uz": "uzbek", "fo": "faroese", "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk",
    "mt": "maltese", "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala", "ha": "hausa",
    "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}
TO_LANGUAGE_CODE = {name: code for code, name in LANGUAGES.items()}

TIME_PRECISION = 0.02  # seconds per timestamp token step
MAX_INITIAL_TIMESTAMP = 1.0  # seconds: the first timestamp may not be later (openai's default)
N_TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|>


class Tokenizer:
    def __init__(self, path: str | Path | None, multilingual: bool, *, json: str | None = None):
        """From a `tokenizer.json` file, or its text (`json`, as an engine core sends it)."""
        self.hf = HFTokenizer.from_str(json) if json is not None else HFTokenizer.from_file(str(path))
        # Text is text: "<|endoftext|>" in a user's prompt is 8 ordinary tokens, never the special one (which
        # would end the prompt or fail its check; the ids here come from the vocabulary, not from encode).
        self.hf.encode_special_tokens = True
        self.multilingual = multilingual
        ids = {t.content: i for i, t in self.hf.get_added_tokens_decoder().items()}
        self.special = ids
        self.eot = ids["<|endoftext|>"]
        self.sot = ids["<|startoftranscript|>"]
        self.translate = ids["<|translate|>"]
        self.transcribe = ids["<|transcribe|>"]
        self.sot_prev = ids["<|startofprev|>"]
        self.sot_lm = ids.get("<|startoflm|>")
        self.no_speech = ids.get("<|nospeech|>", ids.get("<|nocaptions|>"))
        self.no_timestamps = ids["<|notimestamps|>"]
        self.timestamp_begin = self.no_timestamps + 1
        # Every <|xx|> token between sot and translate is a language; the file decides which exist
        # (tiny.en's config.json omits <|en|> from its lang_ids, the tokenizer does not).
        self.language_tokens: dict[str, int] = {
            content[2:-2]: i for content, i in ids.items()
            if self.sot < i < self.translate and content[2:-2] in LANGUAGES
        }
        self.language_of_token = {i: code for code, i in self.language_tokens.items()}

    # --- prompts -------------------------------------------------------------------------------

    def sot_sequence(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        """`<|startoftranscript|>` [language task] [`<|notimestamps|>`].

        English-only models take no language or task token: one would ruin their output.
        """
        seq = [self.sot]
        if self.multilingual:
            if language is None:
                raise ValueError("language must be known (detected) before the prompt is built")
            seq += [self.language_token(language), self.translate if task == "translate" else self.transcribe]
        if not timestamps:
            seq.append(self.no_timestamps)
        return seq

    def language_token(self, language: str) -> int:
        code = TO_LANGUAGE_CODE.get(language.lower(), language.lower())
        if code not in self.language_tokens:
            raise ValueError(f"unknown language {language!r}; known: {', '.join(sorted(self.language_tokens))}")
        return self.language_tokens[code]

    def language_code(self, language: str | None) -> str | None:
        """A requested language (code or English name; None: detect) as the code this model decodes;
        ValueError for one it cannot (an English-only model takes only English)."""
        if language is None:
            return None
        if not self.multilingual:
            if language.lower() not in ("en", "english"):
                raise ValueError(f"this model is English-only; language {language!r} is not available")
            return "en"
        self.language_token(language)
        return TO_LANGUAGE_CODE.get(language.lower(), language.lower())

    def prompt_tokens(self, prompt: str | None, max_tokens: int) -> list[int]:
        """`<|startofprev|>` + the last `max_tokens - 1` tokens of the previous text."""
        if not prompt or not prompt.strip():
            return []
        return self.prompt_from_tokens(self.encode(" " + prompt.strip()), max_tokens)

    def prompt_from_tokens(self, tokens, max_tokens: int) -> list[int]:
        """`<|startofprev|>` + the last `max_tokens - 1` of `tokens` (text and timestamp ids)."""
        tokens = list(tokens)
        if not tokens:
            return []
        if any(not (0 <= t < self.eot or self.timestamp_begin <= t < self.timestamp_begin + N_TIMESTAMPS) for t in tokens):
            raise ValueError("prompt tokens must be text or timestamp tokens of this model")
        return [self.sot_prev] + tokens[-(max_tokens - 1):]

    # --- text ----------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int]) -> str:
        """Text of the ordinary tokens; special and timestamp tokens are dropped."""
        return self.hf.decode([t for t in tokens if t < self.eot], skip_special_tokens=False)

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one text token (a token may hold part of a UTF-8 character)."""
        piece = self.hf.id_to_token(token) or ""
        decoder = _byte_decoder()
        if all(ch in decoder for ch in piece):
            return bytes(decoder[ch] for ch in piece)
        return self.decode([token]).encode()

    def time_of(self, token: int) -> float:
        return (token - self.timestamp_begin) * TIME_PRECISION

    def timestamp_token(self, t: float) -> int:
        """The timestamp token nearest to `t` seconds, within <|0.00|> .. <|30.00|>."""
        return self.timestamp_begin + min(max(round(t / TIME_PRECISION), 0), N_TIMESTAMPS - 1)

    @cached_property
    def blank_tokens(self) -> list[int]:
        """Suppressed as the first sampled token: a transcript never starts with a bare space."""
        return self.encode(" ") + [self.eot]

    @cached_property
    def non_speech_tokens(self) -> list[int]:
        """Symbols that are never speech (openai/whisper's suppress list for `suppress_tokens="-1"`)."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
        miscellaneous = set("♩♪♫♬♭♮♯")
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + list(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return sorted(result)

    def split_words(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        """Group text tokens into words (space-delimited languages) for word timestamps."""
        words, groups, current = [], [], []
        for token in tokens:
            current.append(token)
            text = self.decode(current)
            if "\ufffd" in text:  # an incomplete UTF-8 sequence: keep accumulating
                continue
            if not groups or text.startswith(" ") or text.strip() in string.punctuation:
                words.append(text)
                groups.append(current)
            else:
                words[-1] += text
                groups[-1].extend(current)
            current = []
        return words, groups


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode map, which Whisper's byte-level BPE vocabulary uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}
