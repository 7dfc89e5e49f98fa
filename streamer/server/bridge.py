"""One live stream's I/O between its `LivePolicy` (`streaming/live.py`) and the engine.

The policy decides what to submit and when, the order of finals and what the client hears; the
bridge only carries out its actions (engine submits, cancels, retries, word alignment) and hands
the outcomes back, used by every transport:

    audio (16 kHz float32) -> bridge.feed() -> policy.feed() -> actions
        Submit -> engine.submit(); a task awaits the result -> policy.on_result() -> actions
        Cancel / Retry / Align -> handle.cancel() / loop.call_at / engine.align
        Observe -> /metrics;  client events -> emit(event)

`emit` is the transport's synchronous hand-off (it queues the wire message for its sender task),
so the order of emitted events is the order in which they happened.

The VAD runs on the event loop. With a `VADBatcher` (the gateway's, `ServerState.vad_batcher`)
a chunk waits there a few milliseconds and is scored in one call with the other streams' (half
the cost a frame: `server/vad_batcher.py`); without one `policy.feed` scores it inline. Scoring
on a thread pool was worse (every chunk's return asks for the GIL, and the engine thread ran its
steps 2x slower: session 4): more streams per GPU need more gateway processes, not threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from streamer.engine.handle import Handle
from streamer.engine.errors import Cancelled, EngineClosed, EngineUnavailable
from streamer.engine.scheduler import QueueFull
from streamer.longform.words import add_segment_words
from streamer.server.metrics import Metrics
from streamer.server.vad_batcher import VADBatcher
from streamer.streaming.cadence import PartialCadence
from streamer.streaming.live import (Action, Align, Cancel, Committed, Finalized, LiveOptions, LivePolicy, Observe,
                                     Retry, StreamEvent, Submit)
from streamer.streaming.session import Session


if TYPE_CHECKING:
    from streamer.engine.engine import Engine

log = logging.getLogger("streamer.server")

__all__ = ["Bridge", "Committed", "Finalized", "StreamEvent", "Emit"]

Emit = Callable[[StreamEvent], None]


def _cancel(handle: Handle) -> None:
    """Cancel engine work whose result nobody will await: the engine sets `Cancelled` on the
    handle's future, which is then marked as seen, not left for asyncio to report ("Future
    exception was never retrieved") when it is collected."""
    handle.cancel()
    handle.future.add_done_callback(lambda f: f.cancelled() or f.exception())


