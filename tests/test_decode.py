"""decode.py on real speech: containers and codecs round trip, bad input fails clearly, live PCM
resamples the same in chunks as in one piece."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest

from streamer.audio.decode import (
    SAMPLE_RATE,
    AudioDecodeError,
    MAX_SEPARATE_CHANNELS,
    AudioTooLarge,
    StreamResampler,
    decode_audio,
    pcm_to_float,
    write_wav,
)


@pytest.fixture(scope="module")
def jfk(jfk_path) -> np.ndarray:
    return decode_audio(jfk_path)


class _WriteOnly(io.RawIOBase):
    """A pipe-like sink: muxers cannot go back to write the duration into the header."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.data += b
        return len(b)


class _ReadOnce(io.RawIOBase):
    """A non-seekable upload stream that records how much was read from it."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._data.readinto(b)
        self.bytes_read += n
        return n


def encode(audio: np.ndarray, target, container: str, codec: str, rate: int, layout: str) -> None:
    """Encode 16 kHz mono float audio with PyAV; the encoder converts rate, layout and format."""
    with av.open(target, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(audio[None, :].astype(np.float32), format="flt", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def best_aligned_correlation(a: np.ndarray, b: np.ndarray, max_lag: int = 1600) -> tuple[float, int]:
    """Pearson correlation of a and b at the lag (|lag| <= max_lag samples) that maximises it."""
    n = min(len(a), len(b))
    a, b = a[:n] - a[:n].mean(), b[:n] - b[:n].mean()
    size = 1 << (2 * n - 1).bit_length()
    xcorr = np.fft.irfft(np.fft.rfft(a, size) * np.conj(np.fft.rfft(b, size)), size)
    lags = np.r_[np.arange(0, max_lag + 1), np.arange(-max_lag, 0)]
    best = lags[np.argmax(xcorr[lags])]
    return float(xcorr[best] / np.sqrt((a * a).sum() * (b * b).sum())), int(best)


def test_decodes_jfk_to_16k_mono_float(jfk):
    assert jfk.dtype == np.float32 and jfk.ndim == 1
    assert abs(len(jfk) / SAMPLE_RATE - 11.0) < 0.05
    rms = float(np.sqrt(np.mean(jfk**2)))
    assert 0.03 < rms < 0.5, rms
    assert np.abs(jfk).max() <= 1.0


ROUND_TRIPS = [
    ("wav", "pcm_s16le", 8000, "mono", "wav"),
    ("wav", "pcm_s16le", 48000, "stereo", "wav"),
    ("flac", "flac", 44100, "stereo", "flac"),
    ("mp3", "libmp3lame", 44100, "stereo", "mp3"),
    ("ogg", "libopus", 48000, "stereo", "ogg"),
    ("webm", "libopus", 48000, "mono", "webm"),
    ("ipod", "aac", 44100, "stereo", "m4a"),
]


@pytest.mark.parametrize(
    "container,codec,rate,layout,ext", ROUND_TRIPS, ids=[f"{r[4]}-{r[1]}-{r[2]}-{r[3]}" for r in ROUND_TRIPS]
)
def test_round_trip(jfk, tmp_path, container, codec, rate, layout, ext):
    path = tmp_path / f"jfk.{ext}"
    encode(jfk, str(path), container, codec, rate, layout)
    back = decode_audio(path)
    assert back.dtype == np.float32 and back.ndim == 1
    assert abs(len(back) - len(jfk)) / SAMPLE_RATE < 0.05, (len(back), len(jfk))
    corr, lag = best_aligned_correlation(jfk, back)
    # Measured: 0.98 for AAC, 0.999 or more for the rest. A wrong rate, a lost channel or a gap
    # would break the alignment.
    assert corr > 0.97, corr
    # PyAV's muxing writes no edit list for AAC's 1024 priming samples, so that file alone comes
    # back 23 ms late; every other codec's delay is trimmed by the decoder.
    assert abs(lag) <= (0.024 * SAMPLE_RATE if codec == "aac" else 0), lag


def test_stereo_mixdown_is_channel_mean(jfk, tmp_path):
    path = tmp_path / "stereo.wav"
    write_wav(path, np.stack([0.8 * jfk, 0.4 * jfk], axis=1))
    back = decode_audio(path)
    np.testing.assert_allclose(back, 0.6 * jfk, atol=2e-4)


@pytest.mark.parametrize("channels,rate", [(2, SAMPLE_RATE), (8, SAMPLE_RATE), (9, 8000), (16, 48000)])
def test_channels_kept_apart(jfk, tmp_path, channels, rate):
    """`mono=False` gives each channel back on its own, in order, at any count up to the cap and any
    rate (8 or more channels crashed the process in PyAV's planar frames, session 27)."""
    clip = jfk[: 2 * SAMPLE_RATE]
    source = np.interp(np.arange(len(clip) * rate // SAMPLE_RATE) * SAMPLE_RATE / rate, np.arange(len(clip)), clip)
    gains = np.linspace(0.9, 0.1, channels, dtype=np.float32)
    path = tmp_path / f"ch{channels}.wav"
    write_wav(path, source[:, None] * gains[None, :], rate)
    back = decode_audio(path, mono=False)
    assert back.shape[0] == channels and abs(back.shape[1] - len(clip)) <= 2, back.shape
    n = min(back.shape[1], len(clip))
    for c in range(channels):  # each channel is its own gain times the same speech
        np.testing.assert_allclose(back[c, :n], gains[c] * back[0, :n] / gains[0], atol=3e-3)
    corr, _ = best_aligned_correlation(clip[:n], back[0, :n] / gains[0])
    assert corr > (0.99 if rate >= SAMPLE_RATE else 0.9), corr


def test_too_many_channels_kept_apart_is_refused_mixed_is_not(jfk, tmp_path):
    path = tmp_path / "ch17.wav"
    write_wav(path, np.repeat(jfk[:SAMPLE_RATE, None], MAX_SEPARATE_CHANNELS + 1, axis=1))
    with pytest.raises(AudioDecodeError, match=f"17 channels, more than the {MAX_SEPARATE_CHANNELS}"):
        decode_audio(path, mono=False)
    np.testing.assert_allclose(decode_audio(path), jfk[:SAMPLE_RATE], atol=2e-4)


def test_a_mixdown_of_unnamed_channels_is_their_mean_within_half_a_16_bit_step(jfk, tmp_path):
    """A WAV of 9 channels has no channel names, so the decoder averages them itself; since
    session 32 the mean is rounded to the 16-bit grid that every other file's samples lie on."""
    path = tmp_path / "ch9.wav"
    write_wav(path, jfk[:SAMPLE_RATE, None] * np.linspace(0.9, 0.1, 9, dtype=np.float32)[None, :])
    mean = decode_audio(path, mono=False).mean(axis=0, dtype=np.float64)
    np.testing.assert_allclose(decode_audio(path), mean, rtol=0, atol=0.5 / 32768 + 1e-9)


def test_the_decoder_pool_gives_decode_audio(jfk, jfk_path, tmp_path):
    """The gateway's decoder processes send 16-bit samples (half the bytes of float32: a 4-hour
    upload's 0.92 GB was held twice in the child and twice in the gateway, session 32); the pool
    gives back exactly what `decode_audio` gives in-process."""
    import asyncio

    from streamer.server.decoder import DecoderPool

    stereo = tmp_path / "stereo.wav"
    write_wav(stereo, np.stack([0.8 * jfk, 0.4 * jfk], axis=1), 48000)
    cases = [(jfk_path, True), (stereo, True), (stereo, False)]  # Opus; a mixdown; channels apart
    pool = DecoderPool(1)

    async def main():
        return [await pool.decode(Path(p).read_bytes(), name="x", mono=mono) for p, mono in cases]

    try:
        got = asyncio.run(main())
    finally:
        pool.close()
    assert not pool.inline
    for audio, (p, mono) in zip(got, cases):
        assert audio.dtype == np.float32
        np.testing.assert_array_equal(audio, decode_audio(p, mono=mono))


def test_a_decoder_child_holds_a_second_of_audio_and_leaves_no_file(audio_dir, tmp_path):
    """The decoder child wrote its whole recording into the pipe: 18 minutes of Opus (35 MB of int16)
    grew it by about 4 times that (its chunks, their concatenation, `tobytes`, the pickler's buffer).
    It now writes the samples to a file the gateway names, a second at a time, and returns their
    shape: its growth stays under the int16 bytes (measured: 15 MB, the upload's 4 MB received and
    opened, a second of audio, libav's buffers). The file is removed whatever happens: after a decode; after a decode whose
    child is killed mid-way (the pool decodes it again, in a child of its own, to the same bits); and
    after a decode given up (cancelled) while the child still writes."""
    import asyncio
    import threading
    import time

    import psutil

    from streamer.server.decoder import DecoderPool

    data = (audio_dir / "long" / "asterisk_en_6min.ogg").read_bytes() * 3  # chained Ogg: 18.3 minutes
    expected = decode_audio(data)
    pcm_bytes = 2 * expected.size
    spool = tmp_path / "spool"
    spool.mkdir()
    pool = DecoderPool(1, spool_dir=str(spool))

    def children() -> list[psutil.Process]:  # the forkserver's children: decoder processes
        me = psutil.Process()
        return [p for p in me.children(recursive=True) if p.ppid() != me.pid and p.pid not in others]

    others: set[int] = set()
    others = {p.pid for p in children()}  # another test's pool's, still exiting

    peaks: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for p in children():
                try:
                    peaks[p.pid] = max(peaks.get(p.pid, 0), p.memory_info().rss)
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.005)

    async def main():
        await pool.start()
        (worker,) = children()
        idle = worker.memory_info().rss
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            first = await pool.decode(data, name="long.ogg")
        finally:
            stop.set()
            sampler.join()
        growth = peaks[worker.pid] - idle
        left_after_decode = sorted(spool.iterdir())

        decoding = asyncio.ensure_future(pool.decode(data, name="long.ogg"))
        await asyncio.sleep(1.0)
        assert list(spool.iterdir()), "the decode has not started"
        children()[0].kill()  # as a libav crash would
        again = await decoding
        left_after_crash = sorted(spool.iterdir())

        given_up = asyncio.ensure_future(pool.decode(data, name="long.ogg"))
        await asyncio.sleep(1.0)
        given_up.cancel()
        with pytest.raises(asyncio.CancelledError):
            await given_up
        return first, growth, left_after_decode, again, left_after_crash, sorted(spool.iterdir())

    try:
        first, growth, left_after_decode, again, left_after_crash, left_after_cancel = asyncio.run(main())
    finally:
        pool.close()
    np.testing.assert_array_equal(first, expected)
    np.testing.assert_array_equal(again, expected)
    assert pool.crashes == 1
    assert left_after_decode == left_after_crash == left_after_cancel == []
    print(f"child grew {growth / 2**20:.0f} MB for {pcm_bytes / 2**20:.0f} MB of int16")
    assert growth < pcm_bytes, f"the child grew {growth / 2**20:.0f} MB for {pcm_bytes / 2**20:.0f} MB of int16"


def test_a_gateways_start_removes_the_spool_files_of_killed_gateways_only(audio_dir, tmp_path):
    """A gateway killed mid-decode (SIGKILL: no `finally` runs) leaves its upload's samples in the
    spool directory; the next gateway's `DecoderPool.start` removes them, and keeps the files of
    gateways still alive (here: this process's) and files that are not spool files."""
    import asyncio
    import os
    import signal
    import subprocess
    import sys
    import time

    from streamer.server.decoder import SPOOL_PREFIX, SPOOL_SUFFIX, DecoderPool

    spool = tmp_path / "spool"
    spool.mkdir()
    source = audio_dir / "long" / "asterisk_en_6min.ogg"
    code = (
        "import asyncio\n"
        "from streamer.server.decoder import DecoderPool\n"
        f"data = open({str(source)!r}, 'rb').read() * 6\n"
        f"pool = DecoderPool(1, spool_dir={str(spool)!r})\n"
        "asyncio.run(pool.decode(data, name='long.ogg'))\n"
    )
    gateway = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not [f for f in spool.iterdir() if f.stat().st_size > 0] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(gateway.pid, signal.SIGKILL)  # the gateway and its decoder processes, as an OOM kill
        gateway.wait()
    left = sorted(spool.iterdir())
    assert [f.name for f in left] and all(f.name.startswith(f"{SPOOL_PREFIX}{gateway.pid}-") for f in left)
    alive = spool / f"{SPOOL_PREFIX}{os.getpid()}-live{SPOOL_SUFFIX}"
    other = spool / "notes.txt"
    alive.write_bytes(b"\0\0")
    other.write_text("kept")
    pool = DecoderPool(1, spool_dir=str(spool))
    try:
        asyncio.run(pool.start())
    finally:
        pool.close()
    assert sorted(spool.iterdir()) == sorted([alive, other])


def write_tracks(path: Path, tracks: list[np.ndarray], rate: int = 16000) -> None:
    """A Matroska file of one 16-bit PCM audio track per array (float in [-1, 1]), interleaved
    a second at a time as a muxer would."""
    pcm = [np.round(np.clip(t, -1, 1) * 32767).astype(np.int16) for t in tracks]
    with av.open(str(path), "w", format="matroska") as out:
        streams = [out.add_stream("pcm_s16le", rate=rate, layout="mono") for _ in pcm]
        for start in range(0, max(len(p) for p in pcm), rate):
            for stream, samples in zip(streams, pcm):
                if start < len(samples):
                    frame = av.AudioFrame.from_ndarray(samples[None, start:start + rate], format="s16", layout="mono")
                    frame.sample_rate, frame.pts = rate, start
                    out.mux(stream.encode(frame))
        for stream in streams:
            out.mux(stream.encode(None))


def test_of_two_audio_tracks_a_silent_first_one_is_passed_over(jfk, tmp_path):
    """A file with two audio tracks, the first silent (a screen recording's system audio beside its
    microphone): the silent one was transcribed, an empty transcript. ffmpeg's choice is kept while
    it has sound in its first 30 s (PROBE_S); when it is silent (below -40 dBFS: here a -60 dBFS
    noise floor), the first track with sound is decoded instead, to the same samples as alone."""
    noise = (0.001 * np.random.default_rng(0).standard_normal(len(jfk))).astype(np.float32)  # -60 dBFS
    speech = 0.5 * jfk
    write_tracks(tmp_path / "alone.mkv", [speech])
    write_tracks(tmp_path / "silent_first.mkv", [noise, speech])
    write_tracks(tmp_path / "both_heard.mkv", [speech, 0.3 * jfk[::-1]])
    alone = decode_audio(tmp_path / "alone.mkv")
    assert np.abs(alone - speech).max() < 2 / 32768
    np.testing.assert_array_equal(decode_audio(tmp_path / "silent_first.mkv"), alone)
    np.testing.assert_array_equal(decode_audio(tmp_path / "both_heard.mkv"), alone)  # the first: ffmpeg's
    with open(tmp_path / "silent_first.mkv", "rb") as f:  # a file object, read again after the probe
        np.testing.assert_array_equal(decode_audio(f), alone)


def test_write_wav_round_trip(jfk, tmp_path):
    write_wav(tmp_path / "jfk.wav", jfk)
    np.testing.assert_allclose(decode_audio(tmp_path / "jfk.wav"), jfk, atol=0.5 / 32768 + 1e-7)


def test_bytes_and_file_objects(jfk, jfk_path):
    data = Path(jfk_path).read_bytes()
    np.testing.assert_array_equal(decode_audio(data), jfk)
    np.testing.assert_array_equal(decode_audio(io.BytesIO(data)), jfk)
    with open(jfk_path, "rb") as f:
        f.read(100)  # a file object is read from its start, wherever it was left
        np.testing.assert_array_equal(decode_audio(f), jfk)
    np.testing.assert_array_equal(decode_audio(_ReadOnce(data)), jfk)


def test_text_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("ask not what your country can do for you\n" * 50)
    with pytest.raises(AudioDecodeError, match=r"^notes\.txt: not an audio file"):
        decode_audio(path)
    with pytest.raises(AudioDecodeError, match=r"^upload: not an audio file"):
        decode_audio(io.BytesIO(path.read_bytes()))


def test_empty_file(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(AudioDecodeError, match=r"^empty\.wav: empty file$"):
        decode_audio(tmp_path / "empty.wav")
    with pytest.raises(AudioDecodeError, match=r"^<bytes>: empty file$"):
        decode_audio(b"")


def test_missing_file(tmp_path):
    with pytest.raises(AudioDecodeError, match=r"^nothing\.wav: cannot open"):
        decode_audio(tmp_path / "nothing.wav")


def test_random_bytes():
    noise = np.random.default_rng(0).bytes(20000)
    with pytest.raises(AudioDecodeError, match=r"^noise\.bin: not an audio file"):
        decode_audio(noise, name="noise.bin")


def test_truncated_header(jfk_path):
    head = Path(jfk_path).read_bytes()[:100]
    with pytest.raises(AudioDecodeError, match=r"^cut\.ogg: not an audio file .*truncated"):
        decode_audio(head, name="cut.ogg")


def test_truncated_and_garbled_data_decode_what_is_there(jfk, tmp_path):
    """A damaged packet is skipped, as the ffmpeg CLI (openai-whisper) and faster-whisper skip it,
    its time kept as silence: a FLAC cut off mid-frame (a recorder that stopped) gives its first
    5 s, not an error, and an MP3 with a stretch of garbage gives the rest of its audio, in place.
    Both were refused whole ("corrupt data at 5.3 s"), losing every good second (QA session 31)."""
    flac = io.BytesIO()
    encode(jfk, flac, "flac", "flac", 44100, "stereo")
    cut = tmp_path / "cut.flac"
    cut.write_bytes(flac.getvalue()[: len(flac.getvalue()) // 2])
    head, whole = decode_audio(cut), decode_audio(flac.getvalue())
    assert 5.0 < len(head) / SAMPLE_RATE < 5.6, len(head)
    np.testing.assert_allclose(head[: 5 * SAMPLE_RATE], whole[: 5 * SAMPLE_RATE], atol=1e-3)

    mp3 = io.BytesIO()
    encode(jfk, mp3, "mp3", "libmp3lame", 44100, "stereo")
    clean = decode_audio(mp3.getvalue())
    garbled = bytearray(mp3.getvalue())
    start = len(garbled) // 3
    garbled[start : start + 2000] = np.random.default_rng(1).bytes(2000)
    back = decode_audio(bytes(garbled), name="garbled.mp3")
    assert abs(len(back) - len(clean)) / SAMPLE_RATE < 0.5
    corr, lag = best_aligned_correlation(clean[-4 * SAMPLE_RATE:], back[-4 * SAMPLE_RATE:])
    assert corr > 0.99 and abs(lag) <= 0.1 * SAMPLE_RATE, (corr, lag)  # the audio after the garbage, in place


def test_a_mostly_damaged_file_is_refused(jfk):
    """More damaged packets than good ones: not a recording with a scratch, a broken file."""
    flac = io.BytesIO()
    encode(jfk, flac, "flac", "flac", 44100, "stereo")
    broken = bytearray(flac.getvalue())
    for i in range(2000, len(broken), 200):
        broken[i] ^= 0x55
    with pytest.raises(AudioDecodeError, match=r"^broken\.flac: corrupt data at .* of \d+ packets are damaged$"):
        decode_audio(bytes(broken), name="broken.flac")


def test_damaged_files_raise_only_audio_decode_error(jfk):
    rng = np.random.default_rng(7)
    formats = [("flac", "flac", 44100, "flac"), ("mp3", "libmp3lame", 44100, "mp3"),
               ("ipod", "aac", 44100, "m4a"), ("webm", "libopus", 48000, "webm")]
    for container, codec, rate, ext in formats:
        buf = io.BytesIO()
        encode(jfk, buf, container, codec, rate, "stereo")
        good = buf.getvalue()
        for trial in range(8):
            bad = bytearray(good[: rng.integers(1, len(good))] if trial % 2 else good)
            for _ in range(10):
                bad[rng.integers(0, len(bad))] = rng.integers(0, 256)
            try:
                audio = decode_audio(bytes(bad), name=f"bad.{ext}")
            except AudioDecodeError as e:
                assert str(e).startswith(f"bad.{ext}: ")
                continue
            assert audio.dtype == np.float32 and np.isfinite(audio).all()


def test_max_seconds(jfk_path, jfk):
    # jfk.ogg declares its duration: refused before decoding.
    with pytest.raises(AudioTooLarge, match=r"^jfk\.ogg: 11\.0 s, longer than the 5 s limit$") as info:
        decode_audio(jfk_path, max_seconds=5)
    assert info.value.limit == "seconds" and isinstance(info.value, AudioDecodeError)
    assert len(decode_audio(jfk_path, max_seconds=12)) == len(jfk)

    # Written to a pipe, WebM has no duration (as from a browser's MediaRecorder): refused while decoding
    # (the message has no declared duration in it).
    sink = _WriteOnly()
    encode(jfk, sink, "webm", "libopus", 48000, "mono")
    live = bytes(sink.data)
    with pytest.raises(AudioDecodeError, match=r"^<bytes>: longer than the 5 s limit$"):
        decode_audio(live, max_seconds=5)
    assert abs(len(decode_audio(live, max_seconds=12)) - len(jfk)) < 0.05 * SAMPLE_RATE


def test_max_seconds_judges_the_audio_not_a_longer_video(jfk, tmp_path):
    """A screen recording or video call whose video runs on after its sound stops: MAX_AUDIO_S was
    checked against the container's duration, the longest of its tracks, so 4 s of speech under a
    10 s video was refused at a 5 s limit. The audio stream's own duration decides."""
    path = tmp_path / "call.mp4"
    with av.open(str(path), "w", format="mp4") as out:
        sound = out.add_stream("aac", rate=SAMPLE_RATE, layout="mono")
        video = out.add_stream("mpeg4", rate=5)
        video.width = video.height = 16
        video.pix_fmt = "yuv420p"
        frame = av.AudioFrame.from_ndarray(jfk[None, : 4 * SAMPLE_RATE], format="flt", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        for packet in [*sound.encode(frame), *sound.encode(None)]:
            out.mux(packet)
        grey = np.full((16, 16, 3), 128, np.uint8)
        for i in range(10 * 5):
            picture = av.VideoFrame.from_ndarray(grey, format="rgb24")
            picture.pts = i
            out.mux(video.encode(picture))
        out.mux(video.encode(None))
    with av.open(str(path)) as container:  # the file is what the test needs: a 10 s container, 4 s of audio
        assert container.duration / av.time_base == pytest.approx(10, abs=0.3)
    audio = decode_audio(path, max_seconds=5)
    assert abs(len(audio) / SAMPLE_RATE - 4) < 0.1
    with pytest.raises(AudioTooLarge, match=r"4\.\d s, longer than the 3 s limit"):
        decode_audio(path, max_seconds=3)  # still refused up front, by the audio's duration


def test_an_opus_file_of_exactly_the_limit_is_taken(jfk, tmp_path):
    """Ogg/Opus declares its encoder's padding in its duration (6.5 ms past the last sample): a file
    of exactly MAX_AUDIO_S was refused. The limit has a little slack (`LIMIT_SLACK_S`), no more."""
    path = tmp_path / "exact.ogg"
    with av.open(str(path), "w", format="ogg") as out:
        sound = out.add_stream("libopus", rate=48000, layout="mono")
        audio = np.resize(jfk, 2 * SAMPLE_RATE)  # exactly 2 s of speech, at 48 kHz for Opus
        pcm = np.interp(np.arange(6 * SAMPLE_RATE) / 3, np.arange(audio.size), audio).astype(np.float32)
        for i in range(0, pcm.size, 960):
            frame = av.AudioFrame.from_ndarray(pcm[None, i:i + 960], format="flt", layout="mono")
            frame.sample_rate, frame.pts = 48000, i
            for packet in sound.encode(frame):
                out.mux(packet)
        for packet in sound.encode(None):
            out.mux(packet)
    with av.open(str(path)) as container:  # the file is what the test needs: declared past 2 s
        assert container.duration / av.time_base > 2.0
    assert abs(len(decode_audio(path, max_seconds=2)) - 2 * SAMPLE_RATE) < 0.01 * SAMPLE_RATE
    with pytest.raises(AudioTooLarge, match="longer than the 1.8 s limit"):
        decode_audio(path, max_seconds=1.8)


def test_max_bytes(jfk_path):
    data = Path(jfk_path).read_bytes()
    with pytest.raises(AudioTooLarge, match=r"^jfk\.ogg: .* KB, larger than the 10 KB limit$") as info:
        decode_audio(jfk_path, max_bytes=10 * 1024)
    assert info.value.limit == "bytes"
    with pytest.raises(AudioDecodeError, match=r"larger than the 10 KB limit"):
        decode_audio(data, max_bytes=10 * 1024)
    stream = _ReadOnce(data)
    with pytest.raises(AudioDecodeError, match=r"^upload: .*larger than the 10 KB limit"):
        decode_audio(stream, max_bytes=10 * 1024)
    assert stream.bytes_read <= 10 * 1024 + 1  # never read the whole upload to refuse it
    assert len(decode_audio(data, max_bytes=len(data))) > 0


def _to_rate(audio: np.ndarray, rate: int) -> np.ndarray:
    """16 kHz mono float -> `rate`, one shot through PyAV."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    frame = av.AudioFrame.from_ndarray(audio[None, :], format="flt", layout="mono")
    frame.sample_rate = SAMPLE_RATE
    frames = resampler.resample(frame) + resampler.resample(None)
    return np.concatenate([f.to_ndarray()[0] for f in frames])


def _stream(resampler: StreamResampler, data: bytes, chunk: int) -> np.ndarray:
    parts = [resampler.push(data[i : i + chunk]) for i in range(0, len(data), chunk)]
    return np.concatenate(parts + [resampler.flush()])


def test_stream_resampler_chunks_match_one_shot(jfk, tmp_path):
    at48 = _to_rate(jfk, 48000)
    stereo = np.stack([0.8 * at48, 0.4 * at48], axis=1)
    write_wav(tmp_path / "s.wav", stereo, rate=48000)
    pcm = (tmp_path / "s.wav").read_bytes()[44:]  # the same samples as raw interleaved s16

    one_shot = _stream(StreamResampler(48000, 2), pcm, len(pcm))
    chunked = _stream(StreamResampler(48000, 2), pcm, 1037)  # odd: chunks end mid-sample
    assert len(one_shot) == len(chunked) == len(jfk)
    np.testing.assert_allclose(chunked, one_shot, atol=1e-6)
    # decode_audio mixes and resamples in libswresample to 16-bit: equal to one 16-bit step.
    np.testing.assert_allclose(decode_audio(tmp_path / "s.wav"), one_shot, atol=1 / 32768)
    corr, lag = best_aligned_correlation(0.6 * jfk, one_shot)
    assert corr > 0.999 and lag == 0


def test_stream_resampler_is_reusable_after_flush(jfk):
    pcm = _to_rate(jfk, 44100).astype("<f4").tobytes()
    resampler = StreamResampler(44100, 1, "pcm_f32le")
    first = _stream(resampler, pcm, 999)
    second = _stream(resampler, pcm, 4096)
    assert len(first) == len(second) == len(jfk)
    np.testing.assert_allclose(second, first, atol=1e-6)
    assert best_aligned_correlation(jfk, first)[0] > 0.999


def test_stream_resampler_passes_16k_mono_through(jfk):
    pcm = (jfk * 32767).round().astype("<i2").tobytes()
    out = _stream(StreamResampler(16000), pcm, 333)
    np.testing.assert_array_equal(out, pcm_to_float(pcm, "pcm_s16le"))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(rate=4000), "outside 8000..192000 Hz"),
        (dict(rate=384000), "outside 8000..192000 Hz"),
        (dict(rate=16000, channels=0), "outside 1..8"),
        (dict(rate=16000, channels=9), "outside 1..8"),
        (dict(rate=16000, encoding="pcm_mulaw"), "not one of pcm_s16le, pcm_f32le"),
    ],
)
def test_stream_resampler_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StreamResampler(**kwargs)


def test_pcm_to_float():
    s16 = np.array([-32768, 0, 16384, 32767], dtype="<i2").tobytes()
    np.testing.assert_array_equal(pcm_to_float(s16, "pcm_s16le"), np.array([-1.0, 0.0, 0.5, 32767 / 32768], np.float32))
    f32 = np.array([-0.25, 1.0], dtype="<f4").tobytes()
    assert pcm_to_float(f32, "pcm_f32le").tolist() == [-0.25, 1.0]
    with pytest.raises(ValueError, match="not a whole number"):
        pcm_to_float(s16[:-1], "pcm_s16le")
