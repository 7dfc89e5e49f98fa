"""Audio in: any file PyAV reads, or raw PCM chunks of a live stream, to float32 16 kHz mono.

Files go through `decode_audio` (with size and duration limits checked as early as possible), or
`decode_pcm16` for the same samples as 16-bit integers (what libswresample gives; half the bytes),
or `decode_pcm16_to_file`, which writes them to a file as they come (the upload decoder's children:
`pcm16_file_to_float` reads it back); live PCM goes through `StreamResampler`, which keeps the resampler's state across chunks.
Bad input raises `AudioDecodeError` only: a `ValueError` whose message names the file and says
what is wrong in plain words, fit to hand back to a client.
"""

from __future__ import annotations

import contextlib
import io
import os
import wave
from fractions import Fraction
from typing import BinaryIO, Callable, Iterator

import av
import numpy as np

from streamer.audio import SAMPLE_RATE, g711


BATCH_SECONDS = 1.0
"""Decoded frames are gathered this long before resampling: one resampler call per 20-ms Opus
frame costs about as much as the decoding itself (6-min Opus file: decoding alone 0.43 s,
resampling each frame 0.91 s in all, batched 0.61 s)."""

PCM_DTYPES = {"pcm_s16le": np.dtype("<i2"), "pcm_f32le": np.dtype("<f4"), "mulaw": np.dtype("u1"),
               "alaw": np.dtype("u1")}
"""Raw encodings a live stream may send, as the numpy types of one sample (G.711: one byte)."""
PROBE_S = 30.0
"""A file with several audio streams: how much of each is decoded to find one with sound (ffmpeg's
choice stands unless its first PROBE_S are silent). A track silent longer than that and then
speaking is not found: every track would have to be decoded in full."""
SOUND_PEAK = 0.01
"""-40 dBFS: a track whose samples never reach it is silent (digital silence, a noise floor;
speech peaks well above)."""
READ_BLOCK_SAMPLES = 1 << 20
"""Samples `pcm16_file_to_float` reads at a time: 2 MB beside the float32 array it fills."""

_MIN_RATE, _MAX_RATE = 8000, 192000
_MAX_CHANNELS = 8
MAX_SEPARATE_CHANNELS = 16
LIMIT_SLACK_S = 0.1
"""How far a file may pass `max_seconds`, declared or decoded: Ogg/Opus counts its encoder's padding
too (6.5 ms past the last sample), so a file of exactly the limit was refused."""
"""Channels a file decoded with `mono=False` may have: each is transcribed on its own, so the cap bounds one
upload's work (a mixdown to mono takes any count)."""

Source = str | os.PathLike | bytes | bytearray | memoryview | BinaryIO


class AudioDecodeError(ValueError):
    """Input that is not usable audio. `str(error)` is `"<name>: <reason>"`."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        """The file name, "upload" for a nameless file object, "<bytes>" for bytes."""
        self.reason = reason
        """What is wrong, in plain words (e.g. "empty file", "corrupt data at 1.2 s")."""

    def __reduce__(self):  # raised in the decoder's child process, re-raised in the gateway
        return type(self), (self.name, self.reason)


class SpoolError(RuntimeError):
    """The decoded samples could not be written to (or read back from) their file: the server's
    fault (a full disk), not the upload's."""


class AudioTooLarge(AudioDecodeError):
    """Audio over a limit of `decode_audio`: `limit` is "seconds" (`max_seconds`) or "bytes" (`max_bytes`)."""

    def __init__(self, name: str, reason: str, limit: str) -> None:
        super().__init__(name, reason)
        self.limit = limit

    def __reduce__(self):
        return type(self), (self.name, self.reason, self.limit)


def decode_audio(
    source: Source,
    *,
    max_seconds: float | None = None,
    max_bytes: int | None = None,
    name: str | None = None,
    mono: bool = True,
) -> np.ndarray:
    """Decode the main audio stream of `source` to float32 mono at 16 kHz, shape [N]; with
    `mono=False`, every channel on its own, shape [channels, N] (call recordings: agent and caller).

    `source` is a path, the file's bytes, or a binary file object (read from its start).
    Over `max_bytes` is refused before anything is decoded; over `max_seconds` is refused
    up front when the audio stream (else the container) declares its duration, else as soon as
    decoding passes it.
    `name` replaces the file name in error messages.
    """
    return pcm16_to_float(decode_pcm16(source, max_seconds=max_seconds, max_bytes=max_bytes, name=name, mono=mono))


