"""`/v1/realtime` with the official `openai` SDK (GA and beta clients) and raw WebSocket clients.

The SDK clients stream real recordings as base64 24-kHz PCM16 in 40-ms events, paced at twice
real time (the server's cutting depends on stream time only, not on arrival times, so the
items and texts are the ones of real-time pacing; partial decodes get fewer chances).
"""

from __future__ import annotations

import asyncio
import base64
import json

import av
import jiwer
import numpy as np
import pytest
import websockets
from openai import AsyncOpenAI
from whisper_normalizer.english import EnglishTextNormalizer

from streamer.audio.decode import audio_resampler, decode_audio
from streamer.config import load_settings
from streamer.engine.handle import Handle
from streamer.engine.request import DecodeOptions, Priority
from streamer.server.app import create_app, running

RATE = 24000
CHUNK_S = 0.04
PACE = 2.0
GAP_S = 1.0
TAIL_S = 1.5
"""Silence after the last prompt, so that server VAD ends the last item."""
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"

normalize = EnglishTextNormalizer()


def wer(reference: str, hypothesis: str) -> float:
    return jiwer.wer(normalize(reference), normalize(hypothesis))


def pcm24k(audio16k: np.ndarray) -> bytes:
    # The server's resampler settings (one thread): test_hardening counts this process's threads.
    resampler = audio_resampler(format="s16", layout="mono", rate=RATE)
    frame = av.AudioFrame.from_ndarray(audio16k[None, :].astype(np.float32), format="flt", layout="mono")
    frame.sample_rate = 16000
    frames = resampler.resample(frame) + resampler.resample(None)
    return b"".join(f.to_ndarray().astype("<i2").tobytes() for f in frames)


def silence(seconds: float) -> bytes:
    return b"\x00\x00" * int(seconds * RATE)


@pytest.fixture(scope="module")
def base(engine):
    with running(create_app(load_settings({}), engine)) as url:
        yield url


@pytest.fixture(scope="module")
def prompts(manifest):
    """Four groups of three English prompts: one recording per client."""
    rows = [r for r in manifest if "/en/asterisk/" in r["audio"] and 3 <= r["duration"] <= 5][:12]
    return [rows[i::4] for i in range(4)]


def sdk(base: str) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="unused", base_url=base + "/v1", websocket_base_url=base.replace("http", "ws") + "/v1")


async def send_paced(append, pcm: bytes) -> None:
    chunk = int(CHUNK_S * RATE) * 2
    for i in range(0, len(pcm), chunk):
        await append(base64.b64encode(pcm[i:i + chunk]).decode())
        await asyncio.sleep(CHUNK_S / PACE)


async def collect(connection, sender: asyncio.Task) -> list[dict]:
    """Events until the audio is sent and every started item is committed and completed.

    The check runs on each event and once more when the sender finishes: the last item can
    complete while the tail of silence is still being sent, and then no event follows."""
    events: list[dict] = []
    changed = asyncio.Event()

    async def read() -> None:
        async for event in connection:
            events.append(event.to_dict())
            changed.set()

    def finished() -> bool:
        kinds = [e["type"] for e in events]
        started = kinds.count("input_audio_buffer.speech_started")
        return bool(started) and kinds.count("input_audio_buffer.committed") == started == kinds.count(COMPLETED)

    reader = asyncio.ensure_future(read())
    try:
        await sender
        while not finished():
            if reader.done():
                reader.result()  # a connection error, if that is how it ended
                raise AssertionError(f"connection closed early: {events[-3:]}")
            changed.clear()
            waiter = asyncio.ensure_future(changed.wait())
            await asyncio.wait([reader, waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        return events
    finally:
        reader.cancel()


async def ga_client(base: str, pcm: bytes) -> list[dict]:
    async with sdk(base).realtime.connect(extra_query={"intent": "transcription"}) as connection:
        created = (await connection.recv()).to_dict()
        assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
        await connection.session.update(session={
            "type": "transcription",
            "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": RATE},
                "transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                   "silence_duration_ms": 500},
            }},
        })
        updated = (await connection.recv()).to_dict()
        assert updated["type"] == "session.updated"
        turn = updated["session"]["audio"]["input"]["turn_detection"]
        assert turn == {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}
        sender = asyncio.ensure_future(send_paced(lambda a: connection.input_audio_buffer.append(audio=a), pcm))
        return await asyncio.wait_for(collect(connection, sender), 300)


