"""A submitted window as its asyncio caller holds it: await the result, iterate tokens, cancel.

One class for the in-process engine (settled from its model thread) and for the client of
engine core processes (settled on the event loop). No torch here.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Callable


class Handle:
    def __init__(self, request_id: str, cancel: Callable[[str], None], stream_tokens: bool):
        """Made on the caller's running loop; `cancel(request_id)` withdraws the window."""
        self.id = request_id
        self.submitted = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self.future: asyncio.Future = self._loop.create_future()
        self._tokens: asyncio.Queue | None = asyncio.Queue() if stream_tokens else None
        self._cancel = cancel

    def settle(self, result, error: Exception | None) -> None:
        """The outcome, on the caller's loop."""
        if not self.future.done():
            if error is not None:
                self.future.set_exception(error)
                self.future.exception()  # retrieved: a cancelled window nobody awaits is not an error
            else:
                self.future.set_result(result)
        if self._tokens is not None:
            self._tokens.put_nowait(None)

    def settle_threadsafe(self, result, error: Exception | None) -> None:
        """The outcome, from any thread."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.settle, result, error)

    def push_tokens(self, tokens: list[int]) -> None:
        if self._tokens is not None:
            for token in tokens:
                self._tokens.put_nowait(token)

    def push_tokens_threadsafe(self, tokens: list[int]) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.push_tokens, tokens)

    async def result(self):
        return await asyncio.shield(self.future)

    async def tokens(self) -> AsyncIterator[int]:
        """Token ids as they are sampled (the current attempt's), ending with the result."""
        if self._tokens is None:
            raise RuntimeError("submit(..., stream_tokens=True) to iterate tokens")
        while True:
            token = await self._tokens.get()
            if token is None:
                return
            yield token

    def cancel(self) -> None:
        self._cancel(self.id)

    def __await__(self):
        return self.result().__await__()
