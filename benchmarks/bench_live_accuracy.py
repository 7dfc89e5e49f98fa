"""Live finals against offline transcription on long, messy recordings (issue #12).

Streams each recording through a real server on 127.0.0.1 (in this process, one engine) over
`/v1/stream` (a plain WebSocket client) and `/v1/realtime` (the official `openai` SDK's realtime
client), at `--pace` times real time, `--runs` times each, with and without previous-text
conditioning; transcribes the same file offline with `fast` and `accurate` (and faster-whisper's
sequential `transcribe`, greedy and 5 beams, on the same weights). Per file and system: WER of the
live finals (mean, min, max; spread = max - min over the runs), runaway finals (more words than
twice the reference span they cover), Realtime items whose deltas do not join to their
`completed.transcript`, and the items. WER after Whisper's normaliser on both sides. Per run
also the share of finals that are unstyled (cased letters, none upper case, no punctuation:
`decoding.unstyled`) and how many of those follow an unstyled final (the style carried on).

`--audio mulaw8k` streams the recording over `/v1/stream` as a call-center client does: 8-kHz
G.711 μ-law (`encoding: "mulaw"`, band-limited by libswresample as `bench_telephony.py` does).

Files: `6min` (the shared recording) and `messy-LANG-MINUTES-SEED`, joins of shared prompts with
1-6 s pauses, 3-s noise gaps and a noise floor, built reproducibly (`messy.py`).

    python benchmarks/bench_live_accuracy.py --pace 4 --runs 3                   # tiny.en, en files
    python benchmarks/bench_live_accuracy.py --files messy-en-15-0 --condition on,off --runs 1
    python benchmarks/bench_live_accuracy.py --model base --files messy-es-10-0,messy-fr-10-0
    python benchmarks/bench_live_accuracy.py --transports none --offline fast,accurate,fw-seq,fw-seq-beam5
    python benchmarks/bench_live_accuracy.py --transports stream --audio pcm16k,mulaw8k --offline none --runs 1 \
        --files jfk+messy-en-8-0

The cutting of a stream depends on stream time only and a stream's prompts wait for its previous
final, so the finals do not depend on the pace; only latency does (and partials, which finals
never see). A fast pace keeps runs short on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import time

import numpy as np

from common import AUDIO_DIR, ct2_dir, environment, manifest, normalizer, table, telephone_bytes, wer, write_json

from streamer.audio import SAMPLE_RATE
from streamer.model.decoding import unstyled
from messy import messy_join

CHUNK_S = 0.1
TAIL_S = 2.0
"""Silence after the recording, so that the VAD ends the last utterance."""
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
RUNAWAY_FACTOR = 2.0
LAST_FINAL_WAIT_S = 600.0
"""At most this long after the last audio for the final of the last speech."""
OFFLINE = ("fast", "accurate", "fw-seq", "fw-seq-beam5")
AUDIO = ("pcm16k", "mulaw8k")


JFK_PAUSE_S = 1.0


def recording(spec: str) -> dict:
    """{'name', 'language', 'audio', 'reference', 'spans'} for `6min` or `messy-LANG-MIN-SEED`, or
    `jfk+` either: Kennedy's 11 s first (whose first sentence tiny.en writes unstyled at 8 kHz),
    then the recording 1 s later, to see whether that style carries on into it."""
    from streamer.audio.decode import decode_audio

    if spec.startswith("jfk+"):
        rec, row = recording(spec[4:]), manifest("en", folder="en/jfk")[0]
        jfk = np.concatenate([decode_audio(row["path"]), np.zeros(int(JFK_PAUSE_S * SAMPLE_RATE), np.float32)])
        shift = len(jfk) / SAMPLE_RATE
        spans = None if rec["spans"] is None else \
            [(0.0, shift - JFK_PAUSE_S, row["text"])] + [(s + shift, e + shift, t) for s, e, t in rec["spans"]]
        return {**rec, "name": "jfk+" + rec["name"], "audio": np.concatenate([jfk, rec["audio"]]),
                "reference": row["text"] + " " + rec["reference"], "spans": spans}
    if spec == "6min":
        row = manifest("en", folder="long/")[0]
        return {"name": "asterisk_en_6min", "language": "en", "audio": decode_audio(row["path"]),
                "reference": row["text"], "spans": None}
    _, language, minutes, seed = spec.split("-")
    name, audio, reference, spans = messy_join(language, float(minutes), int(seed))
    return {"name": name, "language": language, "audio": audio, "reference": reference, "spans": spans}


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def reference_words(rec: dict, start: float, end: float) -> int:
    """Words of the reference that a final spanning [start, end] s covers."""
    norm = normalizer(rec["language"])
    if rec["spans"] is not None:
        return sum(len(norm(t).split()) for s, e, t in rec["spans"] if s < end and e > start)
    # The shared 6-min file has 0.5-s pauses only: its mean speech rate stands for the span's.
    rate = len(norm(rec["reference"]).split()) / (len(rec["audio"]) / SAMPLE_RATE)
    return int(rate * (end - start)) + 2


async def engine_idle(engine, ping, quiet_s: float = 1.5) -> None:
    """Until the engine has had nothing queued or live for `quiet_s` (every final is in): `stop`
    gives the server a bounded time to finish, and a fast pace outruns a busy CPU. `ping()` every
    few seconds keeps the stream from its idle timeout meanwhile."""
    quiet_since, pinged = None, time.monotonic()
    while True:
        if time.monotonic() - pinged > 5:
            await ping()
            pinged = time.monotonic()
        m = engine.metrics()
        if m["queue_depth"] == 0 and m["live_sequences"] == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_s:
                return
        else:
            quiet_since = None
        await asyncio.sleep(0.1)


async def stream_native(base: str, rec: dict, pace: float, condition: bool, engine, partials: bool,
                        context: bool | None = None, audio: str = "pcm16k") -> list[dict]:
    """Finals of one `/v1/stream` session: [{'text', 'start', 'end', 'latency_ms'}]; `context`:
    acoustic context on, off, or None for the server's default; `audio`: 16-kHz PCM or 8-kHz μ-law."""
    import websockets

    samples = np.concatenate([rec["audio"], np.zeros(int(TAIL_S * SAMPLE_RATE), np.float32)])
    if audio == "mulaw8k":
        rate, encoding, data = 8000, "mulaw", telephone_bytes(samples, "mulaw")
        chunk = int(CHUNK_S * rate)
    else:
        rate, encoding, data = SAMPLE_RATE, "pcm_s16le", pcm16(samples)
        chunk = int(CHUNK_S * rate) * 2
    language = rec["language"]
    # No keepalive pings: on a loaded machine the in-process server answers late, and a missed pong
    # would end the run (the bench waits for every final anyway).
    async with websockets.connect(base.replace("http", "ws") + "/v1/stream", max_size=None, ping_interval=None) as ws:
        start = {"type": "start", "sample_rate": rate, "encoding": encoding,
                 "language": language if language != "en" else None, "condition_on_previous_text": condition,
                 "partials": partials}
        if context is not None:
            start["acoustic_context"] = context
        await ws.send(json.dumps(start))
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready", ready
        finals: list[dict] = []

        async def send():
            for i in range(0, len(data), chunk):
                await ws.send(data[i:i + chunk])
                await asyncio.sleep(CHUNK_S / pace)
            # The server may not have read all the audio yet (it stops reading past MAX_BACKLOG_S):
            # wait for the final of the last speech, then for the engine to be idle, then stop, so
            # that `stop`'s bounded wait never has a queue of finals before it on a loaded CPU.
            last_speech = rec["spans"][-1][1] if rec["spans"] else len(rec["audio"]) / SAMPLE_RATE - 1.0
            deadline = time.monotonic() + LAST_FINAL_WAIT_S
            while not (finals and finals[-1]["end"] >= last_speech - 1.0) and time.monotonic() < deadline:
                await engine_idle(engine, lambda: ws.send(json.dumps({"type": "ping"})))
            await engine_idle(engine, lambda: ws.send(json.dumps({"type": "ping"})))
            await ws.send(json.dumps({"type": "stop"}))

        sender = asyncio.ensure_future(send())
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "final":
                finals.append({"text": event["text"], "start": event["start"], "end": event["end"],
                               "latency_ms": event["latency_ms"]})
            elif event["type"] == "error":
                raise RuntimeError(event)
            elif event["type"] == "closed":
                break
        await sender
        return finals


