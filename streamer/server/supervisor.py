"""`streamer serve`: one engine core process per device, gateway worker processes on one port.

    supervisor (this process: no model, no sockets of its own but the port reservation)
      ├─ engine core 0..D-1   `engine.core.run_core`    (ZeroMQ over ipc:// in a private run dir)
      └─ gateway 0..W-1       `run_gateway`             (uvicorn on the shared port, and on
                                                          `<run dir>/gw<i>.sock` for relays)

How the port is shared (`GATEWAY_ACCEPT`): `shared` (default): the supervisor holds one listening
socket that every gateway accepts from, so a new connection goes to a gateway that is free to
take it (a busy event loop comes to its accept late) and none is lost when a gateway restarts;
`reuseport`: each gateway has its own SO_REUSEPORT socket and the kernel hashes connections over
them whatever their load (at 600 tiny.en streams on the H200 two gateways of eight ran 1.1-2.7 s
late while the other six ran under 0.1 s, session 9).

Each gateway holds an `EngineClient` of every core. A connection that needs what another gateway
holds (a resumed `/v1/stream` session, a Twilio call's subscriber) is relayed to it over that
gateway's Unix socket (`server/relay.py`). The supervisor restarts a child that dies
(a core's gateways fail its in-flight windows at once and reconnect to the new one), after a
pause that doubles while it keeps dying soon after its start; a child that dies before it was
ever ready (a model that does not load, a device that is not there) stops the server (exit 1). On SIGTERM
or SIGINT it drains in order: the gateways first (they stop accepting, deliver the finals of open
utterances, then close), then the cores (they finish what is left and exit).

Children run in their own sessions, so a terminal's Ctrl-C reaches the supervisor alone and the
drain keeps that order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time

from typing import TYPE_CHECKING

from streamer.config import Settings, log_level

if TYPE_CHECKING:
    from streamer.engine.core import CoreSpec

log = logging.getLogger("streamer.server")

RESTART_DELAY_S = 1.0
"""A child that died is started again after this pause, doubled for each further death in a row
that came less than `STABLE_S` after its start, up to `MAX_RESTART_DELAY_S` (crash loops stay slow)."""
STABLE_S = 60.0
MAX_RESTART_DELAY_S = 30.0
STARTING_STOP_S = 2.0
"""How long a child that was never ready gets to stop on SIGTERM."""
CORE_STOP_S = 40.0
"""How long cores get to finish their work after the gateways are gone."""
BACKLOG = 2048
"""Connections the kernel queues on the port before a gateway accepts them (handshake bursts)."""


class ServeError(Exception):
    """The server cannot start as configured (no such device, an address that cannot be bound)."""


def default_workers(cores: int | None = None) -> int:
    cores = cores or os.cpu_count() or 1
    return 1 if cores <= 2 else min(8, cores // 2)


def engine_devices(device: str) -> list[str]:
    """The devices of `DEVICE`: `cpu`, `cuda:N`, a comma-separated list, or `cuda` / `auto` for
    every visible GPU (`auto` falls back to the CPU)."""
    if "," in device:
        return [d.strip() for d in device.split(",") if d.strip()]
    if device in ("cuda", "auto"):
        import torch

        n = torch.cuda.device_count()
        if n:
            return [f"cuda:{i}" for i in range(n)]
        if device == "cuda":
            raise RuntimeError("DEVICE=cuda but torch sees no CUDA GPU (is the CUDA build of torch installed?)")
        return ["cpu"]
    return [device]


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def run_gateway(settings: Settings, index: int, addresses: list[tuple[str, str]], port: int, rundir: str,
                listener: socket.socket | None = None) -> None:
    """Gateway worker process: the app on the shared port (the supervisor's `listener`, or a
    SO_REUSEPORT socket of its own) and on its own Unix socket in the run directory (where the
    other workers relay the connections whose session this one holds), engines reached through
    `EngineClient`."""
    os.setsid()
    logging.basicConfig(level=log_level("INFO"),
                        format=f"%(asctime)s %(levelname)s gateway{index}: %(message)s")
    # Resume tokens and Twilio calls name their worker; the others relay to it (server/relay.py).
    settings = dataclasses.replace(settings, server=dataclasses.replace(settings.server, worker_id=index,
                                                                        peer_dir=rundir))
    from streamer.engine.client import EngineClient
    from streamer.server.app import build_server, create_app
    from streamer.server.relay import Peers

    client = EngineClient(addresses, settings.engine, gateway=f"gw{index}-{os.getpid()}")
    app = create_app(settings, connect=client.start)
    peers = Peers.of(settings.server)
    peers.release_all()
    if listener is not None:  # shared: accepted one connection at a time (server/accept.py)
        server = build_server(app, settings.server.host, port, shared_listener=listener, sharing=peers.workers)
        sockets = [peers.listen()]
    else:
        sock = reuse_port_socket(settings.server.host, port)
        sock.listen(BACKLOG)
        server, sockets = build_server(app, settings.server.host, port), [sock, peers.listen()]
    state = app.state.streamer

    async def mark_when_ready() -> None:  # serving, and with an engine: this gateway is ready
        await state.engine_ready.wait()
        peers.mark_serving()

    marking: list[asyncio.Task] = []  # (held: the loop keeps weak references to tasks)
    server.on_serving = lambda: marking.append(asyncio.ensure_future(mark_when_ready()))
    server.run(sockets=sockets)


def _core_main(spec: "CoreSpec") -> None:
    from streamer.engine.core import run_core  # here: a gateway worker (spawned from this module) imports no torch

    os.setsid()
    run_core(spec)


class Supervisor:
    """Starts, watches and stops the engine cores and gateway workers."""

    def __init__(self, settings: Settings):
        self.n_workers = settings.server.workers if settings.server.workers is not None else default_workers()
        # The gateways know how many they are (`Peers.all_serving`).
        self.settings = settings = dataclasses.replace(settings, server=dataclasses.replace(settings.server,
                                                                                          workers=self.n_workers))
        self.ctx = multiprocessing.get_context("spawn")
        self.rundir = tempfile.mkdtemp(prefix="streamer-")
        devices = engine_devices(settings.model.device)
        from streamer.engine.core import CoreSpec

        self.specs = [CoreSpec(index=i, model=dataclasses.replace(settings.model, device=d), engine=settings.engine,
                               input_address=f"ipc://{self.rundir}/core{i}-in",
                               output_address=f"ipc://{self.rundir}/core{i}-out",
                               ready_path=os.path.join(self.rundir, f"core{i}.ready"))
                      for i, d in enumerate(devices)]
        # Held for the supervisor's life: port 0 becomes a real port, and no other program takes
        # it between two worker restarts. With `shared` accepts it is the one listening socket.
        self.reservation = reuse_port_socket(settings.server.host, settings.server.port)
        self.listener = None
        if settings.server.accept == "shared":
            self.reservation.listen(BACKLOG)
            self.listener = self.reservation
        self.port = self.reservation.getsockname()[1]
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", os.path.join(self.rundir, "metrics"))
        os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)
        self.cores: list[multiprocessing.Process | None] = [None] * len(self.specs)
        self.gateways: list[multiprocessing.Process | None] = [None] * self.n_workers
        self.stopping = threading.Event()
        self.exit_code = 0
        self.started: dict[tuple[str, int], float] = {}
        self.failures: dict[tuple[str, int], int] = {}
        """Deaths in a row, each less than `STABLE_S` after its start, per child."""
        self.restart_at: dict[tuple[str, int], float] = {}

    def _start_core(self, i: int) -> None:
        proc = self.ctx.Process(target=_core_main, args=(self.specs[i],), name=f"streamer-core{i}")
        proc.start()
        self.cores[i] = proc
        self.started["engine core", i] = time.monotonic()
        log.info("engine core %d (%s): pid %d", i, self.specs[i].model.device, proc.pid)

    def _start_gateway(self, i: int) -> None:
        addresses = [(s.input_address, s.output_address) for s in self.specs]
        proc = self.ctx.Process(target=run_gateway, args=(self.settings, i, addresses, self.port, self.rundir,
                                                          self.listener), name=f"streamer-gateway{i}")
        proc.start()
        self.gateways[i] = proc
        self.started["gateway", i] = time.monotonic()
        log.info("gateway %d: pid %d", i, proc.pid)

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT (0), or until a child dies before it was ever ready (1)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.stopping.set())
        for i in range(len(self.specs)):
            self._start_core(i)
        for i in range(self.n_workers):
            self._start_gateway(i)
        log.info("serving on http://%s:%d with %d gateway workers and %d engine cores",
                 self.settings.server.host, self.port, self.n_workers, len(self.specs))
        try:
            while not self.stopping.wait(0.2):
                self._restart_dead()
        finally:
            self.stop()
        return self.exit_code

    def _was_ready(self, kind: str, i: int) -> bool:
        """The child has loaded and served once (its marker outlives its restarts)."""
        if kind == "engine core":
            return os.path.exists(self.specs[i].ready_path)
        from streamer.server.relay import Peers

        return Peers(self.rundir, i).marked_serving()

    def _restart_dead(self) -> None:
        from prometheus_client import multiprocess

        now = time.monotonic()
        for kind, procs, start in (("engine core", self.cores, self._start_core),
                                   ("gateway", self.gateways, self._start_gateway)):
            for i, proc in enumerate(procs):
                key = (kind, i)
                if proc is None:
                    if key in self.restart_at and now >= self.restart_at[key] and not self.stopping.is_set():
                        del self.restart_at[key]
                        start(i)
                    continue
                if proc.is_alive():
                    continue
                _kill_group(proc.pid)
                if kind == "gateway":
                    multiprocess.mark_process_dead(proc.pid)
                    self._forget_gateway(f"gw{i}-{proc.pid}")
                procs[i] = None
                if not self._was_ready(kind, i):
                    # A bad model, device or setting: every restart would die the same way.
                    log.error("%s %d (pid %d) exited with %s before it was ready (its log is above): "
                              "stopping the server", kind, i, proc.pid, proc.exitcode)
                    self.exit_code = 1
                    self.stopping.set()
                    return
                short = now - self.started[key] < STABLE_S
                self.failures[key] = self.failures.get(key, 0) + 1 if short else 0
                delay = min(MAX_RESTART_DELAY_S, RESTART_DELAY_S * 2 ** max(0, self.failures[key] - 1))
                self.restart_at[key] = now + delay
                log.error("%s %d (pid %d) exited with %s; restarting in %.0f s", kind, i, proc.pid, proc.exitcode, delay)

    def _forget_gateway(self, gateway: str) -> None:
        """A gateway died without its `Bye`: the cores cancel its windows, which nobody will collect
        (else every later request waits behind them)."""
        import zmq

        from streamer.engine import protocol as p

        ctx = zmq.Context()
        try:
            for spec in self.specs:
                push = ctx.socket(zmq.PUSH)
                push.setsockopt(zmq.LINGER, 1000)
                push.connect(spec.input_address)
                with contextlib.suppress(zmq.Again):
                    push.send(p.encode(p.Bye(gateway=gateway)), zmq.NOBLOCK)
                push.close()
        finally:
            ctx.term()

    def stop(self) -> None:
        """Drain: gateways first (finals delivered), then cores; kill what overstays. A child still
        starting has nothing to drain (a gateway waiting for its cores takes no SIGTERM until then)."""
        grace = self.settings.server.shutdown_grace_s + 15.0
        for kind, procs, drain_s in (("gateway", self.gateways, grace), ("engine core", self.cores, CORE_STOP_S)):
            for proc in procs:
                if proc is not None and proc.is_alive():
                    proc.terminate()  # SIGTERM
            start = time.monotonic()
            for i, proc in enumerate(procs):
                if proc is not None:
                    timeout = drain_s if self._was_ready(kind, i) else STARTING_STOP_S
                    proc.join(max(0.0, start + timeout - time.monotonic()))
                    if proc.is_alive():
                        log.error("%s did not stop within %.0f s: killed", proc.name, timeout)
                        proc.kill()
                        proc.join(5.0)
                    _kill_group(proc.pid)  # what a killed child leaves (upload decoders) goes too
        self.reservation.close()
        shutil.rmtree(self.rundir, ignore_errors=True)


def _kill_group(pid: int) -> None:
    """Kill what is left of the session of a child that has ended (each calls setsid): its upload
    decoders, which a killed gateway cannot stop, would outlive it and hold its stderr open."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def serve(settings: Settings) -> int:
    """`streamer serve`. WORKERS=0 runs the old single process (gateway and engine together)."""
    if settings.server.workers == 0:
        from streamer.server.app import build_server, create_app

        build_server(create_app(settings), settings.server.host, settings.server.port).run()
        return 0
    try:
        supervisor = Supervisor(settings)
    except (RuntimeError, OSError) as e:
        raise ServeError(str(e)) from e
    return supervisor.run()
