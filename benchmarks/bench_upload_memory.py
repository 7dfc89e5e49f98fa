"""Memory of one long upload (session 32): `streamer serve` (tiny.en on the CPU) in a subprocess on
127.0.0.1, one file POSTed to `/v1/audio/transcriptions` (fast mode, response_format json, or
`stream=true`), and the resident memory (RSS) of the server's processes sampled every
`--interval` s with psutil: the supervisor, the engine core, the gateway worker, its decoder
processes (children of the gateway's forkserver) and the total of all at one instant.

Each run gets a fresh server, so that what one upload leaves behind in a process's heap does not
count for the next. The table shows each process's idle RSS before the upload and its peak during
it; `total_MB` is the highest sum over the processes at one sampling instant, `total_add_MB` that
minus the idle sum. `ttfb_s` is the time from the request to the first byte of the answer
(for `stream=true`, the first event), `wall_s` to its last. RSS counts shared pages (libraries,
copy-on-write pages of the forkserver's children) in every process that maps them: the idle
column holds those, and the growth is the upload's.

    python benchmarks/make_long_upload.py --hours 1 --out /tmp/long_1h.ogg
    OMP_NUM_THREADS=1 python benchmarks/bench_upload_memory.py --file /tmp/long_1h.ogg --label after
    ... --file /tmp/long_4h.ogg --stream both           # json and stream=true, a server each

Transcripts go beside each file (`<file>.<label>.<json|stream>.txt`), so that two trees' texts can
be compared word for word; WER is against the reference that make_long_upload.py wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import psutil

from common import environment, table, wer, write_json

from streamer.loadtest.client import spawned_server

ROLES = ("supervisor", "core", "gateway", "decoder")
COLUMNS = ["file", "audio_h", "response", *(f"{r}_MB" for r in ROLES), "total_MB", "total_add_MB", "ttfb_s", "wall_s",
           "audio_s_per_s", "wer_%"]


def role(process: psutil.Process, root: int) -> str:
    """Which part of the server a process is: `streamer serve` spawns the engine core (the one that
    maps torch) and the gateway; the gateway's forkserver forks the decoder processes."""
    cmdline = " ".join(process.cmdline())
    if process.pid == root:
        return "supervisor"
    if "resource_tracker" in cmdline:
        return "other"
    if "forkserver" in cmdline:  # a fork keeps its parent's command line
        return "decoder" if "forkserver" in " ".join(process.parent().cmdline()) else "forkserver"
    if process.ppid() == root:
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        return "core" if "libtorch" in maps else "gateway"
    return "other"


class Sampler(threading.Thread):
    """RSS of the server's process tree every `interval` s, by role, until `stop()`."""

    def __init__(self, root: int, interval: float):
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.roles: dict[int, str] = {}
        self.samples: list[dict] = []  # {"t": s, role: MB summed over that role's processes}
        self.t0 = time.perf_counter()
        self._done = threading.Event()

    def sample(self) -> dict:
        tree = psutil.Process(self.root)
        out = {"t": round(time.perf_counter() - self.t0, 2), **{r: 0.0 for r in ROLES}, "other": 0.0, "forkserver": 0.0}
        for p in [tree, *tree.children(recursive=True)]:
            try:
                if p.pid not in self.roles:
                    self.roles[p.pid] = role(p, self.root)
                out[self.roles[p.pid]] += p.memory_info().rss / 2**20
            except psutil.NoSuchProcess:  # a decoder that ended between the listing and the read
                continue
        out["total"] = sum(v for k, v in out.items() if k != "t")
        return {k: round(v, 1) for k, v in out.items()}

    def run(self) -> None:
        while not self._done.is_set():
            self.samples.append(self.sample())
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()


def server_root() -> int:
    """The pid of the server that `spawned_server` started: this process's one child running it."""
    children = [p for p in psutil.Process().children() if "streamer.server.supervisor" in " ".join(p.cmdline())]
    if len(children) != 1:
        raise RuntimeError(f"expected one server process, found {len(children)}")
    return children[0].pid