async def stream_realtime(base: str, rec: dict, pace: float, condition: bool, engine=None, partials=None) -> list[dict]:
    """Items of one `/v1/realtime` session through the openai SDK:
    [{'text' (completed.transcript), 'deltas' (joined), 'start', 'end'}]."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="unused", base_url=base + "/v1", websocket_base_url=base.replace("http", "ws") + "/v1")
    pcm = pcm16(np.concatenate([rec["audio"], np.zeros(int(TAIL_S * SAMPLE_RATE), np.float32)]))
    chunk = int(CHUNK_S * SAMPLE_RATE) * 2
    transcription = {"model": "whisper-1", "condition_on_previous_text": condition}
    if rec["language"] != "en":
        transcription["language"] = rec["language"]
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        await connection.recv()
        await connection.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "transcription": transcription,
            "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 200,
                               "silence_duration_ms": 500}}}})
        updated = (await connection.recv()).to_dict()
        assert updated["type"] == "session.updated", updated
        events: list[dict] = []
        sent = asyncio.Event()

        async def send():
            for i in range(0, len(pcm), chunk):
                await connection.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + chunk]).decode())
                await asyncio.sleep(CHUNK_S / pace)
            sent.set()

        def finished() -> bool:
            kinds = [e["type"] for e in events]
            started = kinds.count("input_audio_buffer.speech_started")
            return sent.is_set() and kinds.count("input_audio_buffer.committed") == started == kinds.count(COMPLETED)

        sender = asyncio.ensure_future(send())
        while not finished():
            try:
                event = await asyncio.wait_for(connection.recv(), 1.0)
            except asyncio.TimeoutError:
                continue
            events.append(event.to_dict())
            if events[-1]["type"] == "error":
                raise RuntimeError(events[-1])
        await sender
    items: dict[str, dict] = {}
    for e in events:
        item = items.setdefault(e.get("item_id", ""), {"text": None, "deltas": "", "start": 0.0, "end": 0.0})
        if e["type"] == "input_audio_buffer.speech_started":
            item["start"] = e["audio_start_ms"] / 1000
        elif e["type"] == "input_audio_buffer.speech_stopped":
            item["end"] = e["audio_end_ms"] / 1000
        elif e["type"] == DELTA:
            item["deltas"] += e["delta"]
        elif e["type"] == COMPLETED:
            item["text"] = e["transcript"]
    return [i for k, i in items.items() if k and i["text"] is not None]


COST = ("windows", "busy_s", "encode_s", "decode_s", "tokens")


def cost(before: dict, after: dict, finals: list[dict]) -> dict:
    """What the engine spent on a live run (it decodes nothing else meanwhile): per window it
    encoded (finals and their retries), and the finals' finalisation latency (`latency_ms`)."""
    d = {k: after[k] - before[k] for k in COST}
    n = max(1, d["windows"])
    lat = sorted(f["latency_ms"] for f in finals if f.get("latency_ms") is not None)
    pick = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))])) if lat else (lambda q: None)
    return {"windows": d["windows"], "engine_ms_per_window": round(1000 * d["busy_s"] / n, 1),
            "encode_ms_per_window": round(1000 * d["encode_s"] / n, 1),
            "decode_ms_per_window": round(1000 * d["decode_s"] / n, 1), "tokens_per_window": round(d["tokens"] / n, 1),
            "latency_p50_ms": pick(0.5), "latency_p95_ms": pick(0.95)}


