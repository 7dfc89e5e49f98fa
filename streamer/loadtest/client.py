"""Load test of live streaming: N concurrent `/v1/stream` clients send real recordings at real-time pace.

Each client streams its own recording (English prompts of `--audio-dir` joined with 1-s pauses,
about `--seconds` long) as 32-ms frames of 16-kHz PCM and measures, on its side:

- time to first partial: from sending the audio where speech began (`speech_started.t`) to
  receiving the utterance's first `partial`;
- finalisation latency: from sending the audio where speech ended (`speech_stopped.t`) to
  receiving the `final` (it includes the VAD's 500 ms of silence); and the decode part alone,
  from receiving `speech_stopped` to receiving the `final`;
- WER of the finals against the prompts' published texts (Whisper's English normaliser);
- partial churn: the fraction of words shown in partials that the final did not keep (words past
  the longest common prefix with the final), and the same for the `stable` prefixes alone;
- and, from the server's `/metrics` before and after each run, where the time went: the mean
  time of a final window in the engine (submit to result) and of its wait for the first token,
  the engine's steps and their mean duration, the fraction of the run the engine was busy, and the
  highest lag of the gateway's event loop (polled every 0.25 s: past ~1 s the process is saturated).

The sweep doubles N from 1 until p95 finalisation exceeds `--target` (or `--max-clients`); the
highest N that held is reported.

    streamer loadtest --spawn --audio-dir ../shared/audio      # start a local server (tiny.en)
    streamer loadtest --url ws://host:8000 --clients 1,2,4,8,16 --audio-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import streamer
from streamer.audio import SAMPLE_RATE as RATE
from streamer.loadtest.corpus import concat, manifest
from streamer.loadtest.report import environment, normalizer, table, wer

FRAME_S = 0.032
"""What the demo page sends: 512 samples."""
GAP_S = 1.0
"""Pause between prompts: longer than the VAD's 500 ms, so each prompt ends an utterance."""
GIVE_UP = 5.0
"""The sweep stops once p95 finalisation passes this multiple of the target."""
STAGGER_S = 2.0
"""Clients start at random moments within this window, as real users do."""


@dataclass
class Recording:
    name: str
    pcm: bytes
    """16-kHz mono pcm_s16le."""
    reference: str


@dataclass
class ClientResult:
    first_partial_s: list[float] = field(default_factory=list)
    final_s: list[float] = field(default_factory=list)
    utterance_s: list[float] = field(default_factory=list)
    """Speech length of each utterance in `final_s` (speech_started to speech_stopped)."""
    decode_s: list[float] = field(default_factory=list)
    server_latency_s: list[float] = field(default_factory=list)
    finals: list[str] = field(default_factory=list)
    partial_words: int = 0
    partial_changed: int = 0
    stable_words: int = 0
    stable_changed: int = 0
    error: str | None = None


LONG_UTTERANCE_S = 8.0
"""Finals of utterances longer than this are also reported apart (`bench_live_engine.py` does the same)."""


def recordings(audio_dir: Path, n: int, seconds: float, language: str = "en") -> list[Recording]:
    """`n` different recordings of about `seconds` each, rotating through the prompts."""
    rows = [r for r in manifest(audio_dir, language) if r["duration"] >= 2.0]
    texts = {r["path"]: r["text"] for r in rows}
    out = []
    per = max(1, int(seconds / (sum(r["duration"] for r in rows) / len(rows) + GAP_S)))
    for i in range(n):
        start = (i * per) % len(rows)
        paths = [rows[(start + j) % len(rows)]["path"] for j in range(len(rows))]
        audio, used = concat(paths, seconds, gap=GAP_S)
        pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
        out.append(Recording(f"client{i}", pcm, " ".join(texts[p] for p in used)))
    return out


def _words(text: str) -> list[str]:
    return normalizer("en")(text).split()


def _changed(shown: str, final: str) -> tuple[int, int]:
    """(words shown, words the final did not keep): those past the common prefix."""
    a, b = _words(shown), _words(final)
    keep = 0
    for x, y in zip(a, b):
        if x != y:
            break
        keep += 1
    return len(a), len(a) - keep


