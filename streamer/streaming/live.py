"""One live stream's policy towards the engine, as a state machine with no I/O.

A transport (through `server/bridge.py`) feeds it audio and the engine's outcomes; it answers
with actions and client events, in the order they happen:

    policy.feed(pcm, now)                 -> [...]
    policy.on_result(job, result, now)    -> [...]   (after a Submit's window came back)
    policy.on_failure(job, code, msg, now)-> [...]   (it failed: `engine_unavailable`, `internal`)
    policy.on_refused(job, now)           -> [...]   (submit said the queue is full)
    policy.on_aligned(job, now)           -> [...]   (after an Align)

    Submit(job, window, options, priority, deadline)  the transport submits it to the engine
    Cancel(job)                                        withdraw that job's window
    Retry(job, at)                                     submit the job's window again at `at`
    Align(job, window, segments, language)             add word timings to a final's segments
    Observe(metric, value, label)                      a measurement for /metrics
    SpeechStarted / SpeechStopped / Partial / Committed / Finalized   events for the client

Rules (each measured; docs/benchmarks.md):
- At most one partial per stream is in the engine, and none while the stream has a final there;
  a newer one waits, replacing an older waiting one. Partials are also spaced in wall time by the
  gateway's shared `PartialCadence`, which widens under load before finals are delayed.
- Finals are delivered in the order their windows were committed, whatever order the engine
  finishes them in (the next prompt and the Realtime API's commit order depend on it).
- With conditioning or acoustic context on, a final is submitted once the previous final is in,
  with the prompt and context as they then stand, so that a stream's text does not depend on the
  engine's speed; a final whose decode with them spoils the context is decoded again alone, and
  one with nothing new after its forced prefix again without the prefix (then alone).
- A final with acoustic context forces the previous finals' segments (text and timestamps) as the
  decoder's prefix (`DecodeOptions.prefix_tokens`); the result holds only what follows them.
- A final whose segments stop early (VAD speech after them) is continued before it goes out: its
  rest is decoded (after its own segments as prefix, with acoustic context) and joined to it, at
  most twice (`streaming/continuation.py`); one `Finalized` for the whole.
- Every live window carries a deadline: when its audio ended at real-time pace. The engine serves
  a class in deadline order, so a client that sends faster than real time queues behind others.
- A final refused by a full queue is retried for `final_patience_s`; a refused partial is dropped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from streamer.audio import SAMPLE_RATE
from streamer.engine.request import DecodeOptions, Priority
from streamer.streaming.cadence import PartialCadence
from streamer.streaming.events import Event, Final, Partial, SpeechStarted, SpeechStopped, SubmitWindow
from streamer.streaming.session import Session

FINAL_PATIENCE_S = 10.0
"""How long a final window retries while the engine queue is full before it fails."""
FINAL_RETRY_S = 0.05
MARK_HISTORY_S = 35.0
"""Arrival times are kept this far back: an utterance (30 s at most) reaches back no further."""
PARTIAL_TOKENS_BASE, PARTIAL_TOKENS_PER_S = 16, 12
"""Token limit of a partial window: about three times the fastest speech rate."""


# --- what the policy tells the transport --------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Submit:
    job: int
    window: SubmitWindow
    options: DecodeOptions
    priority: Priority
    deadline: float | None
    """Monotonic time at which the window's audio ended at real-time pace."""


@dataclass(frozen=True)
class Cancel:
    job: int


@dataclass(frozen=True)
class Retry:
    job: int
    at: float
    """Monotonic time at which to call `policy.retry(job, at)`."""


@dataclass(frozen=True, eq=False)
class Align:
    job: int
    window: SubmitWindow
    segments: list
    """The final's segments, times from the window's start."""
    language: str | None

    @property
    def audio(self) -> np.ndarray:
        """What the words are aligned in: the utterance's own audio, not its acoustic context."""
        return self.window.audio[round(self.window.context_s * SAMPLE_RATE):]


@dataclass(frozen=True)
class Observe:
    metric: str
    """`first_partial`, `partial_interval`, `finalisation` (seconds)."""
    value: float


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
Action = Union[Submit, Cancel, Retry, Align, Observe, StreamEvent]


@dataclass
class _Final:
    window: SubmitWindow
    job: int
    submitted: bool = False
    submitted_at: float = 0.0
    give_up: float = 0.0
    result: object | None = None
    done: bool = False
    """Decoded (and aligned) or failed: deliverable once every earlier final is delivered."""
    error: tuple[str, str] | None = None
    """(code, message) of a failure."""
    continuation: SubmitWindow | None = None
    """The window decoding the rest of a final that stopped early, while in the engine; `result`
    then holds the final's result so far."""
    continued: int = 0
    """Continuations decoded so far."""


