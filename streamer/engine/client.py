"""What a gateway worker holds instead of an `Engine`: the same calls, served by engine core
processes over ZeroMQ (`engine/core.py`, messages in `engine/protocol.py`).

`EngineClient` offers what the server, streaming and long-form code use of an engine:
`submit() -> handle` (`await handle.result()`, `handle.cancel()`), `transcribe`, `align`,
`tokenizer`, `model_name`, `device`, `config`, `queue_depth`, `max_queue`, `quotas`,
`partial_queue_limit`, `ready`, `metrics()`.

Routing: a window goes to the core that already holds windows of its session, else to the least
loaded core (its last `Stats`, plus what this gateway sent it since); so a session's windows stay
together while any is in flight, and an upload's windows spread over every core.

A core that stops publishing `Stats` for `STATS_TIMEOUT_S`, or comes back with a new incarnation
(the supervisor restarted it), fails every window this gateway had in it with `EngineUnavailable`
at once: callers get an error, never a hang. New windows go to the cores that are up; with none
up, `submit` raises `EngineUnavailable`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import time
import uuid

import numpy as np
import zmq
import zmq.asyncio

from streamer.config import EngineConfig
from streamer.engine import protocol as p
from streamer.engine.errors import Cancelled, EngineClosed, EngineUnavailable
from streamer.engine.handle import Handle
from streamer.engine.request import DecodeOptions, Priority, Result, check_options
from streamer.engine.admission import Kind, QueueFull, Quotas, check

log = logging.getLogger("streamer.engine.client")


def _quotas(ready: p.Ready) -> Quotas:
    """One core's admission shares, as its `Ready` announced them."""
    return Quotas(max_queue=ready.max_queue, partial_share=ready.partial_share, file_share=ready.file_share,
                  stream_share=ready.stream_share)


class RemoteHandle(Handle):
    """A window in an engine core, with where it went."""

    def __init__(self, client: "EngineClient", request_id: str, core: "CoreLink", priority: Priority,
                 session_id: str | None, stream_tokens: bool):
        super().__init__(request_id, client.cancel_request, stream_tokens)
        self.core = core
        self.priority = priority
        self.session_id = session_id


@dataclasses.dataclass(eq=False)
class CoreLink:
    """This gateway's view of one engine core."""

    index: int
    push: zmq.Socket
    sub: zmq.asyncio.Socket
    ready: p.Ready | None = None
    quotas: Quotas | None = None
    """The admission shares its `Ready` announced."""
    incarnation: str | None = None
    last_seen: float = 0.0
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    inflight: dict[str, RemoteHandle] = dataclasses.field(default_factory=dict)
    aligns: dict[str, asyncio.Future] = dataclasses.field(default_factory=dict)

    @property
    def up(self) -> bool:
        return self.ready is not None and not self.quiet(time.monotonic())

    def quiet(self, now: float) -> bool:
        """Nothing from the core for `STATS_TIMEOUT_S`, and nothing of it waiting unread here. A
        gateway whose event loop ran late has not read what the core kept sending: that core is
        alive (at 800 tiny.en streams on the H200 gateways ran 3.5 s late and counted their core
        down, failing 76 streams with `engine_unavailable` while it served the others)."""
        return now - self.last_seen > p.STATS_TIMEOUT_S and not self.sub.get(zmq.EVENTS) & zmq.POLLIN

    @property
    def load(self) -> float:
        m = self.metrics
        return m.get("queue_depth", 0.0) + m.get("live_sequences", 0.0) + len(self.inflight)


