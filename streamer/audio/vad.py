"""silero-vad with explicit per-stream state, and the hysteresis that cuts utterances.

One `SileroVAD` (one ONNX Runtime session, loaded once) serves every stream: the LSTM state,
the 64-sample context and the samples short of a whole frame live in each stream's `VADState`.

We run the package's *sequence* export (`silero_vad_16k_sequence.onnx`), not the per-frame
`silero_vad.onnx` that its `OnnxWrapper` drives: both compute the same network (the per-frame
model's `state` input is `[h; c]` stacked) and give bit-identical probabilities, but the
sequence export takes any number of frames in one call. Measured on one CPU core (6-min file):
per-frame model 0.19 ms a frame (5.8 ms per second of audio), sequence model 0.09 ms for one
frame and 0.07 ms a frame in blocks (2.8 ms per second of audio); a batch of 64 streams through
the per-frame model costs 0.08 ms a frame-stream, no better, so there is no cross-stream batch.
Fewer, longer calls also hold the GIL less (ONNX Runtime releases it while it computes).

A live stream sends a frame or two at a time, which the sequence model scores at 0.10 ms a
frame; many streams at once go through the per-frame export (`silero_vad.onnx`) as one batch,
a row per stream and its state stacked, at 0.05 ms a frame-stream for 16 streams and 0.044 for
64 (one core, this machine), bit-identical to scoring each stream alone (`probabilities_many`;
`server/vad_batcher.py` gathers a gateway's streams into it).

`UtteranceSegmenter` is pure: per-frame probabilities in, utterance boundaries out. Its
start/end rules mirror the package's `get_speech_timestamps` so that live cutting and offline
chunking agree with it; max-length cuts are our own (at the quietest recent point).
`ManualSegmenter` leaves the cutting to the client but for the max-length cuts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
import importlib.util
from pathlib import Path
from typing import Literal

import numpy as np

from streamer.audio import SAMPLE_RATE
from streamer.config import VADConfig

FRAME = 512
"""Samples per VAD frame (32 ms): the only frame size the v5/v6 model takes at 16 kHz."""
CONTEXT = 64
"""Trailing samples of the previous frame that the model sees before each frame."""
MAX_BLOCK_FRAMES = 512
"""Frames per ONNX call (16 s): bounds the transient memory of long offline runs."""
HIDDEN = 128
"""LSTM width of the model; `h` and `c` are [1, 1, HIDDEN]."""
MODEL_FILE = "silero_vad_16k_sequence.onnx"
BATCH_MODEL_FILE = "silero_vad.onnx"
"""The per-frame export: [B, CONTEXT + FRAME] rows with state [2, B, HIDDEN] ([h; c]) per call."""
SEQUENCE_MIN_FRAMES = 8
"""In `probabilities_many`, a stream with at least this many new frames is scored alone by the
sequence model (0.054 ms a frame in blocks of 8) instead of holding the batch for as many rounds."""

LEVEL_TARGET = 0.03
"""Frame RMS (-30 dBFS) that the VAD's input is raised to when a stream is quieter. silero-vad's
probabilities fall with the level: a shared English prompt scaled to a -44 dBFS peak (frames of
about -55 dBFS RMS) scores 0.2-0.4 on its first word where it scored 0.9 at its own level, and a
live stream lost "Please enter", or Kennedy's first 5.7 s; at -30 dBFS RMS and above the onsets are
where they are at full level (within 32 ms on 41 shared prompts)."""
MAX_GAIN = 31.6
"""At most +30 dB on the VAD's input: brings a -44 dBFS peak up to the level above. Noise raised
this far is still not speech to the model (white, pink, brown, hum, clicks and 4-Hz modulated
pink noise score at most 0.16 at any level up to a -3 dBFS peak, measured), and samples below
the 16-bit floor stay far below the target."""
LEVEL_HALF_LIFE_S = 2.0
"""The level the gain follows is the loudest recent frame, decaying by half every this many
seconds: the gain stays put across pauses between words and sentences (a stream at -15 dBFS
needs about 5 s of silence before any gain), and a loud frame lowers it at once."""
LEVEL_DECAY = 0.5 ** (FRAME / SAMPLE_RATE / LEVEL_HALF_LIFE_S)
"""Per-frame factor of that decay."""
HELD_HALF_LIFE_S = 60.0
"""A second, slow level (the loudest frame, decaying by half a minute) holds the gain down after a
stream was loud: the level the gain follows is at least `HELD_FRACTION` of it. A stream quiet from
its start is raised as before; in the pauses of a loud call (and on hold) background voices and
noise are raised by a few dB in its first minute of silence, not +30 dB (silero hears a voice down
to a ~-65 dBFS peak unaided: +30 dB would make speech of fainter ones, and Whisper's
hallucinations on them; tests/test_vad.py)."""
HELD_DECAY = 0.5 ** (FRAME / SAMPLE_RATE / HELD_HALF_LIFE_S)
HELD_FRACTION = 0.1
"""-20 dB: the gain's level is at least this much of the slow one."""

