"""API keys out of every log line.

uvicorn logs each request's path with its query string, so `?api_key=KEY` (how browsers pass the
key) would land in the access log; a traceback or a client's message may quote a header. The
`RedactFilter` rewrites a record's message and arguments before any handler formats them:
`api_key=...` (query or form), `Bearer ...`, and the `openai-insecure-api-key.` subprotocol.
"""

from __future__ import annotations

import logging
import re

MASK = "[redacted]"
_PATTERNS = [
    (re.compile(r"(?i)(api[_-]?key=)[^&\s\"']+"), r"\1" + MASK),
    (re.compile(r"(?i)(bearer\s+)[^\s\"',]+"), r"\1" + MASK),
    (re.compile(r"(?i)(openai-insecure-api-key\.)[^\s\"',]+"), r"\1" + MASK),
]
_FORMATTER = logging.Formatter()
LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "streamer", "streamer.server")
"""Loggers whose records are redacted (a filter on a logger sees only records logged to it by name)."""


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:  # a traceback may quote a URL or a header
            record.exc_text = redact(_FORMATTER.formatException(record.exc_info))
        return True


def install() -> None:
    """Redact on the server's loggers and on every handler they and the root logger have
    (records that propagate from other loggers pass a handler's filter). Idempotent."""
    loggers = [logging.getLogger(name) for name in LOGGERS] + [logging.getLogger()]
    for logger in loggers:
        for target in [logger, *logger.handlers]:
            if not any(isinstance(f, RedactFilter) for f in target.filters):
                target.addFilter(RedactFilter())
