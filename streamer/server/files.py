"""OpenAI's file endpoints: `POST /v1/audio/transcriptions`, `POST /v1/audio/translations`,
`GET /v1/models`, `GET /v1/models/{id}`.

An upload is read into a spooled temporary file (on disk past 1 MB) with its size counted as it
arrives, decoded by PyAV in a worker thread, then transcribed by `streamer.longform` through the
shared engine at file priority; the temporary file is removed when the request ends, whatever
happens. Errors use OpenAI's shape `{"error": {"message", "type", "param", "code"}}`; the API key
is checked by the app's `AuthMiddleware` (401) before a request gets here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from typing import Awaitable, TypeVar
from dataclasses import dataclass

from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from streamer.audio import SAMPLE_RATE
from streamer.audio.decode import AudioDecodeError, AudioTooLarge, SpoolError
from streamer.config import model_id
from streamer.engine.errors import EngineClosed, EngineUnavailable
from streamer.engine.request import DecodeOptions
from streamer.engine.scheduler import QueueFull
from streamer.longform import MODES, Transcript, transcribe_long
from streamer.longform.transcript import TranscriptSegment, merge_channels
from streamer.longform.formats import FORMATS, MEDIA_TYPES, render
from streamer.protocols import validation as v
from streamer.protocols.outputs import logprobs_wire
from streamer.server.auth import error_body
from streamer.server.body import BodyStalled, BodyTooLarge, ClientGone, limited_receive
from streamer.server.upload_budget import RETRY_AFTER_S, Hold, Refusal

T = TypeVar("T")
log = logging.getLogger("streamer.server")

WHISPER_ALIAS = "whisper-1"
"""OpenAI's model name; clients written for OpenAI send it, and get the served model."""
MAX_PROMPT_BYTES = 64 * 1024
"""Longest `prompt` (UTF-8): Whisper reads only its last 224 tokens, about 1 KB of text, so this is
generous; checked by `_parse`, so that the error names the field."""
MAX_TEXT_PART_BYTES = 4 * MAX_PROMPT_BYTES
"""Largest text part the multipart parser holds (a 400 naming the part past it: `_FormParser`), and
the allowance for the text fields in the body beside the file. Above MAX_PROMPT_BYTES so that a long
prompt reaches `_parse`'s check and its own message. File parts are not limited by it."""
GRANULARITIES = ("segment", "word")
STREAM_FORMATS = ("json", "text")
"""The response formats `stream=true` serves: its events carry the text, nothing else."""
INCLUDES = ("logprobs",)
DEFAULT_TEMPERATURES = DecodeOptions().temperatures
TEMPERATURE_STEP = 0.2
"""A temperature t > 0 starts the fallback there and climbs by this step to 1.0 (openai's CLI)."""
CREATED = int(time.time())
"""`created` of the listed models: when this server started."""


class ApiError(Exception):
    """A request the endpoint refuses; becomes an OpenAI-shaped error response."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 type_: str = "invalid_request_error", retry_after_s: float | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = status, message, code, param, type_
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        headers = None if self.retry_after_s is None else {"Retry-After": str(max(1, round(self.retry_after_s)))}
        return JSONResponse(error_body(self.message, self.code, type_=self.type, param=self.param),
                            status_code=self.status, headers=headers)


@dataclass(frozen=True)
class FileRequest:
    """The validated fields of one upload."""

    upload: UploadFile
    options: DecodeOptions
    response_format: str
    mode: str
    segments: bool
    """Segment timestamps in verbose_json (the default granularity)."""
    words: bool
    """Word timestamps (`timestamp_granularities[]=word`)."""
    stream: bool
    logprobs: bool = False
    """`include[]=logprobs`: the tokens' log probabilities in the json response."""
    multichannel: bool = False
    """Each channel transcribed on its own, then merged in time order (`merge_channels`)."""


# --- endpoints -------------------------------------------------------------------------------------

async def transcriptions(request: Request) -> Response:
    return await _transcribe(request, "transcribe")


async def translations(request: Request) -> Response:
    return await _transcribe(request, "translate")


async def list_models(request: Request) -> Response:
    try:
        engine = _engine(request)
    except ApiError as e:
        return _refuse(request, e)
    return JSONResponse({"object": "list", "data": [_model_card(name) for name in _served_names(engine)]})


