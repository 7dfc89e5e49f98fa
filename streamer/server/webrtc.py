"""WebRTC ingest (docs/protocol.md, section 3): `POST /v1/webrtc/offer`, `GET /v1/webrtc/config`.

One aiortc `RTCPeerConnection` per offer. The client's audio track (Opus) is decoded by aiortc,
resampled to 16 kHz mono and fed to a `Bridge`; the `/v1/stream` events go back as JSON text on
the data channel `events` that the client created, whose messages are the native protocol's
(`protocols/native.py`: `DataChannelProtocol`, `session_message`). Signalling is one request
with the complete offer (no trickle ICE): aiortc gathers its candidates before
`setLocalDescription` returns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time

import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from streamer.audio import SAMPLE_RATE
from streamer.audio.decode import audio_resampler
from streamer.protocols.native import DataChannelProtocol, DecodeFailed, Flush, Output, Stop, session_message
from streamer.protocols.outputs import Close, Send
from streamer.protocols.start import ModelInfo, ProtocolError, StartOptions, parse_start
from streamer.protocols.validation import ValidationError, parse_json
from streamer.server.auth import error_body
from streamer.server.bridge import StreamEvent
from streamer.server.state import ServerState
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")

CHANNEL = "events"
IDLE_CHECK_S = 1.0
DRAIN_POLL_S = 0.02
DRAIN_LIMIT_S = 2.0
"""Before closing the peer connection, wait this long at most for the data channel to send
what it holds (`closed` must reach the client)."""
MAX_OFFER_BYTES = 256 * 1024
"""Largest offer body (an SDP offer is a few KB): read no further than this."""


def _error(status: int, code: str, message: str, param: str | None = None, headers: dict | None = None,
           state: ServerState | None = None) -> JSONResponse:
    if state is not None:
        state.metrics.errors.labels(code).inc()
    type_ = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(error_body(message, code, type_=type_, param=param), status_code=status, headers=headers)


class WebRtcStream:
    """One peer connection: audio track in, events out on the data channel."""

    transport = "webrtc"

    def __init__(self, state: ServerState, start: StartOptions, address: str | None = None):
        self.state = state
        self.session_id = secrets.token_hex(8)
        self.address = address
        self._counted = True
        """`address` is counted in `state.clients` (offer_endpoint acquired it) until close()."""
        model = ModelInfo.of(state.engine)
        self.protocol = DataChannelProtocol(state.settings.streaming, model, start)
        self.language = model.decoder_language(start.streaming.language)
        session = Session(start.streaming, state.vad)
        self.bridge = state.bridge(session, self._emit, session_id=self.session_id, language=self.language,
                                   task=start.streaming.task)
        servers = [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
                   for s in state.ice_servers]
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=servers))
        self.channel = None
        self._pending: list[dict] = []
        """Messages made before the data channel opened."""
        self._resampler = audio_resampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        self._last_activity = time.monotonic()
        self._ending = False
        self._tasks: set[asyncio.Task] = set()
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_connection_state)

    async def answer(self, sdp: str) -> RTCSessionDescription:
        """Take the client's offer; the answer holds all of the server's candidates."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        self._spawn(self._watch_idle())
        return self.pc.localDescription

    async def shutdown(self, grace_s: float) -> None:
        await self._end("shutdown", grace_s)

    # --- media and messages -------------------------------------------------------------------------

    def _on_track(self, track) -> None:
        if track.kind == "audio":
            self._spawn(self._read_audio(track))

    async def _read_audio(self, track) -> None:
        while not self._ending:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if self._ending:  # audio still in flight after `stop` is dropped
                return
            self._last_activity = time.monotonic()
            pcm = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
            if pcm:
                self.bridge.feed(np.concatenate(pcm).astype(np.float32, copy=False))

    def _on_datachannel(self, channel) -> None:
        if channel.label != CHANNEL:
            return
        self.channel = channel
        channel.on("message", self._on_message)
        self._carry_out(self.protocol.started(self.session_id, self.protocol.start, self.language, None))
        for message in self._pending:
            self._send(message)
        self._pending.clear()

    def _on_message(self, data) -> None:
        self._last_activity = time.monotonic()
        try:
            self._carry_out(self.protocol.receive_text(data) if isinstance(data, str) else self.protocol.receive_bytes(data))
        except Exception as e:  # a bug: the message is refused, the stream goes on
            log.exception("webrtc %s: internal error on a client message", self.session_id)
            self._send({"type": "error", "code": "internal", "message": f"internal error: {type(e).__name__}"})

    def _carry_out(self, outputs: list[Output]) -> None:
        for out in outputs:
            if isinstance(out, Send):
                self._send(out.message)
            elif isinstance(out, Stop):
                self._spawn(self._end("stop", self.state.settings.server.finish_timeout_s))
            elif isinstance(out, Flush):
                self.bridge.flush()
            elif not isinstance(out, Close):  # (the peer connection closes once the channel has drained)
                raise RuntimeError(f"the data channel's protocol asked for {out!r}")

    def _emit(self, event: StreamEvent) -> None:
        message = session_message(event, None)
        if isinstance(message, DecodeFailed):
            self._spawn(self._fail(message.message))
        elif message is not None:
            self._send(message)

    def _send(self, message: dict) -> None:
        if message.get("type") == "error":
            self.state.metrics.errors.labels(message["code"]).inc()
        if self.channel is None:
            self._pending.append(message)
        elif self.channel.readyState == "open":
            self.channel.send(json.dumps(message))

    # --- ending -------------------------------------------------------------------------------------

    async def _watch_idle(self) -> None:
        idle = self.state.settings.server.idle_timeout_s
        while not self._ending:
            await asyncio.sleep(min(IDLE_CHECK_S, idle))
            if time.monotonic() - self._last_activity > idle:
                await self._end("idle_timeout", self.state.settings.server.finish_timeout_s)
                return

    async def _end(self, reason: str, timeout: float) -> None:
        """Finalise, send `closed` and close the peer connection (once)."""
        if self._ending:
            return
        self._ending = True
        try:
            await self.bridge.finish(timeout)
            self._carry_out(self.protocol.close(reason))
            await self._drain_channel()
        finally:
            await self.close()

    async def _fail(self, message: str) -> None:
        """A fatal error, as on `/v1/stream`: `error` (internal), `closed` (error), then close."""
        if self._ending:
            return
        self._ending = True
        self.bridge.close()
        self._carry_out(self.protocol.fail("internal", message, 1011))
        try:
            await self._drain_channel()
        finally:
            await self.close()

    async def _drain_channel(self) -> None:
        give_up = time.monotonic() + DRAIN_LIMIT_S
        while self.channel is not None and self.channel.readyState == "open" and self.channel.bufferedAmount > 0 \
                and time.monotonic() < give_up:
            await asyncio.sleep(DRAIN_POLL_S)

    def _on_connection_state(self) -> None:
        # The client closed the connection or it failed: the session ends without events.
        if self.pc.connectionState in ("failed", "closed") and not self._ending:
            self._ending = True
            self.bridge.close()
            self._spawn(self.close())

    async def close(self) -> None:
        self.state.release(self)
        if self._counted:
            self._counted = False
            self.state.clients.release(self.address)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        await self.pc.close()

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def config_endpoint(request: Request) -> JSONResponse:
    return JSONResponse({"iceServers": request.app.state.streamer.ice_servers})


