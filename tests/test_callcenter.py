"""Call-center pipelines (issue 16) end to end: a real tiny.en engine, a real server on 127.0.0.1
with an API key, real recordings: G.711 streams and uploads, multichannel files and streams,
Twilio Media Streams, the official `deepgram-sdk` (live and pre-recorded), and session resume.

Audio goes as fast as the protocol allows except where partials are the point (Deepgram's
interim results), which paces at real time.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import time

import av
import httpx
import jiwer
import numpy as np
import pytest
import websockets
from whisper_normalizer.english import EnglishTextNormalizer

from streamer.audio import g711
from streamer.audio.decode import audio_resampler, decode_audio, write_wav
from streamer.client import StreamClient
from streamer.config import load_settings
from streamer.server.app import create_app, running

KEY = "callcenter-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
RATE = 16000

normalize = EnglishTextNormalizer()


def wer(reference: str, hypothesis: str) -> float:
    return jiwer.wer(normalize(reference), normalize(hypothesis))


def s16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def to_8k(audio: np.ndarray) -> np.ndarray:
    """16 kHz -> 8 kHz through libswresample (its low-pass first), as a phone network band-limits."""
    resampler = audio_resampler(format="flt", layout="mono", rate=8000)
    frame = av.AudioFrame.from_ndarray(audio[None, :].astype(np.float32), format="flt", layout="mono")
    frame.sample_rate = RATE
    return np.concatenate([f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)])


def g711_wav(audio8k: np.ndarray, codec: str) -> bytes:
    """A WAV file of G.711 (`pcm_mulaw` / `pcm_alaw`), written by FFmpeg's own encoder."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="wav") as out:
        stream = out.add_stream(codec, rate=8000, layout="mono")
        frame = av.AudioFrame.from_ndarray((np.clip(audio8k, -1, 1) * 32767).astype(np.int16)[None, :],
                                           format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


@pytest.fixture(scope="module")
def base(engine):
    settings = load_settings({}, server={"api_key": KEY, "resume_s": 20.0})
    with running(create_app(settings, engine)) as url:
        yield url


@pytest.fixture(scope="module")
def ws_base(base):
    return base.replace("http://", "ws://")


@pytest.fixture(scope="module")
def jfk(jfk_path) -> np.ndarray:
    return decode_audio(jfk_path)


@pytest.fixture(scope="module")
def prompts(manifest) -> tuple[np.ndarray, str]:
    """Two asterisk prompts with a 1.2-s pause: another speaker, two utterances (~10 s)."""
    names = ("agent-pass.ogg", "agent-incorrect.ogg")
    rows = [next(r for r in manifest if r["audio"].endswith("/" + n)) for n in names]
    gap = np.zeros(int(1.2 * RATE), np.float32)
    audio = np.concatenate([decode_audio(rows[0]["audio"]), gap, decode_audio(rows[1]["audio"])])
    return audio, " ".join(r["text"] for r in rows)


@pytest.fixture(scope="module")
def stereo(jfk, prompts) -> tuple[np.ndarray, list[str]]:
    """A call: JFK on channel 0 (the agent), the prompts from 0.5 s on channel 1 (the caller)."""
    other, text = prompts
    n = max(len(jfk), len(other) + RATE // 2)
    audio = np.zeros((n, 2), np.float32)
    audio[: len(jfk), 0] = jfk
    audio[RATE // 2: RATE // 2 + len(other), 1] = other
    return audio, [JFK, text]


async def native(ws_base: str, audio: bytes, start: dict, frame_bytes: int) -> list[dict]:
    """Every event of a `/v1/stream` session that sends `audio` as fast as it can, then stops."""
    events = []
    async with StreamClient(ws_base, key=KEY, **start) as s:
        for i in range(0, len(audio), frame_bytes):
            await s.send(audio[i:i + frame_bytes])
        await s.stop()
        async for event in s:
            events.append(event)
    return events


def finals_text(events: list[dict], channel: int | None = None) -> str:
    return " ".join(e["text"] for e in events if e["type"] == "final" and e.get("channel") == channel)


# --- G.711 ----------------------------------------------------------------------------------------------

def test_g711_tables_match_the_standard():
    """Decoding is ITU-T G.711's expansion (as Python's audioop, where it still exists, and FFmpeg)."""
    codes = bytes(range(256))
    for encoding, codec in (("mulaw", "pcm_mulaw"), ("alaw", "pcm_alaw")):
        ctx = av.CodecContext.create(codec, "r")
        ctx.sample_rate, ctx.layout = 8000, "mono"
        frames = ctx.decode(av.Packet(codes))
        reference = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
        assert (reference == g711.LINEAR[encoding]).all(), encoding
        x = np.linspace(-0.9, 0.9, 4001, dtype=np.float32)
        back = g711.decode(g711.encode(x, encoding), encoding)
        assert np.abs(back - x).max() < 0.03  # the largest step of either law is 1/32 of full scale


def test_g711_streams_and_uploads(ws_base, base, jfk):
    """JFK as 8-kHz μ-law and A-law: on `/v1/stream` (encoding mulaw/alaw) and as WAV uploads."""
    audio8k = to_8k(jfk)

    async def both_streams():
        return await asyncio.gather(*(
            native(ws_base, g711.encode(audio8k, enc), {"sample_rate": 8000, "encoding": enc, "partials": False},
                   frame_bytes=160 * 5) for enc in ("mulaw", "alaw")))

    mulaw_events, alaw_events = asyncio.run(both_streams())
    for events in (mulaw_events, alaw_events):
        assert events[-1] == {"type": "closed", "reason": "stop"}
        assert wer(JFK, finals_text(events)) < 0.25, finals_text(events)  # 8-kHz μ-law, tiny.en: 18 % measured
    with httpx.Client(base_url=base, headers=AUTH, timeout=120) as http:
        for codec in ("pcm_mulaw", "pcm_alaw"):
            r = http.post("/v1/audio/transcriptions", files={"file": ("call.wav", g711_wav(audio8k, codec))},
                          data={"model": "whisper-1", "response_format": "json"})
            assert r.status_code == 200, r.text
            assert wer(JFK, r.json()["text"]) < 0.25, (codec, r.json())


def test_realtime_pcmu(ws_base, prompts):
    """`/v1/realtime` with `audio/pcmu`: the prompts' two items, transcribed."""
    audio, text = prompts
    data = g711.encode(to_8k(audio), "mulaw") + g711.encode(np.zeros(8000), "mulaw")

    async def run() -> list[str]:
        async with websockets.connect(ws_base + "/v1/realtime?intent=transcription", additional_headers=AUTH) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"format": {"type": "audio/pcmu"}}}}}))
            updated = json.loads(await ws.recv())
            assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcmu"}, updated
            for i in range(0, len(data), 1600):
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(data[i:i + 1600]).decode()}))
            done = []
            while len(done) < 2:
                event = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if event["type"].endswith("transcription.completed"):
                    done.append(event["transcript"])
            return done

    transcripts = asyncio.run(run())
    assert wer(text, " ".join(transcripts)) < 0.2, transcripts


