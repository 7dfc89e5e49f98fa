"""`streamer serve`, `streamer transcribe FILE...`, `streamer loadtest`.

stdout carries only transcripts, so the CLI composes in pipes; progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time

from streamer.config import load_settings, log_level


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="tiny.en (default, embedded) | base | a local directory | a Hugging Face hub id")
    p.add_argument("--device", help="auto (default) | cpu | cuda | cuda:N")
    p.add_argument("--dtype", help="auto (default: float32 on the CPU, float16 on CUDA) | float16 | bfloat16 | float32")


def _settings(args, **server):
    """The settings of the environment and the flags; a bad value ends the command (exit 2)."""
    try:
        return load_settings(model={"model": args.model, "device": args.device, "dtype": args.dtype}, server=server)
    except ValueError as e:
        print(f"streamer: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamer", description="Real-time Whisper transcription server")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server (WebSocket, Realtime, WebRTC, file endpoints, web demo)")
    _model_flags(serve)
    serve.add_argument("--host", help="bind address (env HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (env PORT, default 8000)")
    serve.add_argument("--api-key", help="require this key (env API_KEY)")
    serve.add_argument("--workers", type=int, help="gateway worker processes (env WORKERS; default 1 on <= 2 cores, "
                       "else min(8, cores/2); 0: gateway and engine in one process)")
    serve.add_argument("--ssl-certfile", help="PEM certificate: serve HTTPS/WSS (env SSL_CERTFILE)")
    serve.add_argument("--ssl-keyfile", help="PEM private key of --ssl-certfile (env SSL_KEYFILE)")
    serve.add_argument("--allowed-origins", help="web origins allowed besides the server's own, comma-separated; "
                                                 "`*` for any (env ALLOWED_ORIGINS)")

    tr = sub.add_parser("transcribe", help="transcribe audio files (any format PyAV reads)")
    tr.add_argument("files", nargs="+", metavar="FILE")
    _model_flags(tr)
    tr.add_argument("--language", help="language code; default: detect (multilingual models) or en")
    tr.add_argument("--task", default="transcribe", choices=["transcribe", "translate"])
    tr.add_argument("--format", default="text", choices=["text", "json", "verbose_json", "srt", "vtt"])
    tr.add_argument("--mode", default=None, choices=["fast", "accurate"], help="long-form mode (default: env MODE or fast)")
    tr.add_argument("--word-timestamps", action="store_true", help="word-level times (verbose_json)")
    tr.add_argument("--output-dir", metavar="DIR", help="write DIR/<name>.<txt|json|srt|vtt> per file instead of "
                                                        "stdout (several files on stdout: text, srt and vtt under "
                                                        "`==> FILE <==` headers, JSON one object a line with `file`)")
    tr.add_argument("--prompt", help="text to condition the first window on (names, spelling)")
    tr.add_argument("--quiet", action="store_true", help="no progress on stderr")

    lt = sub.add_parser("loadtest", help="stream real recordings from N concurrent clients to a server")
    lt.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of the load test (streamer loadtest --help)")

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["loadtest"]:  # every further argument, --help included, belongs to the load test
        from streamer.loadtest.client import main as loadtest_main

        return loadtest_main(argv[1:])
    args = parser.parse_args(argv)
    logging.basicConfig(level=log_level("WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        from streamer.server.supervisor import ServeError, serve as run_server

        logging.getLogger("streamer").setLevel(log_level("INFO"))
        settings = _settings(args, host=args.host, port=args.port, api_key=args.api_key, workers=args.workers,
                             ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
                             allowed_origins=args.allowed_origins)
        try:
            return run_server(settings)
        except ServeError as e:
            print(f"streamer: cannot serve: {e}", file=sys.stderr)
            return 2
    if args.command == "transcribe":
        if args.word_timestamps and args.format != "verbose_json":
            parser.error(f"--word-timestamps needs --format verbose_json (not {args.format}), as the API's words do")
        if args.output_dir is not None:
            stems = [os.path.splitext(os.path.basename(f))[0] for f in args.files]
            if not os.path.isdir(args.output_dir):
                parser.error(f"--output-dir {args.output_dir!r} is not a directory")
            if len(set(stems)) < len(stems):
                parser.error("--output-dir: two files have the same name; their transcripts would overwrite each other")
        return asyncio.run(_transcribe(args))
    return 2


class _Progress:
    """One line per file on stderr, redrawn in place on a terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last: dict[str, int] = {}

    def __call__(self, name: str, duration: float, fraction: float) -> None:
        if not self.enabled or duration <= 30:
            return
        pct = int(100 * fraction)
        step = 1 if self.tty else 10
        if pct // step == self.last.get(name, -1) // step and pct < 100:
            return
        self.last[name] = pct
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        line = f"{name}: [{bar}] {pct:3d}% of {duration / 60:.1f} min"
        sys.stderr.write(("\r" + line + ("\n" if pct >= 100 else "")) if self.tty else line + "\n")
        sys.stderr.flush()


