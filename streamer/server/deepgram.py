"""Deepgram's speech-to-text API: `WS /v1/listen` (live) and `POST /v1/listen` (recordings), so
that a pipeline written for Deepgram (its SDKs, Pipecat, LiveKit Agents, Vapi) switches by
changing a URL. docs/protocol.md, section 6.

The transports only: the query parameters, the live messages and the pre-recorded response are
`protocols/deepgram.py`'s (`ListenOptions`, `ListenProtocol`, `file_response`). `DeepgramStream`
hands each WebSocket message to the protocol and carries out its answer (audio into the stream's
bridges, `ChannelStreams`: one, or one per channel with `multichannel`); `listen_file` is the
HTTP endpoint.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from urllib.parse import parse_qs

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket

from streamer.audio import SAMPLE_RATE
from streamer.audio.decode import AudioDecodeError, AudioTooLarge, SpoolError, StreamResampler, pcm_dtype
from streamer.config import model_id
from streamer.engine.errors import EngineClosed, EngineUnavailable
from streamer.engine.request import DecodeOptions
from streamer.engine.scheduler import QueueFull
from streamer.longform import transcribe_long
from streamer.protocols.deepgram import (CloseStream, Finalize, KeepAlive, ListenError, ListenOptions,
                                         ListenProtocol, Output, file_response, parse_options)
from streamer.protocols.outputs import Audio, Close, Send
from streamer.server.bridge import Bridge, Finalized, StreamEvent
from streamer.server.channels import ChannelStreams
from streamer.server.body import BodyStalled, BodyTooLarge, ClientGone, read_body
from streamer.server.files import while_connected
from streamer.server.socket_stream import SocketStream, to_protocol
from streamer.server.state import ServerState
from streamer.server.upload_budget import RETRY_AFTER_S, Hold, Refusal
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")


class DeepgramStream(SocketStream):
    """One `WS /v1/listen` connection: binary audio and control messages in, Deepgram messages out."""

    transport = "deepgram"

    def __init__(self, ws: WebSocket, state: ServerState):
        super().__init__(ws, state, uuid.uuid4().hex[:16])
        self._protocol: ListenProtocol | None = None
        self._channels: ChannelStreams | None = None

    def _send(self, message: dict) -> None:
        if message.get("type") == "Error":
            self.state.metrics.errors.labels(message["variant"]).inc()
        self._outbox.send(message)

    def _refuse(self, kind: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        self._send({"type": "Error", "variant": kind, "description": message, "message": message})
        self._outbox.close(close_code)

    async def _serve(self) -> None:
        tokenizer = self.state.engine.tokenizer
        try:
            options = parse_options(_query(self.ws.scope), self.state.settings.streaming, tokenizer.multilingual,
                                    set(tokenizer.language_tokens), live=True)
        except ListenError as e:
            self._send(e.message_event())
            self._outbox.close(1008)
            return
        protocol = self._protocol = ListenProtocol(options, model_id(self.state.engine.model_name),
                                                   self.state.settings.server.max_message_bytes)

        def make_bridge(channel: int | None) -> Bridge:
            def emit(event: StreamEvent) -> None:
                if isinstance(event, Finalized) and event.error is not None:
                    log.error("deepgram %s: %s", self.session_id, event.error)
                self._carry_out(protocol.on_event(event, channel))

            return self.state.bridge(Session(options.streaming, self.state.vad), emit, session_id=self.session_id,
                                     language=options.language, task="transcribe", word_timestamps=True)

        self._channels = ChannelStreams(rate=options.sample_rate, channels=options.channels,
                                        encoding=options.encoding, multichannel=options.multichannel,
                                        make_bridge=make_bridge)
        self._receiver = asyncio.ensure_future(self._receive_loop())
        await asyncio.wait([self._receiver])
        reason = "shutdown" if self._receiver.cancelled() else self._receiver.result()
        if reason == "disconnect":
            self._channels.close()
            self._outbox.abandon()
            return
        await self._channels.finish(self._finish_within(reason))
        self._carry_out(protocol.close(reason))

    async def _receive_loop(self) -> str:
        """Hand client messages to the protocol until the stream ends; returns why: stop,
        idle_timeout, no_audio or disconnect."""
        while True:
            # A fast sender is held back by TCP, as on /v1/stream.
            await self._channels.wait_for_room(self.state.settings.server.max_backlog_s)
            message = await self._next_message()
            if isinstance(message, str):
                return message
            if self._carry_out(to_protocol(self._protocol, message)):
                return "stop"

    def _carry_out(self, outputs: list[Output]) -> bool:
        """Do what the protocol answered; True at `CloseStream`."""
        for out in outputs:
            if isinstance(out, Send):
                self._send(out.message)
            elif isinstance(out, Close):
                self._outbox.close(out.code)
            elif isinstance(out, Audio):
                self.audio_seen = True
                self._channels.push(out.data)
            elif isinstance(out, Finalize):
                self._carry_out(self._protocol.finalized(self._channels.flush(out.channel), out.channel))
            elif isinstance(out, KeepAlive):
                # As Deepgram: a stream kept alive waits for its audio (`first_audio_timeout_s`
                # is for connections that show no sign of wanting a stream); `idle_timeout_s`
                # still ends one whose client falls silent.
                self.audio_seen = True
            elif isinstance(out, CloseStream):
                return True
        return False


def _query(scope) -> dict[str, list[str]]:
    return parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)


async def listen_endpoint(ws: WebSocket) -> None:
    await DeepgramStream(ws, ws.app.state.streamer).run()


# --- POST /v1/listen ---------------------------------------------------------------------------------

def _decode_raw(body: bytes, options: ListenOptions, max_seconds: float) -> np.ndarray:
    """Headerless audio (`encoding` given) -> [channels, N] at 16 kHz; [1, N], the channels' mean,
    unless `multichannel`, as containers are decoded. Over `max_seconds` is `AudioTooLarge`, as
    for a container."""
    frame = pcm_dtype(options.encoding).itemsize * options.channels
    body = body[: len(body) - len(body) % frame]
    if not body:
        raise ListenError("no audio in the request body", "DATA-0000")
    seconds = len(body) // frame / options.sample_rate
    if seconds > max_seconds:
        raise AudioTooLarge("body", f"{seconds:.1f} s, longer than the {max_seconds:g} s limit", "seconds")
    frames = np.frombuffer(body, np.uint8).reshape(-1, options.channels, frame // options.channels)
    out = []
    for c in range(options.channels):
        resampler = StreamResampler(options.sample_rate, 1, options.encoding)
        data = frames[:, c, :].tobytes()
        out.append(np.concatenate([resampler.push(data), resampler.flush()]))
    audio = np.stack(out)
    return audio if options.multichannel else audio.mean(axis=0, keepdims=True)


async def listen_file(request: Request) -> JSONResponse:
    """`POST /v1/listen`: a recording in the body (any container PyAV reads, or raw audio with
    `encoding`), Deepgram's pre-recorded response shape."""
    state: ServerState = request.app.state.streamer
    request_id = str(uuid.uuid4())

    def refuse(status: int, error: ListenError, retry_after_s: float | None = None) -> JSONResponse:
        state.metrics.errors.labels(error.err_code).inc()  # `streamer_errors_total`, as every endpoint's
        headers = {"Retry-After": str(max(1, round(retry_after_s)))} if retry_after_s is not None else None
        return JSONResponse(error.http_body(request_id), status_code=status, headers=headers)

    engine = state.engine
    if engine is None or state.shutting_down:
        return refuse(503, ListenError("the server is not ready", "SERVICE_UNAVAILABLE"))
    started = time.monotonic()
    limits = state.settings.server
    held: Hold | None = None
    try:
        options = parse_options(_query(request.scope), state.settings.streaming, engine.tokenizer.multilingual,
                                set(engine.tokenizer.language_tokens), live=False)
        if request.headers.get("content-type", "").startswith("application/json"):
            raise ListenError("transcribing a URL needs network access this server does not have: send the "
                              "audio in the body", "INVALID_REQUEST")
        body = await read_body(request, int(limits.max_upload_mb * 2**20), limits.upload_idle_timeout_s)
        if options.encoding is not None:
            audio = await asyncio.to_thread(_decode_raw, bytes(body), options, limits.max_audio_s)
        else:
            audio = await state.decoder.decode(bytes(body), max_seconds=limits.max_audio_s, name="body",
                                               mono=not options.multichannel)
        if audio.ndim == 1:
            audio = audio[None]
        decision = state.upload_budget.reserve(audio.size / SAMPLE_RATE)  # as the file endpoints (files.hold_audio)
        if isinstance(decision, Refusal):
            if decision.retry:
                return refuse(429, ListenError(decision.message, "TOO_MANY_REQUESTS"), retry_after_s=RETRY_AFTER_S)
            return refuse(413, ListenError(decision.message, "PAYLOAD_TOO_LARGE"))
        held = decision
        decode = DecodeOptions(language=options.language)
        transcripts = await while_connected(request, asyncio.gather(*(
            transcribe_long(engine, a, mode=limits.mode, options=decode, word_timestamps=True) for a in audio)))
    except BodyTooLarge:
        return refuse(413, ListenError(f"the body is over the {limits.max_upload_mb:g} MB limit", "PAYLOAD_TOO_LARGE"))
    except BodyStalled:
        return refuse(408, ListenError(f"the upload stalled: no data for {limits.upload_idle_timeout_s:g} s",
                                       "SLOW_UPLOAD"))
    except ClientGone:
        log.info("a /v1/listen client disconnected before its answer: its work is dropped")
        return Response(status_code=400)  # never read: the connection is gone
    except ListenError as e:
        return refuse(400, e)
    except AudioTooLarge as e:
        return refuse(413, ListenError(str(e), "PAYLOAD_TOO_LARGE"))
    except AudioDecodeError as e:
        return refuse(400, ListenError(str(e), "UNSUPPORTED_MEDIA"))
    except SpoolError as e:  # the server's temporary storage (a full disk), not the body
        log.error("a /v1/listen body's decoded samples could not be spooled: %s", e)
        return refuse(500, ListenError("the server could not store the decoded audio", "INTERNAL_SERVER_ERROR"))
    except EngineUnavailable as e:  # an engine core died under the request
        return refuse(503, ListenError(str(e), "SERVICE_UNAVAILABLE"), retry_after_s=5)
    except QueueFull as e:
        return refuse(429, ListenError(str(e), "TOO_MANY_REQUESTS"), retry_after_s=e.retry_after_s)
    except EngineClosed:
        return refuse(503, ListenError("the server is shutting down", "SERVICE_UNAVAILABLE"))
    finally:
        if held is not None:
            held.release()
    duration = audio.shape[1] / SAMPLE_RATE
    state.metrics.observe_file(duration * len(transcripts), time.monotonic() - started)
    body_digest = hashlib.sha256(body).hexdigest()
    return JSONResponse(file_response(transcripts, options, model_id(engine.model_name), request_id, duration, body_digest))
