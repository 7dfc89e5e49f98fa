"""The Realtime protocol (`protocols/realtime.py`) without sockets: client events in, server events
and segmentation commands out; the bridges' events in, items in commit order out."""

from __future__ import annotations

import base64
import dataclasses
import json

import numpy as np
import pytest

from streamer.config import StreamingConfig
from streamer.protocols.outputs import Close, Send
from streamer.protocols.realtime import (COMPLETED, DELTA, FAILED, Begin, DropOpen, Feed, Finish, Flush,
                                         RealtimeProtocol, Reconfigure, Settle)
from streamer.protocols.start import ModelInfo
from streamer.streaming.events import Final, SpeechStarted, SpeechStopped
from streamer.streaming.live import Committed, Finalized

ENGLISH = ModelInfo("tiny.en", False, frozenset({"en"}))
DEFAULTS = StreamingConfig()


def protocol(beta: bool = False, limit: int | None = 1 << 20) -> RealtimeProtocol:
    return RealtimeProtocol("sess_1", ENGLISH, DEFAULTS, beta=beta, max_message_bytes=limit)


def send(p: RealtimeProtocol, type_: str, **fields) -> list:
    return p.receive(json.dumps({"type": type_, **fields}))


def append(p: RealtimeProtocol, seconds: float, rate: int = 24000) -> list:
    tone = (3000 * np.sin(np.arange(int(seconds * rate)) / 7)).astype("<i2").tobytes()
    return send(p, "input_audio_buffer.append", audio=base64.b64encode(tone).decode())


def settled(p: RealtimeProtocol, outputs: list) -> list:
    """A manual-mode decision on the buffer: `Settle` first (the transport's VAD catches up), then
    what the protocol decided."""
    assert outputs == [Settle(1)], outputs
    return p.settled()


def events(outputs: list) -> list[dict]:
    return [o.message for o in outputs if isinstance(o, Send)]


def the_error(outputs: list) -> dict:
    (event,) = events(outputs)
    assert event["type"] == "error" and event["event_id"].startswith("event_")
    return event["error"]


def final(utterance_id: int, text: str) -> Finalized:
    return Finalized(utterance_id, Final(utterance_id, text, 0.0, 1.0, None, "en", 0.01, -0.2), 50.0, 1.25)


def test_the_session_starts_in_the_shape_the_client_uses():
    (created,) = events(protocol().created())
    assert created["type"] == "session.created"
    session = created["session"]
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["input"]["turn_detection"] == {"type": "server_vad", "threshold": 0.5,
                                                           "prefix_padding_ms": 200, "silence_duration_ms": 500}
    assert "language" not in session["audio"]["input"]["transcription"]  # detection: absent, not null
    (created,) = events(protocol(beta=True).created())
    assert created["type"] == "transcription_session.created" and created["session"]["input_audio_format"] == "pcm16"


@pytest.mark.parametrize("session, code, param", [
    ({"type": "realtime"}, "unsupported_session_type", "session.type"),
    ({"audio": {"input": {"format": {"type": "audio/opus"}}}}, "invalid_value", "session.audio.input.format.type"),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 96000}}}}, "invalid_value",
     "session.audio.input.format.rate"),
    ({"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 16000}}}}, "invalid_value",
     "session.audio.input.format.rate"),
    ({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}, "invalid_value",
     "session.audio.input.turn_detection.type"),
    ({"audio": {"input": {"turn_detection": {"threshold": 1.0}}}}, "invalid_value",
     "session.audio.input.turn_detection.threshold"),
    ({"audio": {"input": {"transcription": {"language": "fr"}}}}, "invalid_value",
     "session.audio.input.transcription.language"),
    ({"audio": {"input": {"transcription": {"prompt": 3}}}}, "invalid_value", "session.audio.input.transcription.prompt"),
    ({"audio": "loud"}, "invalid_value", "session.audio"),
    ({"include": "item.input_audio_transcription.logprobs"}, "invalid_value", "session.include"),
    ({"include": ["logprobs"]}, "invalid_value", "session.include"),
])
def test_a_bad_update_names_the_field_and_echoes_the_event_id(session, code, param):
    p = protocol()
    error = the_error(send(p, "session.update", session=session, event_id="evt_1"))
    assert (error["type"], error["code"], error["param"], error["event_id"]) == ("invalid_request_error", code, param,
                                                                                "evt_1")
    assert p.config.rate == 24000 and p.config.turn_detection is not None  # nothing of it applied