def decode_pcm16(
    source: Source,
    *,
    max_seconds: float | None = None,
    max_bytes: int | None = None,
    name: str | None = None,
    mono: bool = True,
) -> np.ndarray:
    """`decode_audio`'s samples as int16 (`decode_audio` is `pcm16_to_float` of these): the
    upload decoder's processes send these to the gateway, half the bytes of float32 (a 4-hour
    upload: 0.46 GB instead of 0.92 GB pickled, and twice that in each process for a moment)."""
    chunks: list[np.ndarray] = []
    _decode(source, chunks.append, max_seconds=max_seconds, max_bytes=max_bytes, name=name, mono=mono)
    return np.concatenate(chunks, axis=-1)


def decode_pcm16_to_file(
    source: Source,
    path: str | os.PathLike,
    *,
    max_seconds: float | None = None,
    max_bytes: int | None = None,
    name: str | None = None,
    mono: bool = True,
) -> tuple[int, ...]:
    """`decode_pcm16`'s samples written to `path` as they are decoded (native int16; channels kept
    apart are interleaved), a second of audio in memory at a time; returns the shape `decode_pcm16`
    would have returned (`pcm16_file_to_float(path, shape)` is `decode_audio`'s result). `path` must
    exist: its owner creates it and removes it, and a decode that starts after its owner gave up
    (and removed it) fails instead of leaving a file behind. A write that fails raises `SpoolError`."""
    with open(path, "r+b") as f:
        def write(chunk: np.ndarray) -> None:
            try:  # [channels, n] views of interleaved samples: their transpose is those, in order
                f.write(chunk.T.tobytes() if chunk.ndim == 2 else chunk.tobytes())
            except OSError as e:  # (a full disk is not the file's fault: not an AudioDecodeError)
                raise SpoolError(f"cannot write the decoded samples: {_plain(e)}") from None

        shape = _decode(source, write, max_seconds=max_seconds, max_bytes=max_bytes, name=name, mono=mono)
        f.truncate()  # a second attempt at the same file writes the same samples: nothing after them
    return shape


