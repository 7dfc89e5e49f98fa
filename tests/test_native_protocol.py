"""The native protocol (`protocols/native.py`) without sockets: messages in, messages and commands out."""

from __future__ import annotations

import json

import pytest

from streamer.config import StreamingConfig
from streamer.protocols.native import (TRACK_RATE, DataChannelProtocol, DecodeFailed, Flush, NativeProtocol,
                                       Resume, SessionLog, Start, State, Stop, session_message)
from streamer.protocols.outputs import Audio, Close, Send
from streamer.protocols.start import ModelInfo, StartOptions, parse_start
from streamer.streaming.events import Final, Partial, SpeechStarted
from streamer.streaming.live import Committed, Finalized

ENGLISH = ModelInfo("tiny.en", False, frozenset({"en"}))


def protocol(limit: int | None = 1 << 20) -> NativeProtocol:
    return NativeProtocol(StreamingConfig(), ENGLISH, limit)


def text(p: NativeProtocol, message: dict) -> list:
    return p.receive_text(json.dumps(message))


def errors(outputs: list) -> list[dict]:
    return [o.message for o in outputs if isinstance(o, Send) and o.message["type"] == "error"]


def started(p: NativeProtocol, **fields) -> StartOptions:
    (start,) = text(p, {"type": "start", **fields})
    assert isinstance(start, Start)
    (ready,) = p.started("s1", start.options, "en", "0.token")
    assert ready.message == {"type": "ready", "session_id": "s1", "model": "tiny.en",
                             "sample_rate": start.options.sample_rate, "language": "en", "task": "transcribe",
                             "resume_token": "0.token"}
    return start.options


def test_a_stream_starts_takes_whole_frames_and_stops():
    p = protocol()
    (error,) = errors(p.receive_bytes(b"\0\0"))
    assert error["code"] == "not_started" and p.state is State.OPEN
    options = started(p, sample_rate=8000, encoding="mulaw", channels=2)
    assert (options.sample_rate, options.encoding, options.channels) == (8000, "mulaw", 2)
    assert p.receive_bytes(b"\1\2\3\4") == [Audio(b"\1\2\3\4")]
    (error,) = errors(p.receive_bytes(b"\1\2\3"))
    assert error["code"] == "bad_frame" and "2-byte sample frames, not 3 bytes" in error["message"]
    (error,) = errors(p.receive_bytes(b"\0" * 2 * 8000 * 6))  # 6 s in one frame
    assert error["code"] == "bad_frame" and "at most 5 s" in error["message"]
    assert text(p, {"type": "flush"}) == [Flush()]
    assert text(p, {"type": "ping", "id": 7}) == [Send({"type": "pong", "id": 7})]
    (error,) = errors(text(p, {"type": "start"}))
    assert error["code"] == "already_started"
    assert text(p, {"type": "stop"}) == [Stop()]
    assert p.close("stop") == [Send({"type": "closed", "reason": "stop"}), Close(1000)]
    assert p.receive_bytes(b"\0\0") == [] and p.state is State.ENDED


@pytest.mark.parametrize("fields, name", [
    ({"sample_rate": 16000.0}, "sample_rate"), ({"encoding": "opus"}, "encoding"), ({"channels": 9}, "channels"),
    ({"vad": {"threshold": 1.0}}, "vad.threshold"), ({"vad": {"loud": 1}}, "vad.loud"),
    ({"vad": {"threshold": 0.3, "neg_threshold": 0.4}}, "vad.neg_threshold"),
    ({"language": "fr"}, "language"), ({"task": "translate"}, "task"), ({"colour": "red"}, "colour"),
    ({"partial_interval_ms": 50}, "partial_interval_ms"),
])
def test_a_bad_start_field_is_named_and_the_stream_does_not_start(fields, name):
    p = protocol()
    (error,) = errors(text(p, {"type": "start", **fields}))
    assert error["code"] == "bad_field" and error["field"] == name and error["message"].startswith(f"{name}: ")
    assert p.state is State.OPEN


def test_bad_messages_are_refused_and_the_stream_goes_on():
    p = protocol()
    assert errors(p.receive_text("{"))[0]["code"] == "bad_json"
    assert errors(p.receive_text("[1]"))[0]["code"] == "bad_json"
    assert errors(text(p, {"type": 5}))[0]["code"] == "unknown_type"
    assert errors(text(p, {"type": "dance"}))[0]["message"] == "unknown message type 'dance'"
    assert errors(text(p, {"type": "flush"}))[0] == {"type": "error", "code": "not_started",
                                                     "message": "flush before start"}
    assert text(p, {"type": "stop"}) == [Stop()]  # a stop before start ends the stream too


