"""`input_audio_buffer.commit` with `turn_detection: null` at OpenAI's 100-ms minimum, with the
official `openai` SDK, in each input format (QA session 31b)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading

import av
import numpy as np
import pytest
from openai import AsyncOpenAI

from streamer.audio import g711
from streamer.audio.decode import decode_audio
from streamer.config import load_settings
from streamer.server.app import create_app, running

COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"


@pytest.fixture(scope="module")
def base(engine):
    with running(create_app(load_settings({}), engine)) as url:
        yield url


@pytest.fixture(scope="module")
def speech(jfk_path) -> np.ndarray:
    """16-kHz float32 from the middle of a word ("fellow"): speech in every sample window."""
    return decode_audio(jfk_path)[int(1.0 * 16000):int(2.0 * 16000)]


def encoded(audio16k: np.ndarray, fmt: dict, ms: int) -> bytes:
    """`ms` milliseconds of `audio16k` in the session's input format."""
    rate = fmt.get("rate", 8000)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
    frame = av.AudioFrame.from_ndarray(audio16k[None, :].astype(np.float32), format="flt", layout="mono")
    frame.sample_rate = 16000
    pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)])
    pcm = pcm[: rate * ms // 1000]
    if fmt["type"] == "audio/pcm":
        return pcm.astype("<i2").tobytes()
    return g711.encode(pcm.astype(np.float32) / 32768.0, "mulaw" if fmt["type"] == "audio/pcmu" else "alaw")


@contextlib.asynccontextmanager
async def manual_session(base: str, fmt: dict):
    """A Realtime transcription session (the official SDK) in `fmt` with `turn_detection: null`."""
    client = AsyncOpenAI(api_key="unused", base_url=base + "/v1",
                         websocket_base_url=base.replace("http", "ws") + "/v1")
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        assert (await connection.recv()).type == "session.created"
        await connection.session.update(session={"type": "transcription", "audio": {"input": {
            "format": fmt, "turn_detection": None}}})
        assert (await connection.recv()).type == "session.updated"
        yield connection


async def answer(connection) -> list[dict]:
    """The events up to an error or the item's completion."""
    events = [(await asyncio.wait_for(connection.recv(), 60)).to_dict()]
    while events[-1]["type"] not in ("error", COMPLETED, FAILED):
        events.append((await asyncio.wait_for(connection.recv(), 60)).to_dict())
    return events


async def commit_after(base: str, fmt: dict, audio: bytes) -> list[dict]:
    """A manual-commit session in `fmt`: append `audio` in one event, commit; the answer (with a
    commit, up to the item's completion)."""
    async with manual_session(base, fmt) as connection:
        await connection.input_audio_buffer.append(audio=base64.b64encode(audio).decode())
        await connection.input_audio_buffer.commit()
        return await answer(connection)


@pytest.mark.parametrize("fmt", [{"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcm", "rate": 44100},
                                 {"type": "audio/pcm", "rate": 16000}, {"type": "audio/pcmu"}, {"type": "audio/pcma"}],
                         ids=["pcm24k", "pcm44k", "pcm16k", "pcmu", "pcma"])
def test_a_commit_of_exactly_100_ms_is_taken(base, speech, fmt):
    """OpenAI's rule is at least 100 ms of audio in the buffer: exactly 100 ms is committed, 90 ms
    is `input_audio_buffer_commit_empty`. The buffer was measured after resampling to 16 kHz, which
    holds the last few samples back, so 100 ms of the default 24-kHz PCM (and of 44.1 kHz and
    G.711) was refused as empty."""
    taken = asyncio.run(commit_after(base, fmt, encoded(speech, fmt, 100)))
    assert taken[0]["type"] == "input_audio_buffer.committed" and taken[-1]["type"] == COMPLETED, taken
    assert taken[-1]["item_id"] == taken[0]["item_id"]
    refused = asyncio.run(commit_after(base, fmt, encoded(speech, fmt, 90)))
    assert [e["type"] for e in refused] == ["error"], refused
    assert refused[0]["error"]["code"] == "input_audio_buffer_commit_empty", refused


def test_an_update_does_not_commit_what_a_commit_would_refuse(base, speech):
    """A `session.update` that changes the format ends the open item "as input_audio_buffer.commit
    would" (docs/protocol.md): with `turn_detection: null` and under 100 ms appended, a commit is
    refused, so no item comes of it. The segmentation's end committed it anyway: an item the
    client never committed, `committed` and an empty `completed` after `session.updated`."""
    pcm24k = {"type": "audio/pcm", "rate": 24000}
    pcm16k = {"type": "audio/pcm", "rate": 16000}

    async def run() -> list[dict]:
        async with manual_session(base, pcm24k) as connection:
            await connection.input_audio_buffer.append(audio=base64.b64encode(encoded(speech, pcm24k, 50)).decode())
            await connection.session.update(session={"type": "transcription", "audio": {"input": {"format": pcm16k}}})
            await connection.input_audio_buffer.append(audio=base64.b64encode(encoded(speech, pcm16k, 600)).decode())
            await connection.input_audio_buffer.commit()
            return await answer(connection)

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    assert kinds[0] == "session.updated" and kinds.count("input_audio_buffer.committed") == 1, kinds
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    assert committed["previous_item_id"] is None and events[-1]["item_id"] == committed["item_id"], events
    assert events[-1]["type"] == COMPLETED and events[-1]["transcript"], events


@pytest.mark.parametrize("end", ["idle_timeout", "shutdown"])
@pytest.mark.parametrize("ms", [50, 150])
def test_the_end_of_a_session_commits_what_a_commit_would(engine, speech, end, ms):
    """A push-to-talk session that ends (idle timeout, server shutdown) with audio appended since
    its last commit ends its open item as a commit would: 150 ms is committed and transcribed,
    50 ms (under OpenAI's 100-ms minimum) is dropped. The segmentation's end committed the 50 ms
    anyway (`committed`, an empty `completed`), an item that a `commit` would have refused."""
    pcm16k = {"type": "audio/pcm", "rate": 16000}
    settings = load_settings({}, server={"manual_idle_timeout_s": 1.0 if end == "idle_timeout" else 60.0})
    appended, events = threading.Event(), []

    async def client(base: str) -> None:
        async with manual_session(base, pcm16k) as connection:
            await connection.input_audio_buffer.append(audio=base64.b64encode(encoded(speech, pcm16k, ms)).decode())
            # Bad base64, dropped: its error says that the append before it was read.
            await connection.input_audio_buffer.append(audio="!")
            assert (await connection.recv()).to_dict()["error"]["code"] == "invalid_audio"
            appended.set()
            events.extend([event.to_dict() async for event in connection])  # until the server closes

    with running(create_app(settings, engine)) as base:
        thread = threading.Thread(target=lambda: asyncio.run(asyncio.wait_for(client(base), 60)))
        thread.start()
        assert appended.wait(30)
        if end == "idle_timeout":
            thread.join()
    thread.join()  # shutdown: leaving `running` stopped the server
    kinds = [e["type"] for e in events]
    taken = ["input_audio_buffer.committed", "conversation.item.input_audio_transcription.delta", COMPLETED]
    assert kinds == (taken if ms >= 100 else []) + (["error"] if end == "idle_timeout" else []), events


@pytest.mark.parametrize("wait", [True, False], ids=["after_its_committed", "at_once"])
def test_a_commit_of_what_max_length_committed_is_empty(base, jfk_path, speech, wait):
    """With `turn_detection: null` a buffer that reaches `max_utterance_s` (28 s) is committed
    automatically, at its quietest point. Here that point is the end (the last 64 ms are digital
    silence), so 32 ms stay in the buffer: a commit then, whether the client waited for the
    automatic `committed` or not, is `input_audio_buffer_commit_empty`, and the 32 ms go into the
    next item. The automatic commit did not move the "committed up to" mark, so the commit was
    taken and the 32 ms became an item of their own (QA session 31b)."""
    pcm16k = {"type": "audio/pcm", "rate": 16000}
    n = 28 * 16000 + 512  # the automatic commit comes with the first whole VAD frame past 28 s
    audio = np.concatenate([np.tile(decode_audio(jfk_path), 3)[: n - 1024], np.zeros(1024, np.float32)])
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")

    async def run() -> list[dict]:
        async with manual_session(base, pcm16k) as connection:
            for i in range(0, n, 1600):
                await connection.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + 1600].tobytes()).decode())
            events = []
            if wait:
                events.append((await asyncio.wait_for(connection.recv(), 60)).to_dict())
                assert events[-1]["type"] == "input_audio_buffer.committed", events
            await connection.input_audio_buffer.commit(event_id="late")
            await connection.input_audio_buffer.append(audio=base64.b64encode(encoded(speech, pcm16k, 500)).decode())
            await connection.input_audio_buffer.commit(event_id="next")
            while sum(e["type"] in (COMPLETED, FAILED) for e in events) < 2:
                events.append((await asyncio.wait_for(connection.recv(), 120)).to_dict())
            return events

    events = asyncio.run(run())
    committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert len(committed) == 2 and [(e["code"], e["event_id"]) for e in errors] == [
        ("input_audio_buffer_commit_empty", "late")], events
    assert [e["item_id"] for e in events if e["type"] == COMPLETED] == committed, events
