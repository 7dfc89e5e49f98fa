"""HTTP details that OpenAI's SDKs rely on, for every response of the gateway.

- `x-request-id` on every response (the SDKs expose it as `_request_id` and in errors).
- An unknown path under `/v1/` or a known path with the wrong method answers OpenAI's JSON error
  (404 `unknown_url`, 405 `method_not_allowed` with `Allow`), not the static mount's plain text.
"""

from __future__ import annotations

import secrets

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from streamer.server.auth import error_body

REQUEST_ID_HEADER = b"x-request-id"
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
"""The fallback's methods (Starlette gives a function endpoint GET only unless told)."""


def new_request_id() -> str:
    return "req_" + secrets.token_hex(16)


class RequestIdMiddleware:
    """Adds `x-request-id` to every HTTP response; the id is also in `scope["request_id"]`."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope["request_id"] = request_id

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + [
                    (REQUEST_ID_HEADER, request_id.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def api_fallback(routes: list) -> Route:
    """A route for every other `/v1/...` request: 405 where another method of the path exists, else 404."""

    async def endpoint(request: Request) -> JSONResponse:
        allowed: set[str] = set()
        for route in routes:
            if isinstance(route, Route) and route.matches(request.scope)[0] == Match.PARTIAL:
                allowed |= (route.methods or set()) - {"HEAD"}
        if allowed:
            return JSONResponse(error_body(f"{request.method} is not allowed on {request.url.path}; use "
                                           f"{', '.join(sorted(allowed))}", "method_not_allowed"),
                                status_code=405, headers={"Allow": ", ".join(sorted(allowed))})
        return JSONResponse(error_body(f"unknown URL: {request.method} {request.url.path}", "unknown_url"),
                            status_code=404)

    return Route("/v1/{rest:path}", endpoint, methods=ALL_METHODS)