def test_bad_events_are_refused_and_the_session_goes_on():
    p = protocol(limit=200)
    assert the_error(p.receive("{"))["code"] == "invalid_json"
    assert the_error(send(p, "response.create"))["code"] == "unknown_event"
    error = the_error(send(p, "input_audio_buffer.append", audio="%%%"))
    assert (error["code"], error["param"]) == ("invalid_audio", "audio")
    error = the_error(send(p, "input_audio_buffer.append", audio=base64.b64encode(b"abc").decode()))
    assert "3 bytes is not a whole number of 16-bit samples" in error["message"]
    assert the_error(send(p, "transcription_session.update", session={"input_audio_format": "mp3"}))["param"] == \
        "session.input_audio_format"
    out = send(p, "input_audio_buffer.append", audio="A" * 300)
    assert events(out)[0]["error"]["code"] == "message_too_large" and out[-1] == Close(1009)
    assert send(p, "input_audio_buffer.clear") == []  # nothing after the end


def test_audio_begins_a_segmentation_and_is_resampled_to_16k():
    p = protocol()
    out = append(p, 0.5)
    begin, feed = out
    assert isinstance(begin, Begin) and begin.number == 1 and begin.language == "en"
    assert not begin.streaming.partials and not begin.streaming.manual_commit
    assert begin.streaming.vad.threshold == 0.5 and begin.streaming.vad.min_silence_ms == 500
    assert isinstance(feed, Feed) and feed.number == 1 and abs(len(feed.pcm) - 8000) < 100
    (feed,) = append(p, 0.5)
    assert feed.number == 1


def test_manual_commits_need_a_tenth_of_a_second():
    p = protocol()
    update = send(p, "session.update", session={"audio": {"input": {"turn_detection": None}}})
    assert events(update)[0]["session"]["audio"]["input"]["turn_detection"] is None
    error = the_error(send(p, "input_audio_buffer.commit", event_id="c0"))
    assert (error["code"], error["param"], error["event_id"]) == ("input_audio_buffer_commit_empty",
                                                                  "input_audio_buffer", "c0")
    begin, _ = append(p, 0.05)
    assert begin.streaming.manual_commit and not begin.streaming.partials
    error = the_error(settled(p, send(p, "input_audio_buffer.commit", event_id="c1")))
    assert (error["message"], error["event_id"]) == ("the input audio buffer holds nothing to commit", "c1")
    append(p, 0.1)
    assert settled(p, send(p, "input_audio_buffer.commit")) == [Flush(1)]
    assert the_error(settled(p, send(p, "input_audio_buffer.commit")))["code"] == "input_audio_buffer_commit_empty"
    append(p, 0.3)
    clear = send(p, "input_audio_buffer.clear")
    assert clear[0] == DropOpen(1) and events(clear)[0]["type"] == "input_audio_buffer.cleared"
    assert the_error(settled(p, send(p, "input_audio_buffer.commit")))["code"] == "input_audio_buffer_commit_empty"
    # Manual items have no speech_started / speech_stopped of their own.
    assert p.on_event(1, SpeechStarted(0.0, 1)) == [] and p.on_event(1, SpeechStopped(0.15, 1)) == []
    (committed,) = events(p.on_event(1, Committed(1, 0.0, 0.15, 0.15)))
    assert committed["type"] == "input_audio_buffer.committed" and committed["previous_item_id"] is None


def test_a_server_vad_commit_with_no_speech_open_is_an_error():
    p = protocol()
    error = the_error(send(p, "input_audio_buffer.commit"))
    assert error["message"] == "the input audio buffer holds nothing to commit"
    append(p, 0.5)
    assert send(p, "input_audio_buffer.commit", event_id="c1") == [Flush(1, report=True)]
    error = the_error(p.flushed(False))
    assert (error["message"], error["event_id"]) == ("no speech is open to commit", "c1")
    send(p, "input_audio_buffer.commit")
    assert p.flushed(True) == []


