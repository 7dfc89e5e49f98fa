"""What the gateway shares across requests: settings, the engine, the VAD model, metrics, live streams.

Every live stream of every transport registers here, so that `max_sessions` counts them all
and shutdown can reach each one to deliver its finals.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from streamer.audio.vad import SileroVAD
from streamer.config import Settings
from streamer.engine.admission import Kind, Refused, admit, refuse
from streamer.server.limits import ClientLimits
from streamer.server.loop_lag import LoopLag
from streamer.server.bridge import Bridge, Emit
from streamer.server.metrics import Metrics
from streamer.server.decoder import DecoderPool
from streamer.server.resume import ResumeStore
from streamer.server.upload_budget import UploadBudget, budget_seconds
from streamer.server.vad_batcher import VADBatcher
from streamer.streaming.cadence import CadenceConfig, PartialCadence, budget_for
from streamer.streaming.session import Session


if TYPE_CHECKING:
    from streamer.engine.engine import Engine

log = logging.getLogger("streamer.server")


class LiveStream(Protocol):
    """One open stream of any transport."""

    session_id: str
    transport: str
    """`stream`, `realtime` or `webrtc`: the metrics label."""

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking audio, deliver the finals of open utterances within `grace_s`, tell the
        client why it ends and close."""


@dataclass
class ServerState:
    """`app.state.streamer`."""

    settings: Settings
    engine: Engine | None
    """None until the lifespan has loaded it (when not injected)."""
    vad: SileroVAD
    metrics: Metrics
    ice_servers: list[dict] = field(default_factory=list)
    """`WEBRTC_ICE_SERVERS`: the server's own ICE servers, handed to browsers by `/v1/webrtc/config`."""
    shutting_down: bool = False
    sessions: dict[str, LiveStream] = field(default_factory=dict)
    """Live streams by session id."""
    loop_lag: LoopLag = field(default_factory=LoopLag)
    """How late the event loop runs (the lifespan runs its monitor)."""
    clients: ClientLimits = field(default_factory=ClientLimits)
    """Live streams per client address (`max_connections_per_client`)."""
    resume: ResumeStore | None = None
    """`/v1/stream` sessions kept for resume (built from `settings.server` when None)."""
    decoder: DecoderPool | None = None
    """Child processes that decode uploads (built from `settings.server` when None)."""
    upload_budget: UploadBudget | None = None
    """Decoded upload audio this process holds (`upload_audio_budget_s`; built from settings when None)."""
    twilio: dict = field(default_factory=dict)
    """`/v1/twilio` streams by `streamSid`, for their subscribers (`server/twilio.py`)."""
    engine_ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a gateway worker's engine cores have all said Ready (`app._connect`)."""

    _cadence: PartialCadence | None = None
    _vad_batcher: VADBatcher | None = None

    def __post_init__(self) -> None:
        if self.decoder is None:
            self.decoder = DecoderPool(self.settings.server.upload_decoders, self.settings.server.upload_spool_dir)
        if self.upload_budget is None:
            server = self.settings.server
            self.upload_budget = UploadBudget(budget_seconds(server.upload_audio_budget_s, server.max_audio_s),
                                              on_change=self.metrics.upload_audio.set)
        if self.resume is None:
            server = self.settings.server
            self.resume = ResumeStore(server.worker_id, server.resume_s, max_parked=server.max_sessions,
                                      max_per_client=server.max_connections_per_client)

    @property
    def cadence(self) -> PartialCadence:
        """The partial cadence shared by this process's live streams (built once the engine is known)."""
        if self._cadence is not None:
            return self._cadence
        s = self.settings.streaming
        budget = s.final_budget_s or budget_for(self.engine.device if self.engine is not None else "cpu")
        cadence = PartialCadence(CadenceConfig(min_interval_s=s.partial_interval_s,
                                               max_interval_s=max(s.partial_interval_s, s.partial_interval_max_s),
                                               final_budget_s=budget))
        if self.engine is not None:  # (asked before, by `/metrics` while the engine loads: not kept)
            self._cadence = cadence
        return cadence

    @property
    def vad_batcher(self) -> VADBatcher | None:
        """The batcher that scores this process's streams' VAD together (None: `vad_batch_ms` 0)."""
        ms = self.settings.server.vad_batch_ms
        if self._vad_batcher is None and ms > 0:
            self._vad_batcher = VADBatcher(self.vad, ms / 1000)
        return self._vad_batcher

    def bridge(self, session: Session, emit: Emit, *, session_id: str, language: str | None, task: str,
               word_timestamps: bool = False) -> Bridge:
        """A live stream's (or channel's) bridge to the engine, with this process's shared cadence
        and VAD batcher: how every transport builds one."""
        return Bridge(session, self.engine, self.metrics, emit, session_id=session_id, language=language, task=task,
                      word_timestamps=word_timestamps, cadence=self.cadence, vad_batcher=self.vad_batcher)

    def admit(self, stream: LiveStream) -> Refused | None:
        """Register a new stream; or why not: shutting down, at `max_sessions`, the event loop
        running late (the engine's own refusal comes from `engine_refusal`, which each transport
        asks where its protocol starts a stream: `/v1/stream` at `start`, the others on connect)."""
        refusal = self.refusal()
        if refusal is not None:
            return refusal
        self.sessions[stream.session_id] = stream
        self.metrics.sessions.labels(stream.transport).inc()
        self.metrics.gateway_sessions.set(len(self.sessions))
        return None

    def release(self, stream: LiveStream) -> None:
        if self.sessions.pop(stream.session_id, None) is not None:
            self.metrics.sessions.labels(stream.transport).dec()
            self.metrics.gateway_sessions.set(len(self.sessions))

    def refusal(self) -> Refused | None:
        """Why the gateway would refuse a new live stream now, or None."""
        server = self.settings.server
        if self.shutting_down:
            return refuse("the server is shutting down; retry on another", 0.0, "shutting_down")
        if len(self.sessions) >= server.max_sessions:
            return refuse(f"the server is at its limit of {server.max_sessions} live streams; retry later", 5.0)
        if server.max_loop_lag_s and self.loop_lag.lag >= server.max_loop_lag_s:
            return refuse(f"the server is overloaded (its event loop runs {self.loop_lag.lag:.2f} s late); "
                          "retry later", 2.0)
        return None

    def engine_refusal(self) -> Refused | None:
        """Why the engine would not take a new live stream now (`engine/admission.py`), or None."""
        engine = self.engine
        return None if engine is None else admit(Kind.STREAM, engine.queue_depth, engine.quotas)

    async def drain(self) -> None:
        """Shutdown, part one: refuse new streams, finalise and close every open one.

        Bounded by `shutdown_grace_s` plus a second for the closing handshakes; idempotent.
        """
        self.shutting_down = True
        streams = list(self.sessions.values())
        if not streams:
            return
        grace = self.settings.server.shutdown_grace_s
        log.info("shutdown: finalising %d open streams (grace %.1f s)", len(streams), grace)
        tasks = [asyncio.ensure_future(s.shutdown(grace)) for s in streams]
        done, pending = await asyncio.wait(tasks, timeout=grace + 1.0)
        for task in pending:
            task.cancel()
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("shutdown of a stream failed", exc_info=task.exception())
