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
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from streamer.audio.vad import SileroVAD
from streamer.config import Settings
from streamer.engine.engine import Engine
from streamer.engine.request import DecodeOptions, Priority
from streamer.server import deepgram, files, realtime, twilio
from streamer.server.auth import AuthMiddleware
from streamer.server.metrics import CONTENT_TYPE, Metrics
from streamer.server.state import ServerState
from streamer.server.stream import stream_endpoint

log = logging.getLogger("streamer.server")

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
"""The browser demo, served at `/`."""
WS_MAX_SIZE_FACTOR = 2
"""The WebSocket layer refuses messages over this multiple of `max_message_bytes` on its own
(close 1009, no event); between 1x and this, the protocol handlers answer `too_large` first."""


async def health(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.streamer
    engine = state.engine
    body = {
        "status": "shutting_down" if state.shutting_down else ("ok" if engine is not None else "loading"),
        "model": engine.model_name if engine is not None else None,
        "device": str(next(engine.loaded.model.parameters()).device) if engine is not None else None,
        "sessions": len(state.sessions),
        "queue": engine.scheduler.queue_depth if engine is not None else 0,
    }
    return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)


async def metrics(request: Request) -> Response:
    return Response(request.app.state.streamer.metrics.render(), media_type=CONTENT_TYPE)


async def warm_up(engine: Engine) -> None:
    """One decode of a second of silence, so that the first client does not pay for lazy setup."""
    await engine.transcribe(np.zeros(16000, np.float32), DecodeOptions(), priority=Priority.FINAL)


def _webrtc():
    """The WebRTC module, or None where aiortc cannot be imported (the other transports still serve)."""
    try:
        from streamer.server import webrtc
    except ImportError as e:
        log.warning("WebRTC ingest disabled: %s", e)
        return None
    return webrtc


def create_app(settings: Settings, engine: Engine | None = None) -> Starlette:
    """The gateway. With `engine` given (tests), the caller owns it; otherwise the lifespan loads,
    warms up and finally closes one."""
    metrics_ = Metrics(lambda: state.engine.metrics() if state.engine is not None else None,
                       loop_lag=lambda: state.loop_lag.lag)
    webrtc = _webrtc()
    state = ServerState(settings=settings, engine=engine, vad=SileroVAD(), metrics=metrics_,
                        ice_servers=webrtc.ice_servers_from_env(os.environ) if webrtc else [])

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        owned = state.engine is None
        monitor = asyncio.ensure_future(state.loop_lag.run())
        if owned:
            log.info("loading %s", settings.model.model)
            state.engine = await asyncio.to_thread(Engine.load, settings.model, settings.engine)
            await warm_up(state.engine)
            log.info("serving %s", state.engine.model_name)
        try:
            yield
        finally:
            await state.drain()
            monitor.cancel()
            if owned:
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
        Mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web"),
    ]
    refused = lambda: metrics_.errors.labels("unauthorized").inc()  # noqa: E731
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(AuthMiddleware, api_key=settings.server.api_key, on_refused=refused)])
    app.state.streamer = state
    return app


class GracefulServer(uvicorn.Server):
    """uvicorn, with the streams drained before its own shutdown closes their sockets."""

    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # stop accepting before draining (uvicorn does it again, harmlessly)
            server.close()
        await self.state.drain()
        await super().shutdown(sockets)


def build_server(app: Starlette, host: str, port: int) -> GracefulServer:
    """uvicorn with uvloop and the `websockets` library, limits from the app's settings.

    `websockets-sansio` is uvicorn's implementation on the library's current API; its `websockets`
    one runs on the library's deprecated legacy API (same behaviour, tests pass with both)."""
    settings: Settings = app.state.streamer.settings
    config = uvicorn.Config(
        app, host=host, port=port, loop="uvloop", ws="websockets-sansio", lifespan="on",
        ws_max_size=WS_MAX_SIZE_FACTOR * settings.server.max_message_bytes,
        # No permessage-deflate: PCM barely compresses, and inflating every audio message was 3 %
        # of the event loop's time at 128 streams (and deflating them half of the load client's).
        ws_per_message_deflate=False,
        timeout_graceful_shutdown=int(settings.server.shutdown_grace_s) + 5, log_level="info")
    return GracefulServer(config, app.state.streamer)


@contextlib.contextmanager
def running(app: Starlette, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` from a background thread (tests, benchmarks); yields its base URL
    (`http://host:port`); on exit, shuts down gracefully as on SIGTERM."""
    server = build_server(app, host, port)
    thread = threading.Thread(target=server.run, name="streamer-uvicorn", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start (see its log)")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    try:
        yield f"http://{bound[0]}:{bound[1]}"
    finally:
        server.should_exit = True
        thread.join()


def serve(settings: Settings) -> None:
    """`streamer serve`: load the engine, serve until SIGINT/SIGTERM, shut down gracefully."""
    app = create_app(settings)
    build_server(app, settings.server.host, settings.server.port).run()