def check_items(events: list[dict]) -> list[str]:
    """Per item: speech_started, speech_stopped, committed, then one completed, in commit order,
    with deltas; returns the transcripts."""
    order: dict[str, list[str]] = {}
    for e in events:
        if "item_id" in e:
            order.setdefault(e["item_id"], []).append(e["type"])
    for item, kinds in order.items():
        core = [k for k in kinds if k != DELTA]
        assert core == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                        "input_audio_buffer.committed", COMPLETED], (item, kinds)
    committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    completed = [e for e in events if e["type"] == COMPLETED]
    assert [e["item_id"] for e in completed] == committed
    previous = [e["previous_item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    assert previous == [None] + committed[:-1]
    for e in completed:
        # The deltas of every item join exactly to its transcript (docs/protocol.md).
        deltas = "".join(d["delta"] for d in events if d["type"] == DELTA and d["item_id"] == e["item_id"])
        assert deltas == e["transcript"], e
        assert e["usage"]["type"] == "duration" and e["usage"]["seconds"] > 0
    starts = [e["audio_start_ms"] for e in events if e["type"] == "input_audio_buffer.speech_started"]
    assert starts == sorted(starts)
    return [e["transcript"] for e in completed]


def test_four_sdk_clients_match_offline(base, engine, prompts):
    """Issue 4's acceptance: four official-SDK clients at once, each streaming its recording;
    their completed transcripts are within 1 WER point of offline transcription."""
    clips = [[decode_audio(r["audio"]) for r in group] for group in prompts]
    recordings = [b"".join(pcm24k(c) + silence(GAP_S) for c in group) + silence(TAIL_S) for group in clips]

    async def offline(group) -> str:
        options = DecodeOptions(language="en", timestamps=True)
        return " ".join([(await engine.transcribe(c, options, priority=Priority.FINAL)).text for c in group])

    async def run():
        return await asyncio.gather(*[ga_client(base, pcm) for pcm in recordings])

    offline_texts = [asyncio.run(offline(group)) for group in clips]
    results = asyncio.run(run())
    references, streamed = [], []
    for group, events, batch in zip(prompts, results, offline_texts):
        transcripts = check_items(events)
        assert len(transcripts) >= len(group)
        reference = " ".join(r["text"] for r in group)
        print(f"client: streamed {wer(reference, ' '.join(transcripts)):.3f} offline {wer(reference, batch):.3f}")
        references.append(reference)
        streamed.append(" ".join(transcripts))
    total_streamed = wer(" ".join(references), " ".join(streamed))
    total_offline = wer(" ".join(references), " ".join(offline_texts))
    print(f"WER streamed {total_streamed:.3%}, offline {total_offline:.3%}")
    assert total_streamed <= total_offline + 0.01


def test_beta_sdk_client(base, prompts, manifest):
    """The SDK's beta client (`OpenAI-Beta: realtime=v1`, `transcription_session.update`)."""
    clip = decode_audio(prompts[0][0]["audio"])

    async def run():
        async with sdk(base).beta.realtime.connect(model="whisper-1") as connection:
            created = await connection.recv()
            assert created.type == "transcription_session.created"
            await connection.transcription_session.update(session={
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 600},
            })
            updated = await connection.recv()
            assert updated.type == "transcription_session.updated"
            assert updated.session.turn_detection.silence_duration_ms == 600
            pcm = pcm24k(clip) + silence(TAIL_S)
            sender = asyncio.ensure_future(send_paced(lambda a: connection.input_audio_buffer.append(audio=a), pcm))
            return await asyncio.wait_for(collect(connection, sender), 120)

    transcripts = check_items(asyncio.run(run()))
    assert wer(prompts[0][0]["text"], " ".join(transcripts)) < 0.2


async def raw(base: str):
    ws = await websockets.connect(base.replace("http", "ws") + "/v1/realtime?intent=transcription&model=whisper-1")
    assert json.loads(await ws.recv())["type"] == "session.created"
    return ws


async def next_event(ws, skip=()) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if event["type"] not in skip:
            return event


async def append_raw(ws, pcm: bytes, chunk: int = 4800) -> None:
    """`pcm` as `input_audio_buffer.append` events of `chunk` bytes, unpaced."""
    for i in range(0, len(pcm), chunk):
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(pcm[i:i + chunk]).decode()}))