# --- one transcript per channel -------------------------------------------------------------------------

def test_multichannel_upload(base, stereo, tmp_path):
    """A stereo call recording with `multichannel=true`: each channel its own text, segments and
    words tagged, merged in time order; SRT/VTT name the channel as the speaker."""
    audio, texts = stereo
    path = tmp_path / "call.wav"
    write_wav(path, audio)
    with httpx.Client(base_url=base, headers=AUTH, timeout=120) as http:
        r = http.post("/v1/audio/transcriptions", files={"file": ("call.wav", path.read_bytes())},
                      data={"model": "whisper-1", "multichannel": "true", "response_format": "verbose_json",
                            "timestamp_granularities[]": ["segment", "word"]})
        assert r.status_code == 200, r.text
        body = r.json()
        for c, reference in enumerate(texts):
            assert wer(reference, body["channels"][c]["text"]) < 0.2, body["channels"]
            heard = " ".join(s["text"] for s in body["segments"] if s["channel"] == c)
            assert wer(reference, heard) < 0.2
        starts = [s["start"] for s in body["segments"]]
        assert starts == sorted(starts) and {s["channel"] for s in body["segments"]} == {0, 1}
        assert {w["channel"] for w in body["words"]} == {0, 1}


def test_multichannel_upload_with_logprobs(base, stereo, tmp_path):
    """`include[]=logprobs` with `multichannel=true`: the merged transcript's tokens with their log
    probabilities, as without multichannel (they were left out silently)."""
    audio, _ = stereo
    path = tmp_path / "call.wav"
    write_wav(path, audio)
    with httpx.Client(base_url=base, headers=AUTH, timeout=120) as http:
        r = http.post("/v1/audio/transcriptions", files={"file": ("call.wav", path.read_bytes())},
                      data={"model": "whisper-1", "multichannel": "true", "include[]": "logprobs"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["logprobs"] and all(p["logprob"] <= 0 and p["bytes"] for p in body["logprobs"])
    assert "".join(p["token"] for p in body["logprobs"]).split() == body["text"].split()


def test_merged_channels_render_speakers():
    """`merge_channels` orders segments by time across channels; SRT and WebVTT name the channel."""
    from streamer.longform.formats import render
    from streamer.longform.transcript import Transcript, TranscriptSegment, merge_channels

    def seg(start, end, text):
        return TranscriptSegment(id=0, seek=0, start=start, end=end, text=text, tokens=[1], avg_logprob=-0.1,
                                 compression_ratio=1.0, no_speech_prob=0.0, temperature=0.0)

    agent = Transcript(" Hello. How can I help?", "en", 4.0, [seg(0.0, 1.0, " Hello."), seg(2.5, 3.5, " How can I help?")])
    caller = Transcript(" Hi.", "en", 4.0, [seg(1.2, 2.0, " Hi.")])
    merged = merge_channels([agent, caller])
    assert [s.channel for s in merged.segments] == [0, 1, 0] and merged.text == "Hello. Hi. How can I help?"
    assert render(merged, "json")["channels"][1] == {"channel": 1, "text": " Hi."}
    assert "\n[Channel 1] Hi.\n" in render(merged, "srt")
    assert "00:00:01.200 --> 00:00:02.000\n<v Channel 1>Hi.\n" in render(merged, "vtt")


def test_multichannel_stream(ws_base, stereo):
    """`channels: 2, multichannel: true` on `/v1/stream`: a VAD and utterances per channel, each
    event tagged with its channel."""
    audio, texts = stereo
    events = asyncio.run(native(ws_base, s16(audio), {"channels": 2, "multichannel": True, "partials": False},
                                frame_bytes=3200 * 2))
    for c, reference in enumerate(texts):
        assert wer(reference, finals_text(events, c)) < 0.2, finals_text(events, c)
    assert all("channel" in e for e in events if e["type"] in ("speech_started", "speech_stopped", "final"))
    assert len([e for e in events if e["type"] == "final" and e["channel"] == 1]) == 2  # two prompts, two utterances


# --- Twilio Media Streams ---------------------------------------------------------------------------------

def twilio_messages(inbound: bytes, outbound: bytes, stream_sid: str, call_sid: str) -> list[dict]:
    """Twilio's message sequence for a two-track stream: 20-ms μ-law chunks, interleaved by time."""
    messages = [{"event": "connected", "protocol": "Call", "version": "1.0.0"},
                {"event": "start", "sequenceNumber": "1", "streamSid": stream_sid,
                 "start": {"streamSid": stream_sid, "accountSid": "AC" + "0" * 32, "callSid": call_sid,
                           "tracks": ["inbound", "outbound"], "customParameters": {"api_key": KEY, "agent": "7"},
                           "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}]
    chunks = {"inbound": 0, "outbound": 0}
    for i in range(0, max(len(inbound), len(outbound)), 160):
        for track, data in (("inbound", inbound), ("outbound", outbound)):
            if i < len(data):
                chunks[track] += 1
                messages.append({"event": "media", "sequenceNumber": str(len(messages)), "streamSid": stream_sid,
                                 "media": {"track": track, "chunk": str(chunks[track]), "timestamp": str(i // 8),
                                           "payload": base64.b64encode(data[i:i + 160]).decode()}})
    messages.append({"event": "dtmf", "streamSid": stream_sid, "sequenceNumber": str(len(messages)),
                     "dtmf": {"track": "inbound_track", "digit": "5"}})
    messages.append({"event": "bogus", "streamSid": stream_sid})  # answered with an error event; the stream goes on
    messages.append({"event": "stop", "sequenceNumber": str(len(messages)), "streamSid": stream_sid,
                     "stop": {"accountSid": "AC" + "0" * 32, "callSid": call_sid}})
    return messages


def test_twilio_media_stream(ws_base, stereo):
    """A scripted Twilio client streams a call (JFK inbound, the prompts outbound); a pipeline
    subscribed by callSid before the stream starts gets each track's transcript."""
    audio, texts = stereo
    inbound, outbound = (g711.encode(to_8k(audio[:, c]), "mulaw") for c in (0, 1))
    sid, call = "MZ" + "1" * 32, "CA" + "2" * 32
    messages = twilio_messages(inbound, outbound, sid, call)

    async def run() -> list[dict]:
        async with websockets.connect(f"{ws_base}/v1/twilio/events?callSid={call}", additional_headers=AUTH) as sub:
            assert json.loads(await sub.recv()) == {"type": "subscribed", "key": call}
            async with websockets.connect(ws_base + "/v1/twilio") as twilio:
                for m in messages:
                    await twilio.send(json.dumps(m))
                events = [json.loads(m) async for m in sub]
        return events

    events = asyncio.run(run())
    assert events[0]["type"] == "start" and events[0]["streamSid"] == sid
    assert events[0]["customParameters"] == {"agent": "7"}  # the key is not passed on
    assert events[-1] == {"type": "closed", "reason": "stop"}
    assert any(e["type"] == "dtmf" and e["digit"] == "5" for e in events)
    assert any(e["type"] == "error" and e["code"] == "unknown_event" for e in events)
    for c, track in enumerate(("inbound", "outbound")):
        text = finals_text(events, c)
        assert all(e["track"] == track for e in events if e.get("channel") == c)
        assert wer(texts[c], text) < 0.2, (track, text)


# --- Deepgram --------------------------------------------------------------------------------------------

def deepgram_client(base: str):
    from deepgram import DeepgramClient
    from deepgram.environment import DeepgramClientEnvironment

    ws = base.replace("http://", "ws://")
    return DeepgramClient(api_key=KEY, environment=DeepgramClientEnvironment(base=base, production=ws, agent=ws))


def test_deepgram_sdk_live(base, jfk):
    """The official SDK's live client: interim and final `Results` with real word confidences,
    `SpeechStarted`, `UtteranceEnd`, `Finalize` and `CloseStream` (then `Metadata`). Paced at real
    time, as a live client sends, with 2 s of endpointing."""
    from deepgram.extensions.types.sockets import ListenV1ControlMessage

    audio = s16(jfk)
    received: list = []
    with deepgram_client(base).listen.v1.connect(
            model="nova-3", encoding="linear16", sample_rate="16000", interim_results="true", punctuate="true",
            smart_format="true", vad_events="true", utterance_end_ms="1000", endpointing="2000") as conn:
        reader = threading.Thread(target=lambda: received.extend(conn), daemon=True)
        reader.start()
        chunk = 3200  # 100 ms
        last_second = len(audio) - 2 * RATE
        for i in range(0, len(audio), chunk):
            if i >= last_second:
                # Hold the utterance open (no audio: no silence either) until an interim result
                # is back: a partial decode is seconds on a loaded 2-core CPU.
                for _ in range(600):
                    if any(m.type == "Results" and not m.is_final for m in received):
                        break
                    time.sleep(0.1)
                last_second = len(audio)
            conn.send_media(audio[i:i + chunk])
            time.sleep(0.1)
        conn.send_control(ListenV1ControlMessage(type="KeepAlive"))
        conn.send_control(ListenV1ControlMessage(type="Finalize"))
        conn.send_control(ListenV1ControlMessage(type="CloseStream"))
        reader.join(120)
    kinds = [m.type for m in received]
    results = [m for m in received if m.type == "Results"]
    interim = [r for r in results if not r.is_final]
    final = [r for r in results if r.is_final and r.channel.alternatives[0].transcript]
    assert interim, kinds
    assert "SpeechStarted" in kinds and "UtteranceEnd" in kinds and kinds[-1] == "Metadata", kinds
    assert wer(JFK, " ".join(r.channel.alternatives[0].transcript for r in final)) < 0.15
    words = [w for r in final for w in r.channel.alternatives[0].words]
    confidences = {w.confidence for w in words}
    assert len(confidences) > 3 and all(0.0 < c <= 1.0 for c in confidences)
    assert all(w.start < w.end and w.punctuated_word for w in words)


def test_deepgram_sdk_prerecorded(base, stereo, tmp_path):
    """The SDK's pre-recorded client: a recording in the body, Deepgram's response shape; with
    `multichannel`, one channel of results per channel of the call."""
    audio, texts = stereo
    path = tmp_path / "call.wav"
    write_wav(path, audio)
    client = deepgram_client(base)
    response = client.listen.v1.media.transcribe_file(request=path.read_bytes(), model="nova-3",
                                                       smart_format=True, multichannel=True)
    channels = response.results.channels
    assert len(channels) == 2 and response.metadata.channels == 2
    for c, reference in enumerate(texts):
        alternative = channels[c].alternatives[0]
        assert wer(reference, alternative.transcript) < 0.2, alternative.transcript
        assert alternative.words and len({w.confidence for w in alternative.words}) > 1
    r = httpx.post(base + "/v1/listen?encoding=bogus", content=b"\0" * 100, headers={"Authorization": f"Token {KEY}"})
    assert r.status_code == 400 and r.json()["err_code"] == "INVALID_QUERY_PARAMETER"


def test_the_duration_limit_holds_for_raw_prerecorded_audio(engine, jfk):
    """`MAX_AUDIO_S` bounds headerless audio too: a raw body (`encoding=`) went past it (a 200-MB
    μ-law body is 7 hours at 8 kHz, past the default 4-hour limit), while the same audio in a
    container got its 413 (QA session 31)."""
    settings = load_settings({}, server={"max_audio_s": 5.0})
    with running(create_app(settings, engine)) as url:
        for query, body in (("encoding=linear16&sample_rate=16000", s16(jfk)),
                            ("encoding=mulaw&sample_rate=8000", g711.encode(to_8k(jfk), "mulaw")),
                            ("encoding=linear16&sample_rate=16000&channels=2&multichannel=true",
                             s16(np.repeat(jfk[:, None], 2, axis=1)))):
            r = httpx.post(url + "/v1/listen?" + query, content=body, timeout=120)
            assert r.status_code == 413 and r.json()["err_code"] == "PAYLOAD_TOO_LARGE", (query, r.status_code, r.text)
            assert "5 s" in r.json()["err_msg"], r.text
        r = httpx.post(url + "/v1/listen?encoding=linear16&sample_rate=16000", content=s16(jfk[: 4 * RATE]), timeout=120)
        assert r.status_code == 200 and r.json()["metadata"]["duration"] == pytest.approx(4.0, abs=0.01), r.text


def test_prerecorded_audio_counts_against_the_upload_budget(engine, jfk):
    """`POST /v1/listen` holds its decoded audio through the transcription as the file endpoints do,
    and shares their UPLOAD_AUDIO_BUDGET_S: two channels of 6 s kept apart are 12 s, over a 10-s
    budget (Deepgram's 413 shape); one channel of them is served, and gives its seconds back."""
    settings = load_settings({}, server={"max_audio_s": 10.0, "upload_audio_budget_s": 10.0})
    two = s16(np.repeat(jfk[: 6 * RATE, None], 2, axis=1))
    with running(create_app(settings, engine)) as url:
        r = httpx.post(url + "/v1/listen?encoding=linear16&sample_rate=16000&channels=2&multichannel=true",
                       content=two, timeout=120)
        assert r.status_code == 413 and r.json()["err_code"] == "PAYLOAD_TOO_LARGE", r.text
        assert "12 s of audio (all channels), more than the 10 s" in r.json()["err_msg"], r.text
        r = httpx.post(url + "/v1/listen?encoding=linear16&sample_rate=16000&channels=2", content=two, timeout=120)
        assert r.status_code == 200 and r.json()["metadata"]["duration"] == pytest.approx(6.0, abs=0.01), r.text
        assert "streamer_upload_audio_seconds 0.0" in httpx.get(url + "/metrics", timeout=30).text


def test_raw_pcm_of_two_channels_is_one_channel_unless_multichannel(base, jfk):
    """Headerless linear16 with `channels=2`: the channels' mean without `multichannel` (as a WAV of two
    channels is), one transcript per channel with it."""
    pcm = (np.repeat(jfk[:, None], 2, axis=1) * 32767).astype("<i2").tobytes()  # interleaved L R
    for multichannel, n in (("false", 1), ("true", 2)):
        r = httpx.post(base + f"/v1/listen?encoding=linear16&sample_rate=16000&channels=2&multichannel={multichannel}",
                       content=pcm, headers={"Authorization": f"Token {KEY}"}, timeout=120)
        assert r.status_code == 200, r.text
        channels = r.json()["results"]["channels"]
        assert len(channels) == n, multichannel
        assert all("country" in c["alternatives"][0]["transcript"].lower() for c in channels)


def test_deepgram_errors_in_its_shape(base):
    """A bad query parameter: `Error`, close 1008. An unknown control message: `Error`, and the
    stream goes on to `CloseStream` and `Metadata`."""
    ws_base = base.replace("http://", "ws://")
    token = {"Authorization": f"Token {KEY}"}

    async def run():
        async with websockets.connect(ws_base + "/v1/listen?encoding=opus", additional_headers=token) as ws:
            error = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert error["type"] == "Error" and ws.close_code == 1008, error
        async with websockets.connect(ws_base + "/v1/listen?encoding=mulaw&sample_rate=8000",
                                      additional_headers=token) as ws:
            await ws.send(g711.encode(np.zeros(1600), "mulaw"))
            await ws.send(json.dumps({"type": "Bogus"}))
            assert json.loads(await ws.recv())["variant"] == "INVALID_MESSAGE"
            await ws.send(json.dumps({"type": "CloseStream"}))
            metadata = json.loads(await ws.recv())
            assert metadata["type"] == "Metadata" and metadata["duration"] == pytest.approx(0.2, abs=0.01)

    asyncio.run(run())
    # The pre-recorded POST answers in Deepgram's shape and counts in `streamer_errors_total`.
    r = httpx.post(base + "/v1/listen", content=b"not audio at all", headers=token, timeout=60)
    assert r.status_code == 400 and r.json()["err_code"] == "UNSUPPORTED_MEDIA", r.text
    metrics = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text
    assert 'streamer_errors_total{code="UNSUPPORTED_MEDIA"} 1.0' in metrics


def test_a_finalize_after_the_vad_ended_the_utterance_answers_after_its_final(ws_base, jfk):
    """`Finalize` when the VAD has already ended the utterance but its final is still decoding:
    the empty `from_finalize` answer ("finalization complete", Deepgram) comes after that final,
    not before it (it came first, at a later `start`: a push-to-talk client that waits for
    `from_finalize` took the turn as silent; QA session 30)."""
    audio = s16(np.concatenate([jfk[: int(3.2 * RATE)], np.zeros(RATE, np.float32)]))  # "And so my fellow Americans"

    async def run() -> list[dict]:
        async with websockets.connect(ws_base + "/v1/listen?encoding=linear16&sample_rate=16000",
                                      additional_headers={"Authorization": f"Token {KEY}"}) as ws:
            await ws.send(audio)
            await ws.send(json.dumps({"type": "Finalize"}))
            await ws.send(json.dumps({"type": "CloseStream"}))
            return [json.loads(m) async for m in ws]

    results = [m for m in asyncio.run(run()) if m["type"] == "Results"]
    texts = [r["channel"]["alternatives"][0]["transcript"] for r in results]
    assert len(results) == 2 and wer("And so my fellow Americans", texts[0]) < 0.3 and texts[1] == "", results
    assert results[1]["from_finalize"] and results[0]["start"] <= results[1]["start"]


def test_an_empty_binary_message_closes_a_deepgram_stream(ws_base, jfk):
    """Deepgram's older way to end a stream, still honoured there and sent by older clients: a
    zero-length binary message works as `CloseStream` (finals, `Metadata`, close 1000). It was
    taken as no audio, and the client waited for the idle timeout (60 s; QA session 30)."""
    audio = s16(np.concatenate([jfk[: int(3.2 * RATE)], np.zeros(RATE // 2, np.float32)]))

    async def run() -> tuple[list[dict], int]:
        async with websockets.connect(ws_base + "/v1/listen?encoding=linear16&sample_rate=16000",
                                      additional_headers={"Authorization": f"Token {KEY}"}) as ws:
            await ws.send(audio)
            await ws.send(b"")
            messages = await asyncio.wait_for(asyncio.ensure_future(_all(ws)), 40)
            return messages, ws.close_code

    async def _all(ws) -> list[dict]:
        return [json.loads(m) async for m in ws]

    messages, code = asyncio.run(run())
    assert [m["type"] for m in messages] == ["Results", "Metadata"] and code == 1000, messages
    assert wer("And so my fellow Americans", messages[0]["channel"]["alternatives"][0]["transcript"]) < 0.3
    assert messages[1]["duration"] == pytest.approx(3.7)


def test_finalize_of_one_channel_leaves_the_others_open(ws_base, stereo):
    """Deepgram's `{"type": "Finalize", "channel": 1}` finalises channel 1 alone: the agent on
    channel 0, mid-sentence, is not cut (every channel was finalised; QA session 30)."""
    audio, texts = stereo
    pcm = s16(audio)
    at = 2 * int(2.0 * RATE) * 2  # 2.0 s of both channels: JFK (channel 0) is mid "Americans"

    async def run() -> list[dict]:
        async with websockets.connect(ws_base + "/v1/listen?encoding=linear16&sample_rate=16000&channels=2"
                                      "&multichannel=true", additional_headers={"Authorization": f"Token {KEY}"}) as ws:
            await ws.send(pcm[:at])
            await ws.send(json.dumps({"type": "Finalize", "channel": 1}))
            await ws.send(pcm[at:])
            await ws.send(json.dumps({"type": "CloseStream"}))
            return [json.loads(m) async for m in ws]

    results = [m for m in asyncio.run(run()) if m["type"] == "Results"]
    by_channel = {c: [r for r in results if r["channel_index"] == [c, 2]] for c in (0, 1)}
    assert not any(r["from_finalize"] for r in by_channel[0]), by_channel[0]
    assert any(r["from_finalize"] for r in by_channel[1]), by_channel[1]
    jfk = " ".join(r["channel"]["alternatives"][0]["transcript"] for r in by_channel[0])
    assert wer(texts[0], jfk) < 0.2, jfk


def test_a_fast_deepgram_sender_is_held_to_the_backlog_bound(ws_base, manifest):
    """A `/v1/listen` client sending a recording as fast as it can (as Deepgram's own examples stream
    files) is not read more than `MAX_BACKLOG_S` (10 s) past its oldest undelivered final, as on
    `/v1/stream`: the server had read all 120 s at once (QA session 30), holding the audio of every
    utterance queued behind the first final. Lower bound from the messages: the latest
    `SpeechStarted` against the end of the latest final `Results` (its utterance is at most the
    VAD's 28 s)."""
    row = next(r for r in manifest if r["audio"].endswith("long/asterisk_en_6min.ogg"))
    audio = s16(decode_audio(row["audio"])[: 120 * RATE])

    async def run() -> list[dict]:
        messages = []
        async with websockets.connect(ws_base + "/v1/listen?encoding=linear16&sample_rate=16000&vad_events=true",
                                      additional_headers={"Authorization": f"Token {KEY}"}, ping_interval=None) as ws:
            async def read():
                async for message in ws:
                    messages.append(json.loads(message))

            reader = asyncio.ensure_future(read())
            for i in range(0, len(audio), 3200):
                await ws.send(audio[i:i + 3200])
            await ws.send(json.dumps({"type": "CloseStream"}))
            await asyncio.wait_for(reader, 300)
        return messages

    messages = asyncio.run(run())
    heard, delivered, worst = 0.0, 0.0, 0.0
    for m in messages:
        if m["type"] == "SpeechStarted":
            heard = max(heard, m["timestamp"])
        elif m["type"] == "Results" and m["is_final"]:
            delivered = max(delivered, m["start"] + m["duration"])
        worst = max(worst, heard - delivered)
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    assert messages[-1]["type"] == "Metadata" and len(finals) >= 4, messages[-3:]
    assert worst <= 10.0 + 28.0 + 1.0, worst


def test_audio_keeps_deepgram_and_twilio_streams_past_the_first_audio_timeout(engine):
    """`first_audio_timeout_s` ends a connection that sends no audio; Deepgram's and Twilio's
    streams that do send it, paced over three times that timeout, run to their own end."""
    settings = load_settings({}, server={"api_key": KEY, "first_audio_timeout_s": 0.5})
    silence = g711.encode(np.zeros(800), "mulaw")  # 0.1 s at 8 kHz
    sid = "MZ" + "4" * 32

    async def run(ws_base: str) -> tuple[dict, list[dict]]:
        token = {"Authorization": f"Token {KEY}"}
        async with websockets.connect(ws_base + "/v1/listen?encoding=mulaw&sample_rate=8000",
                                      additional_headers=token) as ws:
            for _ in range(15):
                await ws.send(silence)
                await asyncio.sleep(0.1)
            await ws.send(json.dumps({"type": "CloseStream"}))
            metadata = json.loads(await ws.recv())
        async with websockets.connect(f"{ws_base}/v1/twilio/events?streamSid={sid}", additional_headers=AUTH) as sub:
            await sub.recv()  # subscribed
            async with websockets.connect(ws_base + "/v1/twilio") as twilio:
                messages = twilio_messages(silence * 15, b"", sid, "CA" + "5" * 32)
                for m in messages:
                    await twilio.send(json.dumps(m))
                    if m["event"] == "media" and m["media"]["chunk"].endswith("0"):  # 0.2 s of audio
                        await asyncio.sleep(0.2)
                events = [json.loads(m) async for m in sub]
        return metadata, events

    with running(create_app(settings, engine)) as url:
        metadata, events = asyncio.run(run(url.replace("http://", "ws://")))
    assert metadata["type"] == "Metadata" and metadata["duration"] == pytest.approx(1.5), metadata
    assert events[-1] == {"type": "closed", "reason": "stop"}, events[-3:]
    assert any(e["type"] == "dtmf" and e["t"] == pytest.approx(1.5) for e in events), events


# --- session resume --------------------------------------------------------------------------------------

def test_resume_after_cut_connections(ws_base, prompts):
    """The TCP connection is cut mid-utterance and again between utterances; the client resumes
    each time and gets exactly the finals of an uninterrupted run, none lost, none twice."""
    audio, _ = prompts
    data = s16(audio)
    cut_mid = int(1.5 * RATE) * 2  # inside the first prompt
    cut_between = int(3.3 * RATE + 0.7 * RATE) * 2  # in the pause between the prompts
    start = {"partials": False}

    async def run(cuts: list[int]) -> tuple[list[dict], int]:
        events = []
        async with StreamClient(ws_base, key=KEY, **start) as s:
            pending = sorted(cuts)
            for i in range(0, len(data), 1600):
                if pending and i >= pending[0]:
                    pending.pop(0)
                    s.drop()  # what is still in the socket's buffers is lost: the resume sends it again
                await s.send(data[i:i + 1600])
            await s.stop()
            async for event in s:
                events.append(event)
            return events, s.resumes

    async def both():  # side by side: the engine batches their windows
        return await asyncio.gather(run([]), run([cut_mid, cut_between]))

    (plain, _), (cut, resumes) = asyncio.run(both())
    assert resumes == 2
    assert [e["text"] for e in cut if e["type"] == "final"] == [e["text"] for e in plain if e["type"] == "final"]
    ids = [e["event_id"] for e in cut if "event_id" in e]
    assert ids == sorted(set(ids)) and ids == list(range(1, len(ids) + 1))
    assert len([e for e in plain if e["type"] == "final"]) == 2


def test_resume_store_binds_tokens_to_key_and_time():
    """Sans-I/O: a token resumes only with the key that opened the session, on its worker, and
    not after `resume_s`."""
    from streamer.server.resume import ResumeError, ResumeStore

    async def run():
        store = ResumeStore(worker=3, resume_s=0.05)
        token = store.register("live", "key-a")
        assert token.startswith("3.")
        with pytest.raises(ResumeError, match="belongs to another API key"):
            store.claim(token, "key-b")
        assert store.claim(token, "key-a") == "live"
        expired = []
        store.park(token, lambda: expired.append(True))
        await asyncio.sleep(0.1)
        assert expired == [True]
        with pytest.raises(ResumeError, match="unknown or expired resume token"):
            store.claim(token, "key-a")
        with pytest.raises(ResumeError) as e:
            store.claim("5." + token[2:], "key-a")
        assert e.value.worker == 5
        # bounded: past max_parked the longest parked expires early
        small = ResumeStore(resume_s=60, max_parked=2, max_per_client=2)
        gone = []
        tokens = [small.register(i, None, client=f"10.0.0.{i}") for i in range(3)]
        for i, t in enumerate(tokens):
            small.park(t, lambda i=i: gone.append(i))
        assert gone == [0] and small.parked() == 2
        assert small.claim(tokens[2], None) == 2 and small.parked() == 1

    asyncio.run(run())


def test_parked_sessions_are_bounded_per_client(engine, prompts):
    """A client that drops its connections on purpose cannot park more sessions than its connection
    limit: past it the longest parked one expires early (its token no longer resumes), the newest
    still resume (session 27's QA: 300 parked sessions took 1.7 GB)."""
    audio, _ = prompts
    settings = load_settings({}, server={"resume_s": 60.0, "max_connections_per_client": 2})

    async def park(url: str) -> str:
        ws = await websockets.connect(url + "/v1/stream")
        await ws.send(json.dumps({"type": "start", "partials": False}))
        token = json.loads(await ws.recv())["resume_token"]
        await ws.send(s16(audio[: RATE]))
        await ws.send(json.dumps({"type": "ping"}))
        while json.loads(await ws.recv())["type"] != "pong":
            pass
        ws.transport.abort()  # no close handshake: the session is parked
        await asyncio.sleep(0.3)
        return token

    async def resume(url: str, token: str) -> dict:
        async with websockets.connect(url + "/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start", "resume": {"token": token, "bytes_sent": 2 * RATE}}))
            return json.loads(await ws.recv())

    async def run(url: str):
        tokens = [await park(url) for _ in range(4)]
        return [await resume(url, t) for t in tokens]

    app = create_app(settings, engine)
    with running(app) as url:
        answers = asyncio.run(run(url.replace("http://", "ws://")))
        for _ in range(50):  # the server sees the last close a moment later
            if (parked := app.state.streamer.resume.parked()) == 2:
                break
            time.sleep(0.1)
    assert [a["type"] for a in answers] == ["error", "error", "ready", "ready"], answers
    assert all(a["resumed"] for a in answers[2:]), answers
    assert all(a["code"] == "resume_failed" and "expired" in a["message"] for a in answers[:2]), answers
    assert parked == 2  # the two resumed, parked again when those connections closed without `stop`


def test_resume_refusals(ws_base, prompts):
    """Over the wire: a tampered token, or one of another worker, is `resume_failed` (the latter
    naming the worker) and the socket stays usable."""
    async def run():
        async with StreamClient(ws_base, key=KEY) as s:
            token = s.ready["resume_token"]
            assert token.startswith("0.")
            async with websockets.connect(ws_base + "/v1/stream?api_key=" + KEY) as ws:
                for bad in (token[:-2] + "xx", "7." + token[2:]):
                    await ws.send(json.dumps({"type": "start", "resume": {"token": bad, "bytes_sent": 0,
                                                                           "last_event_id": 0}}))
                    error = json.loads(await ws.recv())
                    assert error["code"] == "resume_failed", error
                assert error["worker"] == 7
            await s.stop()
            return [e async for e in s]

    assert asyncio.run(run())[-1] == {"type": "closed", "reason": "stop"}


def test_a_resume_from_events_no_longer_kept_fails_and_the_session_still_expires(engine, jfk):
    """With `RESUME_EVENTS` 2, a resume from a kept event works, and one from event 0 is
    `resume_failed`; the session is then parked again (claimed and left, it was held for ever), so
    once nobody comes back it expires after `RESUME_S`."""
    settings = load_settings({}, server={"resume_s": 1.5, "resume_events": 2})
    app = create_app(settings, engine)
    store = app.state.streamer.resume

    async def run(url: str) -> tuple[dict, dict]:
        async with websockets.connect(url + "/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start", "partials": False}))
            ready = json.loads(await ws.recv())
            data = s16(jfk) + s16(np.zeros(RATE, np.float32))
            for i in range(0, len(data), RATE):  # half-second frames
                await ws.send(data[i:i + RATE])
            events = []
            while not any(e["type"] == "final" for e in events):
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
        last = events[-1]["event_id"]  # closed without `stop`: parked for a resume
        resume = {"token": ready["resume_token"], "bytes_sent": len(s16(jfk)) + 2 * RATE}
        async with websockets.connect(url + "/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start", "resume": {**resume, "last_event_id": last}}))
            resumed = json.loads(await ws.recv())
        async with websockets.connect(url + "/v1/stream") as ws:
            await ws.send(json.dumps({"type": "start", "resume": {**resume, "last_event_id": 0}}))
            failed = json.loads(await ws.recv())
        return failed, resumed

    with running(app) as url:
        failed, resumed = asyncio.run(run(url.replace("http://", "ws://")))
        assert failed["code"] == "resume_failed" and "no longer kept" in failed["message"], failed
        assert resumed["type"] == "ready", resumed
        give_up = time.monotonic() + 10
        while store._entries:  # parked again after the failed resume: gone after resume_s
            assert time.monotonic() < give_up, "the session never expired"
            time.sleep(0.1)
