"""Prometheus metrics of the gateway, in a registry of its own (one per app, so tests can build many).

Latencies are observed where they end (the event leaving the server); engine gauges are read
from `engine.metrics()` at scrape time, so they cost nothing between scrapes.

With several gateway workers (`streamer serve`, WORKERS > 1) the supervisor sets
`PROMETHEUS_MULTIPROC_DIR` before any worker starts: prometheus_client then keeps every
worker's values in files there, and any worker's `/metrics` renders all of them (sums; the loop
lag as each worker's own series, labelled by pid). Engine figures come from the engine cores,
which every worker hears, so the worker that answers the scrape reports them once.
"""

from __future__ import annotations

from typing import Callable, Iterator

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TRANSPORTS = ("stream", "realtime", "webrtc")
"""Every `LiveStream.transport`: each has its `streamer_sessions` series from the start, so that an
idle server reports 0 (an autoscaler reading a series that does not exist yet cannot scale down)."""

LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
"""Seconds; dense under 1 s, where the finalisation target lies."""


class _EngineCollector(Collector):
    """Engine queue and batch state, read when Prometheus scrapes."""

    def __init__(self, engine_metrics: Callable[[], dict | None], core_metrics: Callable[[], list[dict]] | None):
        self._engine_metrics = engine_metrics
        self._core_metrics = core_metrics

    def collect(self) -> Iterator:
        m = self._engine_metrics()
        if m is None:
            return
        gauges = {
            "queue_depth": "Windows waiting for admission",
            "live_sequences": "Sequences decoding in the engine",
            "free_slots": "Free decoder slots",
            "slots": "Decoder slots",
            "tokens_per_s": "Tokens decoded per second since the engine started",
        }
        for key, help_text in gauges.items():
            yield GaugeMetricFamily(f"streamer_engine_{key}", help_text, value=float(m.get(key, 0)))
        counters = {"tokens": ("tokens", "Tokens decoded"), "windows": ("windows", "Windows encoded"),
                    "steps": ("steps", "Engine steps"), "busy_seconds": ("busy_s", "Wall time spent in engine steps")}
        for name, (key, help_text) in counters.items():
            yield CounterMetricFamily(f"streamer_engine_{name}", help_text, value=float(m.get(key, 0)))
        if "ipc_bytes_in" in m:
            for name, key, help_text in (
                    ("ipc_received_bytes", "ipc_bytes_in", "Bytes the engine cores received from the gateways"),
                    ("ipc_sent_bytes", "ipc_bytes_out", "Bytes the engine cores published to the gateways"),
                    ("ipc_cpu_seconds", None, "CPU time of the engine cores' message threads")):
                value = m.get("ipc_in_cpu_s", 0) + m.get("ipc_out_cpu_s", 0) if key is None else m.get(key, 0)
                yield CounterMetricFamily(f"streamer_engine_{name}", help_text, value=float(value))
        if "cores" in m:
            yield GaugeMetricFamily("streamer_engine_cores_up", "Engine core processes up", value=m.get("cores_up", 0))
        per_core = self._core_metrics() if self._core_metrics is not None else []
        if per_core:
            busy = CounterMetricFamily("streamer_engine_core_busy_seconds", "Wall time each engine core spent in steps",
                                       labels=["core"])
            live = GaugeMetricFamily("streamer_engine_core_live_sequences", "Sequences decoding in each engine core",
                                     labels=["core"])
            for i, cm in enumerate(per_core):
                busy.add_metric([str(i)], float(cm.get("busy_s", 0)))
                live.add_metric([str(i)], float(cm.get("live_sequences", 0)))
            yield busy
            yield live