def test_manual_commits_and_clear(base, prompts):
    """turn_detection null: the client cuts items with commit; clear drops what was appended."""
    first, second, third = (decode_audio(r["audio"]) for r in prompts[1])

    async def run():
        ws = await raw(base)
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"turn_detection": None}}}}))
        updated = await next_event(ws)
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c0"}))
        empty = await next_event(ws)
        assert empty["error"]["code"] == "input_audio_buffer_commit_empty" and empty["error"]["event_id"] == "c0"
        items, transcripts = [], []
        for clip, keep in ((first, True), (second, False), (third, True)):
            await append_raw(ws, pcm24k(clip), 48000)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit" if keep else "input_audio_buffer.clear"}))
            if not keep:
                assert (await next_event(ws))["type"] == "input_audio_buffer.cleared"
                continue
            committed = await next_event(ws)
            assert committed["type"] == "input_audio_buffer.committed"
            assert committed["previous_item_id"] == (items[-1] if items else None)
            items.append(committed["item_id"])
            delta, completed = await next_event(ws), await next_event(ws)
            assert delta["type"] == DELTA and completed["type"] == COMPLETED
            assert delta["delta"] == completed["transcript"] and completed["item_id"] == committed["item_id"]
            assert completed["usage"]["seconds"] == pytest.approx(len(clip) / 16000, abs=0.1)
            transcripts.append(completed["transcript"])
        await ws.close()
        return transcripts

    one, three = asyncio.run(run())
    assert wer(prompts[1][0]["text"], one) < 0.2
    assert wer(prompts[1][2]["text"], three) < 0.2  # nothing of the cleared prompt


def test_a_cleared_item_stays_out_of_the_next_items(base, jfk_path):
    """Server VAD: `clear` while "Ask not" is open drops it, and the next item, decoded in the
    stream's preceding audio (acoustic context), does not bring it back: the cleared audio sat
    inside the next item's context window with no text of its own in the prefix, so the next
    transcript began "Ask not what your country..." (QA session 30)."""
    jfk = decode_audio(jfk_path)
    cut = int(4.45 * 16000)  # "Ask not" (3.3-4.4 s) still open: its silence is shorter than 500 ms

    async def run() -> list[dict]:
        ws = await raw(base)
        events = []

        await append_raw(ws, pcm24k(jfk[:cut]))
        while [e["type"] for e in events].count("input_audio_buffer.speech_started") < 2 or \
                COMPLETED not in [e["type"] for e in events]:  # "And so my fellow Americans" is in: context
            events.append(await next_event(ws))
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        await append_raw(ws, pcm24k(jfk[cut:]) + silence(TAIL_S))
        while [e["type"] for e in events].count(COMPLETED) < 3:
            events.append(await next_event(ws))
        await ws.close()
        return events

    events = asyncio.run(run())
    assert "input_audio_buffer.cleared" in [e["type"] for e in events]
    first, third, fourth = (e["transcript"] for e in events if e["type"] == COMPLETED)
    assert wer("And so my fellow Americans", first) < 0.2, first
    assert wer("what your country can do for you", third) < 0.2, third  # nothing of the cleared "Ask not"
    assert wer("ask what you can do for your country", fourth) < 0.2, fourth