CUT_SEARCH_S = 4.0
"""A max-length cut looks for the quietest point within this many last seconds."""
CUT_SMOOTH_FRAMES = 3
"""Probabilities and energies are averaged over this many frames (~100 ms) before the cut
search, so that one odd frame inside a word does not win over a real pause between words."""


@dataclass
class VADState:
    """One stream's recurrent state; create with `SileroVAD.new_state()`."""

    h: np.ndarray
    """LSTM hidden state [1, 1, 128]."""
    c: np.ndarray
    """LSTM cell state [1, 1, 128]."""
    context: np.ndarray
    """Last CONTEXT samples of the previous frame (zeros before the first frame)."""
    pending: np.ndarray
    """Samples received but fewer than a frame (< FRAME); they wait for the next call."""
    frames: int = 0
    """Frames scored so far; frame i covers samples [i * FRAME, (i + 1) * FRAME)."""
    level: float = 0.0
    """Decaying peak of the frames' RMS (`LEVEL_HALF_LIFE_S`), which sets the input gain."""
    held: float = 0.0
    """The same with `HELD_HALF_LIFE_S`, which bounds the gain after a loud stretch."""


def _packaged_model(name: str = MODEL_FILE) -> str:
    """An ONNX file inside the installed silero-vad, found without importing the package (its
    `__init__` imports torch, which a gateway process has no other use for)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("silero-vad is not installed: pip install silero-vad")
    model = Path(list(spec.submodule_search_locations)[0]) / "data" / name
    if not model.is_file():
        raise FileNotFoundError(f"{name} is not in the installed silero-vad; it ships from silero-vad 6.2.3")
    return str(model)


class SileroVAD:
    """The silero-vad network, loaded once and shared by all streams (thread-safe)."""

    def __init__(self, model_path: str | None = None, max_gain: float = MAX_GAIN):
        """`max_gain`: the most the input of a quiet stream is raised (`LEVEL_TARGET`); 1.0 scores
        the audio as it is, as the package does."""
        try:
            import onnxruntime
        except ImportError as e:
            raise ImportError("silero-vad needs onnxruntime: pip install onnxruntime") from e
        options = onnxruntime.SessionOptions()
        # One thread per call: many streams call at once, and a frame is too small to split.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1

        def load(path: str):
            return onnxruntime.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])

        self._session = load(model_path or _packaged_model())
        # The per-frame export, for `probabilities_many`: the packaged one, loaded on first use
        # (only gateways batch streams); with a custom `model_path` (a sequence export) none.
        self._load = load
        self._batch_path = None if model_path else _packaged_model(BATCH_MODEL_FILE)
        self._batch_session = None
        self.max_gain = max_gain

    @classmethod
    @functools.cache
    def shared(cls) -> SileroVAD:
        """The process's one network with the packaged weights: the gateway's streams and the
        long-form cutter use the same ONNX session (per-stream state lives outside it)."""
        return cls()

    def new_state(self) -> VADState:
        zeros = np.zeros((1, 1, HIDDEN), dtype=np.float32)
        return VADState(h=zeros, c=zeros.copy(), context=np.zeros(CONTEXT, np.float32), pending=np.zeros(0, np.float32))

    def probabilities(self, state: VADState, audio16k: np.ndarray) -> np.ndarray:
        """Speech probability of every frame that `audio16k` completes; leftovers wait in `state`.

        Feeding a signal in any chunking gives the same probabilities as feeding it whole.
        """
        return self._sequence(state, _take_rows(state, audio16k, self.max_gain))

    def probabilities_many(self, jobs: list[tuple[VADState, np.ndarray]]) -> list[np.ndarray]:
        """`probabilities(state, audio)` of every job (one per stream: the states must differ),
        with the streams' frames scored together: round r is one call over every stream that has
        an r-th new frame. Same probabilities as scoring each job alone."""
        rows = [_take_rows(state, audio, self.max_gain) for state, audio in jobs]
        # Streams with a few new frames share calls; long chunks go through the sequence export,
        # and so does everything when fewer than two would share (alone, the per-frame export is
        # slower: 0.13 against 0.10 ms a frame).
        shared = [j for j, r in enumerate(rows) if 0 < len(r) < SEQUENCE_MIN_FRAMES]
        if self._batch_path is None or len(shared) < 2:
            shared = []
        out = [None if j in shared else self._sequence(state, r) for j, ((state, _), r) in enumerate(zip(jobs, rows))]
        if shared:
            if self._batch_session is None:
                self._batch_session = self._load(self._batch_path)
            shared.sort(key=lambda j: -len(rows[j]))  # the streams of round r are then the first ones
            state = np.stack([np.concatenate([jobs[j][0].h, jobs[j][0].c]).reshape(2, HIDDEN) for j in shared], axis=1)
            probs = np.zeros((len(shared), len(rows[shared[0]])), dtype=np.float32)
            sr = np.array(SAMPLE_RATE, dtype=np.int64)
            for r in range(len(rows[shared[0]])):
                k = sum(len(rows[j]) > r for j in shared)
                p, state[:, :k] = self._batch_session.run(
                    None, {"input": np.stack([rows[j][r] for j in shared[:k]]), "state": state[:, :k], "sr": sr})
                probs[:k, r] = p[:, 0]
            for i, j in enumerate(shared):
                jobs[j][0].h, jobs[j][0].c = state[0, i].reshape(1, 1, HIDDEN).copy(), state[1, i].reshape(1, 1, HIDDEN).copy()
                out[j] = probs[i, : len(rows[j])]
        return out  # type: ignore[return-value]

    def _sequence(self, state: VADState, rows: np.ndarray) -> np.ndarray:
        """Score `rows` (from `_take_rows`) in order through the sequence export."""
        if len(rows) == 0:
            return np.zeros(0, dtype=np.float32)
        probs = []
        for i in range(0, len(rows), MAX_BLOCK_FRAMES):
            p, state.h, state.c = self._session.run(
                ["speech_probs", "hn", "cn"], {"input": rows[i : i + MAX_BLOCK_FRAMES], "h": state.h, "c": state.c}
            )
            probs.append(p)
        return np.concatenate(probs).astype(np.float32, copy=False)


def _take_rows(state: VADState, audio16k: np.ndarray, max_gain: float) -> np.ndarray:
    """The model input rows [n, CONTEXT + FRAME] of the whole frames that `audio16k` completes
    (after `state.pending`), each raised by its gain (`_gains`); advances the state's pending
    samples, context, level and frame count (its LSTM state is the caller's to advance)."""
    audio = np.concatenate([state.pending, np.asarray(audio16k, dtype=np.float32).reshape(-1)])
    n = len(audio) // FRAME
    state.pending = audio[n * FRAME :].copy()
    if n == 0:
        return np.zeros((0, CONTEXT + FRAME), dtype=np.float32)
    frames = audio[: n * FRAME].reshape(n, FRAME)  # [n, 512]
    # Each model input row is [context (64) | frame (512)], the context being the tail of
    # the frame before it; this mirrors the package's OnnxWrapper.
    contexts = np.empty((n, CONTEXT), dtype=np.float32)
    contexts[0] = state.context
    contexts[1:] = frames[:-1, -CONTEXT:]
    state.context = frames[-1, -CONTEXT:].copy()
    state.frames += n
    rows = np.concatenate([contexts, frames], axis=1)
    if max_gain > 1.0:
        rows *= _gains(state, frame_rms(frames), max_gain)[:, None]
    return rows


def _gains(state: VADState, rms: np.ndarray, max_gain: float) -> np.ndarray:
    """Per frame, the gain that raises the stream's recent level (the decaying peak of the frame
    RMS, this frame's included, but at least `HELD_FRACTION` of the slowly decaying one) to
    LEVEL_TARGET, between 1 and `max_gain`; advances `state.level` and `state.held`. A gain of the
    VAD's input only: what is transcribed is the audio as sent. It depends on the frames up to each
    one only, so any chunking of a stream gives the same probabilities."""
    levels = np.empty(len(rms), dtype=np.float64)
    level, held = state.level, state.held
    for i, r in enumerate(rms.tolist()):
        level = max(r, level * LEVEL_DECAY)
        held = max(r, held * HELD_DECAY)
        levels[i] = max(level, held * HELD_FRACTION)
    state.level, state.held = level, held
    return np.clip(LEVEL_TARGET / np.maximum(levels, 1e-12), 1.0, max_gain).astype(np.float32)


def frame_rms(frames: np.ndarray) -> np.ndarray:
    """Root-mean-square level of each row of `frames` [n, FRAME]."""
    return np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1)).astype(np.float32)


