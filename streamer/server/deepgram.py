"""Deepgram's speech-to-text API: `WS /v1/listen` (live) and `POST /v1/listen` (recordings), so
that a pipeline written for Deepgram (its SDKs, Pipecat, LiveKit Agents, Vapi) switches by
changing a URL. docs/protocol.md, section 6.

`ListenOptions` (query parameters) and `ListenProtocol` (bridge events in, Deepgram messages out;
control messages in, actions out) have no I/O; `DeepgramStream` is the WebSocket transport and
`listen_file` the HTTP endpoint. What Deepgram names an utterance is what the native protocol
calls a final: `Results` with `is_final` and `speech_final` true. Word confidences are the mean
probability of each word's tokens; a transcript's confidence is the mean over its words.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Mapping
from urllib.parse import parse_qs

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from streamer.audio import SAMPLE_RATE
from streamer.audio.decode import AudioDecodeError, StreamResampler, _pcm_dtype, decode_audio
from streamer.config import StreamingConfig
from streamer.engine.errors import EngineClosed
from streamer.engine.request import DecodeOptions
from streamer.engine.scheduler import QueueFull
from streamer.longform import transcribe_long
from streamer.server.bridge import Bridge, Committed, Finalized, StreamEvent
from streamer.server.channels import ChannelStreams
from streamer.server.socket_stream import FINISH_TIMEOUT_S, SocketStream
from streamer.server.state import ServerState
from streamer.streaming.events import Final, Partial, SpeechStarted
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")

ENCODINGS = {"linear16": "pcm_s16le", "mulaw": "mulaw", "alaw": "alaw"}
"""Deepgram's raw encodings -> ours."""
ENDPOINTING_MIN_MS = 100
"""Deepgram's `endpointing` default is 10 ms of silence; silero-vad needs more than one 32-ms frame
to call speech over, so shorter values are raised to this."""
IGNORED = {"punctuate", "smart_format", "model", "version", "tag", "diarize", "numerals", "profanity_filter",
           "filler_words", "dictation", "keywords", "keyterm", "mip_opt_out", "extra", "redact", "replace",
           "search", "utterances", "utt_split", "paragraphs", "detect_language", "callback", "callback_method",
           "no_delay"}
"""Accepted and without effect: Whisper punctuates and formats on its own; the rest are features
this server does not have (`utterances` matters only to `POST /v1/listen`)."""
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


@dataclass(frozen=True)
class ListenOptions:
    """The query parameters of `/v1/listen`, validated."""

    encoding: str | None = None
    """Ours (`pcm_s16le`, `mulaw`, `alaw`); None: a container file (POST only)."""
    sample_rate: int = 16000
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
        rate = 8000 if encoding in ("mulaw", "alaw") else 16000
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
        encoding=ENCODINGS[encoding] if encoding is not None else None, sample_rate=rate or 16000, channels=channels,
        multichannel=_bool(query, "multichannel", False), interim_results=streaming.partials,
        vad_events=_bool(query, "vad_events", False), utterance_end_ms=_int(query, "utterance_end_ms", 1000, 60000),
        utterances=_bool(query, "utterances", False), language=language, streaming=streaming)


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