async def get_model(request: Request) -> Response:
    try:
        engine = _engine(request)
        name = request.path_params["model"]
        if not _serves(engine, name):
            raise ApiError(404, f"model {name!r} is not served here; served: {', '.join(_served_names(engine))}",
                           "model_not_found", param="model")
    except ApiError as e:
        return _refuse(request, e)
    return JSONResponse(_model_card(name))


routes = [
    Route("/v1/audio/transcriptions", transcriptions, methods=["POST"]),
    Route("/v1/audio/translations", translations, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", get_model, methods=["GET"]),
]


# --- one upload --------------------------------------------------------------------------------------

async def _transcribe(request: Request, task: str) -> Response:
    state = request.app.state.streamer
    limits = state.settings.server
    started = time.monotonic()
    form: FormData | None = None
    held: Hold | None = None
    try:
        engine = _engine(request)
        max_bytes = int(limits.max_upload_mb * 2**20)
        form = await _read_form(request, max_bytes, limits.upload_idle_timeout_s)
        req = _parse(form, engine, task, limits.mode)
        audio = await _decode(state, req.upload, limits.max_audio_s, max_bytes, not req.multichannel)
        held = hold_audio(state, audio)
        await form.close()  # the samples are in memory now: the temporary file can go
        form = None
        run = dict(mode=req.mode, options=req.options, word_timestamps=req.words)
        if req.stream and not req.multichannel:
            deltas: asyncio.Queue = asyncio.Queue()
            task = await _start_stream(engine, audio, run, deltas, held)
            held = None  # the task holds the samples now, and releases them when it ends
            events = _events(task, deltas, state, started, limits.sse_keepalive_s,
                             engine.tokenizer if req.logprobs else None)
            weakref.finalize(events, task.cancel)  # a client that left before the first event: stop decoding
            return StreamingResponse(events,
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        if req.multichannel:
            # The channels' windows go to the engine together and share its steps.
            transcripts = await while_connected(request, asyncio.gather(*(transcribe_long(engine, channel, **run)
                                                                          for channel in audio)))
            transcript = merge_channels(list(transcripts))
        else:
            transcript = await while_connected(request, transcribe_long(engine, audio, **run))
        _observe(state, transcript, started)
        body = render(transcript, req.response_format, segments=req.segments, words=req.words)
        if req.logprobs:
            body["logprobs"] = _logprobs(transcript, engine.tokenizer)
        if isinstance(body, dict):
            return JSONResponse(body)
        return Response(body, media_type=MEDIA_TYPES[req.response_format])
    except ApiError as e:
        return _refuse(request, e)
    except QueueFull as e:
        return _refuse(request, ApiError(429, f"the server is busy, try again shortly ({e})", "rate_limit_exceeded",
                                         type_="rate_limit_error", retry_after_s=e.retry_after_s))
    except EngineClosed:
        return _refuse(request, _shutting_down())
    except EngineUnavailable as e:
        return _refuse(request, _unavailable(e))
    except ClientGone:
        log.info("an upload's client disconnected before its answer: its work is dropped")
        return Response(status_code=400)  # never read: the connection is gone
    finally:
        if held is not None:
            held.release()
        if form is not None:
            await form.close()


def hold_audio(state, audio) -> Hold:
    """`audio`'s seconds (every channel) reserved in the gateway's `UploadBudget`; 429 with
    Retry-After when other uploads hold too much now, 413 when it is over the whole budget. Refused
    at once, not queued: waiting would hold the decoded samples the budget is there to bound."""
    decision = state.upload_budget.reserve(audio.size / SAMPLE_RATE)
    if isinstance(decision, Refusal):
        if decision.retry:
            raise ApiError(429, decision.message, "rate_limit_exceeded", param="file", type_="rate_limit_error",
                           retry_after_s=RETRY_AFTER_S)
        raise ApiError(413, decision.message, "audio_too_long", param="file")
    return decision


class _FirstSubmit:
    """The engine, with `accepted` set once it has taken a window of the recording."""

    def __init__(self, engine):
        self._engine = engine
        self.accepted = asyncio.Event()

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def submit(self, *args, **kwargs):
        handle = self._engine.submit(*args, **kwargs)  # raises QueueFull
        self.accepted.set()
        return handle


async def _start_stream(engine, audio, run: dict, queue: asyncio.Queue, held: Hold) -> asyncio.Task:
    """The transcription of a streamed response, started, each batch of its final segments put on
    `queue` as (text, [(token, logprob)]) (None when it ends), `held` released when it ends however
    it does. Returns once the engine has taken its first window or it has ended, so that a
    refused recording (QueueFull, EngineClosed, EngineUnavailable) is still an HTTP error with its
    status (429 with Retry-After), not an error event after a 200."""
    watched = _FirstSubmit(engine)
    task = asyncio.ensure_future(transcribe_long(
        watched, audio, on_segments=lambda segments: queue.put_nowait(_batch(segments)), **run))
    task.add_done_callback(lambda _: queue.put_nowait(None))
    task.add_done_callback(lambda _: held.release())
    accepted = asyncio.ensure_future(watched.accepted.wait())
    try:
        await asyncio.wait({task, accepted}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        accepted.cancel()
    if task.done() and not task.cancelled() and task.exception() is not None:
        task.result()  # raises the refusal
    return task


def _batch(segments: list[TranscriptSegment]) -> tuple[str, list[tuple[int, float]]]:
    """A batch of final segments as the stream sends it: their text, and their (token, log
    probability) pairs; taken when it comes (the segments are the transcript's, and not frozen)."""
    return "".join(s.text for s in segments), [pair for s in segments for pair in zip(s.tokens, s.token_logprobs)]


async def _events(task: asyncio.Task, queue: asyncio.Queue, state, started: float, keepalive_s: float, tok=None):
    """Server-sent events: `transcript.text.delta` per batch of final segments (a decoded window;
    with `accurate`'s vote, what it has made final), in order, then
    `transcript.text.done`; an error after the response began comes as an `error` event; a comment
    line after `keepalive_s` without an event. With `tok` (`include[]=logprobs`), each event carries
    OpenAI's `logprobs` of its text's tokens, as OpenAI's do."""
    first = True
    try:
        while True:
            try:  # (a get cancelled by the timeout loses no item: wait_for returns one that came meanwhile)
                batch = await asyncio.wait_for(queue.get(), keepalive_s)
            except asyncio.TimeoutError:
                yield KEEPALIVE
                continue
            if batch is None:
                break
            delta, tokens = batch
            if first:
                delta, first = delta.lstrip(), False
            if delta:
                event = {"type": "transcript.text.delta", "delta": delta}
                if tok is not None:
                    event["logprobs"] = logprobs_wire(tok.token_bytes, tokens)
                yield _sse(event)
        try:
            transcript = task.result()
        except (QueueFull, EngineClosed, EngineUnavailable) as e:
            error = (_shutting_down() if isinstance(e, EngineClosed) else _unavailable(e)
                     if isinstance(e, EngineUnavailable) else ApiError(429, str(e), "rate_limit_exceeded"))
            state.metrics.errors.labels(error.code).inc()
            yield _sse(error_body(error.message, error.code, type_=error.type))
            return
        _observe(state, transcript, started)
        done = {"type": "transcript.text.done", "text": transcript.text}
        if tok is not None:
            done["logprobs"] = _logprobs(transcript, tok)
        yield _sse(done)
    finally:
        task.cancel()  # the client went away: stop decoding its windows


KEEPALIVE = ": keep-alive\n\n"
"""An SSE comment: ignored by clients (the `openai` SDKs' parsers included), it keeps proxies from
closing a response that has had nothing to say for a while."""


def _sse(event: dict) -> str:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


async def while_connected(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled (with its engine windows) if the client disconnects first: uvicorn does not
    cancel a handler whose client left, whose windows would otherwise decode for nobody. The body has
    been read, so the next ASGI message is the disconnect."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientGone()
    return task.result()


async def _read_form(request: Request, max_bytes: int, idle_timeout_s: float) -> FormData:
    """The multipart form, its file spooled to a temporary file, under `body.limited_receive`'s
    limits: 413 as soon as the body passes `max_bytes` (declared or counted), 408 when it stalls
    for `idle_timeout_s`, `ClientGone` when the client leaves. On every failure the temporary file
    is closed (so removed) at once."""
    too_large = ApiError(413, f"the upload is larger than the {max_bytes / 2**20:g} MB limit", "file_too_large",
                         param="file")
    try:  # the form's text fields ride along with the file
        limited = limited_receive(request, max_bytes + MAX_TEXT_PART_BYTES, idle_timeout_s)
    except BodyTooLarge:
        raise too_large from None
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "send the audio as multipart/form-data with a `file` field", "invalid_request")
    failure: Exception | None = None

    async def receive():
        # Failures are raised as MultiPartException: the only exception on which Starlette's
        # parser closes the files it has opened.
        nonlocal failure
        try:
            return await limited()
        except BodyTooLarge:
            failure = too_large
        except BodyStalled:
            failure = ApiError(408, f"the upload stalled: no data for {idle_timeout_s:g} s", "upload_timeout",
                               param="file")
        except ClientGone as e:
            failure = e
        raise MultiPartException(str(failure))

    try:
        async with contextlib.aclosing(Request(request.scope, receive).stream()) as stream:
            return await _FormParser(request.headers, stream, max_files=1, max_fields=32,
                                     max_part_size=MAX_TEXT_PART_BYTES).parse()
    except MultiPartException as e:  # ours, or Starlette's multipart errors
        if failure is not None:
            raise failure from None
        if isinstance(e, PartTooLarge) and e.field:
            raise ApiError(400, f"the text field `{e.field}` is larger than {MAX_TEXT_PART_BYTES // 1024} KB, the "
                                "limit of a text field", "invalid_value", param=e.field) from None
        raise ApiError(400, f"malformed multipart body: {e.message}", "invalid_request") from None


class PartTooLarge(MultiPartException):
    """A text part over the parser's `max_part_size`; `field` is its name ("" if unknown)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


class _FormParser(MultiPartParser):
    """Starlette's multipart parser, its part-size error naming the part: Starlette's own ("Part
    exceeded maximum size of 256KB.") does not, and the client had to guess which field it was."""

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        try:
            super().on_part_data(data, start, end)
        except MultiPartException as e:
            # Only a text part's size is checked here. Starlette 1.10 keeps the part being read in
            # `_current_part` (set from its Content-Disposition); without it, the error is unnamed.
            field = getattr(getattr(self, "_current_part", None), "field_name", "")
            raise PartTooLarge(e.message, field) from None


def _parse(form: FormData, engine, task: str, default_mode: str) -> FileRequest:
    def text(name: str, default: str | None = None) -> str | None:
        value = form.get(name)
        if value is None or (isinstance(value, str) and value.strip() == ""):
            return default
        if not isinstance(value, str):
            raise ApiError(400, f"`{name}` must be a text field, not a file", "invalid_value", param=name)
        return value.strip()

    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise ApiError(400, "`file` is required: the audio file to transcribe", "missing_file", param="file")
    tok = engine.tokenizer
    served = _served_names(engine)
    model = text("model")
    if model is None:  # as OpenAI: the SDKs always send one
        raise ApiError(400, f"`model` is required; use one of: {', '.join(served)}", "missing_required_parameter",
                       param="model")
    if not _serves(engine, model):
        raise ApiError(400, f"model {model!r} is not served here; use one of: {', '.join(served)}",
                       "model_not_found", param="model")
    if task == "translate" and not tok.multilingual:
        raise ApiError(400, f"model {model_id(engine.model_name)!r} is English-only and cannot translate; "
                            "serve a multilingual model (e.g. `base`) for translations", "unsupported_task", param="model")
    response_format = text("response_format", "json")
    if response_format not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}, not {response_format!r}",
                       "invalid_value", param="response_format")
    mode = text("mode", default_mode)
    if mode not in MODES:
        raise ApiError(400, f"mode must be one of {', '.join(MODES)}, not {mode!r}", "invalid_value", param="mode")
    granularities = [g.strip() for key in ("timestamp_granularities[]", "timestamp_granularities")
                     for g in form.getlist(key) if isinstance(g, str) and g.strip()]
    bad = [g for g in granularities if g not in GRANULARITIES]
    if bad:
        raise ApiError(400, f"timestamp_granularities must be among {', '.join(GRANULARITIES)}, not {bad[0]!r}",
                       "invalid_value", param="timestamp_granularities")
    stream = (text("stream", "false") or "false").lower()
    if stream not in ("true", "false"):
        raise ApiError(400, f"stream must be true or false, not {stream!r}", "invalid_value", param="stream")
    # The stream's events carry text only (OpenAI's `transcript.text.delta` / `.done`): a format or
    # word timestamps they cannot carry are refused rather than ignored, so nothing unsent is computed.
    if stream == "true" and "word" in granularities:
        raise ApiError(400, "timestamp_granularities[]=word is not streamed: the events carry text only; "
                            "send stream=false for word timestamps", "invalid_value", param="timestamp_granularities")
    if stream == "true" and response_format not in STREAM_FORMATS:
        raise ApiError(400, f"streaming supports only json and text, not response_format={response_format}; "
                            "send stream=false for it", "invalid_value", param="response_format")
    if granularities and response_format != "verbose_json":
        raise ApiError(400, "timestamp_granularities needs response_format=verbose_json", "invalid_value",
                       param="timestamp_granularities")
    include = [i.strip() for key in ("include[]", "include") for i in form.getlist(key) if isinstance(i, str)]
    bad = [i for i in include if i not in INCLUDES]
    if bad:
        raise ApiError(400, f"include must be among {', '.join(INCLUDES)}, not {bad[0]!r}", "invalid_value",
                       param="include")
    logprobs = "logprobs" in include
    if logprobs and response_format != "json":
        raise ApiError(400, "include=logprobs needs response_format=json", "invalid_value", param="include")
    _chunking_strategy(form)
    multichannel = (text("multichannel", "false") or "false").lower()
    if multichannel not in ("true", "false"):
        raise ApiError(400, f"multichannel must be true or false, not {multichannel!r}", "invalid_value",
                       param="multichannel")
    if multichannel == "true" and stream == "true":
        raise ApiError(400, "multichannel does not stream: send stream=false", "invalid_value", param="stream")
    # OpenAI's translations take no `language` (the source language is detected); like any field
    # an endpoint does not define, it is ignored there, as OpenAI does.
    language = _language(text("language"), tok) if task == "transcribe" else None
    prompt = text("prompt")
    if prompt is not None and len(prompt.encode()) > MAX_PROMPT_BYTES:
        raise ApiError(400, f"prompt is {len(prompt.encode()) / 1024:.0f} KB, over the {MAX_PROMPT_BYTES // 1024} KB "
                            "limit (Whisper reads only its last 224 tokens)", "invalid_value", param="prompt")
    options = DecodeOptions(task=task, language=language, prompt=prompt,
                            temperatures=_temperatures(text("temperature")))
    return FileRequest(upload=upload, options=options, response_format=response_format, mode=mode,
                       segments=not granularities or "segment" in granularities, words="word" in granularities,
                       stream=stream == "true", logprobs=logprobs,
                       multichannel=multichannel == "true")


def _chunking_strategy(form: FormData) -> None:
    """OpenAI's `chunking_strategy`: `auto`, or `{"type": "server_vad", ...}` as JSON text or as
    bracketed fields (`chunking_strategy[type]`). Validated, then served by the long-form
    segmentation (docs/protocol.md, section 4): this server always cuts long audio into windows
    itself, so both values behave alike and the VAD parameters do not change the cuts."""
    fields = {k[len("chunking_strategy["):-1]: v for k, v in form.multi_items()
              if k.startswith("chunking_strategy[") and k.endswith("]") and isinstance(v, str)}
    raw = form.get("chunking_strategy")
    if raw is None and not fields:
        return
    try:
        if isinstance(raw, str) and raw.strip() != "auto":
            value = v.parse_json(raw, "chunking_strategy")
            if not isinstance(value, dict):
                raise v.ValidationError("chunking_strategy", "must be \"auto\" or an object")
            fields = value
        elif raw is not None and not isinstance(raw, str):
            raise v.ValidationError("chunking_strategy", "must be a text field")
        if fields:
            v.choice(fields.get("type"), "chunking_strategy.type", ("server_vad",))
            for name, low, high in (("prefix_padding_ms", 0, 10000), ("silence_duration_ms", 0, 10000)):
                if name in fields:
                    v.number(_form_number(fields[name]), f"chunking_strategy.{name}", low, high, integer=True)
            if "threshold" in fields:
                v.number(_form_number(fields["threshold"]), "chunking_strategy.threshold", 0, 1,
                         open_low=True, open_high=True)
    except v.ValidationError as e:
        raise ApiError(400, f"{e.field}: {e.message}", "invalid_value", param="chunking_strategy") from None


def _form_number(value):
    """A number from a JSON object (as is) or from a bracketed form field (text)."""
    if not isinstance(value, str):
        return value
    try:
        return int(value) if value.strip().lstrip("-").isdigit() else float(value)
    except ValueError:
        return value


def _logprobs(transcript: Transcript, tok) -> list[dict]:
    """OpenAI's `logprobs` of a json transcription: every text token of its segments."""
    return logprobs_wire(tok.token_bytes, (
        pair for segment in transcript.segments for pair in zip(segment.tokens, segment.token_logprobs)))


def _language(language: str | None, tok) -> str | None:
    try:
        return tok.language_code(language)
    except ValueError as e:
        raise ApiError(400, str(e), "invalid_value", param="language") from None


def _temperatures(value: str | None) -> tuple[float, ...]:
    """OpenAI's rule: 0 (the default) lets the server raise the temperature when a decode fails."""
    if value is None:
        return DEFAULT_TEMPERATURES
    try:
        t = v.number_text(value, "temperature", 0.0, 1.0)
    except v.ValidationError as e:
        raise ApiError(400, f"temperature must be a number from 0 to 1: {e.message}", "invalid_value",
                       param="temperature") from None
    if t == 0.0:
        return DEFAULT_TEMPERATURES
    steps = int((1.0 - t) / TEMPERATURE_STEP + 1e-6)
    return tuple(round(t + i * TEMPERATURE_STEP, 6) for i in range(steps + 1))


async def _decode(state, upload: UploadFile, max_seconds: float, max_bytes: int, mono: bool = True):
    """Samples of the upload, decoded in a child process (`server/decoder.py`); 413 over the duration
    limit, 400 when not audio."""
    data = await upload.read()
    try:
        return await state.decoder.decode(data, name=upload.filename or "upload", max_seconds=max_seconds,
                                          max_bytes=max_bytes, mono=mono)
    except AudioTooLarge as e:
        raise ApiError(413, str(e), "audio_too_long" if e.limit == "seconds" else "file_too_large", param="file") from None
    except AudioDecodeError as e:  # OpenAI answers 400 (the SDKs raise BadRequestError)
        raise ApiError(400, str(e), "invalid_file_format", param="file") from None
    except SpoolError as e:  # the server's temporary storage (a full disk), not the file
        log.error("an upload's decoded samples could not be spooled: %s", e)
        raise ApiError(500, "the server could not store the decoded audio; try again later", "server_error",
                       type_="server_error") from None


# --- helpers ----------------------------------------------------------------------------------------

def _engine(request: Request):
    state = request.app.state.streamer
    if state.shutting_down:
        raise _shutting_down()
    if state.engine is None:
        raise ApiError(503, "the model is still loading; try again shortly", "model_loading", type_="server_error")
    return state.engine


def _unavailable(e: Exception) -> ApiError:
    return ApiError(503, f"an engine core stopped; try again shortly ({e})", "engine_unavailable", type_="server_error")


def _shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", "shutting_down", type_="server_error")


def _served_names(engine) -> list[str]:
    """The ids `/v1/models` lists and errors name."""
    return [model_id(engine.model_name), WHISPER_ALIAS]


def _serves(engine, name: str) -> bool:
    """A request may name the model by its id, the alias, or the name it was loaded by (a path)."""
    return name in _served_names(engine) or name == engine.model_name


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": CREATED, "owned_by": "streamer"}


def _refuse(request: Request, error: ApiError) -> JSONResponse:
    metrics = getattr(request.app.state.streamer, "metrics", None)
    errors = getattr(metrics, "errors", None)
    if errors is not None:
        errors.labels(error.code).inc()
    return error.response()


def _observe(state, transcript: Transcript, started: float) -> None:
    state.metrics.observe_file(transcript.duration, time.monotonic() - started)
