"""Deepgram's speech-to-text API (docs/protocol.md, section 6) with no I/O: the query parameters
of `/v1/listen` (`ListenOptions`), the live protocol (`ListenProtocol`) and the pre-recorded
response (`file_response`).

`ListenProtocol` is one `WS /v1/listen` connection. Client messages in (`receive_bytes`,
`receive_text`); out come Deepgram messages (`Send`), the connection's end (`Close`) and commands
for the transport: `Audio` (whole sample frames of the stream's encoding and channels),
`Finalize` (end every channel's open utterance, then answer `finalized(opened)`),
`KeepAlive` (the client wants the stream though no audio comes) and `CloseStream` (finish the
stream, then `close(reason)`). The bridges' events come back through
`on_event(event, channel)`.

What Deepgram names an utterance is what the native protocol calls a final: `Results` with
`is_final` and `speech_final` true; a final that a `Finalize` ended has `from_finalize` true and
`speech_final` false. Word confidences are the mean probability of each word's tokens; a
transcript's confidence is the mean over its words.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Mapping, Union

import numpy as np

from streamer.audio.decode import pcm_dtype
from streamer.config import StreamingConfig
from streamer.protocols.outputs import Audio, Close, Send
from streamer.streaming.events import Partial, SpeechStarted
from streamer.streaming.live import Committed, Finalized, StreamEvent

ENCODINGS = {"linear16": "pcm_s16le", "mulaw": "mulaw", "alaw": "alaw"}
"""Deepgram's raw encodings -> ours."""
DEFAULT_RATES = {"linear16": 16000, "mulaw": 8000, "alaw": 8000}
"""`sample_rate` when a raw encoding comes without one: G.711 is telephone audio."""
ENDPOINTING_MIN_MS = 100
"""Deepgram's `endpointing` default is 10 ms of silence; silero-vad needs more than one 32-ms frame
to call speech over, so shorter values are raised to this."""
IGNORED = {"punctuate", "smart_format", "model", "version", "tag", "diarize", "numerals", "profanity_filter",
           "filler_words", "dictation", "keywords", "keyterm", "mip_opt_out", "extra", "redact", "replace",
           "search", "utterances", "utt_split", "paragraphs", "detect_language", "callback", "callback_method",
           "no_delay"}
"""Accepted and without effect: Whisper punctuates and formats on its own; the rest are features
this server does not have (`utterances` matters only to `POST /v1/listen`)."""
CONTROL = ("KeepAlive", "Finalize", "CloseStream")
"""The live API's text messages."""
MODEL_VERSION = "1"
MODEL_ARCH = "whisper"


class ListenError(Exception):
    """A bad request in Deepgram's terms: `err_code` (Deepgram's `DATA-...`/`INVALID-...` style)."""

    def __init__(self, message: str, err_code: str = "INVALID_QUERY_PARAMETER", param: str | None = None):
        super().__init__(message)
        self.message, self.err_code, self.param = message, err_code, param

    def message_event(self) -> dict:
        """The error as a WebSocket message."""
        return {"type": "Error", "variant": self.err_code, "description": self.message, "message": self.message}

    def http_body(self, request_id: str) -> dict:
        return {"err_code": self.err_code, "err_msg": self.message, "request_id": request_id}


