"""`/v1/realtime`: OpenAI's Realtime API in transcription mode (docs/protocol.md, section 2).

Base64 PCM16 in `input_audio_buffer.append` (24 kHz unless the session's format says another
rate) is resampled and fed to a `Bridge`, whose events become Realtime events:

    SpeechStarted -> input_audio_buffer.speech_started (server VAD only)
    SpeechStopped -> input_audio_buffer.speech_stopped (server VAD only)
    Committed     -> input_audio_buffer.committed (a cut also gets speech_stopped / speech_started)
    Finalized     -> the transcript as one delta, then ...transcription.completed (or .failed), in
                     commit order: the deltas of an item join exactly to its transcript, so no
                     partial decodes run for Realtime items (their text could differ from the final's)

With `turn_detection: null` the client cuts items: the Session then runs with a VAD that hears
speech everywhere and never ends it by silence (threshold 0, no negative threshold), so its one
open utterance is exactly the audio appended since the last commit, and `commit` is `flush`.

A `session.update` that changes the rate or the turn detection after audio has been appended
commits the open item and starts a new segmentation (Session, resampler, Bridge) at the
current stream time; the old one finishes its finals in the background.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import logging
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket

from streamer.audio.decode import StreamResampler
from streamer.config import StreamingConfig
from streamer.server import validation as v
from streamer.server.bridge import Bridge, Committed, Finalized, StreamEvent
from streamer.server.state import ServerState
from streamer.server.socket_stream import FINISH_TIMEOUT_S, SocketStream
from streamer.server.stream import ProtocolError, model_info, parse_language
from streamer.server.validation import ValidationError
from streamer.streaming.events import SpeechStarted, SpeechStopped
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")

DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"

DEFAULT_RATE = 24000
"""OpenAI's only PCM rate, the default here."""
MIN_RATE, MAX_RATE = 8000, 48000
G711_FORMATS = {"audio/pcmu": "mulaw", "audio/pcma": "alaw"}
"""GA `format.type` of G.711 (always 8 kHz, as OpenAI) -> our encoding."""
BETA_FORMATS = {"pcm16": "pcm_s16le", "g711_ulaw": "mulaw", "g711_alaw": "alaw"}
G711_RATE = 8000
MIN_COMMIT_S = 0.1
"""A manual commit of less audio than this is `input_audio_buffer_commit_empty` (as OpenAI)."""
MAX_ERROR_CHARS = 300
"""Longest error message (it may quote what the client sent)."""
MAX_ID_CHARS = 64
"""Longest client `event_id` echoed in an error."""
MAX_PROMPT_CHARS = 4096
"""Longest transcription prompt (Whisper's prompt holds at most 223 tokens)."""
NEVER_MS = 10**9
"""`min_silence_ms` of the manual mode's VAD: silence never ends an item."""


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(11)


@dataclass(frozen=True)
class TurnDetection:
    """Server VAD settings, mapped onto `VADConfig`."""

    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int

    def wire(self) -> dict:
        return {"type": "server_vad", **dataclasses.asdict(self)}


@dataclass(frozen=True)
class RealtimeConfig:
    """The session's effective configuration."""

    rate: int
    language: str | None
    prompt: str
    turn_detection: TurnDetection | None
    encoding: str = "pcm_s16le"
    """`pcm_s16le`, or G.711 `mulaw` / `alaw` at 8 kHz."""
    condition_on_previous_text: bool = True
    """Prompt each item with the previous items' text (an extension of OpenAI's API)."""