class Bridge:
    """Drives one stream's `LivePolicy` against the engine; one per stream, event loop only."""

    def __init__(self, session: Session, engine: Engine, metrics: Metrics, emit: Emit, *, session_id: str,
                 language: str | None, task: str, word_timestamps: bool = False,
                 cadence: PartialCadence | None = None, vad_batcher: VADBatcher | None = None):
        self.session = session
        self.vad_batcher = vad_batcher
        self.engine = engine
        self.metrics = metrics
        self.emit = emit
        self.session_id = session_id
        self.policy = LivePolicy(session, LiveOptions(language, task, word_timestamps),
                                 encode=engine.tokenizer.encode, max_new_tokens=engine.config.max_new_tokens,
                                 cadence=cadence, timestamp_token=engine.tokenizer.timestamp_token)
        self._handles: dict[int, tuple[Handle, str]] = {}
        """job -> (its window in the engine, kind)."""
        self._tasks: set[asyncio.Task] = set()
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        """Set while no final is waiting for delivery."""
        self._idle.set()

    @property
    def language(self) -> str | None:
        """Language for the decoder (None: detect); a transport may change it between utterances."""
        return self.policy.options.language

    @language.setter
    def language(self, value: str | None) -> None:
        self.policy.options.language = value

    # --- input ------------------------------------------------------------------------------------

    def feed(self, pcm: np.ndarray) -> None:
        """Take the next 16-kHz chunk of the stream."""
        if len(pcm) == 0:
            return
        if self.vad_batcher is not None:
            self.vad_batcher.add(self, pcm, time.monotonic())
        else:
            self._run(self.policy.feed(pcm, time.monotonic()))

    def feed_scored(self, pcm: np.ndarray, probs: np.ndarray, arrived: float) -> None:
        """The batcher's hand-back: a chunk that arrived at `arrived`, with its VAD scores."""
        self._run(self.policy.feed(pcm, arrived, probs))

    def settle(self) -> None:
        """Before anything but audio: the audio still waiting in the batcher reaches the policy
        (its events are emitted now)."""
        if self.vad_batcher is not None and self.vad_batcher.holds(self):
            self.vad_batcher.drain()

    def flush(self) -> bool:
        """End the open utterance now (client's flush or commit); False when none was open."""
        self.settle()
        actions = self.policy.flush(time.monotonic())
        self._run(actions)
        return bool(actions)

    def drop_open(self) -> bool:
        """Abandon the open utterance: no events, no final (Realtime's `clear`); False when none was open."""
        self.settle()
        actions = self.policy.drop_open(time.monotonic())
        self._run(actions)
        return bool(actions)

    @property
    def backlog_s(self) -> float:
        """Audio past the oldest undelivered final, and audio not yet through the VAD."""
        waiting = self.vad_batcher.pending_s(self) if self.vad_batcher is not None else 0.0
        return self.policy.backlog_s + waiting

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
        self.settle()
        self._run(self.policy.close(time.monotonic()))
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("session %s: finals not delivered within %.1f s", self.session_id, timeout)
        self.close()

    def close(self) -> None:
        """Stop everything at once (the client is gone): cancel tasks and engine work."""
        if self.vad_batcher is not None:
            self.vad_batcher.forget(self)
        self._run(self.policy.abort())
        for handle, _ in self._handles.values():
            _cancel(handle)
        self._handles.clear()
        for task in list(self._tasks):
            task.cancel()
        self._room.set()
        self._idle.set()
        self.session.release()

    # --- actions ----------------------------------------------------------------------------------

    def _run(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Submit):
                self._submit(action)
            elif isinstance(action, Cancel):
                entry = self._handles.get(action.job)
                if entry is not None:
                    entry[0].cancel()  # its task hears `Cancelled` and tells the policy
            elif isinstance(action, Retry):
                loop = asyncio.get_running_loop()
                loop.call_at(loop.time() + max(0.0, action.at - time.monotonic()), self._retry, action.job)
            elif isinstance(action, Align):
                self._spawn(self._align(action))
            elif isinstance(action, Observe):
                self._observe(action)
            else:
                self.emit(action)
        pending = self.policy.pending_finals
        if pending:
            self._idle.clear()
        else:
            self._idle.set()
        self._room.set()

    def _submit(self, action: Submit) -> None:
        kind = action.window.kind
        try:
            handle = self.engine.submit(action.window.audio, action.options, priority=action.priority,
                                        session_id=self.session_id, deadline=action.deadline)
        except QueueFull:
            self._run(self.policy.on_refused(action.job, time.monotonic()))
            return
        except (EngineClosed, EngineUnavailable) as e:
            self._run(self.policy.on_failure(action.job, "engine_unavailable", str(e), time.monotonic()))
            return
        except Exception as e:  # a window the engine refuses (a bug): its job fails as a decode would, not silently
            log.exception("session %s: %s window not submitted", self.session_id, kind)
            self._run(self.policy.on_failure(action.job, "internal", str(e) or type(e).__name__, time.monotonic()))
            return
        self._handles[action.job] = (handle, kind)
        self._spawn(self._await(action.job, handle, kind))

    def _retry(self, job: int) -> None:
        self._run(self.policy.retry(job, time.monotonic()))

    async def _await(self, job: int, handle: Handle, kind: str) -> None:
        result, failure = None, None
        try:
            result = await handle.result()
        except asyncio.CancelledError:
            raise
        except QueueFull:
            pass  # a remote engine core refused it after the submit: neither result nor failure
        except Cancelled:
            failure = ("cancelled", "cancelled")
        except EngineUnavailable as e:
            log.warning("session %s: %s window lost: %s", self.session_id, kind, e)
            failure = ("engine_unavailable", str(e))
        except Exception as e:
            log.exception("session %s: %s window failed", self.session_id, kind)
            failure = ("internal", str(e) or type(e).__name__)
        self._handles.pop(job, None)
        now = time.monotonic()
        if result is not None:
            if result.first_token_s is not None:
                self.metrics.queue_wait.labels(kind).observe(result.first_token_s)
            self.metrics.window_time.labels(kind).observe(now - handle.submitted)
            self._run(self.policy.on_result(job, result, now))
        elif failure is not None:
            self._run(self.policy.on_failure(job, *failure, now))
        else:
            self._run(self.policy.on_refused(job, now))

    async def _align(self, action: Align) -> None:
        try:
            await add_segment_words(self.engine, action.audio, action.segments, language=action.language,
                                    task=self.policy.options.task, offset=action.window.context_s)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("session %s: word timings of a final failed", self.session_id)
        self._run(self.policy.on_aligned(action.job, time.monotonic()))

    def _observe(self, o: Observe) -> None:
        {"first_partial": self.metrics.first_partial, "partial_interval": self.metrics.partial_interval,
         "finalisation": self.metrics.finalisation}[o.metric].observe(o.value)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