# --- query parameters ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ListenOptions:
    """The query parameters of `/v1/listen`, validated."""

    encoding: str | None = None
    """Ours (`pcm_s16le`, `mulaw`, `alaw`); None: a container file (POST only)."""
    sample_rate: int = DEFAULT_RATES["linear16"]
    """Of raw audio; not read for a container."""
    channels: int = 1
    multichannel: bool = False
    interim_results: bool = False
    vad_events: bool = False
    utterance_end_ms: int | None = None
    utterances: bool = False
    language: str | None = None
    streaming: StreamingConfig = field(default_factory=StreamingConfig)


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _bool(query, name: str, default: bool) -> bool:
    value = _one(query, name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ListenError(f"{name} must be true or false, not {value!r}", param=name)
    return value.lower() == "true"


def _int(query, name: str, low: int, high: int) -> int | None:
    value = _one(query, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ListenError(f"{name} must be a whole number, not {value!r}", param=name) from None
    if not low <= number <= high:
        raise ListenError(f"{name} {number} is outside {low}..{high}", param=name)
    return number


def parse_options(query: Mapping[str, list[str]], defaults: StreamingConfig, multilingual: bool,
                  languages: set[str], *, live: bool) -> ListenOptions:
    """Query parameters -> ListenOptions; raises ListenError. Unknown parameters are ignored, as
    Deepgram's own features this server lacks are (`IGNORED`)."""
    encoding = _one(query, "encoding")
    if encoding is not None and encoding not in ENCODINGS:
        raise ListenError(f"encoding must be one of {', '.join(ENCODINGS)}, not {encoding!r}", param="encoding")
    if live and encoding is None:
        encoding = "linear16"  # live audio is raw: containers are not streamed here
    rate = _int(query, "sample_rate", 8000, 192000)
    if encoding is not None and rate is None:
        rate = DEFAULT_RATES[encoding]
    channels = _int(query, "channels", 1, 8) or 1
    language = _one(query, "language")
    if language is not None:
        code = language.split("-")[0].strip().lower()
        if code in ("", "multi"):
            code = None
        elif not multilingual and code != "en":
            raise ListenError(f"the served model is English-only: language {language!r} is not available",
                              param="language")
        elif multilingual and code not in languages:
            raise ListenError(f"unknown language {language!r}", param="language")
        language = code
    elif not multilingual:
        language = "en"
    streaming = replace(defaults, language=language, partials=_bool(query, "interim_results", False))
    endpointing = _one(query, "endpointing")
    if endpointing is not None and endpointing.lower() != "false":
        ms = _int(query, "endpointing", 0, 10000)
        streaming = replace(streaming, vad=replace(streaming.vad, min_silence_ms=max(ms, ENDPOINTING_MIN_MS)))
    return ListenOptions(
        encoding=ENCODINGS[encoding] if encoding is not None else None, sample_rate=rate or ListenOptions.sample_rate,
        channels=channels,
        multichannel=_bool(query, "multichannel", False), interim_results=streaming.partials,
        vad_events=_bool(query, "vad_events", False), utterance_end_ms=_int(query, "utterance_end_ms", 1000, 60000),
        utterances=_bool(query, "utterances", False), language=language, streaming=streaming)


# --- words and confidences -------------------------------------------------------------------------

_WORD_CHARS = re.compile(r"[^\w'-]+", re.UNICODE)


def dg_words(words: list[dict] | None, channel: int | None = None) -> list[dict]:
    """Whisper's words (`word` with its leading space and punctuation, `probability`) -> Deepgram's."""
    out = []
    for w in words or []:
        punctuated = w["word"].strip()
        bare = _WORD_CHARS.sub("", punctuated).strip("'-").lower() or punctuated.lower()
        word = {"word": bare, "start": round(float(w["start"]), 3), "end": round(float(w["end"]), 3),
                "confidence": round(float(w["probability"]), 4), "punctuated_word": punctuated}
        if channel is not None:
            word["channel"] = channel
        out.append(word)
    return out


def confidence(words: list[dict], avg_logprob: float | None = None) -> float:
    """Mean word confidence; without words, the decode's mean token probability."""
    if words:
        return round(float(np.mean([w["confidence"] for w in words])), 4)
    return round(math.exp(avg_logprob), 4) if avg_logprob is not None else 0.0


def model_uuid(model_name: str) -> str:
    """The served model's stable id, which Deepgram's metadata names models by."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"streamer:{model_name}"))


def _model_info(model_name: str) -> dict:
    return {"name": model_name, "version": MODEL_VERSION, "arch": MODEL_ARCH}


def _metadata(request_id: str, sha256: str, created: str, duration: float, channels: int, model_name: str) -> dict:
    """What the live `Metadata` message and the pre-recorded response's `metadata` share."""
    uid = model_uuid(model_name)
    return {"transaction_key": "deprecated", "request_id": request_id, "sha256": sha256, "created": created,
            "duration": round(duration, 3), "channels": channels, "models": [uid],
            "model_info": {uid: _model_info(model_name)}}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


# --- the live protocol -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finalize:
    """End the open utterance of `channel` (None: of every channel) now, then call `finalized(opened)`."""

    channel: int | None = None


@dataclass(frozen=True)
class CloseStream:
    """End of audio: finish the stream's finals, then call `close(reason)`."""


@dataclass(frozen=True)
class KeepAlive:
    """The client keeps the stream open without audio: Deepgram closes a stream only after 10 s
    with neither audio nor KeepAlive, so a stream opened before its first audio (a voice agent
    waiting for the caller) is not closed for want of audio while KeepAlive comes."""


Output = Union[Send, Close, Audio, Finalize, CloseStream, KeepAlive]


class ListenProtocol:
    """One `WS /v1/listen` connection's protocol state."""

    def __init__(self, options: ListenOptions, model_name: str, max_message_bytes: int | None = None):
        self.options = options
        self.model_name = model_name
        self.max_message_bytes = max_message_bytes
        self.request_id = str(uuid.uuid4())
        self.created = _now()
        self._frame_bytes = pcm_dtype(options.encoding).itemsize * options.channels
        self._pending = b""
        """The bytes of a sample frame split across messages (Deepgram takes any chunking)."""
        self._bytes = 0
        """Bytes of whole sample frames taken, for the stream's duration."""
        self._digest = hashlib.sha256()
        self._finalizing: set[int] = set()
        """The channels a `Finalize` is flushing now."""
        self._from_finalize: set[tuple[int, int]] = set()
        """(channel, utterance) that a `Finalize` committed: their `Results` say `from_finalize`."""
        self._undelivered: set[tuple[int, int]] = set()
        """(channel, utterance) committed whose final has not gone out."""
        self._owed: list[tuple[set[tuple[int, int]], dict]] = []
        """Empty `from_finalize` answers waiting for the finals committed before their `Finalize`."""

    @property
    def n_channels(self) -> int:
        return self.options.channels if self.options.multichannel else 1

    @property
    def duration(self) -> float:
        """Seconds of audio taken so far."""
        return self._bytes / self._frame_bytes / self.options.sample_rate

    # --- client messages --------------------------------------------------------------------------

    def receive_bytes(self, data: bytes) -> list[Output]:
        limit = self.max_message_bytes
        if limit is not None and len(data) > limit:
            return [Send(ListenError(f"a {len(data)}-byte message is over the {limit}-byte limit",
                                     "DATA-0001").message_event())]
        if not data:  # Deepgram's older end of stream, which it still honours (older clients send it)
            return [CloseStream()]
        self._digest.update(data)
        data = self._pending + data
        whole = len(data) - len(data) % self._frame_bytes
        self._pending = data[whole:]
        self._bytes += whole
        return [Audio(data[:whole])] if whole else []

    def receive_text(self, text: str) -> list[Output]:
        """`KeepAlive`, `Finalize` or `CloseStream`; anything else is an `Error` and the stream goes on."""
        try:
            msg = json.loads(text)
        except ValueError:
            return [Send(ListenError("a text message must be JSON: {\"type\": \"KeepAlive\" | \"Finalize\" | "
                                     "\"CloseStream\"}", "INVALID_MESSAGE").message_event())]
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind not in CONTROL:
            return [Send(ListenError(f"unknown message type {kind!r} ({', '.join(CONTROL)})",
                                     "INVALID_MESSAGE").message_event())]
        if kind == "Finalize":
            channel = msg.get("channel")
            if channel is not None and (not isinstance(channel, int) or isinstance(channel, bool)
                                        or not 0 <= channel < self.n_channels):
                return [Send(ListenError(f"Finalize's channel must be a channel index from 0 to "
                                         f"{self.n_channels - 1}, not {channel!r}", "INVALID_MESSAGE").message_event())]
            # The commits the flush makes now are the Finalize's.
            self._finalizing = set(range(self.n_channels)) if channel is None else {channel}
            return [Finalize(channel)]
        if kind == "CloseStream":
            return [CloseStream()]
        return [KeepAlive()]

    # --- what the transport reports ---------------------------------------------------------------

    def finalized(self, opened: bool, channel: int | None = None) -> list[Output]:
        """The `Finalize` flush (of `channel`, None: of all) is done; when no utterance was open, an
        empty final says so."""
        self._finalizing = set()
        if opened:
            return []
        empty = self._results(channel or 0, "", [], None, self.duration, self.duration, is_final=True,
                              speech_final=False, from_finalize=True)
        waiting = {k for k in self._undelivered if channel is None or k[0] == channel}
        if waiting:  # "finalization complete" goes out after the finals of the audio before it
            self._owed.append((waiting, empty))
            return []
        return [Send(empty)]

    def on_event(self, event: StreamEvent, channel: int | None) -> list[Output]:
        """A bridge event of the channel `channel` (None: a mixed stream) -> Deepgram messages."""
        ch = channel or 0
        if isinstance(event, SpeechStarted):
            if self.options.vad_events:
                return [Send({"type": "SpeechStarted", "channel": [ch, self.n_channels],
                              "timestamp": round(event.t, 3)})]
            return []
        if isinstance(event, Partial):
            return [Send(self._results(ch, event.text.strip(), [], None, event.start, event.end, is_final=False,
                                       speech_final=False, from_finalize=False))]
        if isinstance(event, Committed):
            self._undelivered.add((ch, event.utterance_id))
            if ch in self._finalizing:
                self._from_finalize.add((ch, event.utterance_id))
            return []
        if isinstance(event, Finalized):
            key = (ch, event.utterance_id)
            finalized = key in self._from_finalize
            self._from_finalize.discard(key)
            self._undelivered.discard(key)
            out: list[Output] = []
            final = event.final
            if final is not None:  # None: silence, or a failed decode (which the transport logs)
                words = dg_words(final.words)
                out.append(Send(self._results(ch, final.text, words, final.avg_logprob, final.start, final.end,
                                              is_final=True, speech_final=not finalized, from_finalize=finalized)))
                if self.options.utterance_end_ms is not None:
                    last = words[-1]["end"] if words else round(final.end, 3)
                    out.append(Send({"type": "UtteranceEnd", "channel": [ch, self.n_channels],
                                     "last_word_end": last}))
            for waiting, _ in self._owed:
                waiting.discard(key)
            while self._owed and not self._owed[0][0]:
                out.append(Send(self._owed.pop(0)[1]))
            return out
        return []  # SpeechStopped: Deepgram has no message of its own for it

    def close(self, reason: str) -> list[Output]:
        """The stream's finals are out (`reason`: stop, shutdown, idle_timeout, no_audio): `Metadata`, close."""
        metadata = _metadata(self.request_id, self._digest.hexdigest(), self.created, self.duration,
                             self.n_channels, self.model_name)
        return [Send({"type": "Metadata", **metadata}), Close(1001 if reason == "shutdown" else 1000)]

    def _results(self, ch: int, transcript: str, words: list[dict], avg_logprob: float | None, start: float,
                 end: float, *, is_final: bool, speech_final: bool, from_finalize: bool) -> dict:
        return {
            "type": "Results",
            "channel_index": [ch, self.n_channels],
            "duration": round(max(0.0, end - start), 3),
            "start": round(start, 3),
            "is_final": is_final,
            "speech_final": speech_final,
            "from_finalize": from_finalize,
            "channel": {"alternatives": [{"transcript": transcript,
                                          "confidence": confidence(words, avg_logprob) if transcript else 0.0,
                                          "words": words}]},
            "metadata": {"request_id": self.request_id, "model_uuid": model_uuid(self.model_name),
                         "model_info": _model_info(self.model_name)},
        }


# --- the pre-recorded response ---------------------------------------------------------------------

def file_response(transcripts: list, options: ListenOptions, model_name: str, request_id: str, duration: float,
                  sha256: str) -> dict:
    """Deepgram's pre-recorded response for one transcript (`longform.Transcript`) per channel."""
    channels, utterances = [], []
    for c, t in enumerate(transcripts):
        words = dg_words([_word(w) for w in t.words])
        logprob = float(np.mean([s.avg_logprob for s in t.segments])) if t.segments else None
        alternative = {"transcript": t.text.strip(), "confidence": confidence(words, logprob), "words": words}
        channels.append({"alternatives": [alternative], **({"detected_language": t.language} if t.language else {})})
        if options.utterances:
            for s in t.segments:
                seg_words = dg_words([_word(w) for w in (s.words or [])])
                utterances.append({"start": s.start, "end": s.end, "confidence": confidence(seg_words, s.avg_logprob),
                                   "channel": c, "transcript": s.text.strip(), "words": seg_words,
                                   "id": str(uuid.uuid4())})
    results: dict[str, Any] = {"channels": channels}
    if options.utterances:
        results["utterances"] = sorted(utterances, key=lambda u: (u["start"], u["channel"]))
    metadata = _metadata(request_id, sha256, _now(), duration, len(transcripts), model_name)
    return {"metadata": metadata, "results": results}


def _word(w) -> dict:
    """A transcript's word (`longform.transcript.Word`) as `dg_words` takes it."""
    return {"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
