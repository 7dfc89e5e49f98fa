"""Deepgram's live protocol (`protocols/deepgram.py`) without sockets: query parameters, audio
and control messages in; `Results`, `SpeechStarted`, `UtteranceEnd`, `Metadata` and commands out.
The same wire through the official SDK and a real server: `tests/test_callcenter.py`."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from streamer.config import StreamingConfig
from streamer.protocols.deepgram import (CloseStream, Finalize, KeepAlive, ListenError, ListenOptions,
                                         ListenProtocol, dg_words, model_uuid, parse_options)
from streamer.protocols.outputs import Audio, Close, Send
from streamer.streaming.events import Final, Partial, SpeechStarted, SpeechStopped
from streamer.streaming.live import Committed, Finalized

WORDS = [{"word": " Ask", "start": 0.5, "end": 0.8, "probability": 0.9},
         {"word": " not!", "start": 0.8, "end": 1.25, "probability": 0.7}]


def options(**query: str) -> ListenOptions:
    return parse_options({k: [v] for k, v in query.items()}, StreamingConfig(), False, {"en"}, live=True)


def protocol(limit: int | None = 1 << 20, **query: str) -> ListenProtocol:
    return ListenProtocol(options(**query), "tiny.en", limit)


def messages(outputs: list) -> list[dict]:
    assert all(isinstance(o, Send) for o in outputs), outputs
    return [o.message for o in outputs]


def final(utterance_id: int = 0, words=WORDS) -> Finalized:
    return Finalized(utterance_id, Final(utterance_id, "Ask not!", 0.4, 1.3, words, "en", 0.01, -0.2), 120.0, 0.9)


def test_query_parameters_in_deepgram_terms():
    o = options(encoding="mulaw", interim_results="true", endpointing="5", utterance_end_ms="1000",
                vad_events="true", smart_format="true")
    assert (o.encoding, o.sample_rate, o.channels, o.language) == ("mulaw", 8000, 1, "en")
    assert o.interim_results and o.streaming.partials and o.vad_events and o.utterance_end_ms == 1000
    assert o.streaming.vad.min_silence_ms == 100  # 5 ms is raised to what silero-vad can tell
    assert options().encoding == "pcm_s16le" and options().sample_rate == 16000  # live default: linear16
    for query, param in [({"encoding": "opus"}, "encoding"), ({"channels": "9"}, "channels"),
                         ({"interim_results": "yes"}, "interim_results"), ({"language": "de"}, "language")]:
        with pytest.raises(ListenError) as e:
            options(**query)
        assert e.value.param == param and e.value.err_code == "INVALID_QUERY_PARAMETER"
        assert e.value.message_event() == {"type": "Error", "variant": "INVALID_QUERY_PARAMETER",
                                           "description": e.value.message, "message": e.value.message}


def test_audio_is_cut_into_whole_frames_and_counted():
    p = protocol(channels="2")  # 2 channels of 16-bit: 4-byte frames
    assert p.receive_bytes(b"\1\2\3") == []
    assert p.receive_bytes(b"\4\5\6\7\10\11") == [Audio(b"\1\2\3\4\5\6\7\10")]
    assert p.receive_bytes(b"\12\13") == []  # 3 bytes wait for the frame's last
    assert p.receive_bytes(b"\14") == [Audio(b"\11\12\13\14")]
    assert p.duration == pytest.approx(3 / 16000)
    (error,) = messages(protocol(limit=10).receive_bytes(b"\0" * 12))
    assert error["type"] == "Error" and error["variant"] == "DATA-0001" and "10-byte limit" in error["message"]


def test_control_messages():
    p = protocol()
    assert p.receive_text(json.dumps({"type": "KeepAlive"})) == [KeepAlive()]
    assert p.receive_text(json.dumps({"type": "Finalize"})) == [Finalize()]
    assert p.receive_text(json.dumps({"type": "CloseStream"})) == [CloseStream()]
    assert p.receive_bytes(b"") == [CloseStream()]  # Deepgram's older end of stream
    for text in ("not json", json.dumps({"type": "Bogus"}), json.dumps([1])):
        (error,) = messages(p.receive_text(text))
        assert error["type"] == "Error" and error["variant"] == "INVALID_MESSAGE", text


def test_results_speech_started_and_utterance_end():
    p = protocol(interim_results="true", vad_events="true", utterance_end_ms="1000")
    (started,) = messages(p.on_event(SpeechStarted(0.4321, 0), None))
    assert started == {"type": "SpeechStarted", "channel": [0, 1], "timestamp": 0.432}
    (interim,) = messages(p.on_event(Partial(0, " Ask", " Ask", "", 0.4, 0.9), None))
    assert interim["type"] == "Results" and not interim["is_final"] and not interim["speech_final"]
    assert interim["channel"]["alternatives"] == [{"transcript": "Ask", "confidence": 0.0, "words": []}]
    assert (interim["start"], interim["duration"]) == (0.4, 0.5)
    assert p.on_event(SpeechStopped(1.3, 0), None) == []  # Deepgram has no message for it
    assert p.on_event(Committed(0, 0.4, 1.3, 1.3), None) == []
    result, end = messages(p.on_event(final(), None))
    assert result["is_final"] and result["speech_final"] and not result["from_finalize"]
    assert result["channel_index"] == [0, 1] and (result["start"], result["duration"]) == (0.4, 0.9)
    alternative = result["channel"]["alternatives"][0]
    assert alternative["transcript"] == "Ask not!" and alternative["confidence"] == 0.8  # mean word confidence
    assert alternative["words"] == [
        {"word": "ask", "start": 0.5, "end": 0.8, "confidence": 0.9, "punctuated_word": "Ask"},
        {"word": "not", "start": 0.8, "end": 1.25, "confidence": 0.7, "punctuated_word": "not!"}]
    assert result["metadata"] == {"request_id": p.request_id, "model_uuid": model_uuid("tiny.en"),
                                  "model_info": {"name": "tiny.en", "version": "1", "arch": "whisper"}}
    assert end == {"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": 1.25}
    assert p.on_event(Finalized(1, None, 50.0, 0.5), None) == []  # silence: no Results


def test_without_the_options_only_finals_go_out():
    p = protocol()
    assert p.on_event(SpeechStarted(0.4, 0), None) == []
    (result,) = messages(p.on_event(final(), None))  # no UtteranceEnd without utterance_end_ms
    assert result["type"] == "Results" and result["is_final"]


def test_finalize_marks_what_it_committed():
    p = protocol(multichannel="true", channels="2")
    p.receive_text(json.dumps({"type": "Finalize"}))
    assert p.on_event(Committed(3, 0.0, 1.3, 1.3), 1) == []  # the transport's flush commits channel 1
    assert p.finalized(True) == []
    p.on_event(Committed(4, 1.3, 2.0, 2.0), 1)  # a commit of the VAD's, after the Finalize
    (by_finalize,) = messages(p.on_event(final(3), 1))
    (by_vad,) = messages(p.on_event(final(4), 1))
    assert by_finalize["channel_index"] == [1, 2] and by_finalize["from_finalize"] and not by_finalize["speech_final"]
    assert by_vad["speech_final"] and not by_vad["from_finalize"]


def test_finalize_of_one_channel():
    """Deepgram's `channel` field finalises that channel alone; a bad one is an `Error`."""
    p = protocol(multichannel="true", channels="2")
    assert p.receive_text(json.dumps({"type": "Finalize", "channel": 1})) == [Finalize(1)]
    p.on_event(Committed(3, 0.0, 1.3, 1.3), 0)  # the VAD's commit on channel 0 during the flush
    p.on_event(Committed(5, 0.0, 1.2, 1.2), 1)
    assert p.finalized(True, 1) == []
    (on_0,) = messages(p.on_event(final(3), 0))
    (on_1,) = messages(p.on_event(final(5), 1))
    assert not on_0["from_finalize"] and on_1["from_finalize"] and on_1["channel_index"] == [1, 2]
    p.receive_text(json.dumps({"type": "Finalize", "channel": 0}))
    (empty,) = messages(p.finalized(False, 0))
    assert empty["from_finalize"] and empty["channel_index"] == [0, 2]
    for bad in (2, -1, "0", True, 0.0):
        (error,) = messages(p.receive_text(json.dumps({"type": "Finalize", "channel": bad})))
        assert error["variant"] == "INVALID_MESSAGE" and "channel" in error["description"], bad


