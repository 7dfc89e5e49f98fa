"""One live stream's glue between its `Session` and the shared `Engine`, used by every transport.

    audio (16 kHz float32) -> bridge.feed() -> session.feed() -> events
        SubmitWindow -> engine.submit(); a task awaits the result -> session.on_result() -> events
        SpeechStarted / SpeechStopped / Partial -> emit(event)
        a final window submitted -> emit(Committed); its result -> emit(Finalized)

`emit` is the transport's synchronous hand-off (it queues the wire message for its sender task),
so the order of emitted events is the order in which they happened. Finals are delivered in the
order their windows were submitted, whatever order the engine finishes them in: the prompt of
the next utterance and the Realtime API's commit order both depend on it.

`session.feed` runs inline on the event loop: silero-vad costs about 0.07 ms per 32-ms frame on
one core (measured in `audio/vad.py`), so a 20-ms chunk costs well under a millisecond and even
a 5-s chunk (the largest frame a client may send) about 11 ms. At 128 streams in one process
that is still 43 % of the loop's time (H200 host, py-spy), but scoring on a thread pool (ONNX
Runtime releases the GIL) was worse: every chunk's return to Python asks for the GIL, and the
engine thread, made to hand it over thousands of times a second, ran its steps 2x slower (session
4: p95 finalisation at 96 streams 2.93 s with 8 VAD threads, 1.32 s inline). More streams per GPU
need more gateway processes, not threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Union

import numpy as np

from streamer.engine.engine import Engine, Handle
from streamer.engine.errors import Cancelled, EngineClosed, EngineUnavailable
from streamer.engine.request import DecodeOptions, Priority
from streamer.engine.scheduler import QueueFull
from streamer.longform.words import add_segment_words
from streamer.server.metrics import Metrics
from streamer.audio import SAMPLE_RATE
from streamer.streaming.events import Event, Final, Partial, SpeechStarted, SpeechStopped, SubmitWindow
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")

FINAL_SUBMIT_PATIENCE_S = 10.0
"""How long a final window retries while the engine queue is full before it fails."""
FINAL_SUBMIT_RETRY_S = 0.05
MARK_HISTORY_S = 35.0
"""Arrival times are kept this far back: an utterance (30 s at most) reaches back no further."""
PARTIAL_TOKENS_BASE, PARTIAL_TOKENS_PER_S = 16, 12
"""Token limit of a partial window: about three times the fastest speech rate."""


@dataclass(frozen=True)
class Committed:
    """A final window went to the engine: the utterance's audio is complete (Realtime: `committed`)."""

    utterance_id: int
    start: float
    """Stream time of the window's first sample (padding included)."""
    end: float
    """Stream time just after its last sample."""
    speech_end: float
    """Where speech stopped or was cut."""


@dataclass(frozen=True)
class Finalized:
    """A final window came back (or failed). Exactly one per `Committed`, in the same order."""

    utterance_id: int
    final: Final | None
    """None when Whisper heard no speech in it, or on failure."""
    latency_ms: float
    """Wall time from the server receiving the audio at `speech_end` to now."""
    duration: float
    """Seconds of audio in the window."""
    error: str | None = None
    """Why the decode failed, if it did."""
    error_code: str | None = None
    """`engine_unavailable` (the engine core holding it stopped: later utterances go on once it is
    back) or `internal`."""


StreamEvent = Union[SpeechStarted, SpeechStopped, Partial, Committed, Finalized]
Emit = Callable[[StreamEvent], None]


def _cancel(handle: Handle) -> None:
    """Cancel engine work whose result nobody will await (its task is cancelled with it): the
    engine sets `Cancelled` on the handle's future, which is then marked as seen, not left for
    asyncio to report ("Future exception was never retrieved") when it is collected."""
    handle.cancel()
    handle.future.add_done_callback(lambda f: f.cancelled() or f.exception())


@dataclass
class _FinalJob:
    window: SubmitWindow
    previous: asyncio.Event | None
    """Set once the final submitted before this one has been delivered."""
    delivered: asyncio.Event = field(default_factory=asyncio.Event)
    handle: Handle | None = None


