"""A request body read under the upload limits, for the endpoints that take a recording:
`files.py` (a multipart form, parsed by Starlette from `limited_receive`) and `deepgram.py`
(`read_body`, the raw body). Each endpoint turns the exceptions into its own error shape.

The size limit is checked from `Content-Length` before anything is read, then counted as the body
arrives, so that a client that declares nothing or lies is stopped as soon as it passes. A body
that stalls is ended: a stalled client held the connection and the bytes so far for as long as it
wished. A client that leaves is not an error (Starlette's `ClientDisconnect` was an ASGI traceback
in the log).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.types import Message


class BodyTooLarge(Exception):
    """The body passes the limit, declared or counted."""


class BodyStalled(Exception):
    """No part of the body came for the idle timeout."""


class ClientGone(Exception):
    """The client disconnected before its answer was ready: there is nobody to answer."""


def limited_receive(request: Request, max_bytes: int, idle_timeout_s: float) -> Callable[[], Awaitable[Message]]:
    """`request`'s ASGI receive, limited: it raises `BodyTooLarge` once the body passes `max_bytes`,
    `BodyStalled` when no message comes for `idle_timeout_s`, `ClientGone` on a disconnect. Raises
    `BodyTooLarge` at once when `Content-Length` declares more than `max_bytes`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge()
    received = 0

    async def receive() -> Message:
        nonlocal received
        try:
            message = await asyncio.wait_for(request.receive(), idle_timeout_s)
        except asyncio.TimeoutError:
            raise BodyStalled() from None
        if message["type"] == "http.disconnect":
            raise ClientGone()
        received += len(message.get("body", b""))
        if received > max_bytes:
            raise BodyTooLarge()
        return message

    return receive


async def read_body(request: Request, max_bytes: int, idle_timeout_s: float) -> bytes:
    """The whole body, under `limited_receive`'s limits (and its exceptions)."""
    receive = limited_receive(request, max_bytes, idle_timeout_s)
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)
