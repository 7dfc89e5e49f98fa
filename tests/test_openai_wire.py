"""The OpenAI wire details the official `openai` Python SDK relies on (issue #13, item 8): status
classes and error codes, JSON 404/405, `x-request-id`, `logprobs`, `chunking_strategy`, `model`."""

from __future__ import annotations

import httpx
import jiwer
import openai
import pytest
from whisper_normalizer.english import EnglishTextNormalizer

from streamer.config import load_settings
from streamer.server.app import create_app, running

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
KEY = "sk-wire-test"
normalize = EnglishTextNormalizer()


@pytest.fixture(scope="module")
def base(engine):
    with running(create_app(load_settings({}, server={"api_key": KEY}), engine)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def jfk(jfk_path):
    with open(jfk_path, "rb") as f:
        return ("jfk.ogg", f.read())


@pytest.fixture(scope="module")
def short(audio_dir):
    """A 3-s prompt (decodes faster than jfk, for the tests that only need a transcript)."""
    with open(audio_dir / "en" / "asterisk" / "agent-newlocation.ogg", "rb") as f:
        return ("prompt.ogg", f.read()), "Please enter a new extension, followed by pound."


def test_not_audio_and_empty_uploads_are_bad_requests(client):
    for upload in (("notes.txt", b"not audio at all" * 100), ("empty.wav", b"")):
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.transcriptions.create(file=upload, model="whisper-1")
        assert info.value.status_code == 400
        assert info.value.body["type"] == "invalid_request_error" and info.value.body["param"] == "file"
        assert info.value.request_id and info.value.request_id.startswith("req_")


def test_unknown_paths_and_methods_answer_json(client, base):
    with pytest.raises(openai.NotFoundError) as info:
        client.get("/nope", cast_to=object)
    assert info.value.body["code"] == "unknown_url"
    for method, path, allow in (("get", "/audio/transcriptions", "POST"), ("put", "/models", "GET"),
                                ("delete", "/audio/translations", "POST")):
        with pytest.raises(openai.APIStatusError) as info:
            getattr(client, method)(path, cast_to=object)
        assert info.value.status_code == 405, (method, path)
        assert info.value.response.headers["content-type"] == "application/json"
        assert info.value.response.headers["allow"] == allow
        assert info.value.body["code"] == "method_not_allowed" and info.value.body["type"] == "invalid_request_error"
    # Outside /v1 the demo page's static files keep their own answers.
    assert httpx.get(base + "/").status_code == 200


def test_a_bad_key_is_invalid_api_key(base, jfk):
    wrong = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.models.list()
    assert info.value.code == "invalid_api_key" and info.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        wrong.audio.transcriptions.create(file=jfk, model="whisper-1")


def test_every_response_has_a_request_id(client, base):
    raw = client.models.with_raw_response.list()
    assert raw.headers["x-request-id"].startswith("req_")
    ids = {client.models.with_raw_response.list().headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3  # one per request
    assert httpx.get(base + "/health").headers["x-request-id"].startswith("req_")
    assert httpx.get(base + "/v1/models").headers["x-request-id"]  # the 401 too


def test_logprobs(client, jfk):
    r = client.audio.transcriptions.create(file=jfk, model="whisper-1", response_format="json", include=["logprobs"])
    assert jiwer.wer(normalize(JFK), normalize(r.text)) < 0.1
    assert r.logprobs and len(r.logprobs) > 15
    assert "".join(lp.token for lp in r.logprobs).strip() == r.text
    assert all(lp.logprob <= 0 and bytes(int(b) for b in lp.bytes).decode() == lp.token for lp in r.logprobs)
    assert sum(lp.logprob for lp in r.logprobs) / len(r.logprobs) > -1.0  # a clean recording
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(file=jfk, model="whisper-1", response_format="text", include=["logprobs"])
    assert info.value.body["param"] == "include"


def test_logprobs_are_streamed_as_openai_does(client, jfk):
    """`include[]=logprobs` with `stream=true` was accepted and its logprobs never sent. OpenAI's
    `transcript.text.delta` and `transcript.text.done` events carry them (`logprobs`: token, logprob,
    bytes): each delta has its own text's tokens, the done event all of them, the same as the json
    response's; without `include`, no event has any."""
    events = list(client.audio.transcriptions.create(file=jfk, model="whisper-1", stream=True, include=["logprobs"]))
    deltas, done = events[:-1], events[-1]
    assert deltas and done.type == "transcript.text.done"
    for delta in deltas:
        assert delta.logprobs and "".join(lp.token for lp in delta.logprobs).strip() == delta.delta.strip()
    streamed = [(lp.token, lp.logprob, lp.bytes) for delta in deltas for lp in delta.logprobs]
    assert [(lp.token, lp.logprob, lp.bytes) for lp in done.logprobs] == streamed
    whole = client.audio.transcriptions.create(file=jfk, model="whisper-1", include=["logprobs"])
    assert [(lp.token, lp.logprob, lp.bytes) for lp in whole.logprobs] == streamed and whole.text == done.text
    plain = list(client.audio.transcriptions.create(file=jfk, model="whisper-1", stream=True))
    assert all(getattr(e, "logprobs", None) is None for e in plain)


def test_chunking_strategy(client, short):
    upload, text = short
    for strategy in ("auto", {"type": "server_vad", "prefix_padding_ms": 300, "silence_duration_ms": 500,
                              "threshold": 0.5}):
        r = client.audio.transcriptions.create(file=upload, model="whisper-1", chunking_strategy=strategy)
        assert jiwer.wer(normalize(text), normalize(r.text)) < 0.2, r.text
        assert getattr(r, "logprobs", None) is None  # only on request
    for bad in ({"type": "semantic"}, {"type": "server_vad", "threshold": 2}, "sometimes"):
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.transcriptions.create(file=upload, model="whisper-1", chunking_strategy=bad)
        assert info.value.body["param"] == "chunking_strategy"


def test_model_is_required(base, jfk):
    r = httpx.post(base + "/v1/audio/transcriptions", files={"file": jfk}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert r.json()["error"]["code"] == "missing_required_parameter"
