"""Messages between gateway workers and engine core processes (ZeroMQ frames, msgpack by msgspec).

    gateway --PUSH--> core (PULL, bound)    Hello, Submit, Cancel, Align, Bye
    core --PUB--> gateways (SUB, topic)     Ready, Done, Tokens, Aligned, Stats

Each core binds two sockets; every gateway connects to both of every core. Replies are published
under the gateway's topic, `Stats` under `ALL`: the gateways learn that a core is up, how loaded
it is, and (when it stops for `STATS_TIMEOUT_S`, or comes back with a new `incarnation`) that its
in-flight windows are lost. Audio travels as float16 (half the bytes of float32; below the
resolution of 16-bit PCM at speech levels, far below Whisper's log-mel floor).

No per-token messages, except `Tokens` for windows submitted with `stream_tokens`.
"""

from __future__ import annotations

from typing import Union

import msgspec
import numpy as np

from streamer.engine.request import DecodeOptions, Result

ALL = b"*"
"""Topic of the messages every gateway reads."""
STATS_INTERVAL_S = 0.25
"""A core publishes its `Stats` this often (and after each step that finished windows, at most this often)."""
STATS_TIMEOUT_S = 3.0
"""A gateway counts a core as down after this long without its `Stats`."""
HELLO_INTERVAL_S = 0.5
"""A gateway repeats `Hello` this often until the core's `Ready` reaches it (PUB drops what is
published before a subscriber has joined)."""


class Hello(msgspec.Struct, tag=True):
    gateway: str


class Submit(msgspec.Struct, tag=True):
    id: str
    gateway: str
    audio: bytes
    """float16 samples at 16 kHz, little-endian."""
    options: DecodeOptions
    priority: int
    session_id: str | None = None
    deadline: float | None = None
    """Monotonic seconds (CLOCK_MONOTONIC is shared by the processes of one host)."""
    stream_tokens: bool = False


class Cancel(msgspec.Struct, tag=True):
    id: str


class AlignItem(msgspec.Struct):
    audio: bytes
    tokens: list[int]


class Align(msgspec.Struct, tag=True):
    id: str
    gateway: str
    items: list[AlignItem]
    language: str | None
    task: str


class Bye(msgspec.Struct, tag=True):
    """The gateway goes away: cancel what it still has in the core."""

    gateway: str


class Ready(msgspec.Struct, tag=True):
    core: int
    incarnation: str
    model: str
    device: str
    max_new_tokens: int
    max_queue: int
    partial_share: float
    file_share: float
    stream_share: float
    """The core's admission shares (`engine/admission.py` `Quotas`)."""
    tokenizer_json: str
    """The model's `tokenizer.json`: the gateways build their tokenizer from it."""
    multilingual: bool
    pid: int


class Done(msgspec.Struct, tag=True):
    id: str
    result: Result | None = None
    error: str | None = None
    """Why it failed: the message."""
    kind: str | None = None
    """`queue_full`, `closed`, `cancelled`, `invalid` or `failed`."""


class Tokens(msgspec.Struct, tag=True):
    items: list[tuple[str, list[int]]]


class WordTimingMsg(msgspec.Struct, array_like=True):
    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


class Aligned(msgspec.Struct, tag=True):
    id: str
    timings: list[list[WordTimingMsg]] | None = None
    error: str | None = None


class Stats(msgspec.Struct, tag=True):
    core: int
    incarnation: str
    metrics: dict[str, float]


ToCore = Union[Hello, Submit, Cancel, Align, Bye]
FromCore = Union[Ready, Done, Tokens, Aligned, Stats]

encode = msgspec.msgpack.Encoder().encode
decode_to_core = msgspec.msgpack.Decoder(ToCore).decode
decode_from_core = msgspec.msgpack.Decoder(FromCore).decode


def audio_bytes(audio: np.ndarray) -> bytes:
    return np.asarray(audio, dtype="<f2").tobytes()


def audio_array(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f2").astype(np.float32)
