"""silero-vad with explicit state, and utterance cutting, against the package's own functions."""

from __future__ import annotations

import numpy as np
import pytest

from streamer.audio.decode import decode_audio
from streamer.audio.vad import FRAME, ManualSegmenter, SileroVAD, UtteranceSegmenter, frame_rms, speech_segments
from streamer.config import VADConfig

LONG = "long/asterisk_en_6min.ogg"


def decode(path) -> np.ndarray:
    return decode_audio(str(path))


@pytest.fixture(scope="module")
def vad() -> SileroVAD:
    return SileroVAD()


@pytest.fixture(scope="module")
def long_audio(audio_dir) -> np.ndarray:
    return decode(audio_dir / LONG)


@pytest.fixture(scope="module")
def uncut(vad, long_audio) -> list[tuple[int, int]]:
    """Utterances of the 6-minute file with no length limit (as the package cuts by default)."""
    return speech_segments(long_audio, VADConfig(max_utterance_s=3600.0), vad)


@pytest.fixture(scope="module")
def package_model():
    silero_vad = pytest.importorskip("silero_vad")
    return silero_vad.load_silero_vad(onnx=True)


def chunks(audio: np.ndarray, seed: int, max_len: int = 3000):
    rng = np.random.default_rng(seed)
    i = 0
    while i < len(audio):
        n = int(rng.integers(1, max_len))
        yield audio[i : i + n]
        i += n


def test_probabilities_equal_package_model_in_any_chunking(package_model, jfk_path):
    """Our sequence-model path with explicit state equals the package's per-frame OnnxWrapper
    (with no input gain: the package scores the audio as it is)."""
    torch = pytest.importorskip("torch")
    vad = SileroVAD(max_gain=1.0)
    audio = decode(jfk_path)
    n = len(audio) // FRAME
    package_model.reset_states()
    frames = torch.from_numpy(audio[: n * FRAME]).reshape(n, FRAME)
    expected = np.array([package_model(frame, 16000).item() for frame in frames])
    state = vad.new_state()
    got = np.concatenate([vad.probabilities(state, c) for c in chunks(audio, seed=1)])
    assert len(got) == n and state.frames == n
    assert len(state.pending) == len(audio) - n * FRAME
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert expected.max() > 0.9 and expected.min() < 0.1  # the clip has speech and pauses


def test_states_are_independent(vad, jfk_path):
    """Interleaving two streams on one model changes neither."""
    audio = decode(jfk_path)
    alone = vad.probabilities(vad.new_state(), audio)
    a, b = vad.new_state(), vad.new_state()
    reversed_audio = audio[::-1].copy()
    got_a, got_b = [], []
    for i in range(0, len(audio), 1600):
        got_a.append(vad.probabilities(a, audio[i : i + 1600]))
        got_b.append(vad.probabilities(b, reversed_audio[i : i + 1600]))
    np.testing.assert_array_equal(np.concatenate(got_a), alone)
    assert not np.array_equal(np.concatenate(got_b), alone)


def test_streams_scored_together_equal_each_alone(vad, audio_dir, jfk_path):
    """`probabilities_many` (a gateway's streams in shared calls of the per-frame model, long
    chunks through the sequence model) gives each stream exactly what scoring it alone gives,
    whatever the chunking, the company in a call and the mix of the two models over a stream."""
    from streamer.audio.vad import SEQUENCE_MIN_FRAMES

    signals = [decode(jfk_path), decode(audio_dir / "es" / "asterisk" / "conf-adminmenu.ogg")]
    signals += [signals[0][::-1].copy(), np.zeros(5 * 16000, np.float32)]
    signals = [x[: 8 * 16000] for x in signals]
    alone = [vad.probabilities(vad.new_state(), x) for x in signals]
    states = [vad.new_state() for _ in signals]
    got: list[list[np.ndarray]] = [[] for _ in signals]
    rng = np.random.default_rng(3)
    offsets = [0] * len(signals)
    while any(o < len(x) for o, x in zip(offsets, signals)):
        jobs, who = [], []
        for j, x in enumerate(signals):
            if offsets[j] >= len(x) or rng.random() < 0.2:
                continue  # not every stream has audio in every call
            # Mostly a frame or two, now and then a long chunk (the sequence model's part).
            n = int(rng.integers(1, 2 * FRAME)) if rng.random() < 0.8 else (SEQUENCE_MIN_FRAMES + 2) * FRAME
            jobs.append((states[j], x[offsets[j]: offsets[j] + n]))
            who.append(j)
            offsets[j] += n
        for j, p in zip(who, vad.probabilities_many(jobs)):
            got[j].append(p)
    for j, x in enumerate(signals):
        np.testing.assert_array_equal(np.concatenate(got[j]), alone[j])
        assert states[j].frames == len(x) // FRAME
    assert alone[0].max() > 0.9 and alone[3].max() < 0.1


