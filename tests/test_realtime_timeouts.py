"""The timeouts of a Realtime session, with the official `openai` SDK.

A session the server ends for want of client events says why (QA session 31b): it was closed with
a bare 1000, nothing for the app to show or act on; OpenAI says a session's end in an `error`
(`session_expired`). A push-to-talk session (`turn_detection: null`) is held by
`manual_idle_timeout_s`, server VAD by `idle_timeout_s` (session 32)."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import pytest
from openai import AsyncOpenAI

from streamer.audio.decode import decode_audio
from streamer.config import load_settings
from streamer.server.app import create_app, running


async def session_until_closed(base: str, append_s: float) -> list[dict]:
    """A manual-commit session that appends `append_s` of silence (none for 0), then waits."""
    client = AsyncOpenAI(api_key="unused", base_url=base + "/v1", websocket_base_url=base.replace("http", "ws") + "/v1")
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        await connection.session.update(session={"type": "transcription", "audio": {"input": {
            "turn_detection": None}}})
        if append_s:
            await connection.input_audio_buffer.append(
                audio=base64.b64encode(b"\0\0" * int(append_s * 24000)).decode())
        events = []
        async for event in connection:  # ends when the server closes
            events.append(event.to_dict())
            assert len(events) < 10
        return events


@pytest.mark.parametrize("reason,settings,append_s", [
    ("no_audio", {"manual_idle_timeout_s": 0.5}, 0.0),
    ("idle_timeout", {"manual_idle_timeout_s": 1.0}, 0.3),
])
def test_a_timed_out_session_says_why_before_it_closes(engine, reason, settings, append_s):
    with running(create_app(load_settings({}, server=settings), engine)) as base:
        events = asyncio.run(asyncio.wait_for(session_until_closed(base, append_s), 30))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["session.created", "session.updated"] and kinds.count("error") == 1, kinds
    assert kinds[-1] == "error", kinds  # after the open item's completion (idle_timeout commits it)
    error = events[-1]["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == reason, error
    assert f"{max(settings.values()):g} s" in error["message"], error


COMPLETED = "conversation.item.input_audio_transcription.completed"
PCM16K = {"type": "audio/pcm", "rate": 16000}


def connect(base: str):
    client = AsyncOpenAI(api_key="unused", base_url=base + "/v1", websocket_base_url=base.replace("http", "ws") + "/v1")
    return client.realtime.connect(extra_query={"intent": "transcription"})


def append_event(pcm16k: np.ndarray) -> str:
    return base64.b64encode((np.clip(pcm16k, -1, 1) * 32767).astype("<i2").tobytes()).decode()


async def push_to_talk(base: str, speech: np.ndarray, pause_s: float) -> list[dict]:
    """A manual-commit session that waits `pause_s` before its first audio and again before its
    commit; the events after the commit, up to the item's completion or an error."""
    async with connect(base) as connection:
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session={"type": "transcription", "audio": {"input": {
            "format": PCM16K, "turn_detection": None}}})
        assert (await connection.recv()).type == "session.updated"
        await asyncio.sleep(pause_s)  # connected ahead of the first press
        await connection.input_audio_buffer.append(audio=append_event(speech))
        await asyncio.sleep(pause_s)  # the user thinks before letting go
        await connection.input_audio_buffer.commit()
        events = [(await asyncio.wait_for(connection.recv(), 60)).to_dict()]
        while events[-1]["type"] not in ("error", COMPLETED):
            events.append((await asyncio.wait_for(connection.recv(), 60)).to_dict())
        return events


async def server_vad_silent(base: str) -> tuple[list[dict], float]:
    """A server-VAD session that appends a little silence, then sends nothing: its events up to
    the close, and how long after the append they ended."""
    async with connect(base) as connection:
        await connection.session.update(session={"type": "transcription", "audio": {"input": {"format": PCM16K}}})
        await connection.input_audio_buffer.append(audio=append_event(np.zeros(4800, np.float32)))
        silent_from = time.monotonic()
        events = [event.to_dict() async for event in connection]  # ends when the server closes
        return events, time.monotonic() - silent_from


def test_push_to_talk_outlives_the_idle_timeout_that_ends_server_vad(engine, jfk_path):
    """With `turn_detection: null` the client sends nothing between presses (a dictation user
    thinking) and has no keepalive event to send: `idle_timeout_s` (and `first_audio_timeout_s`
    for a client that connects before the first press) closed such a session. It is now held by
    `manual_idle_timeout_s`; server VAD keeps `idle_timeout_s`."""
    speech = decode_audio(jfk_path)[: 3 * 16000]  # "And so my fellow Americans"
    settings = {"idle_timeout_s": 1.0, "first_audio_timeout_s": 1.0, "manual_idle_timeout_s": 4.0}
    with running(create_app(load_settings({}, server=settings), engine)) as base:
        async def both():
            return await asyncio.gather(push_to_talk(base, speech, pause_s=2.0), server_vad_silent(base))

        manual, (vad, silent_s) = asyncio.run(asyncio.wait_for(both(), 90))
    assert [e["type"] for e in manual] == ["input_audio_buffer.committed",
                                           "conversation.item.input_audio_transcription.delta", COMPLETED], manual
    assert "fellow americans" in manual[-1]["transcript"].lower(), manual
    assert [e["type"] for e in vad] == ["session.created", "session.updated", "error"], vad
    assert vad[-1]["error"]["code"] == "idle_timeout" and "1 s" in vad[-1]["error"]["message"], vad
    assert 1.0 <= silent_s < 2.0, silent_s