@dataclass
class LiveOptions:
    """What the transport sets per stream; `language` may change between utterances."""

    language: str | None
    task: str = "transcribe"
    word_timestamps: bool = False
    """Finals carry word timings and probabilities (Deepgram's `words`)."""


class LivePolicy:
    """The engine-facing state of one live stream."""

    def __init__(self, session: Session, options: LiveOptions, *, encode: Callable[[str], list[int]],
                 max_new_tokens: int, cadence: PartialCadence | None = None,
                 timestamp_token: Callable[[float], int] | None = None):
        """`encode`: the tokenizer's text -> tokens (prompts); `max_new_tokens`: the engine's limit;
        `timestamp_token`: the tokenizer's seconds -> timestamp token (acoustic context's prefix)."""
        if session.config.acoustic_context and timestamp_token is None:
            raise ValueError("acoustic context needs the tokenizer's timestamp_token")
        self.session = session
        self.options = options
        self.cadence = cadence
        self._encode = encode
        self._timestamp_token = timestamp_token
        self._max_new_tokens = max_new_tokens
        self._jobs = 0
        self._marks: deque[tuple[float, float]] = deque()
        """(stream time reached, monotonic time) per chunk fed."""
        self._origin: float | None = None
        """Monotonic time at which stream time 0 would have arrived at real-time pace (set at the
        first audio; moved later whenever the client falls behind real time, never earlier)."""
        self._partial: tuple[int, SubmitWindow] | None = None
        """(job, window) of the partial in the engine."""
        self._partial_next: SubmitWindow | None = None
        """The newest partial window, waiting for its turn."""
        self._last_partial: tuple[int, float] | None = None
        """(utterance, monotonic time) of the last partial submitted."""
        self._speech_wall: dict[int, float] = {}
        """Utterances without a partial yet: when the server received the audio where speech began."""
        self._finals: list[_Final] = []
        """Committed finals not delivered yet, in commit order."""
        self._dropping = False

    # --- input --------------------------------------------------------------------------------

    def feed(self, pcm: np.ndarray, now: float, probs: np.ndarray | None = None) -> list[Action]:
        """Take the next 16-kHz chunk of the stream (`probs`: its VAD scores, see `Session.feed`)."""
        if len(pcm) == 0:
            return []
        start = self.session.stream_time
        if self._origin is None or self._origin + start < now:
            # Behind real time (a pause, a slow network): the clock restarts from now, so that
            # windows of a late client are not all overdue and cannot jump ahead of the others.
            self._origin = now - start
        self._marks.append((start + len(pcm) / SAMPLE_RATE, now))
        while len(self._marks) > 1 and self._marks[1][0] < self._marks[-1][0] - MARK_HISTORY_S:
            self._marks.popleft()
        out = self._dispatch(self.session.feed(pcm, probs), now)
        return out + self._maybe_partial(now)

    def flush(self, now: float) -> list[Action]:
        """End the open utterance now (a client's flush or commit); [] when none was open."""
        return self._dispatch(self.session.flush(), now)

    def drop_open(self, now: float) -> list[Action]:
        """Abandon the open utterance: no events, no final (Realtime's `clear`)."""
        self._dropping = True
        try:
            return self._dispatch(self.session.flush(), now)
        finally:
            self._dropping = False

    def close(self, now: float) -> list[Action]:
        """End of audio: finalise the open utterance; nothing is provisional any more."""
        out = self._dispatch(self.session.close(), now)
        self._partial_next = None
        return out

    def abort(self) -> list[Action]:
        """Stop everything at once (the client is gone): cancel every job in the engine."""
        self._partial_next = None
        out: list[Action] = []
        if self._partial is not None:
            out.append(Cancel(self._partial[0]))
            self._partial = None
        out += [Cancel(f.job) for f in self._finals if f.submitted and not f.done]
        self._finals.clear()
        return out

    # --- state the transport reads ------------------------------------------------------------

    @property
    def pending_finals(self) -> int:
        """Committed finals not delivered yet."""
        return len(self._finals)

    @property
    def backlog_s(self) -> float:
        """Stream audio received past the end of the oldest final not delivered yet."""
        if not self._finals:
            return 0.0
        return self.session.stream_time - self._finals[0].window.end

    # --- engine outcomes ----------------------------------------------------------------------

    def on_result(self, job: int, result, now: float) -> list[Action]:
        """The window of `job` was decoded (`result`: an engine `Result`)."""
        if self._partial is not None and self._partial[0] == job:
            window = self._partial[1]
            self._partial = None
            return self._dispatch(self.session.on_result(window.window_id, result), now) + self._maybe_partial(now)
        final = self._find(job)
        if final is None:
            return []  # cancelled meanwhile
        if self.cadence is not None:
            self.cadence.observe_final(now - final.submitted_at, now)
        more = True
        if final.continuation is not None:  # the rest of a final that stopped early
            rest = self.session.join(final.window, final.result, final.continuation, result)
            final.continuation, more = None, rest is not None
            result = rest if rest is not None else final.result
        else:
            retry = self.session.retry_final(final.window, result)
            if retry is not None:
                final.window = retry
                final.job = self._next_job()
                return [self._submit_final(final, now)]
        final.result = result
        rest_window = self.session.continuation(final.window, result, final.continued) if more else None
        if rest_window is not None:
            final.continuation, final.continued = rest_window, final.continued + 1
            final.job = self._next_job()
            return [self._submit_final(final, now)]
        return self._decoded(final, now)

    def _decoded(self, final: _Final, now: float) -> list[Action]:
        """`final.result` is the final's text: word timings, or delivery."""
        segments = self.session.new_segments(final.window, final.result)
        if self.options.word_timestamps and segments:
            return [Align(final.job, final.window, segments, final.result.language or self.options.language)]
        final.done = True
        return self._deliver(now)

    def on_aligned(self, job: int, now: float) -> list[Action]:
        """The `Align` of `job` filled its segments' words (or failed; they then have none)."""
        final = self._find(job)
        if final is None:
            return []
        final.done = True
        return self._deliver(now)

    def on_failure(self, job: int, code: str, message: str, now: float) -> list[Action]:
        """The window of `job` failed (`code`: `cancelled`, `engine_unavailable` or `internal`)."""
        if self._partial is not None and self._partial[0] == job:
            self._partial = None  # preempted by a final, or lost with an engine core
            return self._maybe_partial(now)
        final = self._find(job)
        if final is None:
            return []
        if final.continuation is not None:  # the rest is lost, the final so far is not
            final.continuation = None
            return self._decoded(final, now)
        final.done, final.error = True, (code, message)
        return self._deliver(now)

    def on_refused(self, job: int, now: float) -> list[Action]:
        """Submitting the window of `job` was refused (the engine queue is full)."""
        if self._partial is not None and self._partial[0] == job:
            self._partial = None  # partials are the first thing to go under load
            return []
        final = self._find(job)
        if final is None:
            return []
        if now >= final.give_up:
            return self.on_failure(job, "overloaded", "the engine queue stayed full", now)
        final.submitted = False
        return [Retry(job, now + FINAL_RETRY_S)]

    def retry(self, job: int, now: float) -> list[Action]:
        """A `Retry`'s time has come."""
        final = self._find(job)
        if final is None or final.done or final.submitted:
            return []
        return [self._submit(final, now)]

    # --- events from the session --------------------------------------------------------------

    def _dispatch(self, events: list[Event], now: float) -> list[Action]:
        out: list[Action] = []
        for event in events:
            if isinstance(event, SubmitWindow):
                if event.kind == "partial":
                    if not self._dropping:
                        self._partial_next = event
                        out += self._maybe_partial(now)
                else:
                    out += self._commit(event, now)
            elif self._dropping:
                continue
            elif isinstance(event, SpeechStarted):
                self._speech_wall[event.utterance_id] = self._received_at(event.t, now)
                out.append(event)
            elif isinstance(event, Partial):
                began = self._speech_wall.pop(event.utterance_id, None)
                if began is not None:
                    out.append(Observe("first_partial", now - began))
                out.append(event)
            else:
                if isinstance(event, SpeechStopped):
                    self._speech_wall.pop(event.utterance_id, None)
                out.append(event)
        return out

    # --- partials -----------------------------------------------------------------------------

    def _maybe_partial(self, now: float) -> list[Action]:
        window = self._partial_next
        if window is None or self._partial is not None or self._finals:
            return []
        if self.cadence is not None and self._last_partial is not None \
                and now - self._last_partial[1] < self.cadence.interval(now):
            return []
        self._partial_next = None
        job = self._next_job()
        self._partial = (job, window)
        out: list[Action] = []
        if self._last_partial is not None and self._last_partial[0] == window.utterance_id:
            out.append(Observe("partial_interval", now - self._last_partial[1]))
        self._last_partial = (window.utterance_id, now)
        out.append(Submit(job, window, self._options(window), Priority.PARTIAL, self._deadline(window)))
        return out

    # --- finals -------------------------------------------------------------------------------

    def _commit(self, window: SubmitWindow, now: float) -> list[Action]:
        out: list[Action] = []
        # Partials of the utterance are of no use any more: free the engine from them.
        if self._partial_next is not None and self._partial_next.utterance_id == window.utterance_id:
            self._partial_next = None
        if self._partial is not None and self._partial[1].utterance_id == window.utterance_id:
            out.append(Cancel(self._partial[0]))
        self._speech_wall.pop(window.utterance_id, None)
        if self._dropping:
            # Never decoded: the session frees its window, and no later final takes the audio
            # before it (the dropped speech, with no text in the prefix) as acoustic context.
            self.session.forget(window.window_id)
            return out
        final = _Final(window, self._next_job())
        self._finals.append(final)
        out.append(Committed(window.utterance_id, window.utterance_start, window.end, window.speech_end))
        if not (self.session.serial and len(self._finals) > 1):
            out.append(self._submit_final(final, now))
        return out  # else submitted once the one before it is delivered (`_deliver`)

    def _submit_final(self, final: _Final, now: float) -> Submit:
        final.give_up = now + FINAL_PATIENCE_S
        return self._submit(final, now)

    def _submit(self, final: _Final, now: float) -> Submit:
        final.submitted, final.submitted_at = True, now
        window = final.continuation or final.window
        return Submit(final.job, window, self._options(window), Priority.FINAL, self._deadline(window))

    def _deliver(self, now: float) -> list[Action]:
        """Deliver the finals at the head of the order that are done."""
        out: list[Action] = []
        while self._finals and self._finals[0].done:
            final = self._finals.pop(0)
            window = final.window
            if final.error is None:
                events = self.session.on_result(window.window_id, final.result)
            else:  # failed: the session drops the window (no text, context unchanged)
                self.session.forget(window.window_id)
                events = []
            done = next((e for e in events if isinstance(e, Final)), None)
            latency = now - self._received_at(window.speech_end, now)
            if done is not None:
                out.append(Observe("finalisation", latency))
            code, message = final.error or (None, None)
            out.append(Finalized(window.utterance_id, done, 1000.0 * latency, window.end - window.utterance_start,
                                 message, code))
            if self._finals and not self._finals[0].submitted and not self._finals[0].done:
                nxt = self._finals[0]
                nxt.window = self.session.reprompt(nxt.window)  # its prompt/context now has this final
                out.append(self._submit_final(nxt, now))
        if not self._finals:
            out += self._maybe_partial(now)
        return out

    # --- helpers ------------------------------------------------------------------------------

    def _find(self, job: int) -> _Final | None:
        return next((f for f in self._finals if f.job == job), None)

    def _next_job(self) -> int:
        self._jobs += 1
        return self._jobs

    def _received_at(self, t: float, now: float) -> float:
        """Monotonic time at which the stream reached stream time `t`."""
        for reached, wall in self._marks:
            if reached >= t - 1e-6:
                return wall
        return self._marks[-1][1] if self._marks else now

    def _deadline(self, window: SubmitWindow) -> float | None:
        return None if self._origin is None else self._origin + window.end

    def _prompt_tokens(self, window: SubmitWindow) -> tuple[int, ...] | None:
        """The window's prompt as tokens, cut to the session's bound (its newest tokens)."""
        if not window.prompt:
            return None
        tokens = self._encode(" " + window.prompt.strip())
        return tuple(tokens[-self.session.config.prompt_max_tokens:]) or None

    def _prefix_tokens(self, window: SubmitWindow) -> tuple[int, ...] | None:
        """A final's acoustic context as the decoder's forced prefix: each previous final's
        segment as Whisper writes one, <|start|> text <|end|>."""
        if not window.context:
            return None
        ts = self._timestamp_token
        return tuple(t for start, end, tokens in window.context for t in (ts(start), *tokens, ts(end)))

    def _options(self, window: SubmitWindow) -> DecodeOptions:
        o = self.options
        prompt = self._prompt_tokens(window)
        if window.kind == "final":
            # As offline transcription decodes, with timestamps for the final's stream span.
            return DecodeOptions(task=o.task, language=o.language, prompt_tokens=prompt, timestamps=True,
                                 prefix_tokens=self._prefix_tokens(window))
        # A partial is shown only if its greedy decode is good: the fallback to higher temperatures
        # costs a full decode per temperature (0.5 s of speech on tiny.en, CPU: 0.6 s greedy, 5.4 s
        # with all six), and a loop is cut short.
        max_tokens = int(PARTIAL_TOKENS_BASE + PARTIAL_TOKENS_PER_S * len(window.audio) / SAMPLE_RATE)
        return DecodeOptions(task=o.task, language=o.language, prompt_tokens=prompt, temperatures=(0.0,),
                             max_new_tokens=min(max_tokens, self._max_new_tokens))