def test_segments_match_get_speech_timestamps(package_model, long_audio, uncut):
    """15 prompts joined by pauses: same utterances as the package's get_speech_timestamps."""
    torch = pytest.importorskip("torch")
    from silero_vad import get_speech_timestamps

    config = VADConfig()
    expected = get_speech_timestamps(
        torch.from_numpy(long_audio),
        package_model,
        threshold=config.threshold,
        min_speech_duration_ms=config.min_speech_ms,
        min_silence_duration_ms=config.min_silence_ms,
        speech_pad_ms=config.speech_pad_ms,
    )
    assert len(uncut) == len(expected) == 15
    for (start, end), ref in zip(uncut, expected):
        assert abs(start - ref["start"]) <= 1600 and abs(end - ref["end"]) <= 1600  # 100 ms


def test_max_utterance_cuts_at_pauses(vad, long_audio, uncut):
    """Prompts longer than 28 s are cut, at pauses, into adjacent pieces that lose nothing."""
    config = VADConfig(max_utterance_s=28.0)
    cut = speech_segments(long_audio, config, vad)
    assert max(e - s for s, e in cut) <= 28 * 16000
    assert max(e - s for s, e in uncut) > 60 * 16000  # one prompt runs 72 s
    # The same audio is covered: merging adjacent pieces gives the uncut utterances back.
    merged = [list(cut[0])]
    for s, e in cut[1:]:
        if s == merged[-1][1]:
            merged[-1][1] = e
        else:
            merged.append([s, e])
    assert [tuple(m) for m in merged] == uncut
    probs = vad.probabilities(vad.new_state(), long_audio)
    levels = frame_rms(long_audio[: len(probs) * FRAME].reshape(-1, FRAME))
    cuts = [e for (_, e), (s, _) in zip(cut, cut[1:]) if e == s]
    assert len(cuts) >= 4
    for c in cuts:
        f = c // FRAME
        assert probs[f] < 0.2 and levels[f] < 0.05 * np.median(levels[f - 300 : f])


def whole_recording_segments(audio: np.ndarray, config: VADConfig, vad: SileroVAD) -> list[tuple[int, int]]:
    """`speech_segments` as it was before session 32, the reference: the recording scored in one
    piece (6 times its size in memory at once)."""
    padded = np.concatenate([audio, np.zeros(-len(audio) % FRAME, np.float32)])
    probs = vad.probabilities(vad.new_state(), padded)
    levels = frame_rms(padded.reshape(-1, FRAME))
    segmenter = UtteranceSegmenter(config)
    events = [e for p, r in zip(probs.tolist(), levels.tolist()) for e in segmenter.push(p, r)]
    events += segmenter.flush(len(audio))
    segments, start = [], None
    for e in events:
        if e.kind == "start":
            start = e.sample
        elif e.kind in ("cut", "end"):
            segments.append((start, min(e.sample, len(audio))))
            start = e.sample
        else:
            start = None
    return segments


def test_a_recording_scored_a_block_at_a_time_is_cut_as_in_one_piece(vad, long_audio):
    """`speech_segments` scores a recording one ONNX call's block at a time (a 4-hour upload took
    +5 GB in one piece): the same utterances, to the sample, as the whole recording scored at once,
    with a partial last frame and the long-form cutter's settings."""
    audio = long_audio[:-100]
    config = VADConfig(min_silence_ms=300, speech_pad_ms=200, max_utterance_s=28.0)
    segments = speech_segments(audio, config, vad)
    assert len(segments) >= 20  # 15 prompts, the long ones cut
    assert segments == whole_recording_segments(audio, config, vad)


@pytest.mark.parametrize("kind", ["zeros", "noise"])
def test_silence_and_noise_have_no_speech(vad, kind):
    rng = np.random.default_rng(0)
    n = 16000 * 20
    audio = np.zeros(n, np.float32) if kind == "zeros" else (0.1 * rng.standard_normal(n)).astype(np.float32)
    assert speech_segments(audio, VADConfig(), vad) == []


QUIET_DBFS = -44.0
"""A quiet stream: a recording scaled to this peak level (its frames about -55 dBFS RMS)."""


def at_peak(audio: np.ndarray, dbfs: float) -> np.ndarray:
    return (audio * (10 ** (dbfs / 20) / np.abs(audio).max())).astype(np.float32)


