"""One live stream as a state machine with no I/O: audio in, events out.

The caller (a server protocol handler) drives it:

    events = session.feed(pcm)             # float32, 16 kHz mono, any chunk size
    for e in events:
        SubmitWindow -> transcribe e.audio with the engine, then
                        session.on_result(e.window_id, result) -> more events
        SpeechStarted / SpeechStopped / Partial / Final -> send e.to_dict() to the client

Cutting is frame-exact (32-ms VAD frames counted from the start of the stream), so the same
audio gives the same windows whatever the chunk sizes it arrives in.

Partial windows: every `partial_interval_s` of an utterance's audio, the utterance so far.
Only the newest result counts: a partial result older than one already delivered, or that
arrives after the utterance's final window was submitted, is dropped. Final windows: the
whole utterance, padding included, at end of speech, at a max-length cut, or on `flush()`.

Acoustic context (`StreamingConfig.acoustic_context`): a final window opens with the stream's
audio since the earliest of the previous finals that are close enough (no pause of
`acoustic_context_pause_s` between them, the whole window within 30 s), and carries those finals'
segments (`SubmitWindow.context`) for the decoder's forced prefix. What the decoder writes after
the prefix is the utterance's text; a segment that ends before the utterance's own audio begins
was speech of the context that no final had kept (a VAD-discarded burst), and is dropped. A final
whose decode writes nothing after the prefix is decoded again in the same audio without it (then
alone): base stopped at once after 12 s of context on a Spanish sentence that it wrote in full
without the prefix (messy-es-10-0, session 9).

A final written unstyled (lower case, no punctuation: `decoding.unstyled`) is neither context nor
prompt for later finals: tiny.en slips into that register on 8-kHz audio, and through the prefix
it carried on to every later final of the stream (docs/notes/live33.md).

A final whose segments stop early is continued (`streaming/continuation.py`): the session keeps
the VAD's per-frame speech probabilities of the finals in flight to tell words left out from the
padding after the last word.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamer.audio.vad import (FRAME, SAMPLE_RATE, ManualSegmenter, SileroVAD, UtteranceSegmenter, VADEvent, VADState,
                                frame_rms)
from streamer.config import StreamingConfig
from streamer.model.decoding import CONDITION_MAX_TEMPERATURE, unstyled
from streamer.streaming.continuation import CONTINUE_MIN_SPEECH_S, MAX_CONTINUATIONS, continuation_window, joined, rest_start
from streamer.streaming.events import (Event, Final, Partial, SpeechStarted, SpeechStopped, SubmitWindow, WindowId,
                                      window_context)
from streamer.streaming.stabilize import LocalAgreement

MAX_WINDOW_S = 30.0
"""Whisper sees one 30-s window; an utterance must fit in it."""
CONTEXT_WINDOW_S = 24.0
"""A final window with acoustic context is at most this long: Whisper takes speech that runs to
near the end of its 30-s window for a segment cut at the edge and ends without writing it (it
expects the next window to), which left 3.5 s of speech after a 26-s context with no text."""
CONTEXT_MAX_TOKENS = 160
"""Forced prefix of a final with acoustic context, at most: with a prompt of `prompt_max_tokens`
(128) and the start-of-transcript tokens, at least 150 of Whisper's 448 positions stay for the
new text (about 3 tokens a second of speech, 30 s at most)."""
FREE_START_SLACK_S = 0.5
"""A final decoded inside its context without the prefix keeps the segments that start at most
this long before its own audio: the utterance's padding (0.2 s) and Whisper's timestamp slack;
one that starts earlier took the context's last words with it (tiny.en wrote "And so my fellow
Americans asked not" over a context final "And so my fellow Americans.")."""
CHARS_PER_TOKEN = 6
"""Text kept for a prompt: `prompt_max_tokens` of at most this many characters each (the caller
cuts the prompt to its exact token count)."""


def _spoils_context(result: Any) -> bool:
    """openai/whisper's resets, plus the repetition check: after a loop, a poor decode, or text that
    needed a retry hotter than 0.5, the previous text is dropped from later prompts."""
    v = result.verdict
    return v.loop or v.repetition or v.poor or result.temperature > CONDITION_MAX_TEMPERATURE


