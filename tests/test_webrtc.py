"""WebRTC ingest with an aiortc client on the same machine: Opus audio track in, events on the
data channel `events` out, signalling by `POST /v1/webrtc/offer`.

aioice gathers host candidates on every interface but loopback; both peers here are limited to
127.0.0.1 (the tests bind nothing else), where ICE needs no STUN server.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import aioice.ice
import jiwer
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer
from whisper_normalizer.english import EnglishTextNormalizer

from streamer.audio.decode import decode_audio, write_wav
from streamer.config import load_settings
from streamer.server.app import create_app, running

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
ICE_SERVERS = [{"urls": ["turn:turn.example.org:3478?transport=udp"], "username": "u", "credential": "c"}]

normalize = EnglishTextNormalizer()


@pytest.fixture(scope="module", autouse=True)
def loopback_only():
    original = aioice.ice.get_host_addresses
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]
    yield
    aioice.ice.get_host_addresses = original


@pytest.fixture(scope="module")
def base(engine):
    with running(create_app(load_settings({}), engine)) as url:
        yield url


def post(url: str, body) -> tuple[int, dict, object]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


async def offer(pc: RTCPeerConnection) -> dict:
    await pc.setLocalDescription(await pc.createOffer())
    return {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}


def test_recording_over_webrtc(base, jfk_path, tmp_path):
    wav = tmp_path / "jfk.wav"
    write_wav(wav, decode_audio(jfk_path))

    async def run():
        pc = RTCPeerConnection()
        player = MediaPlayer(str(wav))
        pc.addTrack(player.audio)
        channel = pc.createDataChannel("events", ordered=True)
        events: list[dict] = []
        closed = asyncio.Event()

        @channel.on("message")
        def on_message(message):
            events.append(json.loads(message))
            if events[-1]["type"] == "closed":
                closed.set()

        ended = asyncio.Event()
        player.audio.on("ended", ended.set)
        body = {**await offer(pc), "start": {"language": "en", "vad": {"min_silence_ms": 2000}}}
        status, answer, _ = await asyncio.to_thread(post, base + "/v1/webrtc/offer", body)
        assert status == 200, answer
        assert answer["type"] == "answer" and len(answer["session_id"]) == 16
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        await asyncio.wait_for(ended.wait(), 60)
        await asyncio.sleep(0.3)  # RTP still in flight
        channel.send(json.dumps({"type": "ping", "id": 1}))
        channel.send(json.dumps({"type": "stop"}))
        await asyncio.wait_for(closed.wait(), 120)
        await pc.close()
        return events

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    assert kinds[0] == "ready" and events[0]["model"] == "tiny.en"
    assert {"type": "pong", "id": 1} in events
    assert events[-1] == {"type": "closed", "reason": "stop"}
    assert "speech_started" in kinds and "partial" in kinds and "speech_stopped" in kinds
    finals = [e for e in events if e["type"] == "final"]
    assert finals and all(0 <= f["start"] < f["end"] <= 11.5 for f in finals)
    text = " ".join(f["text"] for f in finals)
    assert jiwer.wer(normalize(JFK), normalize(text)) < 0.15, text


def test_config(engine, monkeypatch):
    with running(create_app(load_settings({"WEBRTC_ICE_SERVERS": json.dumps(ICE_SERVERS)}), engine)) as url:
        with urllib.request.urlopen(url + "/v1/webrtc/config", timeout=30) as response:
            assert json.loads(response.read()) == {"iceServers": ICE_SERVERS}


def test_bad_offers(base):
    async def offers():
        with_channel = RTCPeerConnection()
        with_channel.addTransceiver("audio", direction="sendonly")
        with_channel.createDataChannel("events")
        no_channel = RTCPeerConnection()
        no_channel.addTransceiver("audio", direction="sendonly")
        good, bad = await offer(with_channel), await offer(no_channel)
        await with_channel.close()
        await no_channel.close()
        return good, bad

    good, no_channel = asyncio.run(offers())
    url = base + "/v1/webrtc/offer"
    for body, status, code, param in [
        (b"{nope", 400, "bad_sdp", None),
        ({"type": "answer", "sdp": good["sdp"]}, 400, "bad_sdp", None),
        (no_channel, 400, "bad_sdp", None),
        ({**good, "start": {"language": "xx"}}, 400, "bad_field", "language"),
        ({**good, "start": {"vad": {"min_silence_ms": -1}}}, 400, "bad_field", "vad.min_silence_ms"),
        ({"type": "offer", "sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nm=application\r\n"}, 400, "bad_sdp", None),
    ]:
        got, error, _ = post(url, body)
        assert got == status and error["error"]["code"] == code and error["error"]["param"] == param, (body, error)
    with urllib.request.urlopen(base + "/health", timeout=30) as response:
        assert json.loads(response.read())["sessions"] == 0