class InvalidValue(Exception):
    def __init__(self, message: str, param: str, code: str = "invalid_value"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass
class _Item:
    id: str
    stopped: bool = False
    """speech_stopped was sent."""


@dataclass
class _Segmentation:
    """A Session with its resampler and bridge; `offset` is the stream time at which it began."""

    number: int
    config: RealtimeConfig
    resampler: StreamResampler
    bridge: Bridge
    offset: float
    committed_to: float = 0.0
    """Session time up to which audio was committed (manual mode)."""

    @property
    def manual(self) -> bool:
        return self.config.turn_detection is None


class RealtimeStream(SocketStream):
    """One `/v1/realtime` connection."""

    transport = "realtime"

    def __init__(self, ws: WebSocket, state: ServerState):
        super().__init__(ws, state, _id("sess_"))
        self.beta = "realtime=v1" in ws.headers.get("openai-beta", "")
        vad = state.settings.streaming.vad
        self.config = RealtimeConfig(
            rate=DEFAULT_RATE, language=state.settings.streaming.language, prompt="",
            turn_detection=TurnDetection(vad.threshold, vad.speech_pad_ms, vad.min_silence_ms),
            condition_on_previous_text=state.settings.streaming.condition_on_previous)
        self._seg: _Segmentation | None = None
        """The segmentation that takes new audio (None until the first append after a change)."""
        self._segs: dict[int, _Segmentation] = {}
        """Every segmentation with work left, the current one included, by number."""
        self._retiring: set[asyncio.Task] = set()
        self._numbers = 0
        self._time_base = 0.0
        """Stream time at which the next segmentation begins."""
        self._items: dict[tuple[int, int], _Item] = {}
        self._previous_item: str | None = None
        self._order: deque[str] = deque()
        """Committed items whose completion has not been sent, in commit order."""
        self._completions: dict[str, list[tuple[str, dict]]] = {}
        """Messages of finalised items waiting for earlier items' completions."""

    # --- the connection -----------------------------------------------------------------------------

    async def _serve(self) -> None:
        if (refusal := self.state.engine_refusal()) is not None:  # (`/v1/stream` asks at its start message)
            self._refuse(refusal.code, refusal.reason, 1013, refusal.retry_after_s)
            return
        self._event("transcription_session.created" if self.beta else "session.created", session=self._session_wire())
        self._receiver = asyncio.ensure_future(self._receive_loop())
        await asyncio.wait([self._receiver])
        if self._receiver.cancelled():
            reason = "error" if self.stuck else "shutdown"
        else:
            reason = self._receiver.result()
        if reason in ("disconnect", "error"):
            for seg in self._segs.values():
                seg.bridge.close()
                seg.resampler.close()
            for task in self._retiring:
                task.cancel()
            if reason == "disconnect":
                self._outbox.abandon()
            return
        timeout = self._grace if reason == "shutdown" else FINISH_TIMEOUT_S
        self._retire(timeout)
        if self._retiring:
            await asyncio.wait(self._retiring, timeout=timeout)
        self._outbox.close(1001 if reason == "shutdown" else 1000)

    def _subprotocol(self) -> str | None:
        # OpenAI's browser-style clients offer `realtime` (and the key as a second subprotocol):
        # the handshake fails unless the server selects one of them.
        return "realtime" if "realtime" in self.ws.scope.get("subprotocols", ()) else None

    def _event(self, type_: str, **fields: Any) -> None:
        self._outbox.send({"type": type_, "event_id": _id("event_"), **fields})

    def _error(self, type_: str, code: str, message: str, param: str | None = None,
               client_event: str | None = None, retry_after_s: float | None = None) -> None:
        self.state.metrics.errors.labels(code).inc()
        message = message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
        error = {"type": type_, "code": code, "message": message, "param": param, "event_id": client_event}
        if retry_after_s is not None:
            error["retry_after_s"] = retry_after_s  # an extension: when to come back
        self._event("error", error=error)

    def _refuse(self, kind: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        type_, code = {"unauthorized": ("invalid_request_error", "invalid_api_key"),
                       "overloaded": ("server_error", "overloaded"),
                       "shutting_down": ("server_error", "shutting_down")}.get(kind, ("server_error", "internal_error"))
        self._fatal(type_, code, message, close_code, retry_after_s)

    def _fatal(self, type_: str, code: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        self._error(type_, code, message, retry_after_s=retry_after_s)
        self._outbox.close(close_code)

    # --- receiving ----------------------------------------------------------------------------------

    async def _receive_loop(self) -> str:
        """Client events until the connection ends; returns why: idle_timeout, disconnect or error."""
        limit = self.state.settings.server.max_message_bytes
        while True:
            if self._seg is not None:
                await self._seg.bridge.wait_for_room(self.state.settings.server.max_backlog_s)
            message = await self._next_message()
            if isinstance(message, str):
                return message
            text = message.get("text")
            if text is None:
                text = (message.get("bytes") or b"").decode("utf-8", "replace")
            if len(text.encode()) > limit:
                self._fatal("invalid_request_error", "message_too_large", f"a message is over the {limit}-byte limit",
                            1009)
                return "error"
            try:
                self._on_text(text)
            except Exception as e:  # a bug: the event is refused, the session goes on
                log.exception("realtime %s: internal error on a client event", self.session_id)
                self._error("server_error", "internal_error", f"internal error: {type(e).__name__}")

    def _on_text(self, text: str) -> None:
        try:
            msg = v.parse_json(text)
        except ValidationError as e:
            return self._error("invalid_request_error", "invalid_json", e.message)
        if not isinstance(msg, dict):
            return self._error("invalid_request_error", "invalid_json", "an event must be a JSON object")
        kind, client_event = msg.get("type"), msg.get("event_id")
        client_event = client_event if isinstance(client_event, str) and len(client_event) <= MAX_ID_CHARS else None
        try:
            if kind == "input_audio_buffer.append":
                self._append(msg.get("audio"))
            elif kind == "input_audio_buffer.commit":
                self._commit()
            elif kind == "input_audio_buffer.clear":
                self._clear()
            elif kind in ("session.update", "transcription_session.update"):
                self._update(msg.get("session"), beta=kind.startswith("transcription_session"))
            else:
                self._error("invalid_request_error", "unknown_event", f"unsupported event type {v.show(kind)}",
                            client_event=client_event)
        except InvalidValue as e:
            self._error("invalid_request_error", e.code, e.message, e.param, client_event)
        except ValidationError as e:
            self._error("invalid_request_error", "invalid_value", f"{e.field}: {e.message}", e.field, client_event)

    def _append(self, audio: Any) -> None:
        if not isinstance(audio, str):
            raise InvalidValue("`audio` must be a base64 string", "audio", "invalid_audio")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidValue("`audio` is not valid base64", "audio", "invalid_audio") from None
        if self.config.encoding == "pcm_s16le" and len(data) % 2:
            raise InvalidValue(f"{len(data)} bytes is not a whole number of 16-bit samples", "audio", "invalid_audio")
        self.audio_seen = True
        seg = self._seg or self._begin()
        seg.bridge.feed(seg.resampler.push(data))

    def _commit(self) -> None:
        seg = self._seg
        if seg is not None and seg.manual:
            if seg.bridge.session.stream_time - seg.committed_to >= MIN_COMMIT_S:
                seg.committed_to = seg.bridge.session.stream_time
                seg.bridge.flush()
                return
        elif seg is not None and seg.bridge.flush():
            return
        raise InvalidValue("the input audio buffer holds nothing to commit" if seg is None or seg.manual
                           else "no speech is open to commit", "input_audio_buffer", "input_audio_buffer_commit_empty")

    def _clear(self) -> None:
        seg = self._seg
        if seg is not None:
            seg.bridge.drop_open()
            seg.committed_to = seg.bridge.session.stream_time
        self._event("input_audio_buffer.cleared")

    def _update(self, session: Any, *, beta: bool) -> None:
        if not isinstance(session, dict):
            raise InvalidValue("`session` must be an object", "session")
        config = self._parse_beta(session) if beta else self._parse_ga(session)
        seg = self._seg
        if seg is not None:
            if seg.manual:
                if seg.bridge.session.stream_time - seg.committed_to >= MIN_COMMIT_S:
                    seg.committed_to = seg.bridge.session.stream_time
                    seg.bridge.flush()
            else:
                seg.bridge.flush()
            if (config.rate, config.encoding, config.turn_detection) != \
                    (seg.config.rate, seg.config.encoding, seg.config.turn_detection):
                self._retire(FINISH_TIMEOUT_S)
            else:
                seg.bridge.language = self._decoder_language(config.language)
                session_ = seg.bridge.session  # the next items' prompts follow the new settings
                session_.config = dataclasses.replace(session_.config, prompt=config.prompt.strip() or None,
                                                      condition_on_previous=config.condition_on_previous_text)
        self.config = config
        if beta:
            self._event("transcription_session.updated", session=self._session_wire(beta=True))
        else:
            self._event("session.updated", session=self._session_wire(beta=False))

    # --- session configuration ----------------------------------------------------------------------

    def _parse_ga(self, session: dict) -> RealtimeConfig:
        if session.get("type", "transcription") != "transcription":
            raise InvalidValue(f"session.type {v.show(session.get('type'))} is not supported: this server only transcribes",
                               "session.type", "unsupported_session_type")
        audio = _object(session, "audio", "session")
        inp = _object(audio, "input", "session.audio")
        config = self.config
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
            config = self._transcription(config, inp["transcription"], "session.audio.input.transcription")
        if "turn_detection" in inp:
            config = self._turn_detection(config, inp["turn_detection"], "session.audio.input.turn_detection")
        return config

    def _parse_beta(self, session: dict) -> RealtimeConfig:
        config = self.config
        if "input_audio_format" in session:
            encoding = BETA_FORMATS.get(session["input_audio_format"]) \
                if isinstance(session["input_audio_format"], str) else None
            if encoding is None:
                raise InvalidValue(f"input_audio_format {v.show(session['input_audio_format'])} is not supported "
                                   f"({', '.join(BETA_FORMATS)})", "session.input_audio_format")
            config = dataclasses.replace(config, encoding=encoding,
                                         rate=DEFAULT_RATE if encoding == "pcm_s16le" else G711_RATE)
        if "input_audio_transcription" in session:
            config = self._transcription(config, session["input_audio_transcription"],
                                         "session.input_audio_transcription")
        if "turn_detection" in session:
            config = self._turn_detection(config, session["turn_detection"], "session.turn_detection")
        return config

    def _transcription(self, config: RealtimeConfig, value: Any, param: str) -> RealtimeConfig:
        if value is None:
            return config
        if not isinstance(value, dict):
            raise InvalidValue(f"{param} must be an object", param)
        if "language" in value:
            multilingual, languages = model_info(self.state)
            try:
                language = parse_language(value["language"], multilingual, languages)
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

    def _turn_detection(self, config: RealtimeConfig, value: Any, param: str) -> RealtimeConfig:
        if value is None:
            return dataclasses.replace(config, turn_detection=None)
        if not isinstance(value, dict):
            raise InvalidValue(f"{param} must be an object or null", param)
        if value.get("type", "server_vad") != "server_vad":
            raise InvalidValue(f"turn_detection.type {v.show(value.get('type'))} is not supported (only server_vad)",
                               f"{param}.type")
        vad = self.state.settings.streaming.vad
        current = config.turn_detection or TurnDetection(vad.threshold, vad.speech_pad_ms, vad.min_silence_ms)
        threshold = _range(value, "threshold", 0.0, 1.0, current.threshold, param, open_ends=True)
        padding = _range(value, "prefix_padding_ms", 0, 2000, current.prefix_padding_ms, param, integer=True)
        silence = _range(value, "silence_duration_ms", 0, 10000, current.silence_duration_ms, param, integer=True)
        return dataclasses.replace(config, turn_detection=TurnDetection(threshold, padding, silence))

    def _session_wire(self, beta: bool | None = None) -> dict:
        beta = self.beta if beta is None else beta
        c = self.config
        transcription = {"model": self.state.engine.model_name, "language": c.language, "prompt": c.prompt,
                         "condition_on_previous_text": c.condition_on_previous_text}
        turn = c.turn_detection.wire() if c.turn_detection is not None else None
        if beta:
            beta_format = next(k for k, v in BETA_FORMATS.items() if v == c.encoding)
            return {"id": self.session_id, "object": "realtime.transcription_session", "input_audio_format": beta_format,
                    "input_audio_transcription": transcription, "turn_detection": turn,
                    "input_audio_noise_reduction": None, "include": []}
        # GA: no `noise_reduction` and no `language: null` (the SDKs' types allow neither null);
        # an absent language means detection, as in OpenAI's own sessions.
        if c.language is None:
            del transcription["language"]
        return {"object": "realtime.session", "type": "transcription", "id": self.session_id,
                "audio": {"input": {"format": _format_wire(c),
                                    "transcription": transcription, "turn_detection": turn}},
                "include": []}

    def _decoder_language(self, language: str | None) -> str | None:
        multilingual, _ = model_info(self.state)
        return language if multilingual else "en"

    # --- segmentations ------------------------------------------------------------------------------

    def _begin(self) -> _Segmentation:
        """A new Session (and bridge) for the current config, at the current stream time."""
        c = self.config
        defaults: StreamingConfig = self.state.settings.streaming
        if c.turn_detection is None:
            vad = dataclasses.replace(defaults.vad, threshold=0.0, neg_threshold=0.0, min_silence_ms=NEVER_MS,
                                      speech_pad_ms=0, min_speech_ms=0)
            streaming = dataclasses.replace(defaults, vad=vad, partials=False)
        else:
            t = c.turn_detection
            vad = dataclasses.replace(defaults.vad, threshold=t.threshold, speech_pad_ms=t.prefix_padding_ms,
                                      min_silence_ms=t.silence_duration_ms, neg_threshold=None)
            streaming = dataclasses.replace(defaults, vad=vad, partials=False)
        # The item prompt opens every item's prompt, before the previous items' text.
        streaming = dataclasses.replace(streaming, prompt=c.prompt.strip() or None,
                                        condition_on_previous=c.condition_on_previous_text)
        self._numbers += 1
        bridge = Bridge(Session(streaming, self.state.vad), self.state.engine, self.state.metrics,
                        functools.partial(self._on_event, self._numbers), session_id=self.session_id,
                        language=self._decoder_language(c.language), task="transcribe",
                        cadence=self.state.cadence)
        seg = _Segmentation(self._numbers, c, StreamResampler(c.rate, 1, c.encoding), bridge, self._time_base)
        self._segs[seg.number] = seg
        self._seg = seg
        return seg

    def _retire(self, timeout: float) -> None:
        """Finish the current segmentation in the background: open item committed, finals delivered."""
        seg, self._seg = self._seg, None
        if seg is None:
            return
        seg.bridge.feed(seg.resampler.flush())
        self._time_base = seg.offset + seg.bridge.session.stream_time
        task = asyncio.ensure_future(seg.bridge.finish(timeout))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        task.add_done_callback(lambda _: self._segs.pop(seg.number, None))

    # --- bridge events ------------------------------------------------------------------------------

    def _item(self, number: int, utterance_id: int) -> _Item:
        key = (number, utterance_id)
        if key not in self._items:
            self._items[key] = _Item(_id("item_"))
        return self._items[key]

    def _on_event(self, number: int, event: StreamEvent) -> None:
        seg = self._segs[number]

        def ms(t: float) -> int:
            return int(round((seg.offset + t) * 1000))

        if isinstance(event, SpeechStarted):
            if not seg.manual:
                item = self._item(number, event.utterance_id)
                pad = seg.config.turn_detection.prefix_padding_ms / 1000.0
                self._event("input_audio_buffer.speech_started", audio_start_ms=ms(max(0.0, event.t - pad)),
                            item_id=item.id)
        elif isinstance(event, SpeechStopped):
            if not seg.manual:
                item = self._item(number, event.utterance_id)
                item.stopped = True
                self._event("input_audio_buffer.speech_stopped", audio_end_ms=ms(event.t), item_id=item.id)
        elif isinstance(event, Committed):
            self._on_committed(seg, event, ms)
        elif isinstance(event, Finalized):
            self._on_finalized(seg, event)

    def _on_committed(self, seg: _Segmentation, event: Committed, ms) -> None:
        item = self._item(seg.number, event.utterance_id)
        # Server VAD without speech_stopped: a max-length cut, and speech goes on as the next item.
        cut = not seg.manual and not item.stopped
        if cut:
            self._event("input_audio_buffer.speech_stopped", audio_end_ms=ms(event.speech_end), item_id=item.id)
        self._event("input_audio_buffer.committed", item_id=item.id, previous_item_id=self._previous_item)
        self._previous_item = item.id
        self._order.append(item.id)
        if cut:
            following = self._item(seg.number, event.utterance_id + 1)
            self._event("input_audio_buffer.speech_started", audio_start_ms=ms(event.end), item_id=following.id)

    def _on_finalized(self, seg: _Segmentation, event: Finalized) -> None:
        item = self._items.pop((seg.number, event.utterance_id))
        messages: list[tuple[str, dict]] = []
        if event.error is not None:
            messages.append((FAILED, {"item_id": item.id, "content_index": 0, "error": {
                "type": "server_error", "code": "internal_error", "message": event.error, "param": None}}))
        else:
            # Deltas come from the final decode alone, so that they join to the transcript exactly:
            # a partial's text, stable or not, may differ from the final's (case, punctuation, a
            # word that the whole utterance decodes otherwise).
            transcript = event.final.text if event.final is not None else ""
            if transcript:
                messages.append((DELTA, {"item_id": item.id, "content_index": 0, "delta": transcript}))
            messages.append((COMPLETED, {"item_id": item.id, "content_index": 0, "transcript": transcript,
                                         "usage": {"type": "duration", "seconds": round(event.duration, 3)}}))
        self._completions[item.id] = messages
        # Completions go out in commit order, whichever segmentation finished first.
        while self._order and self._order[0] in self._completions:
            for type_, fields in self._completions.pop(self._order.popleft()):
                self._event(type_, **fields)


async def realtime_endpoint(ws: WebSocket) -> None:
    await RealtimeStream(ws, ws.app.state.streamer).run()


def _object(parent: dict, name: str, where: str) -> dict:
    value = parent.get(name, {})
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise InvalidValue(f"{where}.{name} must be an object", f"{where}.{name}")
    return value


def _format_wire(c: RealtimeConfig) -> dict:
    if c.encoding == "pcm_s16le":
        return {"type": "audio/pcm", "rate": c.rate}
    return {"type": next(k for k, v in G711_FORMATS.items() if v == c.encoding)}


def _rate(value: Any, param: str) -> int:
    return v.integer(value, param, MIN_RATE, MAX_RATE)


def _range(obj: dict, name: str, low: float, high: float, default, where: str, *, integer: bool = False,
           open_ends: bool = False):
    if name not in obj or obj[name] is None:
        return default
    return v.number(obj[name], f"{where}.{name}", low, high, open_low=open_ends, open_high=open_ends, integer=integer)
