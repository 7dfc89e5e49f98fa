"""Uploads are decoded in child processes, not in the gateway: a file that crashes libav (session 27:
PyAV segfaulted on planar frames of 8 or more channels) kills a child, not the gateway process with
every live stream it serves.

`DecoderPool.decode(data, name=..., **kw)` runs `decode_audio` on the file's bytes in a
`ProcessPoolExecutor` whose processes fork from a forkserver that has imported PyAV (a new child in
milliseconds, not a spawn's second of imports). A crash breaks the whole executor, failing every
decode in flight with it: each of those runs once more in a fresh executor, so only a file that
crashes it again is refused (`AudioDecodeError`, a 400).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import numpy as np

from streamer.audio.decode import AudioDecodeError, decode_audio

log = logging.getLogger("streamer.server")


def default_processes() -> int:
    """Decoder processes of a gateway worker when the setting is 0: as many as cores, up to 4."""
    return max(1, min(4, os.cpu_count() or 1))


class DecoderPool:
    """Child processes that decode uploads; event loop only. Started at the first upload."""

    def __init__(self, processes: int = 0):
        self.processes = processes or default_processes()
        self.crashes = 0
        """Executors lost to a crashing child (for tests and logs)."""
        self._executor: ProcessPoolExecutor | None = None

    async def decode(self, data: bytes, *, name: str, **kwargs) -> np.ndarray:
        """`decode_audio(data, name=name, **kwargs)` in a child: its result, or its AudioDecodeError."""
        return await self.run(functools.partial(decode_audio, data, name=name, **kwargs), name=name)

    async def run(self, call: Callable[[], Any], *, name: str) -> Any:
        """`call()` (picklable) in a child; AudioDecodeError(name, ...) if the child dies on it twice."""
        for _ in range(2):
            executor = self._get()
            try:
                return await asyncio.get_running_loop().run_in_executor(executor, call)
            except BrokenProcessPool:
                if self._executor is executor:  # the first decode to hear of it replaces the executor
                    self._executor = None
                    self.crashes += 1
                    log.error("an upload decoder process died (%s); starting new ones", name)
                    executor.shutdown(wait=False, cancel_futures=True)
        raise AudioDecodeError(name, "the decoder crashed on this file")

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _get(self) -> ProcessPoolExecutor:
        if self._executor is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["streamer.audio.decode"])
            self._executor = ProcessPoolExecutor(self.processes, mp_context=context)
        return self._executor