class EngineClient:
    """The gateway side of every engine core (one `CoreLink` each)."""

    def __init__(self, addresses: list[tuple[str, str]], config: EngineConfig = EngineConfig(),
                 gateway: str | None = None):
        """`addresses`: (input, output) ZeroMQ addresses of each core, in core order."""
        self.gateway = gateway or f"g{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.topic = self.gateway.encode()
        self._config = config
        self._ctx = zmq.Context()
        self._actx = zmq.asyncio.Context()
        self.cores: list[CoreLink] = []
        for i, (inp, out) in enumerate(addresses):
            push = self._ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.SNDHWM, 0)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(inp)
            sub = self._actx.socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, 0)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            sub.setsockopt(zmq.SUBSCRIBE, p.ALL)
            sub.connect(out)
            self.cores.append(CoreLink(i, push, sub))
        self._ids = itertools.count()
        self._sessions: dict[str, tuple[CoreLink, int]] = {}
        """Session id -> (the core holding its windows, how many are in flight)."""
        self._tasks: list[asyncio.Task] = []
        self.tokenizer = None
        self._model = ""
        self._closed = False

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self, timeout: float = 600.0) -> "EngineClient":
        """Connect to every core and wait until each has said `Ready`."""
        for core in self.cores:
            self._tasks.append(asyncio.ensure_future(self._receive(core)))
        self._tasks.append(asyncio.ensure_future(self._watch()))
        give_up = time.monotonic() + timeout
        while not all(c.ready is not None for c in self.cores):
            if time.monotonic() > give_up:
                missing = [c.index for c in self.cores if c.ready is None]
                raise EngineUnavailable(f"engine cores {missing} did not come up within {timeout:.0f} s")
            await asyncio.sleep(0.05)
        ready = self.cores[0].ready
        self._model = ready.model
        from streamer.model.tokenizer import Tokenizer

        self.tokenizer = Tokenizer(None, ready.multilingual, json=ready.tokenizer_json)
        self._config = dataclasses.replace(self._config, max_new_tokens=ready.max_new_tokens)
        return self

    async def close(self) -> None:
        self._closed = True
        for core in self.cores:
            self._send(core, p.Bye(gateway=self.gateway))
            for handle in list(core.inflight.values()):
                handle.settle(None, EngineClosed("the gateway is shutting down"))
            core.inflight.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for core in self.cores:
            core.push.close(0)
            core.sub.close(0)
        self._ctx.term()
        self._actx.term()

    # --- what the server uses ------------------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def device(self) -> str:
        return ",".join(c.ready.device if c.ready else "?" for c in self.cores)

    @property
    def ready(self) -> bool:
        """Every core is up (loaded, warm, and publishing)."""
        return not self._closed and all(c.up for c in self.cores)

    @property
    def queue_depth(self) -> int:
        return int(sum(c.metrics.get("queue_depth", 0) for c in self.cores if c.up))

    @property
    def max_queue(self) -> int:
        return sum(c.ready.max_queue for c in self.cores if c.ready)

    @property
    def partial_queue_limit(self) -> int:
        return self.quotas.bound(Kind.PARTIAL)

    @property
    def quotas(self) -> Quotas:
        """Admission shares over every core's queue (each core's own in `CoreLink.quotas`)."""
        ready = [c.ready for c in self.cores if c.ready]
        if not ready:
            return Quotas()
        return dataclasses.replace(next(c.quotas for c in self.cores if c.ready), max_queue=sum(r.max_queue for r in ready))

    def submit(self, audio: np.ndarray, options: DecodeOptions | None = None, *,
               priority: Priority = Priority.FILE, session_id: str | None = None, stream_tokens: bool = False,
               deadline: float | None = None) -> RemoteHandle:
        """Send one window (≤ 30 s) to a core; from the event loop. Raises QueueFull (the chosen
        core's last figures say it is full), EngineUnavailable, EngineClosed or ValueError."""
        if self._closed:
            raise EngineClosed("the gateway is shutting down")
        options = options or DecodeOptions()
        check_options(options, self.tokenizer)
        core = self._route(session_id)
        check(priority, int(core.metrics.get("queue_depth", 0)), core.quotas)  # raises QueueFull
        handle = RemoteHandle(self, f"{self.gateway}.{next(self._ids)}", core, priority, session_id, stream_tokens)
        core.inflight[handle.id] = handle
        if session_id is not None:
            held = self._sessions.get(session_id, (core, 0))[1]
            self._sessions[session_id] = (core, held + 1)
        self._send(core, p.Submit(id=handle.id, gateway=self.gateway, audio=p.audio_bytes(audio), options=options,
                                  priority=int(priority), session_id=session_id, deadline=deadline,
                                  stream_tokens=stream_tokens))
        return handle

    async def transcribe(self, audio: np.ndarray, options: DecodeOptions | None = None, **kw) -> Result:
        return await self.submit(audio, options, **kw).result()

    def cancel_request(self, request_id: str) -> None:
        for core in self.cores:
            handle = core.inflight.get(request_id)
            if handle is not None:
                self._send(core, p.Cancel(id=request_id))
                self._forget(core, handle, None, Cancelled("cancelled"))
                return

    async def align(self, items: list, language: str | None, task: str) -> list:
        """Word timings of each `AlignmentItem`, computed by the least loaded core."""
        core = self._route(None)
        rid = f"{self.gateway}.a{next(self._ids)}"
        future = asyncio.get_running_loop().create_future()
        core.aligns[rid] = future
        self._send(core, p.Align(id=rid, gateway=self.gateway, language=language, task=task,
                                 items=[p.AlignItem(p.audio_bytes(i.audio), list(i.tokens)) for i in items]))
        try:
            return await future
        finally:
            core.aligns.pop(rid, None)

    def metrics(self) -> dict:
        """The cores' figures summed (means for the step times), plus `cores_up`."""
        up = [c for c in self.cores if c.up]
        total: dict[str, float] = {}
        for c in up:
            for k, v in c.metrics.items():
                total[k] = total.get(k, 0.0) + v
        for k in ("last_step_ms", "step_ms_p50"):
            if k in total:
                total[k] /= len(up)
        total["cores"] = len(self.cores)
        total["cores_up"] = len(up)
        return total

    def core_metrics(self) -> list[dict]:
        """Each core's last figures, in core order (empty while a core is down)."""
        return [dict(c.metrics) if c.up else {} for c in self.cores]

    # --- internals -----------------------------------------------------------------------------

    def _route(self, session_id: str | None) -> CoreLink:
        if session_id in self._sessions:
            core, _ = self._sessions[session_id]
            if core.up:
                return core
        up = [c for c in self.cores if c.up]
        if not up:
            raise EngineUnavailable("no engine core is up; retry shortly")
        return min(up, key=lambda c: c.load)

    def _send(self, core: CoreLink, message) -> None:
        try:
            core.push.send(p.encode(message), zmq.NOBLOCK)
        except zmq.Again:
            raise EngineUnavailable(f"engine core {core.index} does not take messages") from None

    def _forget(self, core: CoreLink, handle: RemoteHandle, result: Result | None, error: Exception | None) -> None:
        core.inflight.pop(handle.id, None)
        if handle.session_id is not None:
            core_of, held = self._sessions.pop(handle.session_id, (core, 1))
            if held > 1:
                self._sessions[handle.session_id] = (core_of, held - 1)
        handle.settle(result, error)

    def _lost(self, core: CoreLink, why: str) -> None:
        """The core is gone (or restarted): what this gateway had there is lost."""
        if core.inflight or core.aligns:
            log.error("engine core %d %s: failing %d windows", core.index, why, len(core.inflight))
        for handle in list(core.inflight.values()):
            self._forget(core, handle, None, EngineUnavailable(f"engine core {core.index} {why}; the window is lost"))
        for future in core.aligns.values():
            if not future.done():
                future.set_exception(EngineUnavailable(f"engine core {core.index} {why}"))
        core.aligns.clear()

    def _done(self, core: CoreLink, m: p.Done) -> None:
        handle = core.inflight.get(m.id)
        if handle is None:
            return  # cancelled here already
        if m.error is None:
            self._forget(core, handle, m.result, None)
            return
        error = {"queue_full": lambda: QueueFull(int(core.metrics.get("queue_depth", 0)),
                                                 core.ready.max_queue if core.ready else 0, handle.priority,
                                                 core.quotas.retry_after_s if core.quotas else 1.0, m.error),
                 "closed": lambda: EngineClosed(m.error), "cancelled": lambda: Cancelled(m.error),
                 "invalid": lambda: ValueError(m.error)}.get(m.kind, lambda: RuntimeError(m.error))()
        self._forget(core, handle, None, error)

    def _seen(self, core: CoreLink, incarnation: str) -> None:
        if core.incarnation is not None and incarnation != core.incarnation:
            self._lost(core, "restarted")
            core.ready = None  # until its Ready reaches us
        core.incarnation = incarnation
        core.last_seen = time.monotonic()

    async def _receive(self, core: CoreLink) -> None:
        while True:
            _, frame = await core.sub.recv_multipart()
            try:
                m = p.decode_from_core(frame)
            except Exception:
                log.exception("engine core %d: a message this gateway cannot read", core.index)
                continue
            if isinstance(m, p.Done):
                self._done(core, m)
            elif isinstance(m, p.Stats):
                self._seen(core, m.incarnation)
                core.metrics = m.metrics
            elif isinstance(m, p.Tokens):
                for rid, tokens in m.items:
                    handle = core.inflight.get(rid)
                    if handle is not None:
                        handle.push_tokens(tokens)
            elif isinstance(m, p.Aligned):
                future = core.aligns.get(m.id)
                if future is not None and not future.done():
                    if m.error is not None:
                        future.set_exception(RuntimeError(m.error))
                    else:
                        future.set_result(m.timings)
            elif isinstance(m, p.Ready):
                self._seen(core, m.incarnation)
                if core.ready is None:
                    log.info("engine core %d ready (%s on %s)", core.index, m.model, m.device)
                core.ready, core.quotas = m, _quotas(m)

    async def _watch(self) -> None:
        """Say hello to cores that have not answered; notice cores that went quiet."""
        hello = p.Hello(gateway=self.gateway)
        while True:
            now = time.monotonic()
            for core in self.cores:
                if core.ready is None:
                    self._send(core, hello)
                elif (core.inflight or core.aligns) and core.quiet(now):
                    self._lost(core, f"sent nothing for {now - core.last_seen:.1f} s")
            await asyncio.sleep(p.HELLO_INTERVAL_S)
