"""A Realtime session the server ends for want of client events says why, with the official
`openai` SDK (QA session 31b). A push-to-talk client (`turn_detection: null`) that connects
ahead of the first press, or whose user pauses, was closed with a bare 1000: no event, nothing
for the app to show or act on. OpenAI says a session's end in an `error` (`session_expired`)."""

from __future__ import annotations

import asyncio
import base64

import pytest
from openai import AsyncOpenAI

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
    ("no_audio", {"first_audio_timeout_s": 0.5}, 0.0),
    ("idle_timeout", {"idle_timeout_s": 1.0}, 0.3),
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
