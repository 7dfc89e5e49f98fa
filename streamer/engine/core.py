"""An engine core process: one model on one device, serving every gateway worker over ZeroMQ.

vLLM v1's split: the gateways (event loops, sockets, VAD) never share a GIL with the model.
The process runs three threads and no event loop:
- the model thread (`Engine`'s own): schedule, execute, update;
- this module's input loop: receive messages, hand windows to the engine (`Engine.enqueue`);
- the output thread: encode and publish what the engine finished, and `Stats` every
  `STATS_INTERVAL_S`, which is also the gateways' sign of life.

`run_core` is the process's entry point (`multiprocessing`, spawn); `CoreSpec` says what to load
and where to listen.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
import uuid
from dataclasses import dataclass

import zmq

from streamer.config import EngineConfig, ModelConfig, log_level
from streamer.engine import protocol as p
from streamer.engine.engine import Cancelled, Engine, EngineClosed
from streamer.engine.request import Priority
from streamer.engine.scheduler import QueueFull

log = logging.getLogger("streamer.engine.core")

GONE_KEPT = 1024
"""Gateways remembered after their Bye, whose late messages are dropped (names carry a pid: a
restarted gateway has a new one)."""


@dataclass(frozen=True)
class CoreSpec:
    """One engine core: its index, what it loads, and its two ZeroMQ addresses."""

    index: int
    model: ModelConfig
    engine: EngineConfig
    input_address: str
    """Bound PULL socket: gateways push `ToCore` messages here."""
    output_address: str
    """Bound PUB socket: replies under each gateway's topic, `Stats` under `ALL`."""
    cpu_threads: int | None = None
    """torch intra-op threads of the model thread on the CPU (None: torch's default)."""
    ready_path: str | None = None
    """A file created once the model is loaded and warm: the supervisor restarts a core that dies
    after it, and stops the server when one dies before (a bad model or device would only loop)."""


def _error_kind(error: Exception) -> str:
    if isinstance(error, QueueFull):
        return "queue_full"
    if isinstance(error, EngineClosed):
        return "closed"
    if isinstance(error, Cancelled):
        return "cancelled"
    if isinstance(error, ValueError):
        return "invalid"
    return "failed"


