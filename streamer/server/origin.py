"""Which web pages may use the server: `Origin` checks on WebSocket handshakes, CORS for HTTP, and
a `Host` check on loopback binds (DNS rebinding).

Without them, with no API key (the default), any page the user visits could open `/v1/stream` on
the local server or post uploads to it. The rules, for HTTP and WebSocket alike:

- A request without `Origin` passes (SDKs, pipelines, curl, and a browser's own navigation).
- `Origin` must be the server's own origin (scheme and `Host` of the request), or one of
  `ALLOWED_ORIGINS` (`*`: any). Otherwise HTTP answers 403 in OpenAI's error shape and a
  WebSocket handshake is refused with 403 (a hostile page learns nothing).
- A server bound to a loopback address answers only to loopback names in `Host` (`localhost`,
  `127.0.0.1`, `[::1]`, `*.localhost`) or the hosts of `ALLOWED_ORIGINS`: a rebinding attacker's
  `Host: evil.example` is refused (403, `invalid_host`), even when origins are open.
- A cross-origin HTTP request that is allowed gets CORS headers; preflights (OPTIONS) are answered here.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from streamer.server.auth import error_body

PREFLIGHT_MAX_AGE_S = 600
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether a bind address or host name is loopback-only."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def normalize(origin: str) -> str | None:
    """`scheme://host[:port]`, lower case, default ports dropped; None if it is not an origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


def host_name(host_header: str) -> str:
    """The name part of a `Host` header (`[::1]:8000` -> `::1`)."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0].lower()
    return host_header.rsplit(":", 1)[0].lower() if host_header.count(":") == 1 else host_header.lower()


class OriginPolicy:
    """`ALLOWED_ORIGINS` and the bind address, as one decision per request."""

    def __init__(self, allowed_origins: str, bind_host: str):
        items = [o.strip() for o in allowed_origins.split(",") if o.strip()]
        self.any_origin = "*" in items
        self.origins = {n for o in items if o != "*" and (n := normalize(o)) is not None}
        self.check_host = is_loopback(bind_host)
        self.hosts = {urlsplit(o).hostname for o in self.origins}

    def host_allowed(self, host_header: str | None) -> bool:
        if not self.check_host or host_header is None:
            return True
        name = host_name(host_header)
        return is_loopback(name) or name in self.hosts

    def own_origin(self, scope: Scope, host_header: str | None) -> str | None:
        scheme = {"ws": "http", "wss": "https"}.get(scope.get("scheme", "http"), scope.get("scheme", "http"))
        return normalize(f"{scheme}://{host_header}") if host_header else None

    def origin_allowed(self, origin: str, scope: Scope, host_header: str | None) -> bool:
        if self.any_origin:
            return True
        n = normalize(origin)
        return n is not None and (n in self.origins or n == self.own_origin(scope, host_header))


class OriginMiddleware:
    def __init__(self, app: ASGIApp, policy: OriginPolicy, on_refused=None):
        self.app = app
        self.policy = policy
        self.on_refused = on_refused
        """Called with the error code on each refusal (metrics)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host, origin = headers.get("host"), headers.get("origin")
        refusal = None
        if not self.policy.host_allowed(host):
            refusal = ("invalid_host", f"Host {host!r} is not served here (loopback server: use localhost or "
                                       "127.0.0.1, or list the origin in ALLOWED_ORIGINS)")
        elif origin is not None and not self.policy.origin_allowed(origin, scope, host):
            refusal = ("origin_not_allowed", f"pages from {origin!r} may not use this server (ALLOWED_ORIGINS)")
        if refusal is not None:
            if self.on_refused is not None:
                self.on_refused(refusal[0])
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403
            else:
                await JSONResponse(error_body(refusal[1], refusal[0]), status_code=403)(scope, receive, send)
            return
        cross = (scope["type"] == "http" and origin is not None
                 and normalize(origin) != self.policy.own_origin(scope, host))
        if not cross:
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await Response(status_code=204, headers={
                **self._cors(origin),
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": headers.get("access-control-request-headers", "authorization"),
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
            })(scope, receive, send)
            return

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + [
                    (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self._cors(origin).items()]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    @staticmethod
    def _cors(origin: str) -> dict[str, str]:
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Expose-Headers": "x-request-id"}