class Bridge:
    """Drives one `Session` against the engine; one per stream, used from the event loop only."""

    def __init__(self, session: Session, engine: Engine, metrics: Metrics, emit: Emit, *, session_id: str,
                 language: str | None, task: str, word_timestamps: bool = False):
        self.session = session
        self.engine = engine
        self.metrics = metrics
        self.emit = emit
        self.session_id = session_id
        self.language = language
        """Language for the decoder (None: detect); a transport may change it between utterances."""
        self.task = task
        self.word_timestamps = word_timestamps
        """Finals carry word timings and probabilities (Deepgram's `words`)."""
        self._marks: deque[tuple[float, float]] = deque()
        """(stream time reached, monotonic time) per chunk fed."""
        self._partial: tuple[SubmitWindow, Handle] | None = None
        """The partial window in the engine."""
        self._partial_next: SubmitWindow | None = None
        """The newest partial window, waiting for the one in the engine."""
        self._finals: list[_FinalJob] = []
        self._tasks: set[asyncio.Task] = set()
        self._speech_wall: dict[int, float] = {}
        """Utterances without a partial yet: when the server received the audio where speech began."""
        self._dropping = False
        self._origin: float | None = None
        """Monotonic time at which stream time 0 would have arrived at real-time pace (set at the
        first audio; moved later whenever the client falls behind real time, never earlier)."""
        self._room = asyncio.Event()
        self._room.set()
        self._last_partial: tuple[int, float] | None = None
        """(utterance, monotonic time) of the last partial sent to the engine (the cadence metric)."""

    # --- input ------------------------------------------------------------------------------------

    def feed(self, pcm: np.ndarray) -> None:
        """Take the next 16-kHz chunk of the stream."""
        if len(pcm) == 0:
            return
        now = time.monotonic()
        start = self.session.stream_time
        if self._origin is None or self._origin + start < now:
            # Behind real time (a pause, a slow network): the clock restarts from now, so that
            # windows of a late client are not all overdue and cannot jump ahead of the others.
            self._origin = now - start
        self._marks.append((start + len(pcm) / SAMPLE_RATE, now))
        while len(self._marks) > 1 and self._marks[1][0] < self._marks[-1][0] - MARK_HISTORY_S:
            self._marks.popleft()
        self._dispatch(self.session.feed(pcm))

    def flush(self) -> bool:
        """End the open utterance now (client's flush or commit); False when none was open."""
        events = self.session.flush()
        self._dispatch(events)
        return bool(events)

    def drop_open(self) -> bool:
        """Abandon the open utterance: no events, no final (Realtime's `clear`); False when none was open."""
        self._dropping = True
        try:
            events = self.session.flush()
            self._dispatch(events)
        finally:
            self._dropping = False
        return bool(events)

    @property
    def backlog_s(self) -> float:
        """Stream audio received past the end of the oldest final not delivered yet."""
        if not self._finals:
            return 0.0
        return self.session.stream_time - self._finals[0].window.end

    async def wait_for_room(self, max_backlog_s: float) -> None:
        """Return once the backlog is at most `max_backlog_s`. The transport awaits this before
        it reads the socket again, so a client that sends faster than its finals are served is
        slowed by TCP's flow control instead of queueing without bound."""
        while max_backlog_s > 0 and self.backlog_s > max_backlog_s:
            self._room.clear()
            await self._room.wait()

    async def finish(self, timeout: float) -> None:
        """End of audio: finalise the open utterance and wait (up to `timeout`) until every final
        is delivered; then drop what is left."""
        self._dispatch(self.session.close())
        self._partial_next = None  # nothing is provisional any more
        # Tasks and asyncio.wait, not wait_for(gather(...)): a gather cancelled inside wait_for
        # (the client went away) ends with an exception nobody retrieves, which asyncio logs.
        waits = [asyncio.ensure_future(job.delivered.wait()) for job in self._finals]
        try:
            if waits:
                _, late = await asyncio.wait(waits, timeout=timeout)
                if late:
                    log.warning("session %s: finals not delivered within %.1f s", self.session_id, timeout)
        finally:
            for wait in waits:
                wait.cancel()
        self.close()

    def close(self) -> None:
        """Stop everything at once (the client is gone): cancel tasks and engine work."""
        self._partial_next = None
        if self._partial is not None:
            _cancel(self._partial[1])
        for job in self._finals:
            if job.handle is not None:
                _cancel(job.handle)
        for task in list(self._tasks):
            task.cancel()
        self._finals.clear()
        self._room.set()

    # --- events -----------------------------------------------------------------------------------

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, SubmitWindow):
                if event.kind == "partial":
                    self._submit_partial(event)
                else:
                    self._submit_final(event)
            elif self._dropping:
                continue
            elif isinstance(event, SpeechStarted):
                self._speech_wall[event.utterance_id] = self._received_at(event.t)
                self.emit(event)
            elif isinstance(event, Partial):
                began = self._speech_wall.pop(event.utterance_id, None)
                if began is not None:
                    self.metrics.first_partial.observe(time.monotonic() - began)
                self.emit(event)
            else:
                if isinstance(event, SpeechStopped):
                    self._speech_wall.pop(event.utterance_id, None)
                self.emit(event)

    def _received_at(self, t: float) -> float:
        """Monotonic time at which the stream reached stream time `t`."""
        for reached, wall in self._marks:
            if reached >= t - 1e-6:
                return wall
        return self._marks[-1][1] if self._marks else time.monotonic()

    def _prompt_tokens(self, window: SubmitWindow) -> tuple[int, ...] | None:
        """The window's prompt as tokens, cut to the session's bound (its newest tokens)."""
        if not window.prompt:
            return None
        tokens = self.engine.tokenizer.encode(" " + window.prompt.strip())
        return tuple(tokens[-self.session.config.prompt_max_tokens:]) or None

    def _options(self, window: SubmitWindow) -> DecodeOptions:
        prompt = self._prompt_tokens(window)
        if window.kind == "final":
            # As offline transcription decodes, with timestamps for the final's stream span.
            return DecodeOptions(task=self.task, language=self.language, prompt_tokens=prompt, timestamps=True)
        # A partial is shown only if its greedy decode is good: the fallback to higher temperatures
        # costs a full decode per temperature (0.5 s of speech on tiny.en, CPU: 0.6 s greedy, 5.4 s
        # with all six), and a loop is cut short.
        max_tokens = int(PARTIAL_TOKENS_BASE + PARTIAL_TOKENS_PER_S * len(window.audio) / SAMPLE_RATE)
        return DecodeOptions(task=self.task, language=self.language, prompt_tokens=prompt, temperatures=(0.0,),
                             max_new_tokens=min(max_tokens, self.engine.config.max_new_tokens))

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- partials ---------------------------------------------------------------------------------

    def _submit_partial(self, window: SubmitWindow) -> None:
        """At most one partial per stream is in the engine, and none while the stream has a final
        there; a newer one waits (replacing any older waiting one). The partial cadence so falls
        to what the engine can serve, and a partial's encoder pass never stalls this stream's
        final (CPU, tiny.en: 1-2 s per pass, while a whole final decodes in about 1 s)."""
        if self._dropping:
            return
        if self._partial is not None or self._finals:
            self._partial_next = window
            return
        try:
            handle = self.engine.submit(window.audio, self._options(window), priority=Priority.PARTIAL,
                                        session_id=self.session_id, deadline=self._deadline(window))
        except (QueueFull, EngineClosed, EngineUnavailable):
            return  # partials are the first thing to go under load
        self._partial = (window, handle)
        now = time.monotonic()
        if self._last_partial is not None and self._last_partial[0] == window.utterance_id:
            self.metrics.partial_interval.observe(now - self._last_partial[1])
        self._last_partial = (window.utterance_id, now)
        self._spawn(self._await_partial(window, handle))

    async def _await_partial(self, window: SubmitWindow, handle: Handle) -> None:
        result = None
        try:
            result = await self._result(handle, "partial")
        except (Cancelled, EngineUnavailable):
            pass  # preempted by a final, or lost with an engine core
        except Exception:
            log.exception("session %s: partial window %s failed", self.session_id, window.window_id)
        finally:
            self._partial = None
        if result is not None:
            self._dispatch(self.session.on_result(window.window_id, result))
        waiting, self._partial_next = self._partial_next, None
        if waiting is not None:
            self._submit_partial(waiting)

    # --- finals -----------------------------------------------------------------------------------

    def _submit_final(self, window: SubmitWindow) -> None:
        # Partials of the utterance are of no use any more: free the engine from them.
        if self._partial_next is not None and self._partial_next.utterance_id == window.utterance_id:
            self._partial_next = None
        if self._partial is not None and self._partial[0].utterance_id == window.utterance_id:
            self._partial[1].cancel()
        self._speech_wall.pop(window.utterance_id, None)
        if self._dropping:
            return
        job = _FinalJob(window, self._finals[-1].delivered if self._finals else None)
        self._finals.append(job)
        self.emit(Committed(window.utterance_id, window.start, window.end, window.speech_end))
        self._spawn(self._await_final(job))

    async def _await_final(self, job: _FinalJob) -> None:
        window = job.window
        result, error, code = None, None, None
        try:
            if job.previous is not None and self.session.config.condition_on_previous:
                await job.previous.wait()  # its text belongs in this prompt, however fast it came
                window = self.session.reprompt(window)
            result = await self._decode_final(job, window)
            unprompted = self.session.retry_unprompted(window, result)
            if unprompted is not None:
                result = await self._decode_final(job, unprompted)
            if self.word_timestamps and result is not None and result.segments:
                await add_segment_words(self.engine, window.audio, result.segments,
                                        language=result.language or self.language, task=self.task)
        except asyncio.CancelledError:
            raise
        except EngineUnavailable as e:
            log.warning("session %s: final window %s lost: %s", self.session_id, window.window_id, e)
            error, code = str(e), "engine_unavailable"
        except Exception as e:
            log.exception("session %s: final window %s failed", self.session_id, window.window_id)
            error, code = str(e) or type(e).__name__, "internal"
        try:
            if job.previous is not None:
                await job.previous.wait()
            events = self.session.on_result(window.window_id, result) if result is not None else []
            final = next((e for e in events if isinstance(e, Final)), None)
            latency_ms = 1000.0 * (time.monotonic() - self._received_at(window.speech_end))
            if final is not None:
                self.metrics.finalisation.observe(latency_ms / 1000.0)
            self.emit(Finalized(window.utterance_id, final, latency_ms, len(window.audio) / SAMPLE_RATE, error, code))
        finally:
            job.delivered.set()
            if job in self._finals:
                self._finals.remove(job)
            self._room.set()
        waiting, self._partial_next = self._partial_next, None
        if waiting is not None:
            self._submit_partial(waiting)

    async def _decode_final(self, job: _FinalJob, window: SubmitWindow):
        """Decode a final window of `job`; a full queue (said at submit, or by a remote engine core
        afterwards) is waited out for a while: finals are not dropped."""
        give_up = time.monotonic() + FINAL_SUBMIT_PATIENCE_S
        while True:
            try:
                job.handle = self.engine.submit(window.audio, self._options(window), priority=Priority.FINAL,
                                                session_id=self.session_id, deadline=self._deadline(window))
                return await self._result(job.handle, "final")
            except QueueFull:
                if time.monotonic() > give_up:
                    raise
                await asyncio.sleep(FINAL_SUBMIT_RETRY_S)

    def _deadline(self, window: SubmitWindow) -> float | None:
        """When the window's audio ended at real-time pace (monotonic): the engine serves windows
        of a class in this order, so a client that sends faster than real time queues behind the
        others instead of pushing their finals back."""
        if self._origin is None:
            return None
        return self._origin + window.end

    async def _result(self, handle: Handle, kind: str):
        """The window's result, observing the engine's wait for its first token and the whole time."""
        result = await handle.result()
        if result.first_token_s is not None:
            self.metrics.queue_wait.labels(kind).observe(result.first_token_s)
        self.metrics.window_time.labels(kind).observe(time.monotonic() - handle.submitted)
        return result