class Core:
    """The input loop and output thread around one `Engine`."""

    def __init__(self, spec: CoreSpec, engine: Engine):
        self.spec = spec
        self.engine = engine
        self.incarnation = uuid.uuid4().hex[:12]
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.RCVHWM, 0)
        self.inbox.bind(spec.input_address)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)  # replies are never dropped for a slow gateway
        self.pub.bind(spec.output_address)
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.owner: dict[str, str] = {}
        """Request id -> gateway topic, for windows in the engine (input loop and callbacks)."""
        self.lock = threading.Lock()
        self.stopping = False
        self.gone: dict[str, None] = {}
        """Gateways that said Bye (or the supervisor for them), oldest first (input loop only)."""
        self.ipc = {"ipc_bytes_in": 0.0, "ipc_bytes_out": 0.0, "ipc_in_cpu_s": 0.0, "ipc_out_cpu_s": 0.0}
        """What the IPC costs this process: bytes received and published, CPU seconds of the two
        I/O threads (decoding and encoding messages, socket calls)."""
        self.ready = p.Ready(core=spec.index, incarnation=self.incarnation, model=engine.model_name,
                             device=engine.device, max_new_tokens=engine.config.max_new_tokens,
                             max_queue=engine.max_queue, partial_share=engine.quotas.partial_share,
                             file_share=engine.quotas.file_share, stream_share=engine.quotas.stream_share,
                             tokenizer_json=engine.tokenizer.hf.to_str(), multilingual=engine.tokenizer.multilingual,
                             pid=os.getpid())

    # --- output --------------------------------------------------------------------------------

    def _publish(self, topic: str | bytes, message) -> None:
        self.out.put((topic if isinstance(topic, bytes) else topic.encode(), message))

    def _stats(self) -> p.Stats:
        m = {**self.engine.metrics(), **self.ipc}
        return p.Stats(core=self.spec.index, incarnation=self.incarnation,
                       metrics={k: float(v) for k, v in m.items() if isinstance(v, (int, float))})

    def _send(self, topic: bytes, message) -> None:
        frame = p.encode(message)
        self.ipc["ipc_bytes_out"] += len(frame)
        self.pub.send_multipart([topic, frame])

    def output_loop(self) -> None:
        next_stats = 0.0
        tokens: dict[bytes, list] = {}
        while True:
            cpu = time.thread_time()
            timeout = max(0.0, next_stats - time.monotonic())
            try:
                item = self.out.get(timeout=timeout)
            except queue.Empty:
                item = None
            batch = [] if item is None else [item]
            while True:  # drain what is there: one send per message, tokens merged per gateway
                try:
                    batch.append(self.out.get_nowait())
                except queue.Empty:
                    break
            for topic, message in batch:
                if message is None:
                    self._send(p.ALL, self._stats())
                    return
                if isinstance(message, p.Tokens):
                    tokens.setdefault(topic, []).extend(message.items)
                else:
                    self._send(topic, message)
            for topic, items in tokens.items():
                self._send(topic, p.Tokens(items=items))
            tokens.clear()
            if time.monotonic() >= next_stats:
                self._send(p.ALL, self._stats())
                next_stats = time.monotonic() + p.STATS_INTERVAL_S
            self.ipc["ipc_out_cpu_s"] += time.thread_time() - cpu

    # --- input ---------------------------------------------------------------------------------

    def _done(self, request_id: str):
        def on_done(result, error):
            with self.lock:
                topic = self.owner.pop(request_id, None)
            if topic is None:
                return
            if error is None:
                self._publish(topic, p.Done(id=request_id, result=result))
            else:
                self._publish(topic, p.Done(id=request_id, error=str(error) or type(error).__name__,
                                            kind=_error_kind(error)))
        return on_done

    def _submit(self, m: p.Submit) -> None:
        with self.lock:
            self.owner[m.id] = m.gateway
        on_tokens = self._tokens_to(m.gateway, m.id) if m.stream_tokens else None
        try:
            self.engine.enqueue(m.id, p.audio_array(m.audio), m.options, priority=Priority(m.priority),
                                session_id=m.session_id, deadline=m.deadline, on_done=self._done(m.id),
                                on_tokens=on_tokens)
        except Exception as e:  # refused at once: QueueFull, closed, bad options
            self._done(m.id)(None, e)

    def _tokens_to(self, topic: str, request_id: str):
        def on_tokens(tokens: list[int]) -> None:
            self._publish(topic, p.Tokens(items=[(request_id, tokens)]))
        return on_tokens

    def _align(self, m: p.Align) -> None:
        from streamer.model.alignment import AlignmentItem, find_word_timings

        items = [AlignmentItem(p.audio_array(i.audio), list(i.tokens)) for i in m.items]

        def on_done(value, error):
            if error is not None:
                self._publish(m.gateway, p.Aligned(id=m.id, error=f"{type(error).__name__}: {error}"))
                return
            timings = [[p.WordTimingMsg(w.word, list(w.tokens), float(w.start), float(w.end), float(w.probability))
                        for w in window] for window in value]
            self._publish(m.gateway, p.Aligned(id=m.id, timings=timings))

        try:
            self.engine.call_soon(find_word_timings, (self.engine.loaded, items, m.language, m.task), on_done)
        except Exception as e:
            on_done(None, e)

    def _bye(self, gateway: str) -> None:
        # Its Submits may still be on their way over its own connection (the supervisor says Bye for a
        # killed gateway over another): those are dropped as they come.
        self.gone[gateway] = None
        while len(self.gone) > GONE_KEPT:
            self.gone.pop(next(iter(self.gone)))
        with self.lock:
            ids = [rid for rid, topic in self.owner.items() if topic == gateway]
        for rid in ids:
            self.engine.cancel_request(rid)

    def input_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        while not self.stopping:
            if not poller.poll(200):
                continue
            cpu = time.thread_time()
            while True:
                try:
                    frame = self.inbox.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.ipc["ipc_bytes_in"] += len(frame)
                try:
                    m = p.decode_to_core(frame)
                except Exception:
                    log.exception("core %d: a message it cannot read", self.spec.index)
                    continue
                if isinstance(m, (p.Submit, p.Align)) and m.gateway in self.gone:
                    continue  # nobody is left to collect it
                if isinstance(m, p.Submit):
                    self._submit(m)
                elif isinstance(m, p.Cancel):
                    self.engine.cancel_request(m.id)
                elif isinstance(m, p.Hello):
                    self._publish(m.gateway, self.ready)
                elif isinstance(m, p.Align):
                    self._align(m)
                elif isinstance(m, p.Bye):
                    self._bye(m.gateway)
            self.ipc["ipc_in_cpu_s"] += time.thread_time() - cpu

    def run(self) -> None:
        sender = threading.Thread(target=self.output_loop, name="streamer-core-out", daemon=True)
        sender.start()
        self._publish(p.ALL, self.ready)
        try:
            self.input_loop()
        finally:
            # Finish what is live or queued, publish it, then go.
            self.engine.close(timeout=30.0)
            self._publish(p.ALL, None)
            sender.join(5.0)
            self.inbox.close(0)
            self.pub.close(linger=1000)
            self.ctx.term()


def run_core(spec: CoreSpec) -> None:
    """Process entry point: load, warm up, serve until SIGTERM/SIGINT (then drain and exit)."""
    logging.basicConfig(level=log_level("INFO"),
                        format=f"%(asctime)s %(levelname)s core{spec.index}: %(message)s")
    engine = Engine.load(spec.model, spec.engine, cpu_threads=spec.cpu_threads)
    engine.warm_up()
    core = Core(spec, engine)

    def stop(signum, frame):
        core.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("serving %s on %s", engine.model_name, engine.device)
    if spec.ready_path:
        open(spec.ready_path, "w").close()
    core.run()