class _AudioBuffer:
    """The recent samples of a stream, addressed by absolute sample index; appends are amortised
    O(1) (no copy of the whole utterance per 20-ms chunk). Also holds the VAD's per-frame
    probabilities, addressed by frame."""

    def __init__(self, capacity: int = SAMPLE_RATE * 4):
        self._data = np.zeros(capacity, dtype=np.float32)
        self._head = 0
        """Index in `_data` of sample `start`."""
        self.start = 0
        """Absolute index of the first sample held."""
        self.end = 0
        """Absolute index just after the last sample held."""

    def append(self, x: np.ndarray) -> None:
        held, n = self.end - self.start, len(x)
        if self._head + held + n > len(self._data):
            # Move the held samples to the front; double the room when more than half is used.
            size = len(self._data) if 2 * (held + n) <= len(self._data) else 2 * (held + n)
            data = self._data if size == len(self._data) else np.empty(size, dtype=np.float32)
            data[:held] = self._data[self._head : self._head + held]
            self._data, self._head = data, 0
        self._data[self._head + held : self._head + held + n] = x
        self.end += n

    def slice(self, a: int, b: int) -> np.ndarray:
        """A copy of samples [a, b)."""
        if not self.start <= a <= b <= self.end:
            raise IndexError(f"samples [{a}, {b}) are not held (held: [{self.start}, {self.end}))")
        return self._data[self._head + a - self.start : self._head + b - self.start].copy()

    def drop_before(self, a: int) -> None:
        a = min(max(a, self.start), self.end)
        self._head += a - self.start
        self.start = a

    def release(self) -> None:
        """Hold nothing more (the positions stay)."""
        self._data, self._head, self.start = np.zeros(0, np.float32), 0, self.end


@dataclass
class _Utterance:
    """The open utterance."""

    id: int
    start: int
    """Padded first sample."""
    partial_mark: int
    """Sample up to which the last partial window reached (or `start`)."""
    partial_seq: int = 0
    """Number of the newest partial window submitted."""
    delivered_seq: int = 0
    """Number of the newest partial result turned into a `Partial`."""
    partial_ends: dict[int, int] = field(default_factory=dict)
    """End sample of each partial window in flight, by number."""
    agreement: LocalAgreement = field(default_factory=LocalAgreement)


@dataclass(frozen=True)
class _Heard:
    """A delivered final that later finals may take as acoustic context."""

    start: int
    """Its utterance's first sample (padded)."""
    end: int
    """Just after its window's last sample."""
    segments: tuple[tuple[float, float, tuple[int, ...]], ...]
    """(start, end) in stream seconds and text tokens of each of its segments."""

    @property
    def n_tokens(self) -> int:
        """Tokens of its segments in a forced prefix: the text and a timestamp pair each."""
        return sum(len(tokens) + 2 for _, _, tokens in self.segments)


def _alone(window: SubmitWindow) -> SubmitWindow:
    """A final window without its acoustic context: the utterance's own audio."""
    if not window.context_s:
        return window
    skip = round(window.context_s * SAMPLE_RATE)
    return dataclasses.replace(window, audio=window.audio[skip:], start=window.utterance_start, context_s=0.0,
                               context=())


