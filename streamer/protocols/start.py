"""The native protocol's `start` message (docs/protocol.md 1.1): its fields validated into
`StartOptions`, shared by `/v1/stream` and WebRTC's offer; and `ProtocolError`, how either
protocol refuses a client message (the wire `error` event)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from streamer.audio.decode import PCM_DTYPES
from streamer.config import StreamingConfig, VADConfig, model_id
from streamer.protocols import validation as v
from streamer.protocols.validation import ValidationError, show

MAX_ERROR_CHARS = 300
"""Longest `message` (and `field`) of an error event."""
MAX_LANGUAGE_CHARS = 32
"""Longer than any language code or name."""

# `vad` keys of the start message: (low, high, both bounds exclusive).
_VAD_RANGES = {
    "threshold": (0.0, 1.0, True),
    "neg_threshold": (0.0, 1.0, True),
    "min_silence_ms": (0, 10000, False),
    "speech_pad_ms": (0, 2000, False),
    "min_speech_ms": (0, 10000, False),
    "max_utterance_s": (1, 30, False),
}


class ProtocolError(Exception):
    """A client message the protocol rejects; `code` is the wire error code."""

    def __init__(self, code: str, message: str, field: str | None = None, retry_after_s: float | None = None):
        # Capped: a message may quote what the client sent (a 1-MB field name, say).
        message = message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        self.field = field if field is None or len(field) <= MAX_ERROR_CHARS else field[:MAX_ERROR_CHARS] + "..."

    def event(self) -> dict:
        e = {"type": "error", "code": self.code, "message": self.message}
        if self.field is not None:
            e["field"] = self.field
        return e


@dataclass(frozen=True)
class StartOptions:
    """A validated `start` message."""

    sample_rate: int
    encoding: str
    channels: int
    streaming: StreamingConfig
    """Per-stream behaviour: the server's defaults with the client's fields applied."""
    multichannel: bool = False
    """Each channel transcribed on its own (its own VAD and utterances); events carry `channel`."""


def bad_field(name: str, message: str) -> ProtocolError:
    return ProtocolError("bad_field", f"{name}: {message}", name)


def _checked(check, *args, **kwargs):
    """A `validation` helper's result, its ValidationError as ProtocolError(bad_field)."""
    try:
        return check(*args, **kwargs)
    except ValidationError as e:
        raise bad_field(e.field, e.message) from None


def parse_language(value: Any, multilingual: bool, known: set[str], label: str = "language") -> str | None:
    """`null`/`"auto"` -> None (detect); English-only models take only `en` (or nothing)."""
    if value is None or value == "auto":
        return None
    if not isinstance(value, str) or len(value) > MAX_LANGUAGE_CHARS:
        raise bad_field(label, f"must be a language code or null, not {show(value)}")
    code = value.strip().lower()
    if not multilingual and code != "en":
        raise bad_field(label, f"the served model is English-only: {value!r} is not available (use null, auto or en)")
    if multilingual and code not in known:
        raise bad_field(label, f"unknown language {value!r}")
    return code


