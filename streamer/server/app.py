"""The ASGI app and `serve()`: routes, lifespan (engine load, warm-up, graceful shutdown), uvicorn.

Shutdown order: stop accepting connections, finalise every open stream (their finals are
delivered within `shutdown_grace_s`, then `closed`/`shutdown` and close 1001), then let uvicorn
close what is left, then close the engine. uvicorn's own shutdown would close WebSockets first
(1012, no finals), so `GracefulServer` drains the streams before handing over to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable, Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from streamer.audio.vad import SileroVAD
from streamer.config import Settings, model_id, parse_ice_servers
from streamer.server import client_secrets, deepgram, files, realtime, redact, twilio
from streamer.server.accept import SharedAcceptor
from streamer.server.auth import AuthMiddleware, error_body
from streamer.server.metrics import CONTENT_TYPE, Metrics
from streamer.server.openai_http import RequestIdMiddleware, api_fallback
from streamer.server.origin import OriginMiddleware, OriginPolicy
from streamer.server.relay import Peers
from streamer.server.socket_stream import TransportTap
from streamer.server.state import ServerState
from streamer.server.stream import stream_endpoint


if TYPE_CHECKING:
    from streamer.engine.engine import Engine

log = logging.getLogger("streamer.server")

WEB_DIR = Path(__file__).resolve().parents[1] / "web"  # package data: found in a wheel as in a checkout
"""The browser demo, served at `/`."""
LOADING_RETRY_S = 5
"""Retry-After of the API's 503 `loading` while the engine cores load."""
WS_MAX_SIZE_FACTOR = 2
"""The WebSocket layer refuses messages over this multiple of `max_message_bytes` on its own
(close 1009, no event); between 1x and this, the protocol handlers answer `too_large` first."""


async def health(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.streamer
    engine = state.engine
    up = engine is not None and engine.ready
    peers = Peers.of(state.settings.server)
    if state.shutting_down:
        status = "shutting_down"
    elif up:
        status = "ok" if peers is None or peers.all_serving() else "starting"  # the other gateways
    else:
        status = "loading" if engine is None else "engine_down"
    body = {
        "status": status,
        "model": model_id(engine.model_name) if engine is not None else None,
        "device": engine.device if engine is not None else None,
        "sessions": len(state.sessions),
        "gateway_pid": os.getpid(),
        "queue": engine.queue_depth if engine is not None else 0,
    }
    if engine is not None and hasattr(engine, "core_metrics"):
        body["engine_cores"] = [{"core": c.index, "up": c.up, "device": c.ready.device if c.ready else None,
                                 "pid": c.ready.pid if c.ready else None} for c in engine.cores]
    return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)


async def metrics(request: Request) -> Response:
    return Response(request.app.state.streamer.metrics.render(), media_type=CONTENT_TYPE)


async def warm_up(engine: Engine) -> None:
    """One decode of a second of silence, so that the first client does not pay for lazy setup."""
    await asyncio.to_thread(engine.warm_up)


async def _publish_loop_lag(state: ServerState) -> None:
    """Several workers: each writes its own loop lag where every worker's `/metrics` reads it."""
    while True:
        state.metrics.publish()
        await asyncio.sleep(0.5)


def _webrtc():
    """The WebRTC module, or None where aiortc cannot be imported (the other transports still serve)."""
    try:
        from streamer.server import webrtc
    except ImportError as e:
        log.warning("WebRTC ingest disabled: %s", e)
        return None
    return webrtc


async def _connect(state: ServerState, connect: Callable[[], Awaitable]) -> None:
    """The gateway's engine, once every core has said Ready; if they never do, the gateway stops
    (the supervisor then stops the server: a gateway that was never ready)."""
    try:
        state.engine = await connect()
    except Exception:
        log.exception("no engine for this gateway: stopping it")
        signal.raise_signal(signal.SIGTERM)  # uvicorn's own graceful exit
        return
    state.engine_ready.set()


async def _start_decoders(state: ServerState) -> None:
    """A served gateway's upload decoders, started while its engine loads (not at the first upload)."""
    try:
        await state.decoder.start()
    except Exception:  # the first upload tries again, and says what went wrong
        log.exception("upload decoder processes did not start")


