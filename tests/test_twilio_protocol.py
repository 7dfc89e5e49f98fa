"""Twilio Media Streams (`protocols/twilio.py`) without sockets: Twilio's `connected`, `start`,
`media`, `dtmf`, `mark` and `stop` in (the shapes of Twilio's "Media Streams - WebSocket
Messages" page); commands and the subscribers' messages out. The same call through a real server:
`tests/test_callcenter.py::test_twilio_media_stream`."""

from __future__ import annotations

import base64
import json

from streamer.protocols.outputs import Close, Send
from streamer.protocols.twilio import Media, Start, Stop, TwilioProtocol
from streamer.streaming.events import Final, Partial
from streamer.streaming.live import Committed, Finalized

SID, CALL, ACCOUNT = "MZ" + "1" * 32, "CA" + "2" * 32, "AC" + "3" * 32


def twilio(p: TwilioProtocol, event: str, number: int, **body) -> list:
    """One Twilio message as Twilio sends it."""
    return p.receive_text(json.dumps({"event": event, "sequenceNumber": str(number), "streamSid": SID, **body}))


def start(p: TwilioProtocol, tracks=("inbound", "outbound"), **params) -> Start:
    (s,) = twilio(p, "start", 1, start={
        "streamSid": SID, "accountSid": ACCOUNT, "callSid": CALL, "tracks": list(tracks),
        "customParameters": params, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}})
    return s


def media(p: TwilioProtocol, number: int, track: str, audio: bytes) -> list:
    return twilio(p, "media", number, media={"track": track, "chunk": str(number), "timestamp": str(number * 20),
                                             "payload": base64.b64encode(audio).decode()})


def errors(outputs: list) -> list[str]:
    return [o.message["code"] for o in outputs if isinstance(o, Send) and o.message["type"] == "error"]


def test_a_call_starts_streams_both_tracks_and_stops():
    p = TwilioProtocol()
    assert p.receive_text(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})) == []
    s = start(p, agent="7", api_key="secret")
    assert (s.stream_sid, s.call_sid, s.account_sid, s.tracks) == (SID, CALL, ACCOUNT, ["inbound", "outbound"])
    assert s.custom_parameters == {"agent": "7", "api_key": "secret"}  # the transport checks the key
    (subscribed,) = p.started("tiny.en")
    assert subscribed == Send({"type": "start", "streamSid": SID, "callSid": CALL, "tracks": ["inbound", "outbound"],
                               "customParameters": {"agent": "7"}, "model": "tiny.en"})
    assert media(p, 2, "inbound", b"\xff" * 160) == [Media(0, "inbound", b"\xff" * 160)]
    assert media(p, 3, "outbound", b"\x7f" * 400) == [Media(1, "outbound", b"\x7f" * 400)]
    assert twilio(p, "dtmf", 4, dtmf={"track": "inbound_track", "digit": "5"}) == [
        Send({"type": "dtmf", "digit": "5", "track": "inbound_track", "t": 0.05})]  # 400 samples at 8 kHz
    assert twilio(p, "mark", 5, mark={"name": "greeting played"}) == [
        Send({"type": "mark", "name": "greeting played", "t": 0.05})]
    assert twilio(p, "stop", 6, stop={"accountSid": ACCOUNT, "callSid": CALL}) == [Stop()]
    assert p.close("stop") == [Send({"type": "closed", "reason": "stop"}), Close(1000)]


def test_bad_messages_are_reported_and_the_call_goes_on():
    p = TwilioProtocol(max_message_bytes=2000)
    assert errors(media(p, 1, "inbound", b"\0")) == ["not_started"]
    start(p)
    assert errors(p.receive_text("{")) == ["bad_json"]
    assert errors(p.receive_text(json.dumps({"streamSid": SID}))) == ["unknown_event"]
    assert errors(twilio(p, "clear", 2)) == ["unknown_event"]  # sent *to* Twilio, never by it
    assert errors(twilio(p, "media", 3, media={"track": "inbound"})) == ["bad_media"]
    assert errors(media(p, 4, "both", b"\0")) == ["bad_media"]
    assert errors(twilio(p, "media", 5, media={"track": "inbound", "payload": "not base64!"})) == ["bad_media"]
    assert errors(media(p, 6, "inbound", b"\0" * 2000)) == ["bad_message"]  # over the size limit
    assert errors(p.receive_bytes(b"\0")) == ["bad_message"]
    assert errors(twilio(p, "start", 7, start={"streamSid": SID})) == ["already_started"]
    assert media(p, 8, "inbound", b"\1") == [Media(0, "inbound", b"\1")]


def test_a_bad_start_ends_the_stream():
    p = TwilioProtocol()
    outputs = twilio(p, "start", 1, start={"streamSid": SID, "mediaFormat": {"encoding": "audio/x-l16",
                                                                             "sampleRate": 16000, "channels": 1}})
    assert errors(outputs) == ["bad_start"] and outputs[-1] == Close(1008)
    assert "audio/x-l16, 16000, 1" in outputs[0].message["message"]
    assert media(p, 2, "inbound", b"\0") == []  # nothing more is taken
    assert p.close("error") == [Send({"type": "closed", "reason": "error"})]  # closed once only
    for bad in ({"streamSid": SID, "tracks": ["both_tracks"]}, "not an object"):
        assert errors(twilio(TwilioProtocol(), "start", 1, start=bad)) == ["bad_start"]


def test_transcripts_are_tagged_with_their_track():
    p = TwilioProtocol()
    start(p)
    partial = Partial(0, " Ask", " Ask", "", 0.5, 1.0)
    (message,) = p.on_event(partial, 1)
    assert message == Send({**partial.to_dict(), "channel": 1, "track": "outbound"})
    assert p.on_event(Committed(0, 0.0, 1.3, 1.3), 0) == []
    final = Final(0, "Ask not.", 0.5, 1.3, None, "en", 0.01, -0.2)
    (message,) = p.on_event(Finalized(0, final, 80.0, 1.3), 0)
    assert message == Send({**final.to_dict(), "latency_ms": 80.0, "channel": 0, "track": "inbound"})
    (message,) = p.on_event(Finalized(1, None, 10.0, 1.0, error="boom", error_code="internal"), 0)
    assert message == Send({"type": "error", "code": "internal", "message": "boom", "channel": 0})


def test_the_end_says_why():
    for reason, said, code in [("disconnect", "stop", 1000), ("shutdown", "shutdown", 1001),
                               ("idle_timeout", "idle_timeout", 1000), ("error", "error", 1008)]:
        assert TwilioProtocol().close(reason) == [Send({"type": "closed", "reason": said}), Close(code)]
