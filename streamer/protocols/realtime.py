"""OpenAI's Realtime API in transcription mode (docs/protocol.md, section 2) as a state machine
with no I/O.

`RealtimeProtocol` is one `/v1/realtime` connection. Client events in (`receive`); out come
Realtime server events (`Send`), the connection's end (`Close`) and commands on the session's
segmentations, each of which the transport runs as a `Session` with its `Bridge`:

    Begin(number, streaming, language)     a new segmentation, at the current stream time
    Feed(number, pcm)                      its next 16-kHz audio (the protocol decodes the base64
                                           and resamples, so it knows each segmentation's time)
    Flush(number, report)                  end its open item now; with `report`, answer
                                           `flushed(opened)` with whether one was open
    DropOpen(number)                       abandon its open item (`clear`)
    Reconfigure(number, language, prompt, condition_on_previous)   for its next items
    Finish(number)                         deliver its last finals in the background, then
                                           answer `finished(number, timeout_s)` (the finals it
                                           gave up on fail their items)
    Settle(number)                         hand it the audio still waiting for the VAD now (its
                                           events come through `on_event`), then answer `settled()`

The bridges' events come back through `on_event(number, event)`:

    SpeechStarted -> input_audio_buffer.speech_started (server VAD only)
    SpeechStopped -> input_audio_buffer.speech_stopped (server VAD only)
    Committed     -> input_audio_buffer.committed (a cut also gets speech_stopped / speech_started)
    Finalized     -> the transcript as one delta, then ...transcription.completed (or .failed), in
                     commit order: the deltas of an item join exactly to its transcript, so no
                     partial decodes run for Realtime items (their text could differ from the final's)

With `turn_detection: null` the client cuts items: the segmentation's Session then runs with
`manual_commit` (its one open utterance is the audio appended since the last commit, and
`commit` is `Flush`). A buffer that reaches `max_utterance_s` is committed automatically, where
the VAD finds it quietest; so a decision on what the buffer holds (a commit, an update, the end)
waits for a `Settle`, which brings in the automatic commits of all the audio before it. A
`session.update` that changes the rate, the format or the turn detection after audio has been
appended commits the open item and begins a new segmentation at the current stream time; the old
one finishes its finals in the background. An item is named by its segmentation and utterance
(`ItemKey`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Union

import numpy as np

from streamer.audio import SAMPLE_RATE
from streamer.audio.decode import StreamResampler
from streamer.config import StreamingConfig
from streamer.protocols import validation as v
from streamer.protocols.outputs import Close, Send, logprobs_wire
from streamer.protocols.realtime_session import InvalidValue, RealtimeConfig, parse_update, session_wire
from streamer.protocols.start import ModelInfo
from streamer.protocols.validation import ValidationError
from streamer.streaming.events import SpeechStarted, SpeechStopped
from streamer.streaming.live import Committed, Finalized, StreamEvent

DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"

MIN_COMMIT_S = 0.1
"""A manual commit of less audio than this is `input_audio_buffer_commit_empty` (as OpenAI)."""
EMPTY_BUFFER = "the input audio buffer holds nothing to commit"
MAX_ERROR_CHARS = 300
"""Longest error message (it may quote what the client sent)."""
MAX_ID_CHARS = 64
"""Longest client `event_id` echoed in an error."""
REFUSALS = {"unauthorized": ("invalid_request_error", "invalid_api_key"),
            "overloaded": ("server_error", "overloaded"),
            "shutting_down": ("server_error", "shutting_down")}
"""A connection refused by the transport (its kind) -> OpenAI's error type and code."""
TIMEOUTS = {"idle_timeout": "the session is closed: no client event for {:g} s",
            "no_audio": "the session is closed: no audio appended within {:g} s of connecting"}
"""A connection the server ends for want of client events -> the `error` message said first."""


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(11)


# --- what the protocol tells the transport --------------------------------------------------------

@dataclass(frozen=True)
class Begin:
    number: int
    streaming: StreamingConfig
    """The Session's configuration (`RealtimeConfig.streaming`)."""
    language: str | None
    """For the decoder (None: detect)."""


@dataclass(frozen=True, eq=False)
class Feed:
    number: int
    pcm: np.ndarray
    """float32, 16 kHz mono; possibly empty."""


@dataclass(frozen=True)
class Flush:
    number: int
    report: bool = False
    """Answer `flushed(opened)`: a server-VAD commit with no speech open is an error."""


@dataclass(frozen=True)
class DropOpen:
    number: int


@dataclass(frozen=True)
class Reconfigure:
    number: int
    language: str | None
    prompt: str | None
    condition_on_previous: bool


