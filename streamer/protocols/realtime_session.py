"""A Realtime transcription session's configuration (docs/protocol.md 2.2, 2.3): `session.update`
in OpenAI's GA shape and `transcription_session.update` in the beta shape, validated into one
`RealtimeConfig`; the session as the server reports it in either shape; and the `StreamingConfig`
that a segmentation under it runs with. No I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from streamer.config import StreamingConfig, VADConfig
from streamer.protocols import validation as v
from streamer.protocols.start import ModelInfo, ProtocolError, parse_language

DEFAULT_RATE = 24000
"""OpenAI's only PCM rate, the default here."""
MIN_RATE, MAX_RATE = 8000, 48000
G711_FORMATS = {"audio/pcmu": "mulaw", "audio/pcma": "alaw"}
"""GA `format.type` of G.711 (always 8 kHz, as OpenAI) -> our encoding."""
BETA_FORMATS = {"pcm16": "pcm_s16le", "g711_ulaw": "mulaw", "g711_alaw": "alaw"}
G711_RATE = 8000
LOGPROBS = "item.input_audio_transcription.logprobs"
"""The one `include` value: items' deltas and completions carry their tokens' `logprobs`."""
MAX_PROMPT_CHARS = 4096
"""Longest transcription prompt (Whisper's prompt holds at most 223 tokens)."""


