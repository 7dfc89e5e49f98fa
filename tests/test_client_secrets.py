"""Realtime client secrets (`POST /v1/realtime/client_secrets`, `server/client_secrets.py`) with the
official `openai` SDK: a backend holding the API key mints a secret with a session configuration;
an app opens `/v1/realtime` with the secret alone and gets that session; the secret opens nothing
else, and a forged or expired one opens nothing."""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest
import websockets
from openai import AsyncOpenAI

from streamer.audio.decode import decode_audio
from streamer.config import load_settings
from streamer.server import client_secrets
from streamer.server.app import create_app, running
from test_realtime import check_items, collect, pcm24k, send_paced, silence

KEY = "sk-backend-only"
SESSION = {"type": "transcription", "include": ["item.input_audio_transcription.logprobs"], "audio": {"input": {
    "transcription": {"prompt": "AND SO MY FELLOW AMERICANS"},
    "turn_detection": {"type": "server_vad", "silence_duration_ms": 2000}}}}


@pytest.fixture(scope="module")
def base(engine):
    with running(create_app(load_settings({}, server={"api_key": KEY}), engine)) as url:
        yield url


def backend(base: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=KEY, base_url=base + "/v1", max_retries=0)


def app_client(base: str, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=base + "/v1", websocket_base_url=base.replace("http", "ws") + "/v1",
                       max_retries=0)


def test_a_secret_opens_a_session_configured_by_the_backend(base, jfk_path):
    secret = backend(base).realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 120}, session=SESSION)
    assert secret.value.startswith("ek_") and 110 <= secret.expires_at - time.time() <= 121
    assert secret.session.type == "transcription" and secret.session.audio.input.transcription.prompt == SESSION[
        "audio"]["input"]["transcription"]["prompt"]
    pcm = pcm24k(decode_audio(jfk_path)) + silence(2.5)

    async def run():
        async with app_client(base, secret.value).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            created = (await connection.recv()).to_dict()
            sender = asyncio.ensure_future(send_paced(lambda a: connection.input_audio_buffer.append(audio=a), pcm))
            return created, await asyncio.wait_for(collect(connection, sender), 120)

    created, events = asyncio.run(run())
    session = created["session"]
    assert created["type"] == "session.created" and session["include"] == SESSION["include"]
    assert session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 2000
    (transcript,) = check_items(events)
    assert "ASK NOT WHAT YOUR COUNTRY" in transcript  # the secret's prompt, all in capitals
    assert all(e.get("logprobs") for e in events if e["type"].endswith("transcription.completed"))
    # The secret opens Realtime sessions only: not the file endpoints, nor more secrets.
    app_http = openai.OpenAI(api_key=secret.value, base_url=base + "/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        app_http.audio.transcriptions.create(model="whisper-1", file=open(jfk_path, "rb"))
    with pytest.raises(openai.AuthenticationError):
        app_http.realtime.client_secrets.create(session={"type": "transcription"})


def refusal(url: str, key: str) -> tuple[dict, int]:
    """What `/v1/realtime` answers a browser-style client offering `key` as a subprotocol."""
    async def run():
        async with websockets.connect(url.replace("http", "ws") + "/v1/realtime",
                                      subprotocols=["realtime", "openai-insecure-api-key." + key]) as ws:
            error = json.loads(await ws.recv())
            await ws.wait_closed()
            return error, ws.close_code

    return asyncio.run(run())


def test_forged_expired_and_malformed_secrets_open_nothing(base):
    future = int(time.time()) + 60
    forged = client_secrets.mint("another-servers-key", SESSION, future)
    expired = client_secrets.mint(KEY, SESSION, int(time.time()) - 1)
    valid = client_secrets.mint(KEY, {}, future)
    tampered = client_secrets.mint(KEY, {}, future + 3600).split(".")[0] + "." + valid.split(".")[1]
    for key, message in [(forged, "invalid client secret"), (expired, "the client secret has expired"),
                         (tampered, "invalid client secret"), ("ek_%%%.x", "malformed client secret")]:
        error, code = refusal(base, key)
        assert error["type"] == "error" and error["error"]["code"] == "invalid_api_key", key
        assert error["error"]["message"] == message and code == 1008
    # A valid one over the browser's subprotocol: the session opens in the default settings.
    async def run():
        async with websockets.connect(base.replace("http", "ws") + "/v1/realtime",
                                      subprotocols=["realtime", "openai-insecure-api-key." + valid]) as ws:
            return json.loads(await ws.recv())

    assert asyncio.run(run())["type"] == "session.created"


@pytest.mark.parametrize("body, param", [
    ({"expires_after": {"anchor": "created_at", "seconds": 5}}, "expires_after.seconds"),
    ({"expires_after": {"anchor": "used_at"}}, "expires_after.anchor"),
    ({"session": {"type": "realtime"}}, "session.type"),
    ({"session": {"type": "transcription", "audio": {"input": {"turn_detection": {"threshold": 2}}}}},
     "session.audio.input.turn_detection.threshold"),
    ({"session": {"type": "transcription", "include": ["x"]}}, "session.include"),
    ({"session": {"type": "transcription", "audio": {"input": {"transcription": {"prompt": "x" * 9000}}}}},
     "session.audio.input.transcription.prompt"),
    ({"session": "transcription"}, "session"),
])
def test_a_bad_request_names_the_field(base, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        backend(base).post("/realtime/client_secrets", body=body, cast_to=object)
    assert info.value.status_code == 400 and info.value.body["param"] == param