@dataclass(frozen=True)
class Finish:
    number: int


@dataclass(frozen=True)
class Settle:
    number: int


Output = Union[Send, Close, Begin, Feed, Flush, DropOpen, Reconfigure, Finish, Settle]


class ItemKey(NamedTuple):
    """An item by where its audio is: the segmentation and the utterance within it."""

    segmentation: int
    utterance_id: int


@dataclass
class _Item:
    id: str
    stopped: bool = False
    """speech_stopped was sent."""
    start: float = 0.0
    """Its segmentation's time where a max-length cut opened it (a discarded one's usage runs from here)."""


@dataclass
class _Segmentation:
    """A segmentation's state here: its config, resampler, and where it is in stream time."""

    number: int
    config: RealtimeConfig
    resampler: StreamResampler
    offset: float
    """Stream time at which it began."""
    samples: int = 0
    """16-kHz samples fed to it (its Session's `stream_time` * SAMPLE_RATE)."""
    appended: int = 0
    """Samples the client appended, at its own rate: what OpenAI's 100-ms rule counts (the
    resampler holds its last few samples back until more come, so `time` runs a little behind)."""
    committed: int = 0
    """`appended` up to which audio was committed (by the client, or automatically at
    `max_utterance_s`) or cleared (manual mode)."""

    @property
    def time(self) -> float:
        return self.samples / SAMPLE_RATE

    @property
    def uncommitted(self) -> bool:
        """At least `MIN_COMMIT_S` appended since the last commit or clear (manual mode)."""
        return self.appended - self.committed >= round(MIN_COMMIT_S * self.config.rate)

    @property
    def manual(self) -> bool:
        return self.config.manual