def noises(n: int) -> dict[str, np.ndarray]:
    """Non-speech a quiet line carries: coloured noise, mains hum, clicks, pink noise modulated at
    the syllable rate (4 Hz), and the 16-bit floor."""
    rng = np.random.default_rng(7)

    def coloured(alpha: float) -> np.ndarray:
        spectrum = np.fft.rfft(rng.standard_normal(n))
        f = np.maximum(np.arange(len(spectrum)), 1)
        return np.fft.irfft(spectrum / f ** (alpha / 2), n)

    t = np.arange(n) / 16000
    return {"white": coloured(0), "pink": coloured(1), "brown": coloured(2),
            "hum": np.sin(2 * np.pi * 50 * t) + 0.5 * np.sin(2 * np.pi * 150 * t),
            "clicks": (rng.random(n) < 5e-4) * rng.standard_normal(n),
            "syllabic": coloured(1) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)),
            "lsb": rng.integers(-1, 2, n) / 32768}


@pytest.mark.parametrize("name", ["en/jfk.ogg", "en/asterisk/conf-getpin.ogg", "en/asterisk/call-fwd-no-ans.ogg",
                                  "en/asterisk/check-number-dial-again.ogg"])
def test_quiet_speech_starts_where_it_does_at_full_level(vad, audio_dir, name):
    """At a -44 dBFS peak silero-vad's probabilities fall (0.2-0.4 on a first word) and the onset
    came late: 5.7 s on Kennedy's address, 0.3-0.4 s ("Please enter") on the prompts, past the
    200-ms padding. The VAD's input is raised (at most +30 dB), so its onset stays where it is at
    the recording's own level, which the package's model scores as it is."""
    audio = np.concatenate([np.zeros(8000, np.float32), decode(audio_dir / name)])  # 0.5 s of silence first
    full = speech_segments(audio, VADConfig(), SileroVAD(max_gain=1.0))
    quiet = speech_segments(at_peak(audio, QUIET_DBFS), VADConfig(), vad)
    assert quiet and abs(quiet[0][0] - full[0][0]) <= 2 * FRAME, (full, quiet)
    assert abs(quiet[-1][1] - full[-1][1]) <= 4 * FRAME, (full, quiet)


def test_quiet_noise_and_silence_stay_silence(vad):
    """The same gain does not make speech of noise: each kind scaled to the same -44 dBFS peak (and
    so raised by the full +30 dB), or to a loud -6 dBFS (no gain), has no speech, live or offline."""
    n = 16000 * 10
    for kind, noise in noises(n).items():
        for dbfs in (QUIET_DBFS, -6.0):
            audio = at_peak(noise, dbfs)
            assert speech_segments(audio, VADConfig(), vad) == [], (kind, dbfs)
            state = vad.new_state()
            probs = np.concatenate([vad.probabilities(state, c) for c in chunks(audio, seed=2)])
            assert probs.max() < VADConfig().threshold, (kind, dbfs, probs.max())
    assert speech_segments(np.zeros(n, np.float32), VADConfig(), vad) == []


def run(segmenter: UtteranceSegmenter, probs, levels=None):
    levels = [0.0] * len(probs) if levels is None else levels
    return [(i, e.kind, e.sample, e.speech) for i, (p, r) in enumerate(zip(probs, levels)) for e in segmenter.push(p, r)]


def test_segmenter_hysteresis_padding_and_min_silence():
    config = VADConfig(threshold=0.5, neg_threshold=0.35, min_silence_ms=160, speech_pad_ms=64, min_speech_ms=64)
    # 10 frames of silence, 10 of speech, a dip to 0.4 (between the thresholds: not silence),
    # 4 quiet frames (128 ms < 160 ms), speech again, then 8 quiet frames.
    probs = [0.0] * 10 + [0.9] * 10 + [0.4] * 3 + [0.1] * 4 + [0.9] * 5 + [0.1] * 8
    events = run(UtteranceSegmenter(config), probs)
    # Speech starts at frame 10, announced once > 64 ms of it (frame 12); the 2-frame pad
    # reaches back to frame 8. Silence begins at frame 32 and ends the utterance 5 frames on.
    assert events == [(12, "start", 8 * FRAME, 10 * FRAME), (37, "end", 34 * FRAME, 32 * FRAME)]


def test_segmenter_drops_short_bursts():
    config = VADConfig(min_silence_ms=96, speech_pad_ms=0, min_speech_ms=200)
    probs = [0.0] * 5 + [0.9] * 5 + [0.0] * 10 + [0.9] * 8 + [0.0] * 10
    # 5 frames = 160 ms are dropped; 8 frames = 256 ms are kept.
    events = run(UtteranceSegmenter(config), probs)
    assert [(k, s) for _, k, s, _ in events] == [("start", 20 * FRAME), ("end", 28 * FRAME)]