class ListenProtocol:
    """The live API's messages for one stream, without I/O."""

    def __init__(self, options: ListenOptions, model_name: str):
        self.options = options
        self.request_id = str(uuid.uuid4())
        self.model_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"streamer:{model_name}"))
        self.model_name = model_name
        self.created = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        self._finalizing = False
        self._from_finalize: set[tuple[int, int]] = set()
        self._digest = hashlib.sha256()
        self.duration = 0.0

    @property
    def n_channels(self) -> int:
        return self.options.channels if self.options.multichannel else 1

    def audio(self, data: bytes) -> None:
        self._digest.update(data)

    def finalize_started(self) -> None:
        self._finalizing = True

    def finalize_done(self, any_open: bool) -> list[dict]:
        """After a `Finalize`: when nothing was open, an empty final says so at once."""
        self._finalizing = False
        if any_open:
            return []
        return [self._results(0, "", [], None, self.duration, self.duration, is_final=True, speech_final=False,
                              from_finalize=True)]

    def on_event(self, event: StreamEvent, channel: int | None) -> list[dict]:
        ch = channel or 0
        if isinstance(event, SpeechStarted):
            if self.options.vad_events:
                return [{"type": "SpeechStarted", "channel": [ch, self.n_channels], "timestamp": round(event.t, 3)}]
            return []
        if isinstance(event, Partial):
            return [self._results(ch, event.text.strip(), [], None, event.start, event.end, is_final=False,
                                  speech_final=False, from_finalize=False)]
        if isinstance(event, Committed):
            if self._finalizing:
                self._from_finalize.add((ch, event.utterance_id))
            return []
        if isinstance(event, Finalized):
            finalized = (ch, event.utterance_id) in self._from_finalize
            self._from_finalize.discard((ch, event.utterance_id))
            final: Final | None = event.final
            if final is None:
                return []
            words = dg_words(final.words)
            out = [self._results(ch, final.text, words, final.avg_logprob, final.start, final.end, is_final=True,
                                 speech_final=not finalized, from_finalize=finalized)]
            if self.options.utterance_end_ms is not None:
                last = words[-1]["end"] if words else round(final.end, 3)
                out.append({"type": "UtteranceEnd", "channel": [ch, self.n_channels], "last_word_end": last})
            return out
        return []  # SpeechStopped: Deepgram has no message of its own for it

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
            "metadata": {"request_id": self.request_id, "model_uuid": self.model_uuid,
                         "model_info": {"name": self.model_name, "version": MODEL_VERSION, "arch": MODEL_ARCH}},
        }

    def metadata(self) -> dict:
        """The last message, after `CloseStream`."""
        return {"type": "Metadata", "transaction_key": "deprecated", "request_id": self.request_id,
                "sha256": self._digest.hexdigest(), "created": self.created, "duration": round(self.duration, 3),
                "channels": self.n_channels, "models": [self.model_uuid],
                "model_info": {self.model_uuid: {"name": self.model_name, "version": MODEL_VERSION,
                                                 "arch": MODEL_ARCH}}}

    @staticmethod
    def control(text: str) -> str:
        """A client text message -> `KeepAlive`, `Finalize` or `CloseStream`; raises ListenError."""
        try:
            msg = json.loads(text)
        except ValueError:
            raise ListenError("a text message must be JSON: {\"type\": \"KeepAlive\" | \"Finalize\" | "
                              "\"CloseStream\"}", "INVALID_MESSAGE") from None
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind not in ("KeepAlive", "Finalize", "CloseStream"):
            raise ListenError(f"unknown message type {kind!r} (KeepAlive, Finalize, CloseStream)", "INVALID_MESSAGE")
        return kind


