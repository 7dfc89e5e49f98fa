"""Uploads are decoded in child processes, not in the gateway: a file that crashes libav (session 27:
PyAV segfaulted on planar frames of 8 or more channels) kills a child, not the gateway process with
every live stream it serves.

`DecoderPool.decode(data, name=..., **kw)` runs `decode_pcm16_to_file` on the file's bytes in a
`ProcessPoolExecutor` whose processes fork from a forkserver that has imported PyAV (a new child in
milliseconds, not a spawn's second of imports). The child writes the 16-bit samples, a second at a
time, to a temporary file that the gateway created and removes whatever happens (a crash included),
and returns only their shape; the gateway reads the file block by block into `decode_audio`'s float32
array. A result returned pickled was held about four times in the child (its chunks, their
concatenation, `tobytes`, the pickler's buffer: 1.9 GB for a 4-hour upload) and twice in the gateway
for a moment (session 32; docs/notes/up33.md). A crash breaks the whole executor, failing every
decode in flight with it: each of those runs once more in a child of its own, so only the file that
crashes that one too is refused (`AudioDecodeError`, a 400).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import contextlib
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import numpy as np

from streamer.audio.decode import AudioDecodeError, decode_pcm16_to_file, pcm16_file_to_float

log = logging.getLogger("streamer.server")

WARM_S = 0.05
"""How long each warm-up call keeps its child busy (`start`)."""


SPOOL_PREFIX, SPOOL_SUFFIX = "streamer-upload-", ".s16"
"""A spool file is `streamer-upload-<gateway pid>-<random>.s16`: the pid says whose it is."""


def remove_stale_spools(spool_dir: str | None = None) -> int:
    """Remove the spool files in `spool_dir` (None: the temporary directory) whose gateway process is
    gone, and return how many. A gateway removes its own whatever happens, except when it is killed
    (SIGKILL, OOM): then its in-flight uploads' samples stay, up to 0.46 GB each. Gateways that share
    the directory keep each other's: only files of a pid that no longer exists go."""
    folder = spool_dir or tempfile.gettempdir()
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if not (name.startswith(SPOOL_PREFIX) and name.endswith(SPOOL_SUFFIX)):
            continue
        pid = name[len(SPOOL_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def default_processes() -> int:
    """Decoder processes of a gateway worker when the setting is 0: as many as cores, up to 4."""
    return max(1, min(4, os.cpu_count() or 1))


class DecoderPool:
    """Child processes that decode uploads; event loop only. Started by `start()` (a served gateway
    calls it at its start) or else at the first upload."""

    def __init__(self, processes: int = 0, spool_dir: str | None = None):
        """`spool_dir`: where the decoded samples wait between the child and the gateway (2 bytes a
        sample: 0.46 GB for 4 hours); None: the system's temporary directory (`TMPDIR`)."""
        self.processes = processes or default_processes()
        self.spool_dir = spool_dir
        self.crashes = 0
        """Executors lost to a crashing child (for tests and logs)."""
        self.inline = False
        """Children could not start here: uploads decode in the gateway's threads (as before session 27)."""
        self._executor: ProcessPoolExecutor | None = None
        self._starting = asyncio.Lock()

    async def start(self) -> None:
        """Start the forkserver and every child now, not at the first uploads (on the 2-core CPU, the
        first decode of an 11-s file took 0.21-0.48 s from a cold pool, 0.05-0.06 s from a started one);
        first remove the spool files that killed gateways left behind (`remove_stale_spools`)."""
        removed = await asyncio.to_thread(remove_stale_spools, self.spool_dir)
        if removed:
            log.warning("removed %d decoded-upload files left by gateways that were killed", removed)
        executor = await self._get()
        if executor is not None:
            loop = asyncio.get_running_loop()
            # Busy children make the executor fork the next one; idle ones would take every call.
            await asyncio.gather(*(loop.run_in_executor(executor, time.sleep, WARM_S) for _ in range(self.processes)))

    async def decode(self, data: bytes, *, name: str, **kwargs) -> np.ndarray:
        """`decode_audio(data, name=name, **kwargs)`, decoded in a child: its result, or its
        AudioDecodeError (`SpoolError` if the samples' file cannot be written or read)."""
        fd, path = tempfile.mkstemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-", suffix=SPOOL_SUFFIX, dir=self.spool_dir)
        os.close(fd)
        try:
            shape = await self.run(functools.partial(decode_pcm16_to_file, data, path, name=name, **kwargs), name=name)
            return await asyncio.to_thread(pcm16_file_to_float, path, shape)
        finally:  # a child still writing (its decode given up) writes on into the removed file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    async def run(self, call: Callable[[], Any], *, name: str) -> Any:
        """`call()` (picklable) in a child; AudioDecodeError(name, ...) if the child dies on it twice."""
        executor = await self._get()
        if executor is None:
            return await asyncio.to_thread(call)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(executor, call)
        except BrokenProcessPool:
            if self._executor is executor:  # the first decode to hear of it replaces the executor
                self._executor = None
                self.crashes += 1
                log.error("an upload decoder process died (%s); starting new ones", name)
                executor.shutdown(wait=False, cancel_futures=True)
        # Again in a child of its own: a file that crashed the shared one does so alone this time.
        alone = ProcessPoolExecutor(1, mp_context=self._context())
        try:
            return await loop.run_in_executor(alone, call)
        except BrokenProcessPool:
            self.crashes += 1
            raise AudioDecodeError(name, "the decoder crashed on this file") from None
        finally:
            alone.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    @staticmethod
    def _context():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["streamer.audio.decode"])
        return context

    async def _get(self) -> ProcessPoolExecutor | None:
        async with self._starting:
            if self._executor is None and not self.inline:
                executor = ProcessPoolExecutor(self.processes, mp_context=self._context())
                try:  # a child must start at all: it re-imports the parent's __main__ (not possible from stdin)
                    await asyncio.get_running_loop().run_in_executor(executor, os.getpid)
                except BrokenProcessPool:
                    executor.shutdown(wait=False, cancel_futures=True)
                    log.warning("upload decoder processes cannot start in this process (its __main__ cannot be "
                                "imported again); uploads decode in the gateway's threads")
                    self.inline = True
                except BaseException:  # cancelled (the gateway stops): an executor left running keeps it from exiting
                    executor.shutdown(wait=False, cancel_futures=True)
                    raise
                else:
                    self._executor = executor
            return self._executor