async def _transcribe(args) -> int:
    from streamer.audio import SAMPLE_RATE
    from streamer.audio.decode import AudioDecodeError, decode_audio
    from streamer.engine.engine import Engine
    from streamer.engine.request import DecodeOptions
    from streamer.longform import transcribe_long
    from streamer.longform.formats import render
    from streamer.model.weights import WeightsError

    settings = _settings(args)
    mode = args.mode or settings.server.mode
    try:
        engine = Engine.load(settings.model, settings.engine)
    except (WeightsError, ValueError, RuntimeError) as e:
        print(f"streamer: cannot load model {settings.model.model!r}: {e}", file=sys.stderr)
        return 2
    if args.task == "translate" and not engine.tokenizer.multilingual:
        print(f"streamer: {engine.model_name} is English-only and cannot translate; use --model base", file=sys.stderr)
        return 2
    try:
        language = engine.tokenizer.language_code(args.language)
    except ValueError as e:
        engine.close()
        print(f"streamer: --language: {e}", file=sys.stderr)
        return 2
    options = DecodeOptions(task=args.task, language=language, prompt=args.prompt, timestamps=True)
    progress = _Progress(not args.quiet)

    async def one(path: str):
        try:
            audio = await asyncio.to_thread(decode_audio, path, max_seconds=settings.server.max_audio_s)
        except AudioDecodeError as e:
            return path, e
        name, duration = os.path.basename(path), len(audio) / SAMPLE_RATE
        t0 = time.perf_counter()
        transcript = await transcribe_long(engine, audio, mode=mode, options=options, word_timestamps=args.word_timestamps,
                                           on_progress=lambda f: progress(name, duration, f))
        logging.getLogger("streamer").info("%s: %.1f s of audio in %.2f s", name, duration, time.perf_counter() - t0)
        return path, transcript

    try:
        # Every file at once: their windows share engine steps.
        results = await asyncio.gather(*(one(p) for p in args.files))
    except ValueError as e:  # e.g. an unknown --language
        print(f"streamer: {e}", file=sys.stderr)
        return 2
    finally:
        engine.close()
    failed = 0
    for path, result in results:
        if isinstance(result, Exception):
            print(f"streamer: {result}", file=sys.stderr)
            failed += 1
            continue
        _write(path, render(result, args.format, words=args.word_timestamps), args, several=len(results) > 1)
    return 1 if failed else 0


EXTENSIONS = {"text": "txt", "json": "json", "verbose_json": "json", "srt": "srt", "vtt": "vtt"}


def _write(path: str, body: str | dict, args, *, several: bool) -> None:
    """One file's transcript: to `--output-dir`, else stdout (several files kept apart there)."""
    if isinstance(body, dict):
        if args.output_dir is None and several:  # JSON Lines: one parseable object per file
            body = json.dumps({"file": path, **body}, ensure_ascii=False)
        else:
            body = json.dumps(body, ensure_ascii=False, indent=2)
    body = body if body.endswith("\n") else body + "\n"
    if args.output_dir is not None:
        stem = os.path.splitext(os.path.basename(path))[0]
        out = os.path.join(args.output_dir, f"{stem}.{EXTENSIONS[args.format]}")
        with open(out, "w", encoding="utf-8") as f:
            f.write(body)
        print(f"{path} -> {out}", file=sys.stderr)
        return
    if several and args.format not in ("json", "verbose_json"):
        print(f"==> {path} <==")
    sys.stdout.write(body)


if __name__ == "__main__":
    sys.exit(main())