class DeepgramStream(SocketStream):
    """One `WS /v1/listen` connection: binary audio and control messages in, Deepgram messages out."""

    transport = "deepgram"

    def __init__(self, ws: WebSocket, state: ServerState):
        super().__init__(ws, state, uuid.uuid4().hex[:16])
        self._protocol: ListenProtocol | None = None
        self._channels: ChannelStreams | None = None
        self._pending = b""

    def _send(self, message: dict) -> None:
        self._outbox.send(message)

    def _refuse(self, kind: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        self._send({"type": "Error", "variant": kind, "description": message, "message": message})
        self._outbox.close(close_code)

    async def _serve(self) -> None:
        tokenizer = self.state.engine.tokenizer
        try:
            options = parse_options(_query(self.ws.scope),
                                    self.state.settings.streaming, tokenizer.multilingual,
                                    set(tokenizer.language_tokens), live=True)
        except ListenError as e:
            self.state.metrics.errors.labels("bad_field").inc()
            self._send(e.message_event())
            self._outbox.close(1008)
            return
        protocol = self._protocol = ListenProtocol(options, self.state.engine.model_name)

        def make_bridge(channel: int | None) -> Bridge:
            def emit(event: StreamEvent) -> None:
                if isinstance(event, Finalized) and event.error is not None:
                    log.error("deepgram %s: %s", self.session_id, event.error)
                for message in protocol.on_event(event, channel):
                    self._send(message)

            return Bridge(Session(options.streaming, self.state.vad), self.state.engine, self.state.metrics, emit,
                          session_id=self.session_id, language=options.language, task="transcribe",
                          word_timestamps=True, cadence=self.state.cadence)

        self._channels = ChannelStreams(rate=options.sample_rate, channels=options.channels,
                                        encoding=options.encoding, multichannel=options.multichannel,
                                        make_bridge=make_bridge)
        self._receiver = asyncio.ensure_future(self._receive_loop())
        await asyncio.wait([self._receiver])
        reason = "shutdown" if self._receiver.cancelled() else self._receiver.result()
        if reason == "disconnect":
            self._channels.close()
            self._outbox.abandon()
            return
        await self._channels.finish(self._grace if reason == "shutdown" else FINISH_TIMEOUT_S)
        protocol.duration = self._channels.stream_time
        self._send(protocol.metadata())
        self._outbox.close(1001 if reason == "shutdown" else 1000)

    async def _receive_loop(self) -> str:
        limit = self.state.settings.server.max_message_bytes
        channels, protocol = self._channels, self._protocol
        while True:
            message = await self._next_message()
            if isinstance(message, str):
                return message
            text, data = message.get("text"), message.get("bytes")
            if data is not None:
                if len(data) > limit:
                    self._send(ListenError(f"a {len(data)}-byte message is over the {limit}-byte limit",
                                           "DATA-0001").message_event())
                    continue
                protocol.audio(data)
                data = self._pending + data
                whole = len(data) - len(data) % channels.frame_bytes
                self._pending = data[whole:]
                if whole:
                    channels.push(data[:whole])
                protocol.duration = channels.stream_time
                continue
            try:
                kind = protocol.control(text or "")
            except ListenError as e:
                self.state.metrics.errors.labels("unknown_type").inc()
                self._send(e.message_event())
                continue
            if kind == "CloseStream":
                return "stop"
            if kind == "Finalize":
                protocol.finalize_started()
                opened = channels.flush()
                for m in protocol.finalize_done(opened):
                    self._send(m)


def _query(scope) -> dict[str, list[str]]:
    return parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)


async def listen_endpoint(ws: WebSocket) -> None:
    await DeepgramStream(ws, ws.app.state.streamer).run()


# --- POST /v1/listen ---------------------------------------------------------------------------------