def test_an_item_after_a_commit_mid_speech_starts_where_the_commit_cut(base, jfk_path):
    """Server VAD, `commit` mid-sentence: the speech goes on as the next item, whose audio begins at
    the cut. Its `audio_start_ms` said 200 ms earlier (speech start minus the padding, which the
    cut had taken), inside the committed item (QA session 30); every item now starts at or after
    where the one before it stopped."""
    jfk = decode_audio(jfk_path)
    cut = int(1.5 * 16000)  # "And so my fellow | Americans"

    async def run() -> list[dict]:
        ws = await raw(base)
        events = []

        await append_raw(ws, pcm24k(jfk[:cut]))
        while "input_audio_buffer.speech_started" not in [e["type"] for e in events]:
            events.append(await next_event(ws))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await append_raw(ws, pcm24k(jfk[cut:]) + silence(TAIL_S))
        while [e["type"] for e in events].count(COMPLETED) < 5:
            events.append(await next_event(ws))
        await ws.close()
        return events

    events = asyncio.run(run())
    started = [e["audio_start_ms"] for e in events if e["type"] == "input_audio_buffer.speech_started"]
    stopped = [e["audio_end_ms"] for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    assert stopped[0] == pytest.approx(1500, abs=5) and started[1] == stopped[0], (started, stopped)
    assert all(b >= a for a, b in zip(stopped, started[1:])), (started, stopped)
    transcripts = [e["transcript"] for e in events if e["type"] == COMPLETED]
    assert wer("And so my fellow Americans, ask not what your country can do for you, ask what you can do for "
               "your country.", " ".join(transcripts)) < 0.2, transcripts


def test_a_cut_whose_remainder_is_discarded_still_completes_every_item(base, jfk_path):
    """Speech that stops just before `max_utterance_s` (28 s): the cut falls in the silence after it,
    so the item the server announced at the cut (`speech_started`) holds no speech and is
    discarded. That item got `speech_stopped` and then nothing: no `committed`, no transcription,
    and a client waiting for its transcript waited for ever (QA session 30). Every announced item
    now ends with `committed` and one `completed` ("" for the discarded one)."""
    jfk = decode_audio(jfk_path)
    # Speech from 0.35 s to 26.4 s ("...ask not"), pauses under the 2-s silence: one utterance, cut at 28 s.
    audio = np.concatenate([jfk, jfk, jfk[: int(4.5 * 16000)], np.zeros(6 * 16000, np.float32)])

    async def run() -> list[dict]:
        ws = await raw(base)
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 2000}}}}}))
        await next_event(ws)
        await append_raw(ws, pcm24k(audio), 9600)
        events = []
        while True:  # until every announced item has completed
            events.append(await next_event(ws))
            kinds = [e["type"] for e in events]
            if "input_audio_buffer.speech_stopped" in kinds and \
                    kinds.count("input_audio_buffer.speech_started") == kinds.count(COMPLETED):
                break
        await ws.close()
        return events

    events = asyncio.run(run())
    transcripts = check_items(events)
    assert len(transcripts) == 2 and transcripts[1] == "", transcripts
    assert wer("And so my fellow Americans, ask not what your country can do for you, ask what you can do for "
               "your country. " * 2 + "And so my fellow Americans, ask not", transcripts[0]) < 0.2, transcripts


def test_errors_keep_the_session(base):
    bad = [
        ("{oops", "invalid_json", None),
        (json.dumps({"type": "response.create", "event_id": "e1"}), "unknown_event", None),
        (json.dumps({"type": "session.update", "session": {"type": "realtime"}}), "unsupported_session_type", "session.type"),
        (json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "turn_detection": {"type": "semantic_vad"}}}}}), "invalid_value", "session.audio.input.turn_detection.type"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/opus"}}}}}),
         "invalid_value", "session.audio.input.format.type"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu",
                                                                                          "rate": 16000}}}}}),
         "invalid_value", "session.audio.input.format.rate"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 1000}}}}}),
         "invalid_value", "session.audio.input.format.rate"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"threshold": 2}}}}}),
         "invalid_value", "session.audio.input.turn_detection.threshold"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"transcription": {"language": "de"}}}}}),
         "invalid_value", "session.audio.input.transcription.language"),
        (json.dumps({"type": "transcription_session.update", "session": {"input_audio_format": "g729"}}),
         "invalid_value", "session.input_audio_format"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "not base64!"}), "invalid_audio", "audio"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}), "invalid_audio", "audio"),
        (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty", "input_audio_buffer"),
    ]

    async def run():
        ws = await raw(base)
        for message, code, param in bad:
            await ws.send(message)
            event = await next_event(ws)
            assert event["type"] == "error" and event["error"]["code"] == code, (message, event)
            assert event["error"]["param"] == param and event["event_id"].startswith("event_")
            if "e1" in message:
                assert event["error"]["event_id"] == "e1"
        # A rejected update changed nothing; a good one still works.
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "transcription": {"language": "en"}}}}}))
        updated = await next_event(ws)
        assert updated["type"] == "session.updated"
        audio_in = updated["session"]["audio"]["input"]
        assert audio_in["format"]["rate"] == 16000 and audio_in["transcription"]["language"] == "en"
        assert audio_in["turn_detection"]["type"] == "server_vad" and audio_in["turn_detection"]["threshold"] == 0.5
        await ws.close()

    asyncio.run(run())