class Session:
    """Per-stream state: VAD, utterance cutting, windows in flight, prompt, partial stability."""

    def __init__(self, config: StreamingConfig, vad: SileroVAD, sample_rate: int = SAMPLE_RATE):
        if sample_rate != SAMPLE_RATE:
            raise ValueError(f"a session takes {SAMPLE_RATE} Hz audio, not {sample_rate}: resample first")
        if config.vad.max_utterance_s > MAX_WINDOW_S:
            raise ValueError(f"max_utterance_s={config.vad.max_utterance_s} does not fit in a {MAX_WINDOW_S:.0f}-s window")
        if config.partial_interval_s <= 0:
            raise ValueError(f"partial_interval_s must be positive, not {config.partial_interval_s}")
        self.config = config
        self.partial_interval_s = config.partial_interval_s
        """Cadence of partial windows; a server under load may raise it at any time."""
        self._vad = vad
        self._vad_state = vad.new_state()
        # The VAD runs in either case: a manual utterance too is cut at its quietest point when it
        # reaches `max_utterance_s`.
        self._segmenter = ManualSegmenter(config.vad) if config.manual_commit else UtteranceSegmenter(config.vad)
        self._audio = _AudioBuffer()
        self._speech = _AudioBuffer(SAMPLE_RATE // FRAME * 4)
        """The VAD's speech probability per frame, back to the start of the oldest final in flight."""
        self._utterance: _Utterance | None = None
        self._next_id = 1
        self._finals: dict[int, SubmitWindow] = {}
        """Final windows in flight, by utterance, as last submitted."""
        self._context: list[tuple[float, str]] = []
        """(utterance start, text) of the previous finals that may prompt the next utterance, oldest first."""
        self._heard: list[_Heard] = []
        """Recent finals that may be acoustic context (`acoustic_context` only), oldest first."""
        self._context_end = 0.0
        """Stream time at which the newest of them ended."""
        self.closed = False

    @property
    def stream_time(self) -> float:
        """Seconds of audio fed so far."""
        return self._audio.end / SAMPLE_RATE

    @property
    def serial(self) -> bool:
        """A final must wait for the previous final's result: its prompt or context holds it."""
        return self.config.condition_on_previous or self.config.acoustic_context

    @property
    def vad_state(self) -> VADState:
        """The stream's VAD state, for a caller that scores many streams at once (`feed`'s `probs`)."""
        return self._vad_state

    def feed(self, pcm: np.ndarray, probs: np.ndarray | None = None) -> list[Event]:
        """Take the next chunk of audio (float32, 16 kHz mono, any length).

        `probs`: the VAD's probabilities of the frames that `pcm` completes, when the caller has
        scored it already on `vad_state` (`SileroVAD.probabilities_many`); None: scored here.
        """
        if self.closed:
            raise RuntimeError("session is closed")
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if probs is None:
            probs = self._vad.probabilities(self._vad_state, pcm)
        n = len(probs)
        first = self._vad_state.frames - n
        self._audio.append(pcm)
        if n == 0:
            return []
        self._speech.append(probs)
        levels = frame_rms(self._audio.slice(first * FRAME, (first + n) * FRAME).reshape(n, FRAME))
        events: list[Event] = []
        for i, (prob, level) in enumerate(zip(probs.tolist(), levels.tolist())):
            for boundary in self._segmenter.push(prob, level):
                events += self._on_boundary(boundary)
            utt = self._utterance
            frame_end = (first + i + 1) * FRAME
            due = utt is not None and frame_end - utt.partial_mark >= self.partial_interval_s * SAMPLE_RATE
            if self.config.partials and due:
                events.append(self._submit_partial(utt, frame_end))
        self._audio.drop_before(self._keep_from())
        starts = [round(w.utterance_start * SAMPLE_RATE) for w in self._finals.values()]
        self._speech.drop_before(min([self._segmenter.keep_from] + starts) // FRAME)
        return events

    def _keep_from(self) -> int:
        """Earliest sample still needed: the VAD's, and with acoustic context 30 s before the end
        of any final window to come or in flight (one waiting for the previous final is built again)."""
        keep = self._segmenter.keep_from
        if not self.config.acoustic_context:
            return keep
        ends = [round(w.end * SAMPLE_RATE) for w in self._finals.values()]
        return min([keep] + ends) - round(MAX_WINDOW_S * SAMPLE_RATE)

    def flush(self) -> list[Event]:
        """End the current utterance now (a client's commit) and submit its final window."""
        if self.closed:
            return []
        events: list[Event] = []
        for boundary in self._segmenter.flush(self._audio.end):
            events += self._on_boundary(boundary)
        return events

    def close(self) -> list[Event]:
        """Flush, then take no more audio; results of windows in flight are still accepted."""
        events = self.flush()
        self.closed = True
        return events

    def release(self) -> None:
        """The stream is over: free its audio now (up to ~30 s of it, kept for context), not when the
        cycle collector finds the objects that still point at the session."""
        self.closed = True
        self._audio.release()
        self._speech.release()

    def on_result(self, window_id: WindowId, result: Any) -> list[Event]:
        """Turn the engine's result for a window (an `engine.request.Result`) into client events."""
        if window_id.kind == "final":
            window = self._finals.pop(window_id.utterance_id, None)
            if window is None:
                raise KeyError(f"no final window {window_id} in flight")
            return self._final_result(window, result)
        return self._partial_result(window_id.utterance_id, window_id.seq, result)

    def forget(self, window_id: WindowId) -> None:
        """A final window that will never have a result (its decode failed): what it held is
        unknown, so no later final takes the audio before it as context."""
        self._finals.pop(window_id.utterance_id, None)
        self._heard.clear()

    def _on_boundary(self, b: VADEvent) -> list[Event]:
        if b.kind == "start":
            self._utterance = self._open(b.sample)
            return [SpeechStarted(b.speech / SAMPLE_RATE, self._utterance.id, b.sample / SAMPLE_RATE)]
        utt = self._utterance
        assert utt is not None, f"VAD {b.kind} without an open utterance"
        self._utterance = None
        if b.kind == "cut":
            final = self._submit_final(utt, b.sample, b.sample)
            self._utterance = self._open(b.sample)
            return [final]
        if b.kind == "discard":
            return [SpeechStopped(b.speech / SAMPLE_RATE, utt.id, discarded=True)]
        return [SpeechStopped(b.speech / SAMPLE_RATE, utt.id), self._submit_final(utt, b.sample, b.speech)]

    def _open(self, start: int) -> _Utterance:
        utt = _Utterance(id=self._next_id, start=start, partial_mark=start)
        self._next_id += 1
        return utt

    def _window_prompt(self, start: int, audio_from: int | None = None) -> str | None:
        """The prompt of an utterance that starts at sample `start` (its window's audio at
        `audio_from`, earlier with acoustic context): the configured prompt, then the text of the
        previous finals before the window's audio, unless a long pause came before the utterance."""
        if self._context and start / SAMPLE_RATE - self._context_end > self.config.prompt_reset_pause_s:
            self._context.clear()
        parts = [self.config.prompt.strip()] if self.config.prompt and self.config.prompt.strip() else []
        if self.config.condition_on_previous:
            # Finals inside the window's audio are its forced prefix (acoustic context), not prompt.
            audio_from = start if audio_from is None else audio_from
            parts += [text for began, text in self._context if round(began * SAMPLE_RATE) < audio_from]
        return " ".join(parts) or None

    def reprompt(self, window: SubmitWindow) -> SubmitWindow:
        """Final `window` with its prompt and acoustic context as they stand now: a final submitted
        before the previous final's result came back gets that final too (the caller waits for it,
        so that a stream's prompts and thus its text do not depend on how fast the engine answered)."""
        return self._prepared(window)

    def retry_final(self, window: SubmitWindow, result: Any) -> SubmitWindow | None:
        """A final to decode again, or None. Alone (no prompt, no acoustic context) when the decode
        looped, repeated itself, was improbable, or needed a hot retry: a prompt or a forced prefix
        can cause all of them. A forced prefix can also make the decoder stop at once: a final with
        context and no new text is decoded again in the same audio without the prefix (the decoder
        writes the context too, as offline `fast` would; `new_segments` keeps the utterance's), then
        alone, where the usual silence rules judge it."""
        if window.kind != "final" or not (window.prompt or window.context_s) or result.verdict.silence:
            return None
        empty = window.context_s and not "".join(s.text for s in self.new_segments(window, result)).strip()
        if not (empty or _spoils_context(result)):
            return None
        if empty and window.context and not _spoils_context(result):
            free = dataclasses.replace(window, context=())
            self._finals[free.utterance_id] = free
            return free
        alone = dataclasses.replace(_alone(window), prompt=None)
        self._finals[alone.utterance_id] = alone
        return alone

    def continuation(self, window: SubmitWindow, result: Any, done: int) -> SubmitWindow | None:
        """The window that decodes the rest of final `window` (after `done` continuations), or
        None: its decoded segments reach to within `continue_after_s` of the window's end, or the
        VAD heard less than `CONTINUE_MIN_SPEECH_S` of speech after them, or the decode is silence
        or spoiled (the final then goes out as it is), or it was continued `MAX_CONTINUATIONS` times."""
        if window.kind != "final" or done >= MAX_CONTINUATIONS or result.verdict.silence or _spoils_context(result):
            return None
        segments = self.new_segments(window, result)
        rest = rest_start(window, segments, self.config.continue_after_s)
        if rest is None or self._speech_s(rest, window.end) < CONTINUE_MIN_SPEECH_S:
            return None
        return continuation_window(window, segments, rest, done + 1, prefix=self.config.acoustic_context,
                                   max_s=CONTEXT_WINDOW_S, max_tokens=CONTEXT_MAX_TOKENS)

    def join(self, window: SubmitWindow, result: Any, continuation: SubmitWindow, rest_result: Any) -> Any | None:
        """Final `window`'s `result` with the new text of its `continuation`'s result (one result,
        in `window`'s frame), or None when the continuation brought no new text or is silence or
        spoiled: it is dropped and the final goes out as it was."""
        if rest_result.verdict.silence or _spoils_context(rest_result):
            return None
        rest = [s for s in self.new_segments(continuation, rest_result) if s.text.strip()]
        if not rest:
            return None
        return joined(window, result, self.new_segments(window, result), rest, rest_result, continuation)

    def _speech_s(self, start: float, end: float) -> float:
        """Seconds of frames in stream time [start, end) that the VAD scored as speech."""
        a = max(round(start * SAMPLE_RATE) // FRAME, self._speech.start)
        b = min(round(end * SAMPLE_RATE) // FRAME, self._speech.end)
        if b <= a:
            return 0.0
        return int((self._speech.slice(a, b) >= self._segmenter.threshold).sum()) * FRAME / SAMPLE_RATE

    def new_segments(self, window: SubmitWindow, result: Any) -> list:
        """The segments of a final's `result` that are its utterance's: with acoustic context, a
        segment that ends before the utterance's audio begins transcribes the context; decoded
        inside its context without the prefix, one that starts before it does (a segment across
        the boundary would write the context's words again)."""
        segments = list(result.segments or [])
        if not window.context_s:
            return segments
        if not window.context:  # decoded freely inside its context (`retry_final`)
            return [s for s in segments if s.start >= window.context_s - FREE_START_SLACK_S]
        return [s for s in segments if s.end > window.context_s]

    def _prepared(self, window: SubmitWindow) -> SubmitWindow:
        """Final `window` with acoustic context (when on) and prompt as they stand now, and
        recorded as the one in flight."""
        own = _alone(window)
        u0, end = round(own.start * SAMPLE_RATE), round(own.end * SAMPLE_RATE)
        c0, context = self._acoustic_context(u0, end) if self.config.acoustic_context else (u0, ())
        if c0 < u0:
            own = dataclasses.replace(own, audio=np.concatenate([self._audio.slice(c0, u0), own.audio]),
                                      start=c0 / SAMPLE_RATE, context_s=(u0 - c0) / SAMPLE_RATE, context=context)
        own = dataclasses.replace(own, prompt=self._window_prompt(u0, c0))
        self._finals[own.utterance_id] = own
        return own

    def _acoustic_context(self, u0: int, end: int) -> tuple[int, tuple[tuple[float, float, tuple[int, ...]], ...]]:
        """(first sample, prefix segments in seconds from it) of the context of an utterance at
        samples [u0, end): the newest finals back to a long pause, within `CONTEXT_WINDOW_S` and the
        token bound."""
        pause = round(self.config.acoustic_context_pause_s * SAMPLE_RATE)
        chain: list[_Heard] = []
        c0, n = u0, 0
        for h in reversed(self._heard):
            if c0 - h.end >= pause or end - h.start > CONTEXT_WINDOW_S * SAMPLE_RATE \
                    or n + h.n_tokens > CONTEXT_MAX_TOKENS or h.start < self._audio.start or h.start >= c0:
                break
            chain.insert(0, h)
            c0, n = h.start, n + h.n_tokens
        return c0, window_context([s for h in chain for s in h.segments], c0 / SAMPLE_RATE, (u0 - c0) / SAMPLE_RATE)

    def _submit_partial(self, utt: _Utterance, end: int) -> SubmitWindow:
        utt.partial_seq += 1
        utt.partial_ends[utt.partial_seq] = end
        utt.partial_mark = end
        return SubmitWindow(
            window_id=WindowId(utt.id, "partial", utt.partial_seq),
            audio=self._audio.slice(utt.start, end),
            start=utt.start / SAMPLE_RATE,
            prompt=self._window_prompt(utt.start),
        )

    def _submit_final(self, utt: _Utterance, end: int, speech_end: int) -> SubmitWindow:
        return self._prepared(SubmitWindow(
            window_id=WindowId(utt.id, "final"),
            audio=self._audio.slice(utt.start, end),
            start=utt.start / SAMPLE_RATE,
            prompt=None,
            speech_end=speech_end / SAMPLE_RATE,
        ))

    def _partial_result(self, utterance_id: int, seq: int, result: Any) -> list[Event]:
        utt = self._utterance
        # Stale: the utterance is over (its final was submitted) or a newer partial was shown.
        if utt is None or utt.id != utterance_id or seq <= utt.delivered_seq:
            return []
        end = utt.partial_ends.pop(seq)
        for older in [s for s in utt.partial_ends if s < seq]:
            del utt.partial_ends[older]
        utt.delivered_seq = seq
        # Text of a window judged silent or looping would only flicker on the client.
        v = result.verdict
        if not result.text.strip() or v.silence or v.loop or v.repetition or v.poor:
            return []
        split = utt.agreement.update(result.text)
        return [Partial(utterance_id, split.text, split.stable, split.unstable, utt.start / SAMPLE_RATE, end / SAMPLE_RATE)]

    def _final_result(self, window: SubmitWindow, result: Any) -> list[Event]:
        if _spoils_context(result):
            self._context.clear()
            self._heard.clear()
        segments = self.new_segments(window, result)
        text = "".join(s.text for s in segments).strip() if window.context_s else result.text.strip()
        if not text or result.verdict.silence:
            return []
        if unstyled(text):
            # Whisper's caption register (lower case, no punctuation: tiny.en on 8-kHz audio) would
            # carry on through the forced prefix or the prompt to every later final. Its text
            # neither prompts nor is heard, and no later final takes context over its audio; a later
            # final goes alone, as without acoustic context, where the model writes in its usual style.
            self._heard.clear()
        elif result.verdict.conditions:
            self._context.append((window.utterance_start, text))
            self._context_end = window.end
            limit = CHARS_PER_TOKEN * self.config.prompt_max_tokens
            while len(self._context) > 1 and sum(len(t) + 1 for _, t in self._context) > limit:
                self._context.pop(0)
            self._context[0] = (self._context[0][0], _tail(self._context[0][1], limit))
            if self.config.acoustic_context:
                self._hear(window, segments)
        start = max(window.start + segments[0].start, window.utterance_start) if segments else window.utterance_start
        end = window.start + segments[-1].end if segments else window.end
        return [
            Final(
                utterance_id=window.utterance_id,
                text=text,
                start=start,
                end=min(end, window.end),
                words=_words(segments, window.start),
                language=result.language,
                no_speech_prob=result.no_speech_prob,
                avg_logprob=result.avg_logprob,
                token_logprobs=_token_logprobs(segments, result),
            )
        ]


    def _hear(self, window: SubmitWindow, segments: list) -> None:
        """Keep a final's segments as context for the finals after it (30 s back at most)."""
        end = round(window.end * SAMPLE_RATE)
        heard = tuple((window.start + s.start, window.start + s.end, tuple(s.tokens)) for s in segments if s.tokens)
        self._heard.append(_Heard(round(window.utterance_start * SAMPLE_RATE), end, heard))
        self._heard = [h for h in self._heard if h.start >= end - MAX_WINDOW_S * SAMPLE_RATE]


def _tail(text: str, limit: int) -> str:
    """The last `limit` characters of `text`, starting at a word."""
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    return cut[cut.find(" ") + 1 :] if " " in cut else cut


def _token_logprobs(segments: list[Any], result: Any) -> tuple[tuple[int, float], ...]:
    """(token, log probability) of the final's text tokens (its segments'); none after beam search."""
    spans = [list(s.tokens) for s in segments]
    logprobs = result.logprobs_of(spans)
    if spans and sum(map(len, logprobs)) != sum(map(len, spans)):
        return ()
    return tuple((t, lp) for tokens, lps in zip(spans, logprobs) for t, lp in zip(tokens, lps))


def _words(segments: list[Any], offset: float) -> list[dict] | None:
    """Word timings of all segments in stream time, or None when they were not decoded."""
    if not any(s.words for s in segments):
        return None
    return [
        {"word": w.word, "start": offset + w.start, "end": offset + w.end, "probability": w.probability}
        for s in segments
        for w in (s.words or [])
    ]