def _decode_raw(body: bytes, options: ListenOptions) -> np.ndarray:
    """Headerless audio (`encoding` given) -> [channels, N] at 16 kHz."""
    frame = _pcm_dtype(options.encoding).itemsize * options.channels
    body = body[: len(body) - len(body) % frame]
    if not body:
        raise ListenError("no audio in the request body", "DATA-0000")
    frames = np.frombuffer(body, np.uint8).reshape(-1, options.channels, frame // options.channels)
    out = []
    for c in range(options.channels):
        resampler = StreamResampler(options.sample_rate, 1, options.encoding)
        data = frames[:, c, :].tobytes()
        out.append(np.concatenate([resampler.push(data), resampler.flush()]))
    return np.stack(out)


async def listen_file(request: Request) -> JSONResponse:
    """`POST /v1/listen`: a recording in the body (any container PyAV reads, or raw audio with
    `encoding`), Deepgram's pre-recorded response shape."""
    state: ServerState = request.app.state.streamer
    request_id = str(uuid.uuid4())
    engine = state.engine
    if engine is None or state.shutting_down:
        return JSONResponse({"err_code": "SERVICE_UNAVAILABLE", "err_msg": "the server is not ready",
                             "request_id": request_id}, status_code=503)
    started = time.monotonic()
    try:
        options = parse_options(_query(request.scope), state.settings.streaming, engine.tokenizer.multilingual,
                                set(engine.tokenizer.language_tokens), live=False)
        if request.headers.get("content-type", "").startswith("application/json"):
            raise ListenError("transcribing a URL needs network access this server does not have: send the "
                              "audio in the body", "INVALID_REQUEST")
        limits = state.settings.server
        max_bytes = int(limits.max_upload_mb * 2**20)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                return JSONResponse(ListenError(f"the body is over the {limits.max_upload_mb:g} MB limit",
                                                "PAYLOAD_TOO_LARGE").http_body(request_id), status_code=413)
        if options.encoding is not None:
            audio = await asyncio.to_thread(_decode_raw, bytes(body), options)
        else:
            audio = await asyncio.to_thread(decode_audio, bytes(body), max_seconds=limits.max_audio_s,
                                            name="body", mono=False)
        if not options.multichannel and audio.shape[0] > 1:
            audio = audio.mean(axis=0, keepdims=True)
        decode = DecodeOptions(language=options.language)
        transcripts = await asyncio.gather(*(transcribe_long(engine, a, mode=limits.mode, options=decode,
                                                             word_timestamps=True) for a in audio))
    except ListenError as e:
        return JSONResponse(e.http_body(request_id), status_code=400)
    except AudioDecodeError as e:
        return JSONResponse(ListenError(str(e), "UNSUPPORTED_MEDIA").http_body(request_id), status_code=400)
    except QueueFull as e:
        return JSONResponse({"err_code": "TOO_MANY_REQUESTS", "err_msg": str(e), "request_id": request_id},
                            status_code=429, headers={"Retry-After": str(max(1, round(e.retry_after_s)))})
    except EngineClosed:
        return JSONResponse({"err_code": "SERVICE_UNAVAILABLE", "err_msg": "the server is shutting down",
                             "request_id": request_id}, status_code=503)
    duration = audio.shape[1] / SAMPLE_RATE
    state.metrics.observe_file(duration * len(transcripts), time.monotonic() - started)
    body_digest = hashlib.sha256(body).hexdigest()
    return JSONResponse(file_response(transcripts, options, engine.model_name, request_id, duration, body_digest))


def file_response(transcripts: list, options: ListenOptions, model_name: str, request_id: str, duration: float,
                  sha256: str) -> dict:
    """Deepgram's pre-recorded response for one transcript per channel."""
    model_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"streamer:{model_name}"))
    channels, utterances = [], []
    for c, t in enumerate(transcripts):
        words = dg_words([{"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
                          for w in t.words])
        logprob = float(np.mean([s.avg_logprob for s in t.segments])) if t.segments else None
        alternative = {"transcript": t.text.strip(), "confidence": confidence(words, logprob), "words": words}
        channels.append({"alternatives": [alternative], **({"detected_language": t.language} if t.language else {})})
        if options.utterances:
            for s in t.segments:
                seg_words = dg_words([{"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
                                      for w in (s.words or [])])
                utterances.append({"start": s.start, "end": s.end, "confidence": confidence(seg_words, s.avg_logprob),
                                   "channel": c, "transcript": s.text.strip(), "words": seg_words,
                                   "id": str(uuid.uuid4())})
    results: dict[str, Any] = {"channels": channels}
    if options.utterances:
        results["utterances"] = sorted(utterances, key=lambda u: (u["start"], u["channel"]))
    created = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    metadata = {"transaction_key": "deprecated", "request_id": request_id, "sha256": sha256, "created": created,
                "duration": round(duration, 3), "channels": len(transcripts), "models": [model_uuid],
                "model_info": {model_uuid: {"name": model_name, "version": MODEL_VERSION, "arch": MODEL_ARCH}}}
    return {"metadata": metadata, "results": results}