async def stream_one(url: str, rec: Recording, pace: float, delay: float, start: dict) -> ClientResult:
    """One client: stream `rec` at `pace` times real time after `delay` seconds, then stop."""
    from streamer.client import StreamClient

    await asyncio.sleep(delay)
    result = ClientResult()
    frame = int(FRAME_S * RATE) * 2
    sent_at: list[float] = []
    """Wall time at which each frame was sent."""
    started: dict[int, float] = {}
    stopped: dict[int, tuple[float, float]] = {}
    partials: dict[int, list[dict]] = {}

    def sent_time(t: float) -> float:
        i = min(int(t * RATE * 2) // frame, len(sent_at) - 1)
        return sent_at[max(i, 0)]

    try:
        async with StreamClient(url, **start) as ws:  # refused: StreamError; resumes a dropped connection

            async def receive():
                async for e in ws:
                    now = time.monotonic()
                    uid = e.get("utterance_id")
                    if e["type"] == "speech_started":
                        started[uid] = e["t"]
                    elif e["type"] == "partial":
                        if uid not in partials and uid in started:
                            result.first_partial_s.append(now - sent_time(started[uid]))
                        partials.setdefault(uid, []).append(e)
                    elif e["type"] == "speech_stopped":
                        stopped[uid] = (e["t"], now)
                    elif e["type"] == "final":
                        result.finals.append(e["text"])
                        result.server_latency_s.append(e["latency_ms"] / 1000)
                        if uid in stopped:
                            t, received = stopped[uid]
                            result.final_s.append(now - sent_time(t))
                            result.utterance_s.append(t - started.get(uid, t))
                            result.decode_s.append(now - received)
                        for p in partials.pop(uid, []):
                            n, changed = _changed(p["text"], e["text"])
                            result.partial_words += n
                            result.partial_changed += changed
                            n, changed = _changed(p["stable"], e["text"])
                            result.stable_words += n
                            result.stable_changed += changed
                    elif e["type"] == "error":
                        raise RuntimeError(f"server error: {e}")

            receiver = asyncio.ensure_future(receive())
            t0 = time.monotonic()
            for k, i in enumerate(range(0, len(rec.pcm), frame)):
                # Sleep to the frame's due time (not by a fixed step), so that pacing does not drift.
                await asyncio.sleep(max(0.0, t0 + k * FRAME_S / pace - time.monotonic()))
                sent_at.append(time.monotonic())
                await ws.send(rec.pcm[i:i + frame])
            await ws.stop()
            await receiver
    except Exception as e:  # a refused or broken client is a result, not a crash of the run
        result.error = f"{type(e).__name__}: {e}"
    return result


def _client_process(url: str, recs: list[Recording], pace: float, delays: list[float], start: dict):
    """One load-client process: its share of the clients on its own event loop; (results, CPU s)."""
    async def main():
        return await asyncio.gather(*(stream_one(url, r, pace, d, start) for r, d in zip(recs, delays)))

    cpu0 = time.process_time()
    results = asyncio.run(main())
    return results, time.process_time() - cpu0


def run_load(url: str, n_clients: int, files: list[Recording], pace: float = 1.0, *,
             start: dict | None = None, seed: int = 0, procs: int = 1, fast: tuple[Recording, float] | None = None) -> dict:
    """N clients at once, each streaming one of `files` (round robin), spread over `procs`
    processes so that the load client is never the limit; the summary of the run, with the
    clients' own CPU use (`client_cpu`: CPU seconds per wall second, all processes)."""
    rng = random.Random(seed)
    start = {"language": "en"} if start is None else start
    recs = [files[i % len(files)] for i in range(n_clients)]
    delays = [rng.uniform(0, STAGGER_S) for _ in recs]
    procs = max(1, min(procs, n_clients))
    t0 = time.monotonic()
    fast_task = None
    if fast is not None:  # one more client, faster than real time, in a process of its own
        import concurrent.futures

        pool = concurrent.futures.ProcessPoolExecutor(1)
        fast_task = pool.submit(_client_process, url, [fast[0]], fast[1], [0.0], start)
    if procs == 1:
        results, cpu = _client_process(url, recs, pace, delays, start)
    else:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(procs) as pool:
            parts = pool.starmap(_client_process, [(url, recs[i::procs], pace, delays[i::procs], start)
                                                  for i in range(procs)])
        order = [j for i in range(procs) for j in range(i, n_clients, procs)]
        flat = [r for part, _ in parts for r in part]
        results = [None] * n_clients
        for j, r in zip(order, flat):
            results[j] = r
        cpu = sum(c for _, c in parts)
    wall = time.monotonic() - t0
    fast_result = None
    if fast_task is not None:
        [fast_result], _ = fast_task.result()
        pool.shutdown()
    ok = [(r, rec) for r, rec in zip(results, recs) if r.error is None]

    def pct(values: list[float], q: float) -> float | None:
        return float(np.percentile(values, q)) if values else None

    def gather(name: str) -> list[float]:
        return [v for r, _ in ok for v in getattr(r, name)]

    summary = {"clients": n_clients, "failed": n_clients - len(ok), "wall_s": wall, "client_procs": procs,
               "client_cpu": cpu / wall if wall else None,
               "errors": sorted({r.error for r in results if r.error})[:5]}
    for name, key in (("first_partial_s", "ttfp"), ("final_s", "final"), ("decode_s", "decode"),
                      ("server_latency_s", "server_final")):
        values = gather(name)
        for q in (50, 95, 99):
            summary[f"{key}_p{q}"] = pct(values, q)
        summary[f"{key}_n"] = len(values)
    long = [f for r, _ in ok for f, u in zip(r.final_s, r.utterance_s) if u > LONG_UTTERANCE_S]
    summary["utterance_p95_s"] = pct(gather("utterance_s"), 95)
    summary[f"final_p95_over_{LONG_UTTERANCE_S:g}s"] = pct(long, 95)  # their decode is longest
    summary["wer"] = wer([rec.reference for _, rec in ok], [" ".join(r.finals) for r, _ in ok], "en") if ok else None
    words = sum(r.partial_words for r, _ in ok)
    stable = sum(r.stable_words for r, _ in ok)
    if fast_result is not None:
        summary["fast_sender"] = {"pace": fast[1], "error": fast_result.error, "finals": len(fast_result.final_s),
                                  "final_p50": pct(fast_result.final_s, 50), "final_p95": pct(fast_result.final_s, 95)}
    summary["partial_churn"] = sum(r.partial_changed for r, _ in ok) / words if words else None
    summary["stable_churn"] = sum(r.stable_changed for r, _ in ok) / stable if stable else None
    return summary


SERVER_SAMPLES = ("streamer_window_seconds_sum", "streamer_window_seconds_count",
                  "streamer_window_queue_wait_seconds_sum", "streamer_window_queue_wait_seconds_count",
                  "streamer_engine_steps_total", "streamer_engine_busy_seconds_total",
                  "streamer_event_loop_lag_seconds", "streamer_partial_interval_seconds_sum",
                  "streamer_partial_interval_seconds_count", "streamer_engine_ipc_received_bytes_total",
                  "streamer_engine_ipc_sent_bytes_total", "streamer_engine_ipc_cpu_seconds_total",
                  "streamer_partial_cadence_seconds", "streamer_gateway_sessions",
                  "streamer_engine_core_busy_seconds_total")
LAG_POLL_S = 0.25
"""How often the gateway's event-loop lag is read during a run (its peak is reported)."""


def server_samples(http_url: str) -> dict[str, float]:
    """The cumulative samples of SERVER_SAMPLES from `/metrics`, keyed `name` or `name:kind`."""
    from prometheus_client.parser import text_string_to_metric_families

    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(http_url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        # Labels that split a sample: `kind` (final/partial), `pid` (a gateway worker's loop lag),
        # `core` (an engine core's busy time).
        return {":".join([s.name] + [s.labels[k] for k in ("kind", "pid", "core") if k in s.labels]): s.value
                for family in text_string_to_metric_families(text) for s in family.samples if s.name in SERVER_SAMPLES}
    return {}


class LagWatch:
    """The highest event-loop lag the server reports while a run goes on (a thread polling
    `/metrics`, so that the clients' loop is not blocked)."""

    def __init__(self, http_url: str):
        self.http_url, self.peak = http_url, 0.0
        self.per_gateway: dict[str, float] = {}
        """pid -> highest lag (several gateway workers), '0' for a single process."""
        self.streams: dict[str, float] = {}
        """pid -> most live streams the gateway held at once."""
        self.cadence: list[float] = []
        """The live policy's partial cadence as polled (every gateway's)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "LagWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(LAG_POLL_S):
            for key, value in server_samples(self.http_url).items():
                if key.startswith("streamer_event_loop_lag_seconds"):
                    pid = key.partition(":")[2] or "0"
                    self.per_gateway[pid] = max(self.per_gateway.get(pid, 0.0), value)
                    self.peak = max(self.peak, value)
                elif key.startswith("streamer_gateway_sessions"):
                    pid = key.partition(":")[2] or "0"
                    self.streams[pid] = max(self.streams.get(pid, 0.0), value)
                elif key.startswith("streamer_partial_cadence_seconds"):
                    self.cadence.append(value)


def _profile_later(health: dict, args) -> None:
    """py-spy the engine core (and one gateway) for `--profile-s` seconds, once the run's clients
    are all streaming: collapsed stacks to `<out>.core.txt` / `<out>.gateway.txt`."""
    import shutil

    spy = shutil.which("py-spy")
    cores = [c["pid"] for c in health.get("engine_cores") or [] if c.get("pid")]
    if spy is None or not cores:
        print(f"profile: skipped (py-spy {'missing' if spy is None else 'found'}, core pids {cores})", flush=True)
        return
    base = str(Path(args.out)) if args.out else "bench_streaming"
    targets = [(cores[0], base + ".core.txt")]
    if health.get("gateway_pid"):
        targets.append((health["gateway_pid"], base + ".gateway.txt"))

    def run():
        time.sleep(STAGGER_S + 3.0)
        procs = [subprocess.Popen([spy, "record", "--nonblocking", "--threads", "-r", "200", "-d", str(args.profile_s), "-f", "raw",
                                   "-p", str(pid), "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for pid, out in targets]
        for proc in procs:
            proc.wait()
        print(f"profile: wrote {[out for _, out in targets]}", flush=True)

    threading.Thread(target=run, daemon=True).start()


def server_side(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    """Where the server's time went during one run, from the deltas of its cumulative metrics."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}

    def mean(name: str, kind: str) -> float | None:
        n = d.get(f"{name}_count:{kind}", 0.0)
        return d[f"{name}_sum:{kind}"] / n if n else None

    steps, busy = d.get("streamer_engine_steps_total", 0.0), d.get("streamer_engine_busy_seconds_total", 0.0)
    per_core = sorted((int(k.rpartition(":")[2]), v) for k, v in d.items()
                      if k.startswith("streamer_engine_core_busy_seconds_total:"))
    return {"final_window_s": mean("streamer_window_seconds", "final"),
            "final_first_token_s": mean("streamer_window_queue_wait_seconds", "final"),
            "partial_window_s": mean("streamer_window_seconds", "partial"),
            "engine_steps": int(steps), "step_ms": 1000 * busy / steps if steps else None,
            "ipc_MBps": (d.get("streamer_engine_ipc_received_bytes_total", 0.0)
                         + d.get("streamer_engine_ipc_sent_bytes_total", 0.0)) / wall_s / 1e6 if wall_s else None,
            "ipc_cpu": d.get("streamer_engine_ipc_cpu_seconds_total", 0.0) / wall_s if wall_s else None,
            "partial_interval_s": (d.get("streamer_partial_interval_seconds_sum", 0.0)
                                   / d["streamer_partial_interval_seconds_count"]
                                   if d.get("streamer_partial_interval_seconds_count") else None),
            "engine_busy": busy / wall_s if wall_s else None,
            # Each core's share of the run spent in steps (several cores: is the routing keeping all busy?)
            "core_busy": "/".join(f"{v / wall_s:.2f}" for _, v in per_core) if wall_s and per_core else None}


def _health(http_url: str) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(http_url + "/health", timeout=5) as response:
            return json.loads(response.read())
    return None


@contextlib.contextmanager
def spawned_server(model: str, device: str | None, workers: int | None = None, env_extra: dict | None = None,
                   startup_s: float = 300.0):
    """`streamer serve` in a subprocess on a free port of 127.0.0.1; SIGTERM at the end.
    `workers`: gateway worker processes (None: the server's default; 0: one process); `startup_s`:
    how long it may take to become healthy (a core that fails to load is restarted, never healthy)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("from streamer.config import load_settings; from streamer.server.supervisor import serve; "
            f"serve(load_settings(model={{'model': {model!r}, 'device': {device!r}}}, "
            # every client of the load test comes from this host: no per-address limit
            f"server={{'port': {port}, 'workers': {workers!r}, 'max_connections_per_client': 0}}))")
    # The child imports this same `streamer` (a checkout run without installing it, or a wheel).
    here = str(Path(streamer.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env_extra or {})}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL)
    try:
        http_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + startup_s  # a deadline: a /health probe itself may wait 5 s
        while (_health(http_url) or {}).get("status") != "ok":
            if proc.poll() is not None:
                raise RuntimeError("the server exited during startup")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not become healthy in {startup_s:g} s")
            time.sleep(0.25)
        yield f"ws://127.0.0.1:{port}"
    finally:
        stop_server(proc, 60)


def stop_server(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM (the server drains: open utterances get their finals), then SIGKILL after `grace_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


COLUMNS = ["clients", "failed", "ttfp_p50", "ttfp_p95", "ttfp_p99", "final_p50", "final_p95", "final_p99",
           f"final_p95_over_{LONG_UTTERANCE_S:g}s", "utterance_p95_s", "decode_p50", "decode_p95", "wer", "partial_churn", "stable_churn", "client_cpu"]


SERVER_COLUMNS = ["clients", "final_window_s", "final_first_token_s", "partial_window_s", "engine_steps", "step_ms",
                  "engine_busy", "core_busy", "loop_lag_max_s", "partial_interval_s", "cadence_max_s", "ipc_MBps", "ipc_cpu"]


def fairness(url: str, args) -> dict:
    """`--fast-sender PACE`: N real-time clients alone, then the same N beside one client that
    sends PACE times faster than real time for the whole run; their finalisation latencies."""
    n = args.clients[0]
    files = recordings(args.audio_dir, n, args.seconds)
    audio = recordings(args.audio_dir, 1, args.seconds * args.fast_sender, language="en")[0]
    fast = Recording("fast", audio.pcm, audio.reference)
    runs = []
    for label, extra in (("alone", None), (f"beside a {args.fast_sender:g}x sender", (fast, args.fast_sender))):
        summary = run_load(url, n, files, args.pace, procs=args.client_procs, fast=extra)
        summary["label"] = label
        runs.append(summary)
        print(table([summary], ["label", *COLUMNS]), flush=True)
    rise = (runs[1]["final_p95"] - runs[0]["final_p95"]) if runs[0]["final_p95"] and runs[1]["final_p95"] else None
    print(f"p95 finalisation of the {n} real-time clients: {runs[0]['final_p95']:.2f} s alone, "
          f"{runs[1]['final_p95']:.2f} s beside the fast sender (+{rise:.2f} s); the fast sender's own: "
          f"{runs[1]['fast_sender']}", flush=True)
    return {"clients": n, "fast_sender_pace": args.fast_sender, "seconds_per_client": args.seconds,
            "p95_rise_s": rise, "environment": environment(), "runs": runs}


def sweep(url: str, args) -> dict:
    http_url = url.replace("ws://", "http://").replace("wss://", "https://")
    health = _health(http_url) or {}
    files = recordings(args.audio_dir, max(args.clients), args.seconds)
    runs, best, held_so_far = [], 0, True
    for n in args.clients:
        before = server_samples(http_url)
        if args.profile_at == n:
            _profile_later(health, args)
        with LagWatch(http_url) as lag:
            summary = run_load(url, n, files, args.pace, procs=args.client_procs)
        summary["server"] = server_side(before, server_samples(http_url), summary["wall_s"])
        summary["server"]["loop_lag_max_s"] = lag.peak
        summary["server"]["loop_lag_per_gateway_s"] = sorted(lag.per_gateway.values(), reverse=True)
        # Streams held per gateway, in the order of the lags above (the most loaded loop first).
        order = sorted(lag.per_gateway, key=lag.per_gateway.get, reverse=True)
        summary["server"]["streams_per_gateway"] = [int(lag.streams.get(pid, 0)) for pid in order]
        summary["server"]["cadence_mean_s"] = float(np.mean(lag.cadence)) if lag.cadence else None
        summary["server"]["cadence_max_s"] = max(lag.cadence) if lag.cadence else None
        runs.append(summary)
        print(table([summary], COLUMNS), flush=True)
        print(table([{"clients": n, **summary["server"]}], SERVER_COLUMNS), flush=True)
        held = summary["failed"] == 0 and summary["final_p95"] is not None and summary["final_p95"] < args.target
        held_so_far = held_so_far and held
        if held_so_far:
            best = n
        # Past the target, keep sweeping only while it is still in sight: the curve is worth having.
        if summary["failed"] or summary["final_p95"] is None or summary["final_p95"] > GIVE_UP * args.target:
            break
    return {"model": health.get("model"), "device": health.get("device"), "seconds_per_client": args.seconds,
            "pace": args.pace, "target_p95_final_s": args.target, "max_clients_held": best,
            "environment": environment(), "runs": runs}


def main(argv: list[str] | None = None, *, prog: str = "streamer loadtest", results_dir: Path = Path("."),
         audio_dir: Path | None = None) -> int:
    """`results_dir`: where a result goes without `--out`; `audio_dir`: `--audio-dir`'s default."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, ws://host:port")
    where.add_argument("--spawn", action="store_true", help="start a local server for the run")
    p.add_argument("--model", default="tiny.en", help="with --spawn: the model to serve")
    p.add_argument("--device", default=None, help="with --spawn: cpu, cuda, ... (default: auto)")
    p.add_argument("--clients", default="1,2,4,8,16,32,64,128,256,512",
                   type=lambda s: [int(x) for x in s.split(",")], help="N values of the sweep, in order")
    p.add_argument("--seconds", type=float, default=30.0, help="audio per client")
    p.add_argument("--pace", type=float, default=1.0, help="times real time")
    p.add_argument("--target", type=float, default=1.0, help="p95 finalisation latency to hold, seconds")
    p.add_argument("--out", help=f"JSON path (default {results_dir}/bench_streaming_<device>.json)")
    p.add_argument("--audio-dir", type=Path, default=audio_dir, required=audio_dir is None,
                   help=f"the recordings: a directory holding manifest.jsonl (default {audio_dir})")
    p.add_argument("--workers", type=int, default=None,
                   help="with --spawn: gateway worker processes (default: the server's; 0: one process)")
    p.add_argument("--fast-sender", type=float, default=None,
                   help="fairness run: the first --clients N alone, then beside one client this many times faster")
    p.add_argument("--profile-at", type=int, default=None, help="py-spy the engine core during the run of this N")
    p.add_argument("--profile-s", type=int, default=12, help="seconds of py-spy sampling")
    p.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 4)),
                   help="load-client processes (default: a quarter of the cores, at most 8)")
    args = p.parse_args(argv)

    spawn = spawned_server(args.model, args.device, args.workers) if args.spawn else contextlib.nullcontext(args.url)
    with spawn as url:
        if args.fast_sender:
            result = fairness(url.rstrip("/"), args)
            if args.out:
                write_json(Path(args.out), result)
            print(f"wrote {args.out or write_json(results_dir / 'bench_streaming_fairness.json', result)}")
            return 0
        result = sweep(url.rstrip("/"), args)
    print()
    print(table(result["runs"], COLUMNS))
    print(table([{"clients": r["clients"], **r["server"]} for r in result["runs"]], SERVER_COLUMNS))
    print(f"\nhighest N with p95 finalisation < {args.target:g} s: {result['max_clients_held']}")
    device = (result["device"] or "unknown").split(":")[0]
    path = write_json(Path(args.out) if args.out else results_dir / f"bench_streaming_{device}.json", result)
    print(f"wrote {path}")
    return 0


def write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path