def live_row(rec: dict, system: str, run: int, finals: list[dict], wall: float) -> dict:
    text = " ".join(f["text"] for f in finals)
    norm = normalizer(rec["language"])
    runaway = [f for f in finals if len(norm(f["text"]).split()) > RUNAWAY_FACTOR * max(1, reference_words(rec, f["start"], f["end"]))]
    unjoined = [f for f in finals if "deltas" in f and f["deltas"] != f["text"]]
    plain = [unstyled(f["text"]) for f in finals]
    return {"file": rec["name"], "system": system, "run": run, "wer_%": wer([rec["reference"]], [text], rec["language"]),
            "items": len(finals), "runaway": len(runaway), "unjoined": len(unjoined) if "realtime" in system else None,
            "unstyled_%": round(100 * sum(plain) / max(1, len(finals)), 1), "unstyled": sum(plain),
            "after_unstyled": sum(a and b for a, b in zip(plain, plain[1:])),
            "unstyled_texts": [f["text"][:120] for f, p in zip(finals, plain) if p],
            "wall_s": round(wall, 1), "runaway_texts": [f["text"][:200] for f in runaway], "text": text}


def offline_rows(engine, fw, rec: dict, systems: list[str]) -> list[dict]:
    from streamer.engine.request import DecodeOptions
    from streamer.longform import transcribe_long

    rows = []
    language = rec["language"]
    for system in systems:
        t0 = time.perf_counter()
        if system in ("fast", "accurate"):
            text = asyncio.run(transcribe_long(engine, rec["audio"], mode=system, options=DecodeOptions(language=language))).text
        else:
            segments, _ = fw.transcribe(rec["audio"], beam_size=5 if system.endswith("beam5") else 1, language=language,
                                        vad_filter=False, condition_on_previous_text=True)
            text = "".join(s.text for s in segments)
        rows.append({"file": rec["name"], "system": system, "run": 0, "wer_%": wer([rec["reference"]], [text], language),
                     "wall_s": round(time.perf_counter() - t0, 1), "text": text})
        print(table(rows[-1:], ["file", "system", "wer_%", "wall_s"]), flush=True)
    return rows