class Metrics:
    """The gateway's counters, gauges and histograms."""

    def __init__(self, engine_metrics: Callable[[], dict | None], loop_lag: Callable[[], float] | None = None,
                 core_metrics: Callable[[], list[dict]] | None = None, cadence: Callable[[], float] | None = None):
        """`engine_metrics` returns `engine.metrics()`, or None while no engine is loaded;
        `loop_lag` the event loop's lag in seconds (`LoopLag.lag`); `core_metrics` each engine
        core's figures (several cores); `cadence` the live streams' partial interval now."""
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry()
        self._loop_lag = loop_lag
        self.loop_lag = None
        if loop_lag is not None:
            self.loop_lag = Gauge("streamer_event_loop_lag_seconds", "How late the gateway's event loop runs "
                                  "(peak-holding, half-life 1 s); new streams are refused past MAX_LOOP_LAG_S",
                                  registry=self.registry, multiprocess_mode="liveall")
            if not self.multiprocess:
                self.loop_lag.set_function(loop_lag)
        self.sessions = Gauge("streamer_sessions", "Live streams", ["transport"], registry=self.registry,
                              multiprocess_mode="livesum")
        for transport in TRANSPORTS:
            self.sessions.labels(transport)
        self.gateway_sessions = Gauge("streamer_gateway_sessions", "Live streams this gateway process holds "
                                      "(a sample per gateway: how the port's connections are spread)",
                                      registry=self.registry, multiprocess_mode="liveall")
        self.first_partial = Histogram(
            "streamer_time_to_first_partial_seconds",
            "From the server receiving the audio where speech began to the first partial of that utterance",
            buckets=LATENCY_BUCKETS, registry=self.registry)
        self.finalisation = Histogram(
            "streamer_finalisation_latency_seconds",
            "From the server receiving the audio at the end of speech to the final being sent",
            buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram(
            "streamer_window_queue_wait_seconds",
            "From submitting a window to its first decoded token (queue wait plus the encoder pass)",
            ["kind"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.window_time = Histogram(
            "streamer_window_seconds",
            "From submitting a live window to its result (queue, encoder, decoding, fallback attempts)",
            ["kind"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.errors = Counter("streamer_errors_total", "Error events and responses sent, by code", ["code"],
                              registry=self.registry)
        self.file_audio = Counter("streamer_file_audio_seconds", "Audio transcribed through the file endpoints",
                                  registry=self.registry)
        self.file_time = Histogram(
            "streamer_file_processing_seconds", "From an upload's decoded audio to its transcript",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800), registry=self.registry)
        self.upload_audio = Gauge(
            "streamer_upload_audio_seconds", "Decoded upload audio held by the file endpoints, from decode to "
            "transcript (every channel counted); uploads past UPLOAD_AUDIO_BUDGET_S are refused",
            registry=self.registry, multiprocess_mode="livesum")
        self.partial_interval = Histogram(
            "streamer_partial_interval_seconds",
            "Time between two partial windows of one utterance: the live policy widens it under load",
            buckets=(0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0), registry=self.registry)
        self._cadence = cadence
        self.partial_cadence = None
        if cadence is not None:
            self.partial_cadence = Gauge(
                "streamer_partial_cadence_seconds", "Wall time the live policy leaves between two partials of a "
                "stream now (widened while finals exceed FINAL_BUDGET_S in the engine)", registry=self.registry,
                multiprocess_mode="liveall")
            if not self.multiprocess:
                self.partial_cadence.set_function(cadence)
        self._engine = _EngineCollector(engine_metrics, core_metrics)
        self.registry.register(self._engine)

    def observe_file(self, audio_s: float, wall_s: float) -> None:
        """A file transcription finished: `audio_s` seconds of audio in `wall_s` seconds."""
        self.file_audio.inc(audio_s)
        self.file_time.observe(wall_s)

    def publish(self) -> None:
        """Several workers: write this worker's gauges where every worker's `/metrics` reads them."""
        if self.loop_lag is not None:
            self.loop_lag.set(self._loop_lag())
        if self.partial_cadence is not None:
            self.partial_cadence.set(self._cadence())

    def render(self) -> bytes:
        """The Prometheus text exposition of everything (every worker's, in multiprocess mode)."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        self.publish()
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(self._engine)
        return generate_latest(registry)
