"""API-key check: `Authorization: Bearer KEY` (or Deepgram's `Token KEY`) header, `?api_key=KEY`
query parameter, or (WebSocket) the subprotocol `openai-insecure-api-key.KEY` that OpenAI's
browser clients offer.

HTTP requests are checked by `AuthMiddleware` (401 in OpenAI's error shape). WebSockets pass
through it: a browser sees nothing of a refused handshake, so each WebSocket protocol accepts
first, checks `authorized(scope, key)` and sends its own error event before closing (1008).
"""

from __future__ import annotations

import hmac
from typing import Iterable
from urllib.parse import parse_qs

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send


KEY_SUBPROTOCOL = "openai-insecure-api-key."
"""Prefix of the WebSocket subprotocol that carries a key (browsers cannot set headers)."""


def presented_key(scope: Scope) -> str | None:
    """The key a request carries, header first; None when it carries none."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() in ("bearer", "token") and token.strip():
                return token.strip()
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("api_key")
    if values:
        return values[0]
    for offered in scope.get("subprotocols", ()):
        if offered.startswith(KEY_SUBPROTOCOL) and len(offered) > len(KEY_SUBPROTOCOL):
            return offered[len(KEY_SUBPROTOCOL):]
    return None


def authorized(scope: Scope, api_key: str | None) -> bool:
    """True when no key is configured or the request presents it (constant-time comparison)."""
    if not api_key:
        return True
    key = presented_key(scope)
    return key is not None and hmac.compare_digest(key.encode(), api_key.encode())


def error_body(message: str, code: str, *, type_: str = "invalid_request_error", param: str | None = None) -> dict:
    """OpenAI's error shape, used by every HTTP error of the gateway."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class AuthMiddleware:
    """Refuses HTTP requests without the key under `protected_prefixes`; `/health` and the
    static demo page lie outside them and stay open."""

    def __init__(self, app: ASGIApp, api_key: str | None, protected_prefixes: Iterable[str] = ("/v1/", "/metrics"),
                 on_refused=None):
        self.app = app
        self.api_key = api_key
        self.protected_prefixes = tuple(protected_prefixes)
        self.on_refused = on_refused
        """Called with no arguments on each refusal (metrics)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.protected_prefixes) \
                and not authorized(scope, self.api_key):
            if self.on_refused is not None:
                self.on_refused()
            body = error_body("missing or wrong API key: send `Authorization: Bearer KEY` or `?api_key=KEY`",
                              "invalid_api_key")
            await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        await self.app(scope, receive, send)
