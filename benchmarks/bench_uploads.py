"""End-to-end uploads (issue 15): N concurrent uploads of long real recordings through the server's
OpenAI file endpoint, in `fast` and `accurate` modes, against transformers' ASR pipeline on the same
samples and the same weights.

Ours: `streamer serve` in a subprocess on 127.0.0.1 (supervisor, engine core, gateway workers: what
a deployment runs); N clients POST one WAV each to `/v1/audio/transcriptions` at once. Wall time runs
from the first request to the last answer: upload, decoding, segmentation and the engine.
Transformers: `pipeline("automatic-speech-recognition", model=DIR, chunk_length_s=30, batch_size=N,
dtype=float16 on CUDA / float32 on the CPU, attn_implementation="sdpa")`, called once on the N
recordings' samples (it is spared the upload and the decoding). DIR is written by
`save_hf_checkpoint` from the weights the server loads. Greedy decoding on its side; our `accurate`
mode (5 beams, 30-s windows) is compared with the same row.

Recordings: the shared 6-minute file and messy English joins (`messy.py`: prompts in a seeded
order, pauses, noise gaps, a noise floor) of `--minutes` each, seeds 0, 1, ...: `--files` distinct
recordings in all; upload i of N is recording i mod `--files`. The samples are quantised to 16 bits
as the WAV upload carries them, and transformers gets the same values. A multilingual model is told
`language=en` on both sides. Each system is warmed up first on the first minute of the first
recording, as many copies at once as the largest N (per mode for ours).

    python benchmarks/bench_uploads.py --uploads 1,2 --files 2 --minutes 0.5 --no-shared   # CPU smoke
    python benchmarks/bench_uploads.py --device cuda --model tiny.en=/tmp/tiny --model base=/tmp/base
    ... --baseline benchmarks/results/bench_uploads_h200.json   # rows > 10 % slower: exit status 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import io
import json
import os
import signal
import sys
import time
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from baseline import SLOWER  # the guard's one threshold, as for bench_engine.py's rows
from common import environment, manifest, table, wer, write_json
from messy import messy_join

from streamer.audio import SAMPLE_RATE

COLUMNS = ["model", "system", "uploads", "files", "audio_s", "wall_s", "audio_s_per_s", "vs_transformers",
           "wer_%", "latency_p50_s", "core_busy"]
WARM_S = 60
"""Seconds of the first recording that warm each system up, as many copies at once as the largest
N (per mode for ours), so that the measured runs meet no batch size for the first time."""


@dataclass
class Recording:
    name: str
    audio: np.ndarray
    """float32 16 kHz, on the 16-bit grid (what the server decodes from the WAV)."""
    reference: str
    wav: bytes

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def recording(name: str, audio: np.ndarray, reference: str) -> Recording:
    """`audio` as a 16-bit WAV upload, and the float samples the server decodes from it."""
    pcm = np.clip(np.round(audio * 32768), -32768, 32767).astype(np.int16)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())
    return Recording(name, pcm.astype(np.float32) / 32768, reference, buf.getvalue())


def recordings(n: int, minutes: float, shared: bool) -> list[Recording]:
    from streamer.audio.decode import decode_audio

    out = []
    if shared:
        long = manifest("en", folder="long/")[0]
        out.append(("asterisk_en_6min", decode_audio(long["path"]), long["text"]))
    seed = 0
    while len(out) < n:
        name, audio, reference, _ = messy_join("en", minutes, seed)
        out.append((name, audio, reference))
        seed += 1
    return [recording(name, audio, reference) for name, audio, reference in out]


def batch(files: list[Recording], n: int) -> list[Recording]:
    return [files[i % len(files)] for i in range(n)]


def row(model: str, system: str, recs: list[Recording], wall: float, texts: list[str], latencies=None) -> dict:
    audio_s = sum(r.seconds for r in recs)
    return {"model": model, "system": system, "uploads": len(recs), "files": len({r.name for r in recs}),
            "audio_s": round(audio_s, 1), "wall_s": wall, "audio_s_per_s": audio_s / wall,
            "wer_%": wer([r.reference for r in recs], texts, "en"),
            "latency_p50_s": float(np.median(latencies)) if latencies else None,
            "texts": {r.name: t for r, t in zip(recs, texts)}}


# --- ours: the server's file endpoint ----------------------------------------------------------------

async def upload_all(url: str, recs: list[Recording], mode: str, timeout_s: float) -> tuple[float, list[str], list[float]]:
    import httpx

    limits = httpx.Limits(max_connections=len(recs) + 4, max_keepalive_connections=len(recs) + 4)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(timeout_s)) as client:
        t0 = time.perf_counter()

        async def one(i: int, rec: Recording) -> tuple[str, float]:
            r = await client.post("/v1/audio/transcriptions", files={"file": (f"{rec.name}_{i}.wav", rec.wav, "audio/wav")},
                                  data={"model": "whisper-1", "mode": mode, "language": "en", "response_format": "json"})
            if r.status_code != 200:
                raise RuntimeError(f"upload {i} ({rec.name}, {mode}): HTTP {r.status_code} {r.text[:300]}")
            return r.json()["text"], time.perf_counter() - t0

        done = await asyncio.gather(*(one(i, rec) for i, rec in enumerate(recs)))
        return time.perf_counter() - t0, [t for t, _ in done], [s for _, s in done]


def bench_ours(label: str, url: str, mode: str, args, files: list[Recording], report: dict) -> list[dict]:
    rows = []
    warm = recording("warm", files[0].audio[: WARM_S * SAMPLE_RATE], "")
    asyncio.run(upload_all(url, [warm] * max(args.uploads), mode, args.timeout))
    from streamer.loadtest.client import server_samples, server_side

    for n in args.uploads:
        recs = batch(files, n)
        before = server_samples(url)
        wall, texts, latencies = asyncio.run(upload_all(url, recs, mode, args.timeout))
        rows.append(row(label, f"ours {mode}", recs, wall, texts, latencies))
        # each engine core's busy share (several GPUs: are an upload's windows spread over all?)
        rows[-1]["core_busy"] = server_side(before, server_samples(url), wall)["core_busy"]
        record(rows[-1], args, report)
    return rows


def record(r: dict, args, report: dict) -> None:
    """Print a new row (with its ratio once the pipeline's row of its size is in) and rewrite the
    JSON, so that a run cut short by a timeout keeps what it measured."""
    report["rows"].append(r)
    with_ratios(report["rows"])
    print(table([r], COLUMNS), flush=True)
    write_json(args.out, report)


# --- transformers' pipeline ---------------------------------------------------------------------------

def hf_checkpoint(label: str, model: str, args) -> tuple[Path, bool]:
    """The checkpoint directory transformers opens (same weights as the server's), and whether
    the model is multilingual."""
    from streamer.model.weights import load_model, save_hf_checkpoint

    path = Path(args.hf_dir or os.environ.get("TMPDIR", "/tmp")) / f"streamer-hf-{label}"
    loaded = load_model(model)
    save_hf_checkpoint(loaded, path)
    multilingual = loaded.multilingual
    del loaded
    gc.collect()
    return path, multilingual


def bench_transformers(label: str, model: str, args, files: list[Recording], report: dict) -> list[dict]:
    import torch
    import transformers

    t = time.perf_counter()
    path, multilingual = hf_checkpoint(label, model, args)
    cuda = args.device.startswith("cuda")
    pipe = transformers.pipeline("automatic-speech-recognition", model=str(path),
                                 dtype=torch.float16 if cuda else torch.float32, device=args.device if cuda else "cpu",
                                 model_kwargs={"attn_implementation": "sdpa"})
    generate = {"language": "en", "task": "transcribe"} if multilingual else {}
    print(f"{label}: transformers {transformers.__version__} pipeline ready in {time.perf_counter() - t:.1f} s "
          f"({pipe.model.config._attn_implementation}, {pipe.model.dtype})", flush=True)

    def run(audios: list[np.ndarray], n: int) -> list[str]:
        out = pipe(audios, batch_size=n, chunk_length_s=30, generate_kwargs=dict(generate))
        return [o["text"] for o in out]

    run([files[0].audio[: WARM_S * SAMPLE_RATE]] * max(args.uploads), max(args.uploads))
    rows = []
    for n in args.uploads:
        recs = batch(files, n)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        texts = run([r.audio for r in recs], n)
        wall = time.perf_counter() - t0
        rows.append(row(label, "transformers", recs, wall, texts))
        record(rows[-1], args, report)
    return rows


def bench_model(label: str, model: str, systems: list[str], args, files: list[Recording], report: dict) -> list[dict]:
    """Our first mode, transformers, our other modes: the issue's comparison (fast against the
    pipeline) comes first. The pipeline runs while the server is up and idle (no request in
    flight; its engine keeps the K/V memory it sized at start, a few GB of the GPU's). A part that
    fails is reported and the others still run."""
    from streamer.loadtest.client import spawned_server

    rows: list[dict] = []

    def attempt(what: str, fn) -> None:
        try:
            rows.extend(fn())
        except Exception as e:  # one system or mode failing must not lose the others' numbers
            import traceback

            traceback.print_exc()
            report.setdefault("errors", []).append(f"{label} {what}: {e!r}")
            write_json(args.out, report)

    with contextlib.ExitStack() as stack:
        url = None
        if "ours" in systems:
            t = time.perf_counter()
            env = {"PRECISION": args.precision} if args.precision else None

            def start() -> list[dict]:
                nonlocal url
                server = spawned_server(model, args.device, args.workers, env, startup_s=args.startup_timeout)
                url = "http" + stack.enter_context(server)[len("ws"):]
                print(f"{label}: server up in {time.perf_counter() - t:.1f} s ({url})", flush=True)
                return []

            attempt("server", start)
        modes = args.modes if url else []
        for mode in modes[:1]:
            attempt(f"ours {mode}", lambda: bench_ours(label, url, mode, args, files, report))
        if "transformers" in systems:
            attempt("transformers", lambda: bench_transformers(label, model, args, files, report))
            gc.collect()  # the pipeline's model, before our other modes run
            if args.device.startswith("cuda"):
                import torch

                torch.cuda.empty_cache()
        for mode in modes[1:]:
            attempt(f"ours {mode}", lambda: bench_ours(label, url, mode, args, files, report))
    return rows


# --- comparison ------------------------------------------------------------------------------------

def with_ratios(rows: list[dict]) -> list[dict]:
    hf = {(r["model"], r["uploads"]): r["audio_s_per_s"] for r in rows if r["system"] == "transformers"}
    for r in rows:
        theirs = hf.get((r["model"], r["uploads"]))
        r["vs_transformers"] = r["audio_s_per_s"] / theirs if theirs and r["system"] != "transformers" else None
    return rows


def against_baseline(rows: list[dict], paths: list[str]) -> list[dict]:
    """Per row, the best recorded rate for the same model, system, uploads and audio (the same
    recordings); flagged when this run is more than SLOWER times slower."""
    best: dict[tuple, tuple[float, str]] = {}
    for p in paths:
        for r in json.loads(Path(p).read_text()).get("rows", []):
            key = (r["model"], r["system"], r["uploads"], r["audio_s"])
            if key not in best or r["audio_s_per_s"] > best[key][0]:
                best[key] = (r["audio_s_per_s"], Path(p).name)
    out = []
    for r in rows:
        key = (r["model"], r["system"], r["uploads"], r["audio_s"])
        if key in best:
            slower = best[key][0] / r["audio_s_per_s"]
            out.append({"model": r["model"], "system": r["system"], "uploads": r["uploads"], "baseline": best[key][0],
                        "now": r["audio_s_per_s"], "slower_x": slower, "flag": slower > SLOWER, "baseline_file": best[key][1]})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], help="NAME or NAME=DIR (tiny.en, base; repeatable)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the server's and the pipeline's)")
    p.add_argument("--uploads", default="1,8,32", help="N concurrent uploads, comma-separated")
    p.add_argument("--modes", default="fast,accurate")
    p.add_argument("--systems", default="ours,transformers")
    p.add_argument("--files", type=int, default=8, help="distinct recordings")
    p.add_argument("--minutes", type=float, default=3.0, help="length of each messy join")
    p.add_argument("--no-shared", action="store_true", help="without the shared 6-minute file")
    p.add_argument("--precision", default=None, help="the server's PRECISION (CUDA preset; default its own)")
    p.add_argument("--workers", type=int, default=None, help="gateway workers (default: the server's)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per upload request")
    p.add_argument("--startup-timeout", type=float, default=120.0, help="seconds the server may take to become healthy")
    p.add_argument("--hf-dir", default=None, help="where the checkpoints for transformers go (default $TMPDIR or /tmp)")
    p.add_argument("--baseline", action="append", default=[], help="a recorded bench_uploads JSON (repeatable)")
    p.add_argument("--out", default="bench_uploads.json")
    args = p.parse_args()
    args.uploads = [int(n) for n in args.uploads.split(",") if n.strip()]
    args.modes = [m for m in args.modes.split(",") if m]
    systems = args.systems.split(",")
    models = [m.partition("=") for m in args.model or ["tiny.en"]]
    # `timeout` in the GPU script sends SIGTERM: unwind, so that the spawned server is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    t = time.perf_counter()
    files = recordings(args.files, args.minutes, not args.no_shared)
    print(f"{len(files)} recordings ({', '.join(f'{r.name} {r.seconds / 60:.1f} min' for r in files)}) "
          f"in {time.perf_counter() - t:.1f} s", flush=True)
    report = {"environment": environment(), "device": args.device, "precision": args.precision,
              "uploads": args.uploads, "recordings": [{"name": r.name, "seconds": r.seconds} for r in files], "rows": []}
    rows = []
    for name, _, path in models:
        rows += bench_model(name, path or name, systems, args, files, report)
    report["rows"] = with_ratios(rows)
    # Transcripts of each distinct recording from each system's largest run; not in the rows.
    top = max(args.uploads)
    report["transcripts"] = {f"{r['model']} {r['system']}": r.pop("texts") for r in rows if r["uploads"] == top}
    for r in rows:
        r.pop("texts", None)
    if rows:
        print("\n" + table(rows, COLUMNS))
    status = 0
    if args.baseline:
        compared = against_baseline(rows, args.baseline)
        report["baseline"] = {"files": args.baseline, "rows": compared}
        print(f"\nagainst the baseline (slower_x > 1: slower; flagged past {SLOWER:.2f}):")
        print(table(compared, ["model", "system", "uploads", "baseline", "now", "slower_x", "flag", "baseline_file"]))
        status = 3 if any(r["flag"] for r in compared) else 0
    for e in report.get("errors", []):
        print("ERROR", e)
    print("wrote", write_json(args.out, report))
    raise SystemExit(status or (1 if report.get("errors") else 0))


if __name__ == "__main__":
    main()