class LoadingGate:
    """Until the gateway has its engine, the API (`/v1/...`) answers 503 `loading` with Retry-After (a
    WebSocket is closed with 1013, try again later); `/health`, `/metrics` and the web page serve."""

    def __init__(self, app, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if self.state.engine is not None or scope["type"] not in ("http", "websocket") \
                or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        self.state.metrics.errors.labels("loading").inc()
        if scope["type"] == "websocket":
            await receive()  # websocket.connect; accepted, so that the client sees why (a refused handshake is a 403)
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 1013, "reason": "the model is loading"})
            return
        body = error_body("the model is loading; retry shortly", "loading", type_="server_error")
        await JSONResponse(body, status_code=503, headers={"Retry-After": str(LOADING_RETRY_S)})(scope, receive, send)


def create_app(settings: Settings, engine: Engine | None = None,
                connect: Callable[[], Awaitable] | None = None) -> Starlette:
    """The gateway. With `engine` given (tests), the caller owns it; with `connect`, the
    lifespan awaits it for an engine (a gateway worker's `EngineClient` of the engine cores) and
    closes that at the end; otherwise the lifespan loads, warms up and finally closes one."""
    metrics_ = Metrics(lambda: state.engine.metrics() if state.engine is not None else None,
                       loop_lag=lambda: state.loop_lag.lag,
                       core_metrics=lambda: state.engine.core_metrics() if hasattr(state.engine, "core_metrics") else [],
                       cadence=lambda: state.cadence.interval(time.monotonic()))
    webrtc = _webrtc()
    state = ServerState(settings=settings, engine=engine, vad=SileroVAD.shared(), metrics=metrics_,
                        ice_servers=parse_ice_servers(settings.server.webrtc_ice_servers) if webrtc else [])

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        owned = state.engine is None
        monitors = [asyncio.ensure_future(state.loop_lag.run())]
        if metrics_.multiprocess:
            monitors.append(asyncio.ensure_future(_publish_loop_lag(state)))
        connecting = decoders = None
        if owned and connect is not None:
            # Engine cores can take minutes to load (a large model on a GPU): meanwhile `/health`
            # answers `loading` and the API 503 (`LoadingGate`), instead of leaving connections unanswered.
            connecting = asyncio.ensure_future(_connect(state, connect))
            decoders = asyncio.ensure_future(_start_decoders(state))
        elif owned:
            log.info("loading %s", settings.model.model)
            from streamer.engine.engine import Engine  # only here: a gateway worker imports no torch

            state.engine = await asyncio.to_thread(Engine.load, settings.model, settings.engine)
            await warm_up(state.engine)
            log.info("serving %s", state.engine.model_name)
        if state.engine is not None:
            state.engine_ready.set()
        try:
            yield
        finally:
            if connecting is not None:
                connecting.cancel()
            await state.drain()
            if decoders is not None:  # still starting: stopped before the pool closes
                decoders.cancel()
                await asyncio.gather(decoders, return_exceptions=True)
            state.decoder.close()
            for monitor in monitors:
                monitor.cancel()
            if owned and connect is not None:
                if state.engine is not None:
                    await state.engine.close()
            elif owned:
                await asyncio.to_thread(state.engine.close)

    routes = [
        Route("/health", health),
        Route("/metrics", metrics),
        WebSocketRoute("/v1/stream", stream_endpoint),
        WebSocketRoute("/v1/realtime", realtime.realtime_endpoint),
        WebSocketRoute("/v1/listen", deepgram.listen_endpoint),
        Route("/v1/listen", deepgram.listen_file, methods=["POST"]),
        *twilio.routes,
        *(webrtc.routes if webrtc else []),
        *files.routes,
        *client_secrets.routes,
    ]
    routes += [api_fallback(routes), Mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")]
    refused = lambda: metrics_.errors.labels("unauthorized").inc()  # noqa: E731
    policy = OriginPolicy(settings.server.allowed_origins, settings.server.host)
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[
        Middleware(RequestIdMiddleware),
        Middleware(OriginMiddleware, policy=policy, on_refused=lambda code: metrics_.errors.labels(code).inc()),
        Middleware(TransportTap),
        Middleware(AuthMiddleware, api_key=settings.server.api_key, on_refused=refused),
        Middleware(LoadingGate, state=state),
    ])
    app.state.streamer = state
    return app