def pcm16_file_to_float(path: str | os.PathLike, shape: tuple[int, ...]) -> np.ndarray:
    """The int16 samples `decode_pcm16_to_file` wrote, as `decode_audio`'s float32 array of `shape`,
    read `READ_BLOCK_SAMPLES` at a time into the array (no second copy of the recording)."""
    out = np.empty(shape, np.float32)
    channels = 1 if len(shape) == 1 else shape[0]
    frames = shape[-1]
    block = np.empty(max(1, READ_BLOCK_SAMPLES // channels) * channels, np.int16)
    with open(path, "rb") as f:
        done = 0
        while done < frames:
            n = min(frames - done, len(block) // channels)
            part = block[: n * channels]
            if f.readinto(part) != part.nbytes:
                raise SpoolError(f"{path}: {frames} samples expected, the file ends before")
            out[..., done:done + n] = part if channels == 1 else part.reshape(n, channels).T
            out[..., done:done + n] *= 1 / 32768  # exact, as pcm16_to_float
            done += n
    return out


def _decode(source: Source, emit, *, max_seconds: float | None, max_bytes: int | None, name: str | None,
            mono: bool) -> tuple[int, ...]:
    """The decoding core: `emit(chunk)` with the int16 samples, about a second at a time ([n], or
    [channels, n] with `mono=False`); returns the shape of them all."""
    data, name = _prepare(source, name, max_bytes)
    with _open_audio(data, name) as (container, stream):
        declared = _declared_duration(container, stream)
        if max_seconds is not None and declared is not None and declared > max_seconds + LIMIT_SLACK_S:
            raise AudioTooLarge(name, f"{declared:.1f} s, longer than the {max_seconds:g} s limit", "seconds")
        if not mono and stream.codec_context.channels > MAX_SEPARATE_CHANNELS:
            raise AudioDecodeError(name, f"{stream.codec_context.channels} channels, more than the "
                                         f"{MAX_SEPARATE_CHANNELS} transcribed separately")
        converter = _MonoConverter(emit, keep_channels=not mono)
        decoded_s = 0.0
        position_s = 0.0
        good = bad = 0
        first_error: str | None = None
        try:
            for packet in container.demux(stream):
                if packet.pts is not None and packet.time_base is not None:
                    position_s = float(packet.pts * packet.time_base)
                try:
                    frames = packet.decode()
                except av.error.InvalidDataError as e:
                    # A damaged packet (a truncated last frame, flipped bits) is skipped, as the ffmpeg
                    # CLI and faster-whisper skip it; its time is kept as silence so that later
                    # timestamps stay where the speech is.
                    bad += 1
                    first_error = first_error or f"corrupt data at {position_s:.1f} s ({_plain(e)})"
                    converter.skip(_packet_seconds(packet))
                    continue
                good += 1
                for frame in frames:
                    decoded_s += frame.samples / frame.sample_rate
                    converter.add(frame)
                if max_seconds is not None and decoded_s > max_seconds + LIMIT_SLACK_S:
                    raise AudioTooLarge(name, f"longer than the {max_seconds:g} s limit", "seconds")
            if bad > good:
                raise AudioDecodeError(name, f"{first_error}; {bad} of {good + bad} packets are damaged")
            converter.finish()
        except (AudioDecodeError, SpoolError):
            raise
        except (av.error.FFmpegError, ValueError, OSError, EOFError) as e:
            raise AudioDecodeError(name, f"corrupt data at {position_s:.1f} s ({_plain(e)})") from None
    if converter.samples == 0:
        raise AudioDecodeError(name, first_error or "no audio data (truncated or corrupt)")
    return (converter.samples,) if mono else (converter.channels, converter.samples)


def _packet_seconds(packet: av.Packet) -> float:
    """How long a packet plays, 0 when the container does not say."""
    if packet.duration and packet.time_base is not None:
        return float(packet.duration * packet.time_base)
    return 0.0


def pcm16_to_float(pcm: np.ndarray) -> np.ndarray:
    """int16 samples to float32 in [-1, 1) (x / 32768, exact), with one array allocated."""
    samples = pcm.astype(np.float32)
    samples *= 1 / 32768
    return samples


def pcm_to_float(data: bytes, encoding: str = "pcm_s16le") -> np.ndarray:
    """Little-endian PCM (`pcm_s16le`, `pcm_f32le`) or G.711 (`mulaw`, `alaw`) to float32 in
    [-1, 1], interleaved as given."""
    dtype = pcm_dtype(encoding)
    if len(data) % dtype.itemsize:
        raise ValueError(f"{len(data)} bytes of {encoding} is not a whole number of {dtype.itemsize}-byte samples")
    if encoding in g711.ENCODINGS:
        return g711.decode(data, encoding)
    samples = np.frombuffer(data, dtype=dtype)
    if dtype.kind == "i":
        return pcm16_to_float(samples)
    return samples.astype(np.float32)


class StreamResampler:
    """Live PCM chunks of one stream to 16 kHz mono float32, with resampler state across chunks.

    Chunks are interleaved little-endian PCM (or G.711) at `rate` Hz with `channels` channels; a chunk may
    end anywhere, even inside a sample (the rest waits for the next chunk). Channels are
    averaged (raw PCM carries no channel layout to mix by), then resampled with libswresample.
    """

    def __init__(self, rate: int, channels: int = 1, encoding: str = "pcm_s16le") -> None:
        if not _MIN_RATE <= rate <= _MAX_RATE:
            raise ValueError(f"sample rate {rate} Hz is outside {_MIN_RATE}..{_MAX_RATE} Hz")
        if not 1 <= channels <= _MAX_CHANNELS:
            raise ValueError(f"{channels} channels is outside 1..{_MAX_CHANNELS}")
        self.rate = rate
        self.channels = channels
        self.encoding = encoding
        self._frame_bytes = pcm_dtype(encoding).itemsize * channels
        self._pending = b""  # bytes of an incomplete sample frame at the end of the last chunk
        # Made at the first chunk and dropped at flush()/close(): a new stream starts afresh.
        self._resampler: av.AudioResampler | None = None
        self._pts = 0  # input samples pushed so far, the timestamp of the next frame

    def push(self, data: bytes) -> np.ndarray:
        """Convert the next chunk; returns the 16 kHz samples ready so far (may be empty)."""
        data = self._pending + data
        whole = len(data) - len(data) % self._frame_bytes
        self._pending = data[whole:]
        samples = pcm_to_float(data[:whole], self.encoding)
        mono = samples.reshape(-1, self.channels).mean(axis=1, dtype=np.float32) if self.channels > 1 else samples
        if self.rate == SAMPLE_RATE or mono.size == 0:
            return mono
        if self._resampler is None:
            self._resampler = self._new_resampler()
        frame = av.AudioFrame.from_ndarray(mono[None, :], format="flt", layout="mono")
        frame.sample_rate = self.rate
        frame.time_base = Fraction(1, self.rate)
        frame.pts = self._pts
        self._pts += mono.size
        return _frames_to_array(self._resampler.resample(frame), np.float32)

    def flush(self) -> np.ndarray:
        """End the stream: return the resampler's last samples and reset for a new stream.

        An incomplete sample left at the end is dropped.
        """
        tail = (np.zeros(0, np.float32) if self._resampler is None
                else _frames_to_array(self._resampler.resample(None), np.float32))
        self.close()
        return tail

    def close(self) -> None:
        """Free the resampler (and its threads) now; the next chunk starts a new stream."""
        self._pending = b""
        self._resampler = None
        self._pts = 0

    def _new_resampler(self) -> av.AudioResampler | None:
        if self.rate == SAMPLE_RATE:
            return None
        return audio_resampler(format="flt", layout="mono", rate=SAMPLE_RATE)


def audio_resampler(**options) -> av.AudioResampler:
    """`av.AudioResampler(**options)` on the caller's thread. A filter graph's default is a thread
    per core, alive until the cyclic garbage collector frees the graph (PyAV 18.1: a graph and its
    filters hold each other), so every live stream kept a core's worth of threads after it ended;
    resampling one stream's chunk is microseconds of work."""
    return av.AudioResampler(threads=1, **options)


def write_wav(path: str | os.PathLike, audio: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """Write float audio in [-1, 1], shape [N] or [N, channels], as 16-bit PCM WAV."""
    audio = np.asarray(audio, dtype=np.float32)
    channels = 1 if audio.ndim == 1 else audio.shape[1]
    # The inverse of pcm_to_float (x / 32768), so that write then decode gives back the samples.
    pcm = np.clip((audio * 32768.0).round(), -32768, 32767).astype("<i2")
    with wave.open(os.fspath(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm.tobytes())


class _MonoConverter:
    """Decoded frames of any format, layout and rate -> int16 16 kHz mono chunks, handed to `emit`.

    Frames wait in a FIFO until about `BATCH_SECONDS` are there, then go through the resampler
    together. A change of format mid-stream (chained Ogg, a new layout) flushes the old
    resampler and starts a new one. With `keep_channels`, channels are not mixed: chunks are
    [channels, n] (a change of channel count mid-stream is refused).
    """

    def __init__(self, emit: Callable[[np.ndarray], None], keep_channels: bool = False) -> None:
        self._emit = emit
        self._keep = keep_channels
        self.samples = 0
        """Samples (per channel) emitted so far."""
        self.channels: int | None = None
        """With `keep_channels`: the channels of the chunks emitted."""
        self._key: tuple[str, str, int] | None = None
        self._fifo: av.AudioFifo | None = None
        self._resampler: av.AudioResampler | None = None
        self._channels: int | None = None  # channels of the resampler's output where not mono
        self._mix = False

    def _convert(self, frame: av.AudioFrame | None) -> np.ndarray:
        samples = _frames_to_array(self._resampler.resample(frame), np.int16, self._channels)
        if self._mix:  # back on the 16-bit grid: within half a step of the exact mean
            return np.round(samples.mean(axis=0)).astype(np.int16)
        return samples

    def add(self, frame: av.AudioFrame) -> None:
        key = (frame.format.name, frame.layout.name, frame.sample_rate)
        if key != self._key:
            self._drain()
            self._key = key
            self._fifo = av.AudioFifo()
            # 16-bit output makes libswresample normalise its mixdown (stereo: (L + R) / 2; float
            # output would give 0.707 * (L + R), which clips) and matches `ffmpeg -ac 1 -f s16le`,
            # which openai-whisper's load_audio uses. 16 bits lose nothing a speech model hears.
            # Packed even where channels are kept: PyAV 18 reads planar frames of 8 or more channels
            # past their planes (a segfault of the whole process). libswresample cannot mix a layout of
            # unnamed channels (a WAV of 9 or 17 without a channel mask): those are kept and averaged here.
            n = len(frame.layout.channels)
            self._mix = not self._keep and n > 1 and any(c.name == "NONE" for c in frame.layout.channels)
            self._channels = n if self._keep or self._mix else None
            self._resampler = audio_resampler(format="s16", layout=frame.layout.name if self._channels else "mono",
                                              rate=SAMPLE_RATE)
        frame.pts = None  # the FIFO insists on gapless timestamps; only the samples matter here
        self._fifo.write(frame)
        if self._fifo.samples >= BATCH_SECONDS * frame.sample_rate:
            self._put(self._convert(self._fifo.read()))

    def skip(self, seconds: float) -> None:
        """Silence in place of `seconds` of audio that could not be decoded (at the current rate and
        layout; before the first frame, nothing: the recording then starts at its first good frame)."""
        if self._fifo is None or round(seconds * self._key[2]) <= 0:
            return
        format_, layout, rate = self._key
        silence = av.AudioFrame(format=format_, layout=layout, samples=round(seconds * rate))
        for plane in silence.planes:
            plane.update(bytes(plane.buffer_size))
        silence.sample_rate = rate
        self._fifo.write(silence)

    def finish(self) -> None:
        self._drain()

    def _put(self, chunk: np.ndarray) -> None:
        if chunk.shape[-1] == 0:
            return
        if self._keep:
            if self.channels is not None and chunk.shape[0] != self.channels:
                raise ValueError("the number of channels changes within the file")
            self.channels = chunk.shape[0]
        self.samples += chunk.shape[-1]
        self._emit(chunk)

    def _drain(self) -> None:
        if self._fifo is None:
            return
        if self._fifo.samples:
            self._put(self._convert(self._fifo.read()))
        self._put(self._convert(None))
        self._fifo = self._resampler = self._key = None


def _frames_to_array(frames: list[av.AudioFrame], dtype: type, channels: int | None = None) -> np.ndarray:
    """Packed frames of the format of `dtype` (`flt`: float32, `s16`: int16) -> [N] (mono), or
    [channels, N] of interleaved ones."""
    if not frames:
        return np.zeros(0 if channels is None else (channels, 0), dtype)
    samples = np.concatenate([f.to_ndarray()[0] for f in frames])
    return samples if channels is None else samples.reshape(-1, channels).T


def _prepare(source: Source, name: str | None, max_bytes: int | None) -> tuple[str | BinaryIO, str]:
    """Check the size of `source` and return what `av.open` should read, and the name for errors."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        name = name or "<bytes>"
        content = bytes(source)
        size = len(content)
        data: str | BinaryIO = io.BytesIO(content)
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        name = name or os.path.basename(path) or path
        try:
            if os.path.isdir(path):
                raise AudioDecodeError(name, "is a folder, not a file")
            size = os.path.getsize(path)
        except OSError as e:
            raise AudioDecodeError(name, f"cannot open ({e.strerror or e})") from None
        data = path
    else:
        name = name or os.path.basename(str(getattr(source, "name", "") or "")) or "upload"
        if getattr(source, "seekable", lambda: False)():
            size = source.seek(0, io.SEEK_END)
            source.seek(0)
            data = source
        else:  # PyAV needs to seek in most containers: keep it in memory, but never past the limit
            content = source.read(-1 if max_bytes is None else max_bytes + 1)
            size = len(content)
            data = io.BytesIO(content)
    if size == 0:
        raise AudioDecodeError(name, "empty file")
    if max_bytes is not None and size > max_bytes:
        raise AudioTooLarge(name, f"{_size(size)}, larger than the {_size(max_bytes)} limit", "bytes")
    return data, name


@contextlib.contextmanager
def _open(data: str | BinaryIO, name: str) -> Iterator[av.container.InputContainer]:
    """`av.open` for reading, with its errors turned into `AudioDecodeError`."""
    try:
        container = av.open(data, mode="r", metadata_errors="ignore")
    except av.error.InvalidDataError:
        raise AudioDecodeError(name, "not an audio file (unrecognised or corrupt data)") from None
    except EOFError:  # av.error.EOFError is one too
        raise AudioDecodeError(name, "not an audio file (data ends before any audio; truncated?)") from None
    except (av.error.FFmpegError, ValueError, OSError) as e:
        raise AudioDecodeError(name, f"cannot open ({_plain(e)})") from None
    try:
        yield container
    finally:
        container.close()


@contextlib.contextmanager
def _open_audio(data: str | BinaryIO, name: str) -> Iterator[tuple[av.container.InputContainer,
                                                                    av.audio.stream.AudioStream]]:
    """The container, and the audio stream to decode: ffmpeg's choice (`av_find_best_stream`: the
    default track first, then the most probed frames, the highest bitrate; else the first), unless
    the file has several audio streams and that one is silent (`SOUND_PEAK`) through its first
    `PROBE_S` while another is not: then the first of those (`_stream_with_sound`; a screen
    recording's silent system-audio track before its microphone's). The file is opened again after
    such a probe, so that the chosen stream decodes from a clean start."""
    with _open(data, name) as container:
        stream = _audio_stream(container, name, container.streams.best("audio"))
        if len(container.streams.audio) == 1:
            yield container, stream
            return
        index = _stream_with_sound(container, stream)
    if not isinstance(data, str):
        data.seek(0)
    with _open(data, name) as container:
        yield container, _audio_stream(container, name, container.streams[index])


def _audio_stream(container: av.container.InputContainer, name: str,
                  stream: av.audio.stream.AudioStream | None) -> av.audio.stream.AudioStream:
    if stream is None:
        raise AudioDecodeError(name, "not an audio file (no audio stream)")
    if stream.codec_context is None:
        raise AudioDecodeError(name, "unsupported audio codec (no decoder for it)")
    return stream


def _stream_with_sound(container: av.container.InputContainer, best: av.audio.stream.AudioStream) -> int:
    """The index of the audio stream to decode among several: `best`, unless its first `PROBE_S` are
    silent and another's are not (the first such). Decodes until `best` has sound or every stream
    has `PROBE_S`; a probe that fails decides nothing (`best`)."""
    streams = [s for s in container.streams.audio if s.codec_context is not None]
    peaks = {s.index: 0.0 for s in streams}
    probed = {s.index: 0.0 for s in streams}
    try:
        for packet in container.demux(*streams):
            i = packet.stream.index
            if packet.size == 0 or probed[i] >= PROBE_S:
                continue
            try:
                frames = packet.decode()
            except av.error.FFmpegError:  # a damaged packet: the rest may still be heard
                continue
            for frame in frames:
                probed[i] += frame.samples / frame.sample_rate
                peaks[i] = max(peaks[i], _peak(frame))
            if peaks.get(best.index, 0.0) >= SOUND_PEAK or min(probed.values()) >= PROBE_S:
                break
    except (av.error.FFmpegError, ValueError, OSError, EOFError):
        return best.index
    if peaks.get(best.index, 0.0) >= SOUND_PEAK:
        return best.index
    return next((s.index for s in streams if peaks[s.index] >= SOUND_PEAK), best.index)


_SAMPLE_TYPES = {"u8": np.uint8, "s16": np.int16, "s32": np.int32, "s64": np.int64, "flt": np.float32,
                 "dbl": np.float64}


def _peak(frame: av.AudioFrame) -> float:
    """The largest sample magnitude of a frame, 1 at full scale. Read from its planes: PyAV 18's
    `to_ndarray` reads past the planes of planar frames of 8 or more channels (a segfault)."""
    dtype = np.dtype(_SAMPLE_TYPES[frame.format.name.rstrip("p")])
    count = frame.samples * (1 if frame.format.is_planar else len(frame.layout.channels))
    peak = 0.0
    for plane in frame.planes if count else ():
        x = np.frombuffer(plane, dtype, count=count)
        if dtype.kind == "f":
            peak = max(peak, float(np.abs(x).max()))
        elif dtype.kind == "u":  # u8 is offset by 128
            peak = max(peak, float(np.abs(x.astype(np.int16) - 128).max()) / 128)
        else:
            peak = max(peak, float(np.abs(x.astype(np.int64)).max()) / 2 ** (8 * dtype.itemsize - 1))
    return peak


def _declared_duration(container: av.container.InputContainer, stream: av.audio.stream.AudioStream) -> float | None:
    # The audio stream's own duration first: the container's is its longest track's, and a video
    # whose picture runs on after the sound stops must not be judged by the picture.
    if stream.duration is not None and stream.time_base is not None and stream.duration > 0:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and container.duration > 0:
        return container.duration / av.time_base
    return None


def pcm_dtype(encoding: str) -> np.dtype:
    """The numpy type of one sample of a raw encoding; ValueError for another encoding."""
    if encoding not in PCM_DTYPES:
        raise ValueError(f"PCM encoding {encoding!r} is not one of {', '.join(PCM_DTYPES)}")
    return PCM_DTYPES[encoding]


def _size(n: int) -> str:
    if n >= 2**20:
        return f"{n / 2**20:.4g} MB"
    if n >= 2**10:
        return f"{n / 2**10:.4g} KB"
    return f"{n} bytes"


def _plain(error: Exception) -> str:
    """FFmpeg's own words for an error, without errno and file noise."""
    return getattr(error, "strerror", None) or str(error) or type(error).__name__