class InvalidValue(Exception):
    """A client event the session refuses: `param` names the bad field, `code` is OpenAI's."""

    def __init__(self, message: str, param: str, code: str = "invalid_value"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass(frozen=True)
class TurnDetection:
    """Server VAD settings, mapped onto `VADConfig`."""

    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int

    @classmethod
    def of(cls, vad: VADConfig) -> "TurnDetection":
        return cls(vad.threshold, vad.speech_pad_ms, vad.min_silence_ms)

    def wire(self) -> dict:
        return {"type": "server_vad", **dataclasses.asdict(self)}


@dataclass(frozen=True)
class RealtimeConfig:
    """The session's effective configuration."""

    rate: int
    language: str | None
    prompt: str
    turn_detection: TurnDetection | None
    """None: the client commits items (`turn_detection: null`)."""
    encoding: str = "pcm_s16le"
    """`pcm_s16le`, or G.711 `mulaw` / `alaw` at 8 kHz."""
    condition_on_previous_text: bool = True
    """Prompt each item with the previous items' text (an extension of OpenAI's API)."""
    logprobs: bool = False
    """`include: ["item.input_audio_transcription.logprobs"]`."""

    @classmethod
    def default(cls, streaming: StreamingConfig) -> "RealtimeConfig":
        """A new session's: 24-kHz PCM16, server VAD with the server's VAD settings."""
        return cls(rate=DEFAULT_RATE, language=streaming.language, prompt="",
                   turn_detection=TurnDetection.of(streaming.vad),
                   condition_on_previous_text=streaming.condition_on_previous)

    @property
    def manual(self) -> bool:
        return self.turn_detection is None

    def segmentation_changes(self, other: "RealtimeConfig") -> bool:
        """Audio under `other` needs a new segmentation (resampler, VAD): rate, format or turn detection differ."""
        return (self.rate, self.encoding, self.turn_detection) != (other.rate, other.encoding, other.turn_detection)

    def streaming(self, defaults: StreamingConfig) -> StreamingConfig:
        """How a segmentation under this configuration cuts and prompts: server VAD with its
        settings, or commits by the client; no partials (deltas come from the final decode); the
        item prompt opens every item's prompt, before the previous items' text."""
        if self.turn_detection is None:
            streaming = dataclasses.replace(defaults, manual_commit=True)
        else:
            t = self.turn_detection
            vad = dataclasses.replace(defaults.vad, threshold=t.threshold, speech_pad_ms=t.prefix_padding_ms,
                                      min_silence_ms=t.silence_duration_ms, neg_threshold=None)
            streaming = dataclasses.replace(defaults, vad=vad, manual_commit=False)
        return dataclasses.replace(streaming, partials=False, prompt=self.prompt.strip() or None,
                                   condition_on_previous=self.condition_on_previous_text)


# --- session.update ---------------------------------------------------------------------------------

def parse_update(session: Any, config: RealtimeConfig, *, beta: bool, vad: VADConfig,
                 model: ModelInfo) -> RealtimeConfig:
    """`config` with a `session.update`'s (or, `beta`, a `transcription_session.update`'s)
    `session` applied; raises InvalidValue or ValidationError naming the field. `vad`: the
    server's settings, for fields a first `turn_detection` leaves out."""
    if not isinstance(session, dict):
        raise InvalidValue("`session` must be an object", "session")
    return _parse_beta(session, config, vad, model) if beta else _parse_ga(session, config, vad, model)


def _parse_ga(session: dict, config: RealtimeConfig, vad: VADConfig, model: ModelInfo) -> RealtimeConfig:
    if session.get("type", "transcription") != "transcription":
        raise InvalidValue(f"session.type {v.show(session.get('type'))} is not supported: this server only transcribes",
                           "session.type", "unsupported_session_type")
    audio = _object(session, "audio", "session")
    inp = _object(audio, "input", "session.audio")
    if "format" in inp:
        fmt = _object(inp, "format", "session.audio.input")
        kind = fmt.get("type", "audio/pcm")
        if isinstance(kind, str) and kind in G711_FORMATS:
            if fmt.get("rate", G711_RATE) != G711_RATE:
                raise InvalidValue(f"{kind} is 8000 Hz, not {v.show(fmt['rate'])}",
                                   "session.audio.input.format.rate")
            config = dataclasses.replace(config, rate=G711_RATE, encoding=G711_FORMATS[kind])
        elif kind != "audio/pcm":
            raise InvalidValue(f"format {v.show(kind)} is not supported (audio/pcm, audio/pcmu, audio/pcma)",
                               "session.audio.input.format.type")
        else:
            config = dataclasses.replace(config, encoding="pcm_s16le",
                                         rate=DEFAULT_RATE if config.encoding != "pcm_s16le" else config.rate)
            if "rate" in fmt:
                config = dataclasses.replace(config, rate=_rate(fmt["rate"], "session.audio.input.format.rate"))
    if "transcription" in inp:
        config = _transcription(config, inp["transcription"], "session.audio.input.transcription", model)
    if "turn_detection" in inp:
        config = _turn_detection(config, inp["turn_detection"], "session.audio.input.turn_detection", vad)
    return _include(config, session)


def _parse_beta(session: dict, config: RealtimeConfig, vad: VADConfig, model: ModelInfo) -> RealtimeConfig:
    if "input_audio_format" in session:
        encoding = BETA_FORMATS.get(session["input_audio_format"]) \
            if isinstance(session["input_audio_format"], str) else None
        if encoding is None:
            raise InvalidValue(f"input_audio_format {v.show(session['input_audio_format'])} is not supported "
                               f"({', '.join(BETA_FORMATS)})", "session.input_audio_format")
        config = dataclasses.replace(config, encoding=encoding,
                                     rate=DEFAULT_RATE if encoding == "pcm_s16le" else G711_RATE)
    if "input_audio_transcription" in session:
        config = _transcription(config, session["input_audio_transcription"], "session.input_audio_transcription",
                                model)
    if "turn_detection" in session:
        config = _turn_detection(config, session["turn_detection"], "session.turn_detection", vad)
    return _include(config, session)


def _include(config: RealtimeConfig, session: dict) -> RealtimeConfig:
    if "include" not in session:
        return config
    value = session["include"]
    if value is None:
        value = []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise InvalidValue("session.include must be a list of strings", "session.include")
    unknown = [x for x in value if x != LOGPROBS]
    if unknown:
        raise InvalidValue(f"session.include {v.show(unknown[0])} is not supported (only {LOGPROBS})",
                           "session.include")
    return dataclasses.replace(config, logprobs=LOGPROBS in value)


def _transcription(config: RealtimeConfig, value: Any, param: str, model: ModelInfo) -> RealtimeConfig:
    if value is None:
        return config
    if not isinstance(value, dict):
        raise InvalidValue(f"{param} must be an object", param)
    if "language" in value:
        try:
            language = parse_language(value["language"], model.multilingual, model.languages)
        except ProtocolError as e:
            raise InvalidValue(e.message, f"{param}.language") from None
        config = dataclasses.replace(config, language=language)
    if "prompt" in value:
        prompt = v.string(value["prompt"], f"{param}.prompt", max_length=MAX_PROMPT_CHARS)
        config = dataclasses.replace(config, prompt=prompt)
    if "condition_on_previous_text" in value:
        flag = v.boolean(value["condition_on_previous_text"], f"{param}.condition_on_previous_text")
        config = dataclasses.replace(config, condition_on_previous_text=flag)
    return config


def _turn_detection(config: RealtimeConfig, value: Any, param: str, vad: VADConfig) -> RealtimeConfig:
    if value is None:
        return dataclasses.replace(config, turn_detection=None)
    if not isinstance(value, dict):
        raise InvalidValue(f"{param} must be an object or null", param)
    if value.get("type", "server_vad") != "server_vad":
        raise InvalidValue(f"turn_detection.type {v.show(value.get('type'))} is not supported (only server_vad)",
                           f"{param}.type")
    current = config.turn_detection or TurnDetection.of(vad)
    threshold = _range(value, "threshold", 0.0, 1.0, current.threshold, param, open_ends=True)
    padding = _range(value, "prefix_padding_ms", 0, 2000, current.prefix_padding_ms, param, integer=True)
    silence = _range(value, "silence_duration_ms", 0, 10000, current.silence_duration_ms, param, integer=True)
    return dataclasses.replace(config, turn_detection=TurnDetection(threshold, padding, silence))


# --- the session as reported ------------------------------------------------------------------------

def session_wire(config: RealtimeConfig, session_id: str, model_name: str, *, beta: bool) -> dict:
    """The `session` of `session.created` / `.updated` (or, `beta`, of `transcription_session.*`)."""
    c = config
    transcription = {"model": model_name, "language": c.language, "prompt": c.prompt,
                     "condition_on_previous_text": c.condition_on_previous_text}
    turn = c.turn_detection.wire() if c.turn_detection is not None else None
    include = [LOGPROBS] if c.logprobs else []
    if beta:
        beta_format = next(k for k, e in BETA_FORMATS.items() if e == c.encoding)
        return {"id": session_id, "object": "realtime.transcription_session", "input_audio_format": beta_format,
                "input_audio_transcription": transcription, "turn_detection": turn,
                "input_audio_noise_reduction": None, "include": include}
    # GA: no `noise_reduction` and no `language: null` (the SDKs' types allow neither null);
    # an absent language means detection, as in OpenAI's own sessions.
    if c.language is None:
        del transcription["language"]
    return {"object": "realtime.session", "type": "transcription", "id": session_id,
            "audio": {"input": {"format": _format_wire(c), "transcription": transcription, "turn_detection": turn}},
            "include": include}


def _format_wire(c: RealtimeConfig) -> dict:
    if c.encoding == "pcm_s16le":
        return {"type": "audio/pcm", "rate": c.rate}
    return {"type": next(k for k, e in G711_FORMATS.items() if e == c.encoding)}


def _object(parent: dict, name: str, where: str) -> dict:
    value = parent.get(name, {})
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise InvalidValue(f"{where}.{name} must be an object", f"{where}.{name}")
    return value


def _rate(value: Any, param: str) -> int:
    return v.integer(value, param, MIN_RATE, MAX_RATE)


def _range(obj: dict, name: str, low: float, high: float, default, where: str, *, integer: bool = False,
           open_ends: bool = False):
    if name not in obj or obj[name] is None:
        return default
    return v.number(obj[name], f"{where}.{name}", low, high, open_low=open_ends, open_high=open_ends, integer=integer)
