"""Realtime client secrets (OpenAI's `POST /v1/realtime/client_secrets`, docs/protocol.md 2.7):
a short-lived key that a backend holding the API key mints for a browser or phone app, which then
opens `/v1/realtime` with it instead of the API key, in a session configured by the backend.

A secret is stateless, so that any gateway worker (or replica sharing `API_KEY`) accepts it:
`ek_` + the payload (its expiry and the session it configures, JSON, base64url) + `.` + an
HMAC-SHA256 of the payload under a key derived from `API_KEY`. It opens Realtime sessions only
(the file endpoints and the other protocols take the API key alone), any number of them until it
expires; a session opened before the expiry runs on past it, as OpenAI's do.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from streamer.protocols import validation as v
from streamer.protocols.realtime import new_id
from streamer.protocols.realtime_session import InvalidValue, RealtimeConfig, parse_update, session_wire
from streamer.protocols.start import ModelInfo
from streamer.protocols.validation import ValidationError
from streamer.server.auth import error_body

PREFIX = "ek_"
DEFAULT_SECONDS = 600
MIN_SECONDS, MAX_SECONDS = 10, 7200
"""OpenAI's default and range of `expires_after.seconds`."""
MAX_SESSION_BYTES = 8192
"""Largest session a secret carries (a browser sends the secret in a WebSocket subprotocol header)."""
MAX_BODY_BYTES = 64 * 1024


class SecretError(Exception):
    """A presented `ek_` key that opens nothing: forged, malformed or expired."""


def _signing_key(api_key: str | None) -> bytes:
    # Derived, so that a secret never reveals anything usable as the API key itself. Without an
    # API key the server is open anyway; the secret then only carries its session.
    return hashlib.sha256(b"streamer realtime client secret\0" + (api_key or "").encode()).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint(api_key: str | None, session: dict | None, expires_at: int) -> str:
    """A secret that opens Realtime sessions configured by `session` (a `session.update`'s
    `session`, already validated) until `expires_at` (Unix seconds)."""
    payload = json.dumps({"exp": expires_at, "session": session}, separators=(",", ":")).encode()
    signature = hmac.new(_signing_key(api_key), payload, hashlib.sha256).digest()
    return f"{PREFIX}{_b64(payload)}.{_b64(signature)}"


def verify(api_key: str | None, presented: str | None, now: float | None = None) -> dict | None:
    """The session a presented key's secret configures (`{}` for none), or None when the key is
    not a client secret at all; raises SecretError for a forged, malformed or expired one."""
    if presented is None or not presented.startswith(PREFIX):
        return None
    body, _, signature = presented[len(PREFIX):].partition(".")
    try:
        payload, mac = _unb64(body), _unb64(signature)
    except (binascii.Error, ValueError):
        raise SecretError("malformed client secret") from None
    if not hmac.compare_digest(mac, hmac.new(_signing_key(api_key), payload, hashlib.sha256).digest()):
        raise SecretError("invalid client secret")
    claims = json.loads(payload)
    if (time.time() if now is None else now) >= claims["exp"]:
        raise SecretError("the client secret has expired")
    return claims["session"] or {}


def initial_config(session: dict, defaults: RealtimeConfig, streaming, model: ModelInfo) -> RealtimeConfig:
    """The configuration a session opened with a secret starts in."""
    return parse_update(session, defaults, beta=False, vad=streaming.vad, model=model)


async def create(request: Request) -> JSONResponse:
    """`POST /v1/realtime/client_secrets` (behind the API key): `{"expires_after": {"anchor":
    "created_at", "seconds": 10..7200}, "session": {...}}` -> `{"value", "expires_at", "session"}`."""
    state = request.app.state.streamer
    body = await request.body()
    try:
        if len(body) > MAX_BODY_BYTES:
            raise ValidationError("body", f"larger than {MAX_BODY_BYTES} bytes")
        data = v.obj(v.parse_json(body, "body") if body.strip() else {}, "body")
        seconds = _seconds(data.get("expires_after"))
        session = data.get("session")
        if session is None:
            session = {}
        if not isinstance(session, dict):
            raise InvalidValue("session must be an object", "session")
        model = ModelInfo.of(state.engine)
        streaming = state.settings.streaming
        config = initial_config(session, RealtimeConfig.default(streaming), streaming, model)
        if len(json.dumps(session, separators=(",", ":")).encode()) > MAX_SESSION_BYTES:
            raise InvalidValue(f"session is larger than {MAX_SESSION_BYTES} bytes", "session")
    except InvalidValue as e:
        return JSONResponse(error_body(e.message, e.code, param=e.param), status_code=400)
    except ValidationError as e:
        return JSONResponse(error_body(e.message, "invalid_value", param=e.field), status_code=400)
    expires_at = int(time.time()) + seconds
    value = mint(state.settings.server.api_key, session, expires_at)
    wire = session_wire(config, new_id("sess_"), model.name, beta=False)
    return JSONResponse({"value": value, "expires_at": expires_at, "session": {**wire, "expires_at": expires_at}})


def _seconds(expires_after: Any) -> int:
    if expires_after is None:
        return DEFAULT_SECONDS
    if not isinstance(expires_after, dict):
        raise InvalidValue("expires_after must be an object", "expires_after")
    if expires_after.get("anchor", "created_at") != "created_at":
        raise InvalidValue(f"expires_after.anchor {v.show(expires_after.get('anchor'))} is not supported "
                           "(only created_at)", "expires_after.anchor")
    if expires_after.get("seconds") is None:
        return DEFAULT_SECONDS
    return v.integer(expires_after["seconds"], "expires_after.seconds", MIN_SECONDS, MAX_SECONDS)


routes = [Route("/v1/realtime/client_secrets", create, methods=["POST"])]