def test_a_message_over_the_limit_ends_the_stream():
    p = protocol(limit=100)
    out = p.receive_text(json.dumps({"type": "ping", "id": "x" * 100}))
    assert out == [Send({"type": "error", "code": "too_large", "message": "a 126-byte message is over the 100-byte limit"}),
                   Send({"type": "closed", "reason": "error"}), Close(1009)]
    assert p.state is State.ENDED and text(p, {"type": "ping"}) == []


def test_a_refusal_says_when_to_come_back():
    p = protocol()
    assert p.fail("overloaded", "full", 1013, retry_after_s=2.0) == [
        Send({"type": "error", "code": "overloaded", "message": "full", "retry_after_s": 2.0}),
        Send({"type": "closed", "reason": "error"}), Close(1013)]


def test_resume_is_checked_against_the_session_log():
    p = protocol()
    (error,) = errors(text(p, {"type": "start", "resume": {"token": "t", "extra": 1}}))
    assert error["field"] == "resume"
    fields = {"token": "0.t", "bytes_sent": 6400, "last_event_id": 1}
    assert text(p, {"type": "start", "resume": fields}) == [Resume(fields)]

    log = SessionLog(keep=2)
    log.bytes_received = 6400
    for t in (1.0, 2.0, 3.0):
        log.number(SpeechStarted(t, 1).to_dict())
    assert [m["event_id"] for m in log.events] == [2, 3]  # the oldest fell out
    assert log.check_resume(6400, 1) is None and log.check_resume(7000, 3) is None
    assert log.check_resume(6399, 1).message.startswith("bytes_sent must be a whole number of at least 6400")
    assert log.check_resume(6400, 4).field == "resume"
    assert log.check_resume(6400, True) is not None and log.check_resume(True, 1) is not None
    assert [m["event_id"] for m in log.replay(1)] == [2, 3] and log.replay(3) == []
    with pytest.raises(Exception, match="events after 0 are no longer kept"):
        log.replay(0)

    options = parse_start({"type": "start", "channels": 2, "multichannel": True}, StreamingConfig(), False, {"en"})
    (ready,) = p.resumed("s1", options, "en", "0.t", log)
    assert ready.message["resumed"] is True and ready.message["bytes_received"] == 6400
    assert ready.message["last_event_id"] == 3 and ready.message["channels"] == 2 and ready.message["multichannel"]
    assert p.state is State.STREAMING and p.receive_bytes(b"\0" * 4) == [Audio(b"\0" * 4)]


def test_session_events_become_messages():
    final = Final(2, "Ask not.", 1.0, 2.0, None, "en", 0.01, -0.2)
    assert session_message(Committed(2, 0.8, 2.2, 2.0), None) is None
    assert session_message(Finalized(2, None, 100.0, 1.4), None) is None  # no speech in it
    message = session_message(Finalized(2, final, 123.456, 1.4), 1)
    assert message == {**final.to_dict(), "latency_ms": 123.5, "channel": 1}
    assert session_message(Partial(2, "Ask", "Ask", "", 1.0, 1.5), None)["type"] == "partial"
    lost = session_message(Finalized(3, None, 0.0, 1.0, "core 0 stopped", "engine_unavailable"), 0)
    assert lost == {"type": "error", "code": "engine_unavailable", "utterance_id": 3, "channel": 0,
                    "message": "utterance 3 was lost: core 0 stopped; the stream goes on"}
    assert session_message(Finalized(4, None, 0.0, 1.0, "boom", "internal"), None) == \
        DecodeFailed("decoding utterance 4 failed: boom")


def test_the_data_channel_speaks_the_same_protocol_without_audio_frames():
    options = parse_start({"language": "en", "partials": False}, StreamingConfig(), False, {"en"}, audio_fields=False)
    p = DataChannelProtocol(StreamingConfig(), ENGLISH, options)
    (ready,) = p.started("s2", options, "en", None)
    assert ready.message == {"type": "ready", "session_id": "s2", "model": "tiny.en", "sample_rate": TRACK_RATE,
                             "language": "en", "task": "transcribe"}
    assert errors(p.receive_bytes(b"\0\0"))[0]["code"] == "bad_frame"
    assert errors(text(p, {"type": "start"}))[0] == {"type": "error", "code": "already_started",
                                                     "message": "the offer's `start` started the stream"}
    assert text(p, {"type": "flush"}) == [Flush()] and text(p, {"type": "stop"}) == [Stop()]
    assert p.receive_text("x" * (2 << 20))[0].message["code"] == "bad_json"  # no size limit of its own