def mean_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(sum(values) / len(values), 1) if values else None


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for key in dict.fromkeys((r["file"], r["system"]) for r in rows):
        runs = [r for r in rows if (r["file"], r["system"]) == key]
        wers = [r["wer_%"] for r in runs]
        out.append({"file": key[0], "system": key[1], "runs": len(runs), "wer_%": sum(wers) / len(wers),
                    "wer_min": min(wers), "wer_max": max(wers), "spread": max(wers) - min(wers),
                    "items": runs[0].get("items"), "runaway": sum(r.get("runaway") or 0 for r in runs) if "items" in runs[0] else None,
                    "unjoined": sum(r["unjoined"] for r in runs) if runs[0].get("unjoined") is not None else None,
                    "unstyled_%": mean_of(runs, "unstyled_%"), "after_unstyled": mean_of(runs, "after_unstyled"),
                    "identical_runs": len({r["text"] for r in runs}) == 1})
        for k in ("engine_ms_per_window", "encode_ms_per_window", "decode_ms_per_window", "latency_p50_ms", "latency_p95_ms"):
            values = [r[k] for r in runs if r.get(k) is not None]
            if values:
                out[-1][k] = round(sum(values) / len(values), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--files", default="6min,messy-en-15-0")
    parser.add_argument("--transports", default="stream,realtime", help="stream, realtime, or none")
    parser.add_argument("--condition", default="off", help="previous-text conditioning of the live runs: on, off or on,off")
    parser.add_argument("--context", default="default", help="acoustic context of the /v1/stream runs: on, off, "
                        "on,off, or default (the server's; /v1/realtime always runs the server's)")
    parser.add_argument("--audio", default="pcm16k", help="what /v1/stream sends: pcm16k, mulaw8k (8-kHz G.711 "
                        "μ-law, a call-center client), or both; /v1/realtime always sends 16-kHz PCM")
    parser.add_argument("--pace", type=float, default=4.0, help="times real time")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partials", default="off", help="on: /v1/stream decodes partials too (finals never "
                        "see them; off saves CPU on a shared machine; Realtime items run none)")
    parser.add_argument("--offline", default="fast,accurate", help=f"of {', '.join(OFFLINE)}, or none")
    parser.add_argument("--continue-after", default=None, help="the server's CONTINUE_AFTER_S (a final that "
                        "stops this long before its audio is continued; 0: off); default: the server's")
    parser.add_argument("--out", default="bench_live_accuracy.json")
    args = parser.parse_args()

    from streamer.config import ModelConfig, load_settings
    from streamer.engine.engine import Engine
    from streamer.server.app import create_app, running

    # Faster than real time the engine runs behind the audio; a client that has sent everything and
    # waits for its last finals must not meet the server's idle timeout.
    # And the server reads the socket however far the engine is behind (MAX_BACKLOG_S=0): with its
    # read paused, the client's pongs queue behind audio and uvicorn's keepalive (20 s) closes the
    # stream with 1011 (found here on the 15-minute join at 4x on the loaded CPU).
    env = {"MODEL_ID": args.model, "IDLE_TIMEOUT_S": "3600", "MAX_BACKLOG_S": "0"}
    if args.continue_after is not None:
        env["CONTINUE_AFTER_S"] = args.continue_after
    settings = load_settings(env)
    engine = Engine.load(ModelConfig(model=args.model, device="cpu"), settings.engine)
    offline = [s for s in args.offline.split(",") if s in OFFLINE]
    fw = None
    if any(s.startswith("fw") for s in offline):
        from faster_whisper import WhisperModel

        fw = WhisperModel(ct2_dir(args.model), device="cpu", compute_type="float32", cpu_threads=os.cpu_count() or 1)
    transports = [t for t in args.transports.split(",") if t in ("stream", "realtime")]
    conditions = [c == "on" for c in args.condition.split(",")]
    contexts = [None if c == "default" else c == "on" for c in args.context.split(",")]
    audios = args.audio.split(",")
    if not set(audios) <= set(AUDIO):
        parser.error(f"--audio takes {', '.join(AUDIO)}, not {args.audio}")
    rows: list[dict] = []
    with running(create_app(settings, engine)) as base:
        for spec in args.files.split(","):
            rec = recording(spec)
            print(f"{rec['name']}: {len(rec['audio']) / SAMPLE_RATE / 60:.1f} min", flush=True)
            for transport, condition, context, sent in [(t, c, x, a) for t in transports for c in conditions
                                                        for x in (contexts if t == "stream" else [None])
                                                        for a in (audios if t == "stream" else ["pcm16k"])]:
                ctx = "" if context is None else ("+ctx" if context else "-ctx")
                phone = "+mulaw8k" if sent == "mulaw8k" else ""
                system = f"{transport}{'+cond' if condition else ''}{ctx}{phone}@{args.pace:g}x"
                for run in range(args.runs):
                    t0, before = time.perf_counter(), engine.metrics()
                    if transport == "stream":
                        finals = asyncio.run(stream_native(base, rec, args.pace, condition, engine, args.partials == "on",
                                                           context, sent))
                    else:
                        finals = asyncio.run(stream_realtime(base, rec, args.pace, condition))
                    rows.append({**live_row(rec, system, run, finals, time.perf_counter() - t0),
                                 **cost(before, engine.metrics(), finals)})
                    write_json(args.out, {"model": args.model, "pace": args.pace, "runs": rows})  # so far
                    print(table(rows[-1:], ["file", "system", "run", "wer_%", "items", "runaway", "unjoined",
                                            "unstyled_%", "after_unstyled", "wall_s",
                                            "engine_ms_per_window", "encode_ms_per_window", "decode_ms_per_window",
                                            "latency_p50_ms", "latency_p95_ms"]), flush=True)
            rows += offline_rows(engine, fw, rec, offline)
    engine.close()
    result = {"environment": environment(), "model": args.model, "pace": args.pace, "audio_dir": str(AUDIO_DIR),
              "summary": summary(rows), "runs": rows}
    print("\n" + table(result["summary"], ["file", "system", "runs", "wer_%", "wer_min", "wer_max", "spread", "items",
                                           "runaway", "unjoined", "unstyled_%", "after_unstyled", "identical_runs", "engine_ms_per_window",
                                           "latency_p50_ms", "latency_p95_ms"]))
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()