def upload(url: str, path: str, stream: bool, timeout_s: float) -> tuple[float, float, str]:
    """POST the file; (seconds to the first byte of the answer, to its end, transcript text)."""
    import httpx

    data = {"model": "whisper-1", "mode": "fast", "response_format": "json", "stream": "true" if stream else "false"}
    with open(path, "rb") as f, httpx.Client(base_url=url, timeout=httpx.Timeout(timeout_s)) as client:
        t0 = time.perf_counter()
        first = None
        body = b""
        with client.stream("POST", "/v1/audio/transcriptions", data=data,
                           files={"file": (os.path.basename(path), f, "audio/ogg")}) as r:
            for chunk in r.iter_bytes():
                first = first or time.perf_counter() - t0
                body += chunk
        wall = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {body[:300]!r}")
    if not stream:
        return first, wall, json.loads(body)["text"]
    events = [json.loads(line[len(b"data: "):]) for line in body.splitlines() if line.startswith(b"data: ")]
    done = [e for e in events if e.get("type") == "transcript.text.done"]
    if not done:
        raise RuntimeError(f"no transcript.text.done event: {events[-1:]}")
    return first, wall, done[0]["text"]


def measure(path: str, stream: bool, args) -> dict:
    """One fresh server, one upload of `path`: the row of the table (and the RSS timeline)."""
    reference = json.loads(Path(path + ".json").read_text())
    with spawned_server("tiny.en", "cpu", args.workers, startup_s=args.startup_timeout) as ws_url:
        url = "http" + ws_url[len("ws"):]
        time.sleep(args.settle)  # the decoder pool's warm-up and the first /health probes are over
        sampler = Sampler(server_root(), args.interval)
        idle = sampler.sample()
        sampler.start()
        try:
            ttfb, wall, text = upload(url, path, stream, args.timeout)
        finally:
            sampler.stop()
    response = "stream" if stream else "json"
    Path(f"{path}.{args.label}.{response}.txt").write_text(text)
    peaks = {k: max(s[k] for s in sampler.samples) for k in (*ROLES, "total")}
    at = {k: next(s["t"] for s in sampler.samples if s[k] == peaks[k]) for k in peaks}
    row = {"file": Path(path).name, "audio_h": reference["seconds"] / 3600, "response": response,
           **{f"{k}_MB": peaks[k] for k in peaks}, "total_add_MB": peaks["total"] - idle["total"],
           "ttfb_s": ttfb, "wall_s": wall, "audio_s_per_s": reference["seconds"] / wall,
           "wer_%": wer([reference["reference"]], [text], "en")}
    return {**row, "label": args.label, "idle_MB": {k: idle[k] for k in (*ROLES, "total")}, "peak_at_s": at,
            "words": len(text.split()), "timeline": sampler.samples}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", action="append", required=True, help="an upload from make_long_upload.py (repeatable)")
    p.add_argument("--stream", choices=("off", "on", "both"), default="off", help="stream=true runs")
    p.add_argument("--label", default="run", help="names the run in the JSON and the transcripts' files")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between RSS samples")
    p.add_argument("--settle", type=float, default=3.0, help="seconds between the server's start and the upload")
    p.add_argument("--workers", type=int, default=None, help="gateway workers (default: the server's)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the upload's answer")
    p.add_argument("--startup-timeout", type=float, default=180.0)
    p.add_argument("--out", default=None, help="JSON under benchmarks/results/ (default bench_upload_memory_LABEL.json)")
    args = p.parse_args()
    streams = {"off": [False], "on": [True], "both": [False, True]}[args.stream]
    report = {"environment": environment(), "label": args.label, "interval_s": args.interval, "rows": []}
    for path in args.file:
        for stream in streams:
            report["rows"].append(measure(path, stream, args))
            print(table(report["rows"][-1:], COLUMNS), flush=True)
            write_json(args.out or f"bench_upload_memory_{args.label}.json", report)
    print("\n" + table(report["rows"], COLUMNS))
    idle = [{"file": r["file"], "response": r["response"], **{f"{k}_MB": v for k, v in r["idle_MB"].items()},
             **{f"{k}_peak_at_s": v for k, v in r["peak_at_s"].items()}} for r in report["rows"]]
    print("\nidle RSS before each upload, and when each peak came (s from the request):")
    print(table(idle, ["file", "response", *(f"{k}_MB" for k in (*ROLES, "total")),
                       *(f"{k}_peak_at_s" for k in (*ROLES, "total"))]))


if __name__ == "__main__":
    main()