def test_the_prompt_opens_each_item_and_bad_conditioning_is_an_error(base, jfk_path):
    """`transcription.prompt` prompts the items (an all-caps prompt makes tiny.en write in capitals);
    `condition_on_previous_text` that is not a boolean is an error naming the field, and the
    session goes on. The deltas of the item join to its transcript."""
    pcm = pcm24k(decode_audio(jfk_path)) + silence(2.5)

    async def run():
        async with sdk(base).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            await connection.recv()
            await connection.session.update(session={"type": "transcription", "audio": {"input": {
                "transcription": {"prompt": "AND SO MY FELLOW AMERICANS", "condition_on_previous_text": "yes"}}}})
            error = (await connection.recv()).to_dict()
            await connection.session.update(session={"type": "transcription", "audio": {"input": {
                "transcription": {"prompt": "AND SO MY FELLOW AMERICANS", "condition_on_previous_text": False},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 2000}}}})
            updated = (await connection.recv()).to_dict()
            sender = asyncio.ensure_future(send_paced(lambda a: connection.input_audio_buffer.append(audio=a), pcm))
            return error, updated, await asyncio.wait_for(collect(connection, sender), 120)

    error, updated, events = asyncio.run(run())
    assert error["type"] == "error" and error["error"]["code"] == "invalid_value"
    assert error["error"]["param"] == "session.audio.input.transcription.condition_on_previous_text"
    transcription = updated["session"]["audio"]["input"]["transcription"]
    assert transcription["prompt"] == "AND SO MY FELLOW AMERICANS" and transcription["condition_on_previous_text"] is False
    (transcript,) = check_items(events)
    assert "ASK NOT WHAT YOUR COUNTRY" in transcript