@dataclass(frozen=True)
class VADEvent:
    """An utterance boundary, in samples from the start of the stream.

    start:   an utterance opens at `sample` (padding included); speech began at `speech`.
    cut:     the utterance reached its maximum length and closes at `sample`; the next one
             opens at the same sample (speech goes on).
    end:     the utterance closes at `sample` (padding included); speech stopped at `speech`.
    discard: the utterance opened by the last cut closes with too little speech to keep.
    """

    kind: Literal["start", "cut", "end", "discard"]
    sample: int
    speech: int


@dataclass
class _Candidate:
    """Speech under way (package terms: `triggered`), confirmed or not."""

    start: int
    """Padded first sample of the utterance."""
    speech: int
    """First sample of detected speech (after a cut: the cut point)."""
    confirmed: bool
    """True once it holds more than min_speech_ms of speech (a `start` was sent)."""
    silence_from: int | None = None
    """Sample where the current run of silence began (package: `temp_end`)."""
    probs: list[float] = field(default_factory=list)
    rms: list[float] = field(default_factory=list)
    """Per-frame probability and level since `start`'s frame, for max-length cuts."""


class UtteranceSegmenter:
    """Hysteresis over per-frame probabilities; pure, one per stream.

    Speech starts at a frame with probability >= threshold and ends once the probability has
    stayed below neg_threshold for min_silence_ms (frames in between keep the silence running,
    as in the package). An utterance is announced (`start`) only once it holds more than
    min_speech_ms of speech, so shorter bursts vanish without a trace.
    """

    def __init__(self, config: VADConfig, sample_rate: int = SAMPLE_RATE):
        if sample_rate != SAMPLE_RATE:
            raise ValueError(f"silero-vad runs at {SAMPLE_RATE} Hz, not {sample_rate}")
        self.threshold = config.threshold
        self.neg_threshold = config.neg_threshold if config.neg_threshold is not None else max(config.threshold - 0.15, 0.01)
        ms = sample_rate // 1000
        self.min_silence = config.min_silence_ms * ms
        self.min_speech = config.min_speech_ms * ms
        self.pad = config.speech_pad_ms * ms
        self.max_length = int(config.max_utterance_s * sample_rate)
        self.frames = 0
        """Frames consumed; the next frame starts at sample `frames * FRAME`."""
        self._floor = 0
        """No utterance may reach back before this sample (the end of the previous one)."""
        self._cand: _Candidate | None = None

    @property
    def active(self) -> bool:
        """An announced utterance is open."""
        return self._cand is not None and self._cand.confirmed

    @property
    def utterance_start(self) -> int | None:
        """Padded first sample of the open utterance, if one is announced."""
        return self._cand.start if self.active else None

    @property
    def keep_from(self) -> int:
        """Earliest sample a caller must still hold to cut the next utterance."""
        if self._cand is not None:
            return self._cand.start
        return max(self._floor, self.frames * FRAME - self.pad)

    def push(self, prob: float, rms: float = 0.0) -> list[VADEvent]:
        """Consume the next frame's speech probability and level (RMS)."""
        cur = self.frames * FRAME
        self.frames += 1
        frame_end = cur + FRAME
        cand = self._cand
        events: list[VADEvent] = []
        if cand is None:
            if prob >= self.threshold:
                start = max(self._floor, cur - self.pad)
                # After a flush the frame may straddle the end of the last utterance.
                cand = self._cand = _Candidate(start=start, speech=max(cur, self._floor), confirmed=False)
                self._record(cand, start, prob, rms)
                events += self._confirm(cand, frame_end)
            return events

        cand.probs.append(prob)
        cand.rms.append(rms)
        if prob >= self.threshold:
            cand.silence_from = None
        if frame_end - cand.start > self.max_length:
            events += self._cut(cand, frame_end)
            cand = self._cand
        if prob < self.neg_threshold:
            if cand.silence_from is None:
                cand.silence_from = cur
            if cur - cand.silence_from >= self.min_silence:
                return events + self._close(cand, cand.silence_from, min(cand.silence_from + self.pad, frame_end))
        events += self._confirm(cand, frame_end)
        return events

    def flush(self, end_sample: int) -> list[VADEvent]:
        """Close any speech at `end_sample` (end of the audio so far); the stream may go on."""
        cand = self._cand
        if cand is None:
            return []
        end_sample = min(end_sample, cand.start + self.max_length)
        # As the package does at the end of audio: speech runs to the last sample.
        return self._close(cand, end_sample, end_sample)

    def _record(self, cand: _Candidate, start: int, prob: float, rms: float) -> None:
        """Seed the per-frame history; the padding frames get placeholders, since a cut only
        searches the second half of an utterance."""
        n_pad = (self.frames - 1) - start // FRAME
        cand.probs.extend([0.0] * n_pad + [prob])
        cand.rms.extend([0.0] * n_pad + [rms])

    def _confirm(self, cand: _Candidate, frame_end: int) -> list[VADEvent]:
        if cand.confirmed:
            return []
        # Speech lasts at least until where silence began, or past this frame if none has.
        speech_until = cand.silence_from if cand.silence_from is not None else frame_end
        if speech_until - cand.speech > self.min_speech:
            cand.confirmed = True
            return [VADEvent("start", cand.start, cand.speech)]
        return []

    def _close(self, cand: _Candidate, speech_end: int, end: int) -> list[VADEvent]:
        self._cand = None
        if speech_end - cand.speech > self.min_speech:
            self._floor = end
            opened = [] if cand.confirmed else [VADEvent("start", cand.start, cand.speech)]
            return opened + [VADEvent("end", end, speech_end)]
        return [VADEvent("discard", end, speech_end)] if cand.confirmed else []

    def _cut(self, cand: _Candidate, frame_end: int) -> list[VADEvent]:
        """Close the utterance at the quietest point of its last CUT_SEARCH_S seconds."""
        first_frame = cand.start // FRAME
        n = len(cand.probs)
        lo = max(n - int(CUT_SEARCH_S * SAMPLE_RATE) // FRAME, n // 2, 1)
        probs = _smooth(np.asarray(cand.probs))[lo:n]
        rms = _smooth(np.asarray(cand.rms))[lo:n]
        # Probability and relative level count equally: the model often stays near 1.0
        # across short pauses between words, where the level still drops.
        score = probs + rms / max(float(rms.max()), 1e-9)
        best = lo + int(np.argmin(score))
        cut = (first_frame + best) * FRAME
        events = []
        if not cand.confirmed:
            cand.confirmed = True
            events.append(VADEvent("start", cand.start, cand.speech))
        events.append(VADEvent("cut", cut, cut))
        nxt = _Candidate(start=cut, speech=cut, confirmed=True, probs=cand.probs[best:], rms=cand.rms[best:])
        # Silence that began before the cut now begins at it, in the new utterance.
        if cand.silence_from is not None:
            nxt.silence_from = max(cand.silence_from, cut)
        self._cand = nxt
        self._floor = cut
        return events


class ManualSegmenter(UtteranceSegmenter):
    """The client cuts utterances (`flush`), as in OpenAI Realtime's `turn_detection: null`: one
    opens at the first frame after the last one closed and holds all the audio until the next
    `flush`, whatever the VAD hears (no padding, no minimum speech, no end by silence). Past
    `max_utterance_s` it is cut like any other, where the probabilities and the level are lowest."""

    def __init__(self, config: VADConfig, sample_rate: int = SAMPLE_RATE):
        super().__init__(config, sample_rate)
        self.pad = 0
        self.min_speech = 0

    def push(self, prob: float, rms: float = 0.0) -> list[VADEvent]:
        cur = self.frames * FRAME
        self.frames += 1
        cand = self._cand
        if cand is None:
            # After a flush the frame may straddle the end of the last utterance.
            start = max(self._floor, cur)
            self._cand = _Candidate(start=start, speech=start, confirmed=True)
            self._record(self._cand, start, prob, rms)
            return [VADEvent("start", start, start)]
        cand.probs.append(prob)
        cand.rms.append(rms)
        if cur + FRAME - cand.start > self.max_length:
            return self._cut(cand, cur + FRAME)
        return []


def _smooth(x: np.ndarray) -> np.ndarray:
    """Moving average over CUT_SMOOTH_FRAMES; the edges repeat so that they are not pulled down."""
    half = CUT_SMOOTH_FRAMES // 2
    return np.convolve(np.pad(x, half, mode="edge"), np.ones(CUT_SMOOTH_FRAMES) / CUT_SMOOTH_FRAMES, mode="valid")


def speech_segments(audio: np.ndarray, config: VADConfig, vad: SileroVAD | None = None) -> list[tuple[int, int]]:
    """Sample ranges [start, end) of the utterances in a whole recording (16 kHz float32).

    Same cutting as a live stream; utterances are at most `config.max_utterance_s` long.
    """
    vad = vad or SileroVAD.shared()
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    state = vad.new_state()
    segmenter = UtteranceSegmenter(config)
    events: list[VADEvent] = []
    # A block of one ONNX call at a time (the same probabilities as in one piece, the same calls):
    # the whole recording at once held a padded copy, a second copy, the model's input rows and
    # the levels' float64 squares, 6 times the audio's size (a 4-hour upload: +5 GB; session 32).
    block = MAX_BLOCK_FRAMES * FRAME
    for start in range(0, len(audio), block):
        chunk = audio[start:start + block]
        if len(chunk) % FRAME:  # like the package, score the last partial frame padded with zeros
            chunk = np.concatenate([chunk, np.zeros(-len(chunk) % FRAME, np.float32)])
        probs = vad.probabilities(state, chunk)
        levels = frame_rms(chunk.reshape(-1, FRAME))
        events += [e for p, r in zip(probs.tolist(), levels.tolist()) for e in segmenter.push(p, r)]
    events += segmenter.flush(len(audio))
    segments: list[tuple[int, int]] = []
    start = None
    for e in events:
        if e.kind == "start":
            start = e.sample
        elif e.kind in ("cut", "end"):
            segments.append((start, min(e.sample, len(audio))))
            start = e.sample
        else:  # discard
            start = None
    return segments