async def offer_endpoint(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.streamer
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_OFFER_BYTES:
            return _error(413, "too_large", f"an offer may hold at most {MAX_OFFER_BYTES} bytes", state=state)
    try:
        body = parse_json(raw)
    except ValidationError:
        return _error(400, "bad_sdp", "the body must be JSON: {sdp, type, start}", state=state)
    if not isinstance(body, dict) or body.get("type") != "offer" or not isinstance(body.get("sdp"), str):
        return _error(400, "bad_sdp", "expected {\"type\": \"offer\", \"sdp\": \"...\"}", state=state)
    sdp = body["sdp"]
    if "m=audio" not in sdp or "m=application" not in sdp:
        return _error(400, "bad_sdp", "the offer needs an audio track and the data channel `events` "
                                      "(create it before createOffer())", state=state)
    start_fields = body.get("start") or {}
    if not isinstance(start_fields, dict):
        return _error(400, "bad_field", "start must be an object", "start", state=state)
    model = ModelInfo.of(state.engine)
    try:
        start = parse_start(start_fields, state.settings.streaming, model.multilingual, model.languages, audio_fields=False)
    except ProtocolError as e:
        return _error(400, e.code, e.message, e.field, state=state)
    if (refusal := state.engine_refusal()) is not None:
        return _error(503, refusal.code, refusal.reason, headers={"Retry-After": str(max(1, round(refusal.retry_after_s)))},
                      state=state)
    address = request.client.host if request.client else None
    refusal = state.clients.acquire(address, state.settings.server.max_connections_per_client)
    if refusal is not None:
        return _error(503, "overloaded", refusal, headers={"Retry-After": "5"}, state=state)
    stream = WebRtcStream(state, start, address)
    refusal = state.admit(stream)
    if refusal is not None:
        await stream.close()
        return _error(503, refusal.code, refusal.reason, headers={"Retry-After": str(max(1, round(refusal.retry_after_s)))},
                      state=state)
    try:
        answer = await stream.answer(sdp)
    except Exception as e:
        await stream.close()
        if isinstance(e, (ValueError, AssertionError)):  # aiortc's complaints about an offer it cannot use
            return _error(400, "bad_sdp", f"unusable offer: {e}", state=state)
        log.exception("webrtc offer failed")
        return _error(500, "internal", f"internal error: {type(e).__name__}", state=state)
    return JSONResponse({"sdp": answer.sdp, "type": answer.type, "session_id": stream.session_id})


routes = [
    Route("/v1/webrtc/config", config_endpoint, methods=["GET"]),
    Route("/v1/webrtc/offer", offer_endpoint, methods=["POST"]),
]