def test_update_mid_stream_keeps_stream_time(base, prompts):
    """A session.update that changes rate and VAD after audio: the open item is committed, the
    next audio is read at the new rate, stream time runs on, completions stay in commit order."""
    first, second = (decode_audio(r["audio"]) for r in prompts[2][:2])
    at16k = (first.clip(-1, 1) * 32767).astype("<i2").tobytes()

    async def run():
        ws = await raw(base)
        await append_raw(ws, pcm24k(first)[: int(2.0 * RATE) * 2], 32000)  # two seconds in: speech is open
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {"silence_duration_ms": 700}}}}}))
        gap = b"\0\0" * 16000
        await append_raw(ws, at16k[2 * 32000:] + gap + (second.clip(-1, 1) * 32767).astype("<i2").tobytes() + 2 * gap, 32000)
        events = []
        while sum(e["type"] == COMPLETED for e in events) < 2 or \
                sum(e["type"] == COMPLETED for e in events) < sum(e["type"] == "input_audio_buffer.committed" for e in events):
            events.append(await next_event(ws))
        await ws.close()
        return events

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    # The update first commits the open item, then answers.
    assert kinds.index("input_audio_buffer.committed") < kinds.index("session.updated")
    committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    assert [e["item_id"] for e in events if e["type"] == COMPLETED] == committed
    starts = [e["audio_start_ms"] for e in events if e["type"] == "input_audio_buffer.speech_started"]
    stops = [e["audio_end_ms"] for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    assert stops[0] == pytest.approx(2000, abs=40)  # the update committed the open item where the audio stood
    # The second prompt begins 1 s after the first ends, in stream time (its item's start includes padding).
    assert starts == sorted(starts) and starts[-1] >= len(first) / 16 + 1000 - 300
    transcripts = [e["transcript"] for e in events if e["type"] == COMPLETED]
    assert wer(prompts[2][1]["text"], transcripts[-1]) < 0.2


def test_logprobs_when_included(base, engine, jfk_path):
    """`include: ["item.input_audio_transcription.logprobs"]` (OpenAI's SDK client): the delta and
    the completion carry each text token's `logprobs`, whose tokens join to the transcript and
    whose bytes are the token's; an unknown `include` value is an error naming the field."""
    pcm = pcm24k(decode_audio(jfk_path)) + silence(2.5)

    async def run():
        async with sdk(base).realtime.connect(extra_query={"intent": "transcription"}) as connection:
            await connection.recv()
            await connection.session.update(session={"type": "transcription", "include": ["item.input_audio_transcription.bogus"]})
            error = (await connection.recv()).to_dict()
            await connection.session.update(session={"type": "transcription",
                                                     "include": ["item.input_audio_transcription.logprobs"],
                                                     "audio": {"input": {"turn_detection": {
                                                         "type": "server_vad", "silence_duration_ms": 2000}}}})
            updated = (await connection.recv()).to_dict()
            sender = asyncio.ensure_future(send_paced(lambda a: connection.input_audio_buffer.append(audio=a), pcm))
            return error, updated, await asyncio.wait_for(collect(connection, sender), 120)

    error, updated, events = asyncio.run(run())
    assert error["type"] == "error" and error["error"]["param"] == "session.include"
    assert updated["session"]["include"] == ["item.input_audio_transcription.logprobs"]
    (transcript,) = check_items(events)
    (completed,) = [e for e in events if e["type"] == COMPLETED]
    (delta,) = [e for e in events if e["type"] == DELTA]
    logprobs = completed["logprobs"]
    assert delta["logprobs"] == logprobs and len(logprobs) >= 15
    assert "".join(p["token"] for p in logprobs).strip() == transcript
    assert all(p["logprob"] <= 0 and bytes(p["bytes"]).decode() == p["token"] for p in logprobs)
    # The decode is sure of most of JFK's words.
    assert np.median([p["logprob"] for p in logprobs]) > -0.5


def test_a_retired_segmentation_past_the_finish_timeout_fails_its_items_and_later_ones_complete(engine, prompts, monkeypatch):
    """A `session.update` that changes the rate retires the segmentation; its items' finals get
    FINISH_TIMEOUT_S (here 2 s) to come back. One that never does (its decode stands in for a stuck
    engine window) used to hold every later completion back for good, completions going out in
    commit order: now it is given up as `...transcription.failed`, and the items after it complete."""
    first, second = (decode_audio(r["audio"]) for r in prompts[3][:2])
    submit, stuck = engine.submit, []

    def first_final_hangs(audio, options, *, priority, **kw):
        if priority == Priority.FINAL and not stuck:
            stuck.append(Handle("stuck", lambda _: None, False))  # never settles
            return stuck[0]
        return submit(audio, options, priority=priority, **kw)

    monkeypatch.setattr(engine, "submit", first_final_hangs)

    async def run(base):
        ws = await raw(base)
        await append_raw(ws, pcm24k(first) + silence(1.0))
        events = [await next_event(ws)]
        while events[-1]["type"] != "input_audio_buffer.committed":
            events.append(await next_event(ws))
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}}}}}))
        await append_raw(ws, (np.concatenate([second, np.zeros(24000, np.float32)]) * 32767).astype("<i2").tobytes())
        while sum(e["type"] in (COMPLETED, FAILED) for e in events) < 2:
            events.append(await asyncio.wait_for(next_event(ws), 30))
        await ws.close()
        return events

    with running(create_app(load_settings({"FINISH_TIMEOUT_S": "2"}), engine)) as base:
        events = asyncio.run(run(base))
    assert stuck
    committed = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]
    (failed,) = [e for e in events if e["type"] == FAILED]
    (completed,) = [e for e in events if e["type"] == COMPLETED]
    assert [failed["item_id"], completed["item_id"]] == committed  # in commit order
    assert failed["error"]["type"] == "server_error" and "2 s" in failed["error"]["message"], failed
    assert wer(prompts[3][1]["text"], completed["transcript"]) < 0.2