def parse_start(msg: dict, defaults: StreamingConfig, multilingual: bool, known_languages: set[str], *,
                audio_fields: bool = True) -> StartOptions:
    """Validate a start message's fields against docs/protocol.md; raises ProtocolError(bad_field).

    With `audio_fields=False` (WebRTC) the audio format fields are ignored: the track decides.
    """
    allowed = {"type", "sample_rate", "encoding", "channels", "multichannel", "language", "task", "partials",
               "partial_interval_ms", "condition_on_previous", "condition_on_previous_text", "prompt", "vad",
               "acoustic_context"}
    for name in msg:
        if name not in allowed:
            raise bad_field(name, "unknown field")
    rate, encoding, channels, multichannel = 16000, "pcm_s16le", 1, False
    if audio_fields:
        if "multichannel" in msg:
            multichannel = _checked(v.boolean, msg["multichannel"], "multichannel")
        if "sample_rate" in msg:
            rate = _checked(v.integer, msg["sample_rate"], "sample_rate", 8000, 192000)
        if "encoding" in msg:
            encoding = _checked(v.choice, msg["encoding"], "encoding", PCM_DTYPES)
        if "channels" in msg:
            channels = _checked(v.integer, msg["channels"], "channels", 1, 8)
    changes: dict[str, Any] = {}
    if "language" in msg:
        changes["language"] = parse_language(msg["language"], multilingual, known_languages)
    if "task" in msg:
        _checked(v.choice, msg["task"], "task", ("transcribe", "translate"))
        if msg["task"] == "translate" and not multilingual:
            raise bad_field("task", "translate needs a multilingual model; the served model is English-only")
        changes["task"] = msg["task"]
    if "partials" in msg:
        changes["partials"] = _checked(v.boolean, msg["partials"], "partials")
    if "partial_interval_ms" in msg:
        changes["partial_interval_s"] = _checked(v.number, msg["partial_interval_ms"], "partial_interval_ms",
                                                 100, 10000) / 1000.0
    for name in ("condition_on_previous", "condition_on_previous_text"):  # the second is openai's name
        if name in msg:
            changes["condition_on_previous"] = _checked(v.boolean, msg[name], name)
    if "prompt" in msg:
        changes["prompt"] = parse_prompt(msg["prompt"], "prompt")
    if "acoustic_context" in msg:
        changes["acoustic_context"] = _checked(v.boolean, msg["acoustic_context"], "acoustic_context")
    if "vad" in msg:
        changes["vad"] = parse_vad(msg["vad"], defaults.vad)
    return StartOptions(rate, encoding, channels, dataclasses.replace(defaults, **changes), multichannel)


PROMPT_MAX_CHARS = 2000
"""Longest prompt accepted (Whisper keeps at most its last 223 tokens anyway)."""


def parse_prompt(value: Any, label: str) -> str | None:
    """A prompt field: a string of at most PROMPT_MAX_CHARS, or null."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_field(label, f"must be a string or null, not {v.show(value)}")
    if len(value) > PROMPT_MAX_CHARS:
        raise bad_field(label, f"{len(value)} characters is over the {PROMPT_MAX_CHARS}-character limit")
    return value.strip() or None


def parse_vad(vad: Any, defaults: VADConfig) -> VADConfig:
    vad = _checked(v.obj, vad, "vad")
    values: dict[str, Any] = {}
    for name in vad:
        if name not in _VAD_RANGES:
            raise bad_field(f"vad.{name}", "unknown field")
        low, high, open_ends = _VAD_RANGES[name]
        values[name] = _checked(v.number, vad[name], f"vad.{name}", low, high, open_low=open_ends,
                                open_high=open_ends, integer=name.endswith("_ms"))
    config = dataclasses.replace(defaults, **values)
    if config.neg_threshold is not None and config.neg_threshold >= config.threshold:
        raise bad_field("vad.neg_threshold", f"{config.neg_threshold} must be below threshold {config.threshold}")
    return config


@dataclass(frozen=True)
class ModelInfo:
    """What the protocols need to know of the served model."""

    name: str
    multilingual: bool
    languages: frozenset[str]
    """Language codes it knows."""
    token_bytes: Callable[[int], bytes] | None = dataclasses.field(default=None, compare=False)
    """A text token's bytes (`Tokenizer.token_bytes`), for `logprobs`; None: none are sent."""

    @classmethod
    def of(cls, engine) -> "ModelInfo":
        """Of an `Engine` or `EngineClient`."""
        tokenizer = engine.tokenizer
        return cls(model_id(engine.model_name), tokenizer.multilingual, frozenset(tokenizer.language_tokens),
                   tokenizer.token_bytes)

    def decoder_language(self, language: str | None) -> str | None:
        """The language the decoder is given: `en` on an English-only model, else `language`
        (None: detected per utterance)."""
        return language if self.multilingual else "en"