def test_finalize_with_nothing_open_answers_an_empty_final_at_once():
    p = protocol()
    p.receive_bytes(b"\0" * 3200)  # 0.1 s
    p.receive_text(json.dumps({"type": "Finalize"}))
    (empty,) = messages(p.finalized(False))
    assert empty["is_final"] and empty["from_finalize"] and not empty["speech_final"]
    assert (empty["start"], empty["duration"]) == (0.1, 0.0)
    assert empty["channel"]["alternatives"] == [{"transcript": "", "confidence": 0.0, "words": []}]


def test_finalize_with_nothing_open_answers_after_the_finals_still_decoding():
    """The VAD ended utterance 1 before the `Finalize`: the empty answer follows its final."""
    p = protocol(utterance_end_ms="1000")
    p.receive_bytes(b"\0" * 64000)  # 2 s
    p.on_event(Committed(1, 0.0, 1.3, 1.3), None)
    p.receive_text(json.dumps({"type": "Finalize"}))
    assert p.finalized(False) == []
    result, utterance_end, empty = messages(p.on_event(final(1), None))
    assert result["channel"]["alternatives"][0]["transcript"] == "Ask not!" and result["speech_final"]
    assert utterance_end["type"] == "UtteranceEnd"
    assert empty["from_finalize"] and empty["channel"]["alternatives"][0]["transcript"] == "" and empty["start"] == 2.0
    # A silent or failed final releases it too.
    p.on_event(Committed(2, 1.3, 1.9, 1.9), None)
    p.receive_text(json.dumps({"type": "Finalize"}))
    assert p.finalized(False) == []
    (empty,) = messages(p.on_event(Finalized(2, None, 0.0, 0.6), None))
    assert empty["from_finalize"]


def test_metadata_closes_the_stream():
    p = protocol(encoding="mulaw")
    audio = bytes(range(256)) * 8
    p.receive_bytes(audio[:1000])
    p.receive_bytes(audio[1000:])
    (metadata, close) = p.close("stop")
    assert close == Close(1000) and p.close("shutdown")[1] == Close(1001)
    metadata = metadata.message
    assert metadata["type"] == "Metadata" and metadata["request_id"] == p.request_id
    assert metadata["sha256"] == hashlib.sha256(audio).hexdigest()
    assert metadata["duration"] == 0.256 and metadata["channels"] == 1  # 2048 μ-law bytes at 8 kHz
    assert metadata["models"] == [model_uuid("tiny.en")] == [str(uuid.uuid5(uuid.NAMESPACE_URL, "streamer:tiny.en"))]
    assert metadata["model_info"] == {model_uuid("tiny.en"): {"name": "tiny.en", "version": "1", "arch": "whisper"}}


def test_words_lose_punctuation_and_keep_a_channel():
    assert dg_words([{"word": " Don't.", "start": 1, "end": 2, "probability": 0.5}], channel=1) == [
        {"word": "don't", "start": 1.0, "end": 2.0, "confidence": 0.5, "punctuated_word": "Don't.", "channel": 1}]