def test_segmenter_forced_cut_at_quietest_point_then_continues():
    config = VADConfig(speech_pad_ms=0, min_silence_ms=500, max_utterance_s=10.0)
    n = 10 * 16000 // FRAME + 20  # longer than the limit
    probs = [0.95] * n
    levels = [0.1] * n
    dip = 280  # 9 s in: inside the last 4 s before the limit
    probs[dip - 1 : dip + 2] = [0.4, 0.3, 0.4]
    levels[dip - 1 : dip + 2] = [0.01, 0.0, 0.01]
    segmenter = UtteranceSegmenter(config)
    events = run(segmenter, probs, levels)
    limit_frame = 10 * 16000 // FRAME
    assert [(k, s) for _, k, s, _ in events] == [("start", 0), ("cut", dip * FRAME)]
    assert events[1][0] == limit_frame  # the cut is decided when the limit is reached
    assert segmenter.active and segmenter.utterance_start == dip * FRAME
    tail = segmenter.flush(n * FRAME)
    assert [(e.kind, e.sample) for e in tail] == [("end", n * FRAME)]


def test_segmenter_discards_cut_remainder_without_speech():
    config = VADConfig(speech_pad_ms=0, min_silence_ms=200, min_speech_ms=200, max_utterance_s=4.0)
    # 4 s = 125 frames. Speech that ends before the limit is one utterance.
    kinds = [k for _, k, _, _ in run(UtteranceSegmenter(config), [0.9] * 110 + [0.0] * 20)]
    assert kinds == ["start", "end"]
    # A pause at frames 121-123, two more frames of speech, and the limit is reached at frame
    # 125: the cut lands in the pause, and the 128 ms after it are too little to keep.
    events = run(UtteranceSegmenter(config), [0.9] * 121 + [0.0] * 3 + [0.9] * 2 + [0.0] * 20)
    expected = [(6, "start", 0), (125, "cut", 122 * FRAME), (133, "discard", 126 * FRAME)]
    assert [(i, k, s) for i, k, s, _ in events] == expected


def test_manual_segmenter_leaves_the_cutting_to_the_client(vad, long_audio):
    """An utterance from the first frame after each flush to the next flush, whatever the VAD
    hears; past max_utterance_s a cut at the quietest point, as a VAD with threshold 0 that never
    ends speech would do (how Realtime's `turn_detection: null` used to be run)."""
    audio = long_audio[: 90 * 16000]
    probs = vad.probabilities(vad.new_state(), audio).tolist()
    levels = frame_rms(audio[: len(probs) * FRAME].reshape(-1, FRAME)).tolist()
    config = VADConfig(max_utterance_s=20.0)
    always = VADConfig(threshold=0.0, neg_threshold=0.0, min_silence_ms=10**9, speech_pad_ms=0, min_speech_ms=0,
                       max_utterance_s=20.0)
    flushes = {int(s * 16000 / FRAME): int(s * 16000) + 100 for s in (3.3, 4.0, 31.7, 90.0)}  # frame -> sample
    got = []
    for segmenter in (ManualSegmenter(config), UtteranceSegmenter(always)):
        events = []
        for i, (p, r) in enumerate(zip(probs, levels)):
            events += segmenter.push(p, r)
            if i in flushes:
                events += segmenter.flush(flushes[i])
        got.append(events)
    manual, reference = got
    assert manual == reference
    kinds = [e.kind for e in manual]
    assert kinds[:4] == ["start", "end", "start", "end"] and manual[0].sample == 0 and manual[1].sample == flushes[103]
    assert kinds.count("cut") >= 2  # 27.7 s between two flushes, then 58 s: cut at 20 s at the latest
    assert all(b.sample - a.sample <= 20 * 16000 for a, b in zip(manual, manual[1:]) if a.kind != "end")


def test_a_background_voice_in_a_loud_calls_pause_is_not_raised_into_speech(vad, audio_dir, monkeypatch):
    """silero-vad hears a voice down to a ~-65 dBFS peak unaided (its onset late); one at -70 dBFS, 20 s
    into the pause of a loud talker (a TV across the room), it does not, and the slow level
    (`HELD_FRACTION` of a peak decaying by half a minute) holds the gain near 0 dB there, so it stays
    background. Following only the 2-s level the gain reached +30 dB and the VAD cut it as speech
    (Whisper then transcribes, or hallucinates on, it). The same voice in a stream that was never
    loud is raised, and is speech."""
    from streamer.audio import vad as vad_module

    loud = at_peak(decode(audio_dir / "en/jfk.ogg"), -1.0)
    voice = at_peak(decode(audio_dir / "en/asterisk/conf-getpin.ogg"), -70.0)
    pause = np.zeros(16000 * 20, np.float32)
    audio = np.concatenate([loud, pause, voice])
    after = len(loud) + len(pause) // 2

    def late(segments):
        return [s for s in segments if s[1] > after]
    assert late(speech_segments(audio, VADConfig(), vad)) == []
    assert late(speech_segments(np.concatenate([np.zeros_like(loud), pause, voice]), VADConfig(), vad))
    monkeypatch.setattr(vad_module, "HELD_FRACTION", 0.0)
    assert late(speech_segments(audio, VADConfig(), vad))  # what the 2-s level alone did