def test_a_format_change_after_audio_begins_a_new_segmentation_at_the_stream_time():
    p = protocol()
    append(p, 2.0)
    out = send(p, "session.update", session={"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}})
    flush, tail, finish, updated = out
    assert flush == Flush(1) and isinstance(tail, Feed) and tail.number == 1 and finish == Finish(1)
    assert events([updated])[0]["session"]["audio"]["input"]["format"]["rate"] == 16000
    begin, feed = append(p, 1.0, rate=16000)
    assert begin.number == 2 and abs(len(feed.pcm) - 16000) < 100
    # The second segmentation's times are stream times: it began where the first one ended (2 s).
    (started,) = events(p.on_event(2, SpeechStarted(0.5, 1)))
    assert abs(started["audio_start_ms"] - 2300) <= 2  # 0.5 s less the 200-ms padding, after 2 s
    # A prompt or language change keeps the segmentation: its next items follow the new settings.
    out = send(p, "session.update", session={"audio": {"input": {"transcription": {"prompt": " Kennedy "}}}})
    assert out[:2] == [Flush(2), Reconfigure(2, "en", "Kennedy", False)]


def test_completions_go_out_in_commit_order_and_deltas_join_to_the_transcript():
    p = protocol()
    append(p, 1.0)
    started = events(p.on_event(1, SpeechStarted(0.3, 1)))[0]
    stopped = events(p.on_event(1, SpeechStopped(1.2, 1)))[0]
    assert started["item_id"] == stopped["item_id"] and stopped["audio_end_ms"] == 1200
    (first,) = events(p.on_event(1, Committed(1, 0.1, 1.4, 1.2)))
    # A max-length cut: speech_stopped and committed for the item, speech_started for the next.
    p.on_event(1, SpeechStarted(2.0, 2))
    cut = events(p.on_event(1, Committed(2, 1.8, 29.8, 29.8)))
    assert [e["type"] for e in cut] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                                        "input_audio_buffer.speech_started"]
    assert cut[0]["audio_end_ms"] == 29800 and cut[2]["audio_start_ms"] == 29800
    assert cut[1]["previous_item_id"] == first["item_id"] and cut[2]["item_id"] != cut[1]["item_id"]
    third = events(p.on_event(1, SpeechStopped(31.0, 3)))[0]
    assert third["item_id"] == cut[2]["item_id"]  # the item opened by the cut
    p.on_event(1, Committed(3, 29.8, 31.2, 31.0))
    # The engine finishes them out of order; the client hears them in commit order.
    assert p.on_event(1, final(3, "three")) == [] and p.on_event(1, final(2, "two")) == []
    out = events(p.on_event(1, final(1, "one")))
    assert [(e["type"], e["item_id"]) for e in out] == [
        (DELTA, first["item_id"]), (COMPLETED, first["item_id"]), (DELTA, cut[1]["item_id"]),
        (COMPLETED, cut[1]["item_id"]), (DELTA, third["item_id"]), (COMPLETED, third["item_id"])]
    assert [e.get("delta") or e.get("transcript") for e in out] == ["one", "one", "two", "two", "three", "three"]
    assert out[1]["usage"] == {"type": "duration", "seconds": 1.25}


def test_logprobs_only_when_included_and_kept_by_the_decode():
    """Token bytes come from the model (`ModelInfo.token_bytes`); a final decoded without
    per-token log probabilities (beam search) has an empty list; the beta session echoes `include`."""
    p = RealtimeProtocol("sess_1", dataclasses.replace(ENGLISH, token_bytes=lambda t: b" one" if t == 1 else b"!"),
                         DEFAULTS, beta=True)
    append(p, 1.0)
    p.on_event(1, Committed(1, 0.0, 1.0, 1.0))
    assert all("logprobs" not in e for e in events(p.on_event(1, final(1, "one"))))
    (updated,) = events(send(p, "transcription_session.update", session={
        "include": ["item.input_audio_transcription.logprobs"]}))
    assert updated["session"]["include"] == ["item.input_audio_transcription.logprobs"]
    p.on_event(1, Committed(2, 1.0, 2.0, 2.0))
    p.on_event(1, Committed(3, 2.0, 3.0, 3.0))
    kept = Final(2, "one!", 1.0, 2.0, None, "en", 0.01, -0.2, token_logprobs=((1, -0.25), (2, -1.5)))
    p.on_event(1, Finalized(3, final(3, "beams").final, 50.0, 1.0))
    delta, completed, _, beams = events(p.on_event(1, Finalized(2, kept, 50.0, 1.0)))
    want = [{"token": " one", "logprob": -0.25, "bytes": list(b" one")}, {"token": "!", "logprob": -1.5, "bytes": [33]}]
    assert delta["logprobs"] == completed["logprobs"] == want
    assert beams["type"] == COMPLETED and beams["logprobs"] == []


def test_an_empty_or_failed_item_still_completes_in_order():
    p = protocol()
    append(p, 1.0)
    p.on_event(1, Committed(1, 0.0, 1.0, 1.0))
    p.on_event(1, Committed(2, 1.0, 2.0, 2.0))
    assert p.on_event(1, Finalized(2, None, 0.0, 1.0, "boom", "internal")) == []
    out = events(p.on_event(1, Finalized(1, None, 10.0, 1.0)))  # no speech in it: no delta
    assert [e["type"] for e in out] == [COMPLETED, FAILED]
    assert out[0]["transcript"] == "" and out[1]["error"]["message"] == "boom"


def test_an_item_a_cut_opened_that_holds_no_speech_completes_empty_in_order():
    p = protocol()
    append(p, 15.0)
    append(p, 15.0)
    p.on_event(1, SpeechStarted(0.3, 1))
    cut = events(p.on_event(1, Committed(1, 0.1, 28.1, 28.1)))
    following = cut[2]["item_id"]
    # The speech had stopped just before the cut: the remainder is discarded, no final comes.
    out = events(p.on_event(1, SpeechStopped(28.1, 2, discarded=True)))
    assert [(e["type"], e["item_id"]) for e in out] == [("input_audio_buffer.speech_stopped", following),
                                                         ("input_audio_buffer.committed", following)]
    assert out[1]["previous_item_id"] == cut[1]["item_id"]
    done = events(p.on_event(1, final(1, "one")))  # the empty one waits for the item before it
    assert [(e["type"], e["item_id"]) for e in done][1:] == [(COMPLETED, cut[1]["item_id"]), (COMPLETED, following)]
    assert done[2]["transcript"] == "" and done[2]["usage"]["seconds"] == pytest.approx(1.9, abs=0.01)


def test_end_commits_the_open_item_and_finishes():
    p = protocol()
    assert p.end() == []  # no audio: nothing to finish
    p = protocol()
    append(p, 1.0)
    tail, finish = p.end()
    assert isinstance(tail, Feed) and finish == Finish(1)
    assert p.closed("shutdown") == [Close(1001)]
    said, close = p.closed("idle_timeout", 60.0)
    assert close == Close(1000) and said.message["error"]["code"] == "idle_timeout"
    assert "60 s" in said.message["error"]["message"]
    error = events(p.refuse("overloaded", "full", 1013, 2.0))[0]["error"]
    assert (error["type"], error["code"], error["retry_after_s"]) == ("server_error", "overloaded", 2.0)


def test_the_end_takes_a_manual_buffer_as_a_commit_would():
    """With `turn_detection: null` the open item is the audio appended since the last commit: at
    the end (idle timeout, shutdown) it is committed from 100 ms, else dropped, as a commit would
    refuse it; the resampler's last samples come first, so that they open no item of their own."""
    def manual(seconds: float, commit: bool = False) -> RealtimeProtocol:
        p = protocol()
        send(p, "session.update", session={"audio": {"input": {"turn_detection": None}}})
        append(p, seconds)
        if commit:
            assert settled(p, send(p, "input_audio_buffer.commit")) == [Flush(1)]
        return p

    p = manual(0.1)
    tail, finish = settled(p, p.end())
    assert isinstance(tail, Feed) and finish == Finish(1)
    p = manual(0.09)
    tail, drop, finish = settled(p, p.end())
    assert isinstance(tail, Feed) and drop == DropOpen(1) and finish == Finish(1)
    p = manual(0.5, commit=True)  # nothing appended since the commit
    tail, drop, finish = settled(p, p.end())
    assert isinstance(tail, Feed) and drop == DropOpen(1) and finish == Finish(1)


def test_an_automatic_commit_at_max_length_ends_the_manual_buffer():
    """A manual buffer that reaches `max_utterance_s` is committed where the VAD cut it; a commit
    after it counts only what came after the cut. Whether the cut has come is known once the
    transport's VAD has all the audio, so each decision on the buffer waits for a `Settle`: the
    commit, an update (which commits the buffer), the end. The automatic commit did not move the
    mark: a commit 32 ms after it was taken, and those 32 ms became an item (QA session 31b)."""
    p = protocol()
    send(p, "session.update", session={"audio": {"input": {"turn_detection": None}}})
    for _ in range(28):
        append(p, 1.0)
    append(p, 0.032)
    commit = send(p, "input_audio_buffer.commit", event_id="late")
    # The transport's VAD cuts at 28 s, while it settles for the commit.
    (committed,) = events(p.on_event(1, Committed(1, 0.0, 28.0, 28.0)))
    assert committed["type"] == "input_audio_buffer.committed"
    error = the_error(settled(p, commit))
    assert (error["code"], error["event_id"]) == ("input_audio_buffer_commit_empty", "late")
    append(p, 0.07)  # 32 ms + 70 ms since the cut
    assert settled(p, send(p, "input_audio_buffer.commit")) == [Flush(1)]
    append(p, 0.5)
    update = settled(p, send(p, "session.update", session={"audio": {"input": {"transcription": {"prompt": "x"}}}}))
    assert update[0] == Flush(1) and events(update)[0]["type"] == "session.updated"


def test_a_segmentation_given_up_fails_its_committed_items_and_releases_the_later_ones():
    """A retired segmentation whose finals did not come back within the finish timeout: its
    committed items fail (in commit order), and the next segmentation's completions, held behind
    them, go out; its late events are dropped."""
    p = protocol()
    append(p, 2.0)
    p.on_event(1, SpeechStarted(0.3, 1))
    p.on_event(1, SpeechStopped(1.2, 1))
    (stuck,) = events(p.on_event(1, Committed(1, 0.1, 1.4, 1.2)))
    p.on_event(1, SpeechStarted(1.6, 2))  # announced, never committed
    send(p, "session.update", session={"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}})
    append(p, 2.0, rate=16000)
    p.on_event(2, SpeechStarted(0.3, 1))
    p.on_event(2, SpeechStopped(1.2, 1))
    (later,) = events(p.on_event(2, Committed(1, 0.1, 1.4, 1.2)))
    assert p.on_event(2, final(1, "later")) == []  # waits for the stuck item
    out = events(p.finished(1, 2.0))
    assert [(e["type"], e["item_id"]) for e in out] == [(FAILED, stuck["item_id"]), (DELTA, later["item_id"]),
                                                         (COMPLETED, later["item_id"])]
    assert out[0]["error"]["code"] == "transcription_timeout" and "2 s" in out[0]["error"]["message"]
    assert p.on_event(1, final(1, "too late")) == [] and p.finished(1, 2.0) == []
    # A segmentation that delivered everything fails nothing.
    p.on_event(2, SpeechStarted(1.5, 2))
    p.on_event(2, SpeechStopped(1.8, 2))
    p.on_event(2, Committed(2, 1.5, 1.9, 1.8))
    assert [e["type"] for e in events(p.on_event(2, final(2, "done")))] == [DELTA, COMPLETED]
    assert p.finished(2, 2.0) == []