class RealtimeProtocol:
    """One `/v1/realtime` connection's protocol state."""

    def __init__(self, session_id: str, model: ModelInfo, defaults: StreamingConfig, *, beta: bool,
                 max_message_bytes: int | None = None, config: RealtimeConfig | None = None):
        self.session_id = session_id
        self.model = model
        self.defaults = defaults
        self.beta = beta
        """The client asked for the beta shapes (`OpenAI-Beta: realtime=v1`)."""
        self.max_message_bytes = max_message_bytes
        self.config = config or RealtimeConfig.default(defaults)
        """The session's settings (`config`: those a client secret opened it with)."""
        self.ended = False
        self._seg: _Segmentation | None = None
        """The segmentation that takes new audio (None until the first append after a change)."""
        self._segs: dict[int, _Segmentation] = {}
        """Every segmentation with work left, the current one included, by number."""
        self._numbers = 0
        self._time_base = 0.0
        """Stream time at which the next segmentation begins."""
        self._items: dict[ItemKey, _Item] = {}
        self._previous_item: str | None = None
        self._order: deque[str] = deque()
        """Committed items whose completion has not been sent, in commit order."""
        self._completions: dict[str, list[tuple[str, dict]]] = {}
        """Messages of finalised items waiting for earlier items' completions."""
        self._commit_event: str | None = None
        """The client `event_id` of the server-VAD commit awaiting `flushed`."""
        self._on_settled: Callable[[], list[Output]] | None = None
        """The decision on a manual buffer awaiting `settled`."""

    # --- the connection -------------------------------------------------------------------------

    def created(self) -> list[Output]:
        """The first server event."""
        kind = "transcription_session.created" if self.beta else "session.created"
        return [self._event(kind, session=session_wire(self.config, self.session_id, self.model.name, beta=self.beta))]

    def refuse(self, kind: str, message: str, close_code: int, retry_after_s: float | None = None) -> list[Output]:
        """The transport ends the connection (`kind`: unauthorized, overloaded, shutting_down, internal)."""
        type_, code = REFUSALS.get(kind, ("server_error", "internal_error"))
        return self.fail(type_, code, message, close_code, retry_after_s)

    def fail(self, type_: str, code: str, message: str, close_code: int,
             retry_after_s: float | None = None) -> list[Output]:
        self.ended = True
        return [self.error(type_, code, message, retry_after_s=retry_after_s), Close(close_code)]

    def error(self, type_: str, code: str, message: str, param: str | None = None, client_event: str | None = None,
              retry_after_s: float | None = None) -> Send:
        """An `error` event; `client_event` is the `event_id` of the client event that caused it."""
        message = message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
        error = {"type": type_, "code": code, "message": message, "param": param, "event_id": client_event}
        if retry_after_s is not None:
            error["retry_after_s"] = retry_after_s  # an extension: when to come back
        return self._event("error", error=error)

    def end(self) -> list[Output]:
        """The client is done (or the server shuts down): commit the open item and finish the
        current segmentation; close with `closed(reason)` once every `Finish` is done."""
        self.ended = True
        seg = self._seg
        if seg is not None and seg.manual:
            return self._after_settling(seg, self._retire)
        return self._retire()

    def closed(self, reason: str, after_s: float | None = None) -> list[Output]:
        """The connection ends (`reason`: shutdown, idle_timeout, no_audio). A timeout is said in
        an `error` first (as OpenAI's `session_expired`): a bare close 1000 told the client nothing."""
        out: list[Output] = []
        if reason in TIMEOUTS:
            out.append(self.error("invalid_request_error", reason, TIMEOUTS[reason].format(after_s or 0.0)))
        return out + [Close(1001 if reason == "shutdown" else 1000)]

    def abort(self) -> None:
        """The connection is gone: free the resamplers (the transport closes the bridges); nothing
        more is sent."""
        self.ended = True
        for seg in self._segs.values():
            seg.resampler.close()
        self._segs.clear()
        self._items.clear()
        self._order.clear()
        self._completions.clear()

    # --- client events ------------------------------------------------------------------------

    def receive(self, text: str) -> list[Output]:
        """One client event (a WebSocket message's text)."""
        if self.ended:
            return []
        limit = self.max_message_bytes
        if limit is not None and len(text.encode()) > limit:
            return self.fail("invalid_request_error", "message_too_large", f"a message is over the {limit}-byte limit",
                             1009)
        try:
            msg = v.parse_json(text)
        except ValidationError as e:
            return [self.error("invalid_request_error", "invalid_json", e.message)]
        if not isinstance(msg, dict):
            return [self.error("invalid_request_error", "invalid_json", "an event must be a JSON object")]
        kind, client_event = msg.get("type"), msg.get("event_id")
        client_event = client_event if isinstance(client_event, str) and len(client_event) <= MAX_ID_CHARS else None
        try:
            if kind == "input_audio_buffer.append":
                return self._append(msg.get("audio"))
            if kind == "input_audio_buffer.commit":
                return self._commit(client_event)
            if kind == "input_audio_buffer.clear":
                return self._clear()
            if kind in ("session.update", "transcription_session.update"):
                return self._update(msg.get("session"), beta=kind.startswith("transcription_session"))
            return [self.error("invalid_request_error", "unknown_event", f"unsupported event type {v.show(kind)}",
                               client_event=client_event)]
        except InvalidValue as e:
            return [self.error("invalid_request_error", e.code, e.message, e.param, client_event)]
        except ValidationError as e:
            return [self.error("invalid_request_error", "invalid_value", f"{e.field}: {e.message}", e.field,
                               client_event)]

    def _append(self, audio: Any) -> list[Output]:
        if not isinstance(audio, str):
            raise InvalidValue("`audio` must be a base64 string", "audio", "invalid_audio")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidValue("`audio` is not valid base64", "audio", "invalid_audio") from None
        if self.config.encoding == "pcm_s16le" and len(data) % 2:
            raise InvalidValue(f"{len(data)} bytes is not a whole number of 16-bit samples", "audio", "invalid_audio")
        out: list[Output] = []
        seg = self._seg or self._begin(out)
        seg.appended += len(data) // (2 if self.config.encoding == "pcm_s16le" else 1)
        pcm = seg.resampler.push(data)
        seg.samples += len(pcm)
        out.append(Feed(seg.number, pcm))
        return out

    def _commit(self, client_event: str | None) -> list[Output]:
        seg = self._seg
        if seg is not None and seg.manual:
            return self._after_settling(seg, functools.partial(self._commit_buffer, seg, client_event))
        if seg is not None:
            self._commit_event = client_event
            return [Flush(seg.number, report=True)]
        raise InvalidValue(EMPTY_BUFFER, "input_audio_buffer", "input_audio_buffer_commit_empty")

    def _commit_buffer(self, seg: _Segmentation, client_event: str | None) -> list[Output]:
        """A manual commit, once the audio before it is settled."""
        if not seg.uncommitted:
            return [self.error("invalid_request_error", "input_audio_buffer_commit_empty", EMPTY_BUFFER,
                               "input_audio_buffer", client_event)]
        seg.committed = seg.appended
        return [Flush(seg.number)]

    def flushed(self, opened: bool) -> list[Output]:
        """How a `Flush` with `report` went: a server-VAD commit with no speech open is an error."""
        client_event, self._commit_event = self._commit_event, None
        if opened:
            return []
        return [self.error("invalid_request_error", "input_audio_buffer_commit_empty", "no speech is open to commit",
                           "input_audio_buffer", client_event)]

    def _clear(self) -> list[Output]:
        out: list[Output] = []
        seg = self._seg
        if seg is not None:
            out.append(DropOpen(seg.number))
            seg.committed = seg.appended
        out.append(self._event("input_audio_buffer.cleared"))
        return out

    def _update(self, session: Any, *, beta: bool) -> list[Output]:
        config = parse_update(session, self.config, beta=beta, vad=self.defaults.vad, model=self.model)
        seg = self._seg
        if seg is not None and seg.manual:  # it commits the buffer, as a commit would
            return self._after_settling(seg, functools.partial(self._apply_update, config, beta))
        return self._apply_update(config, beta)

    def _apply_update(self, config: RealtimeConfig, beta: bool) -> list[Output]:
        out: list[Output] = []
        seg = self._seg
        if seg is not None:
            # What was appended under the old settings is committed under them.
            if not seg.manual:
                out.append(Flush(seg.number))
            elif seg.uncommitted:
                seg.committed = seg.appended
                out.append(Flush(seg.number))
            if config.segmentation_changes(seg.config):
                out += self._retire()
            else:  # the next items' language and prompts follow the new settings
                out.append(Reconfigure(seg.number, self.model.decoder_language(config.language),
                                       config.prompt.strip() or None, config.condition_on_previous_text))
        self.config = config
        kind = "transcription_session.updated" if beta else "session.updated"
        out.append(self._event(kind, session=session_wire(config, self.session_id, self.model.name, beta=beta)))
        return out

    # --- segmentations ------------------------------------------------------------------------

    def _after_settling(self, seg: _Segmentation, then: Callable[[], list[Output]]) -> list[Output]:
        """`then()` once the audio appended to `seg` has all been through the VAD: where the
        buffer begins depends on the automatic commits that audio makes, and the transport may
        still hold some of it for the VAD (a client commits right after its last append)."""
        self._on_settled = then
        return [Settle(seg.number)]

    def settled(self) -> list[Output]:
        """A `Settle` is done (its automatic commits came through `on_event`): the decision it held."""
        then, self._on_settled = self._on_settled, None
        return then()

    def _begin(self, out: list[Output]) -> _Segmentation:
        """A new segmentation for the current config, at the current stream time."""
        c = self.config
        self._numbers += 1
        seg = _Segmentation(self._numbers, c, StreamResampler(c.rate, 1, c.encoding), self._time_base)
        self._segs[seg.number] = seg
        self._seg = seg
        out.append(Begin(seg.number, c.streaming(self.defaults), self.model.decoder_language(c.language)))
        return seg

    def _retire(self) -> list[Output]:
        """Finish the current segmentation: the resampler's last samples in, then `Finish`, whose
        end commits the open item. With `turn_detection: null` that item is what a commit would
        take: under `MIN_COMMIT_S` a commit refuses, so it is dropped (after the last samples, which
        would otherwise open an item of their own)."""
        seg, self._seg = self._seg, None
        if seg is None:
            return []
        tail = seg.resampler.flush()
        seg.samples += len(tail)
        self._time_base = seg.offset + seg.time
        out: list[Output] = [Feed(seg.number, tail)]
        if seg.manual and not seg.uncommitted:
            out.append(DropOpen(seg.number))
            seg.committed = seg.appended
        return out + [Finish(seg.number)]

    def finished(self, number: int, timeout_s: float) -> list[Output]:
        """A `Finish` is done: the segmentation's finals are delivered, or were given up after
        `timeout_s`. An item of it that was committed and has no transcription fails now; left
        waiting, it would hold back every later item's completion (they go out in commit order)."""
        self._segs.pop(number, None)
        for key in [k for k in self._items if k.segmentation == number]:
            item = self._items.pop(key)
            if item.id in self._order and item.id not in self._completions:
                self._completions[item.id] = [(FAILED, {"item_id": item.id, "content_index": 0, "error": {
                    "type": "server_error", "code": "transcription_timeout", "param": None,
                    "message": f"the transcription did not finish within {timeout_s:g} s of the end of its audio"}})]
        return self._completed_in_order()

    # --- the bridges' events ------------------------------------------------------------------

    def on_event(self, number: int, event: StreamEvent) -> list[Output]:
        seg = self._segs.get(number)
        if seg is None:  # finished (its late events are given up) or aborted
            return []
        if isinstance(event, SpeechStarted):
            if seg.manual:
                return []
            item = self._item(ItemKey(number, event.utterance_id))
            pad = seg.config.turn_detection.prefix_padding_ms / 1000.0
            start = event.start if event.start is not None else max(0.0, event.t - pad)
            return [self._event("input_audio_buffer.speech_started", audio_start_ms=_ms(seg, start), item_id=item.id)]
        if isinstance(event, SpeechStopped):
            if seg.manual:
                return []
            item = self._item(ItemKey(number, event.utterance_id))
            item.stopped = True
            out = [self._event("input_audio_buffer.speech_stopped", audio_end_ms=_ms(seg, event.t), item_id=item.id)]
            if event.discarded:
                # A cut's remainder with too little speech: no transcription comes, but the item was
                # announced (speech_started at the cut), so it is committed and completes empty.
                self._items.pop(ItemKey(number, event.utterance_id))
                out += self._commit_item(item)
                self._completions[item.id] = [(COMPLETED, {
                    "item_id": item.id, "content_index": 0, "transcript": "",
                    "usage": {"type": "duration", "seconds": round(max(0.0, seg.time - item.start), 3)}})]
                out += self._completed_in_order()
            return out
        if isinstance(event, Committed):
            return self._on_committed(seg, event)
        if isinstance(event, Finalized):
            return self._on_finalized(seg, event)
        return []

    def _item(self, key: ItemKey) -> _Item:
        if key not in self._items:
            self._items[key] = _Item(new_id("item_"))
        return self._items[key]

    def _on_committed(self, seg: _Segmentation, event: Committed) -> list[Output]:
        out: list[Output] = []
        item = self._item(ItemKey(seg.number, event.utterance_id))
        if seg.manual:  # an automatic commit (at max length) ends the buffer as the client's would
            seg.committed = max(seg.committed, round(event.end * seg.config.rate))
        # Server VAD without speech_stopped: a max-length cut, and speech goes on as the next item.
        cut = not seg.manual and not item.stopped
        if cut:
            out.append(self._event("input_audio_buffer.speech_stopped", audio_end_ms=_ms(seg, event.speech_end),
                                   item_id=item.id))
        out += self._commit_item(item)
        if cut:
            following = self._item(ItemKey(seg.number, event.utterance_id + 1))
            following.start = event.end
            out.append(self._event("input_audio_buffer.speech_started", audio_start_ms=_ms(seg, event.end),
                                   item_id=following.id))
        return out

    def _commit_item(self, item: _Item) -> list[Output]:
        """`committed`; its completion will go out in this order."""
        committed = self._event("input_audio_buffer.committed", item_id=item.id, previous_item_id=self._previous_item)
        self._previous_item = item.id
        self._order.append(item.id)
        return [committed]

    def _completed_in_order(self) -> list[Output]:
        """The completions whose earlier items have completed: they go out in commit order,
        whichever segmentation finished first."""
        out: list[Output] = []
        while self._order and self._order[0] in self._completions:
            out += [self._event(type_, **fields) for type_, fields in self._completions.pop(self._order.popleft())]
        return out

    def _on_finalized(self, seg: _Segmentation, event: Finalized) -> list[Output]:
        item = self._items.pop(ItemKey(seg.number, event.utterance_id))
        messages: list[tuple[str, dict]] = []
        if event.error is not None:
            messages.append((FAILED, {"item_id": item.id, "content_index": 0, "error": {
                "type": "server_error", "code": "internal_error", "message": event.error, "param": None}}))
        else:
            # Deltas come from the final decode alone, so that they join to the transcript exactly:
            # a partial's text, stable or not, may differ from the final's (case, punctuation, a
            # word that the whole utterance decodes otherwise).
            transcript = event.final.text if event.final is not None else ""
            logprobs = {}
            if self.config.logprobs and self.model.token_bytes is not None:
                tokens = event.final.token_logprobs if event.final is not None else ()
                logprobs = {"logprobs": logprobs_wire(self.model.token_bytes, tokens)}
            if transcript:
                messages.append((DELTA, {"item_id": item.id, "content_index": 0, "delta": transcript, **logprobs}))
            messages.append((COMPLETED, {"item_id": item.id, "content_index": 0, "transcript": transcript,
                                         **logprobs,
                                         "usage": {"type": "duration", "seconds": round(event.duration, 3)}}))
        self._completions[item.id] = messages
        return self._completed_in_order()

    def _event(self, type_: str, **fields: Any) -> Send:
        return Send({"type": type_, "event_id": new_id("event_"), **fields})


def _ms(seg: _Segmentation, t: float) -> int:
    """Stream milliseconds of time `t` of a segmentation."""
    return int(round((seg.offset + t) * 1000))