class GracefulServer(uvicorn.Server):
    """uvicorn, with the streams drained before its own shutdown closes their sockets.

    `shared_listener`: a listening socket shared with `sharing` gateway processes (this one
    included), accepted from one connection at a time (`server/accept.py`) besides the sockets
    given to `run`."""

    def __init__(self, config: uvicorn.Config, state: ServerState, shared_listener: socket.socket | None = None,
                 sharing: int = 1):
        super().__init__(config)
        self.state = state
        self.shared_listener = shared_listener
        self.sharing = sharing
        self.acceptor: SharedAcceptor | None = None
        self.on_serving: Callable[[], None] | None = None
        """Called once every socket accepts connections."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.shared_listener is not None and not self.should_exit:
            config = self.config

            def protocol() -> asyncio.Protocol:  # what uvicorn's own servers make per connection
                return config.http_protocol_class(config=config, server_state=self.server_state,
                                                  app_state=self.lifespan.state)

            self.acceptor = SharedAcceptor(self.shared_listener, protocol, config.ssl, self.sharing)
            self.acceptor.start()
        if self.on_serving is not None and not self.should_exit:
            self.on_serving()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.acceptor is not None:
            self.acceptor.close()
        for server in self.servers:  # stop accepting before draining (uvicorn does it again, harmlessly)
            server.close()
        await self.state.drain()
        await super().shutdown(sockets)


def build_server(app: Starlette, host: str, port: int, shared_listener: socket.socket | None = None,
                 sharing: int = 1) -> GracefulServer:
    """uvicorn with uvloop and the `websockets` library, limits from the app's settings
    (`shared_listener`, `sharing`: see `GracefulServer`).

    `websockets-sansio` is uvicorn's implementation on the library's current API; its `websockets`
    one runs on the library's deprecated legacy API (same behaviour, tests pass with both)."""
    settings: Settings = app.state.streamer.settings
    config = uvicorn.Config(
        app, host=host, port=port, loop="uvloop", ws="websockets-sansio", lifespan="on",
        ws_max_size=WS_MAX_SIZE_FACTOR * settings.server.max_message_bytes,
        # No permessage-deflate: PCM barely compresses, and inflating every audio message was 3 %
        # of the event loop's time at 128 streams (and deflating them half of the load client's).
        ws_per_message_deflate=False,
        # No keepalive pings from the server: while a stream's socket is not read (backpressure,
        # MAX_BACKLOG_S) the client's pong waits behind its audio in TCP's buffers, and uvicorn's
        # 20-s ping timeout closed such streams with 1011 (a 15-min file sent at 4x, twice). A
        # silent client is closed by IDLE_TIMEOUT_S; a dropped one resumes.
        ws_ping_interval=None, ws_ping_timeout=None,
        timeout_graceful_shutdown=int(settings.server.shutdown_grace_s) + 5, log_level="info",
        ssl_certfile=settings.server.ssl_certfile, ssl_keyfile=settings.server.ssl_keyfile)
    redact.install()  # after uvicorn.Config: it (re)configures the logging handlers
    return GracefulServer(config, app.state.streamer, shared_listener, sharing)


@contextlib.contextmanager
def running(app: Starlette, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` from a background thread (tests, benchmarks); yields its base URL
    (`http://host:port`, `https://` with TLS); on exit, shuts down gracefully as on SIGTERM."""
    server = build_server(app, host, port)
    thread = threading.Thread(target=server.run, name="streamer-uvicorn", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start (see its log)")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    scheme = "https" if server.config.ssl_certfile else "http"
    try:
        yield f"{scheme}://{bound[0]}:{bound[1]}"
    finally:
        server.should_exit = True
        thread.join()


