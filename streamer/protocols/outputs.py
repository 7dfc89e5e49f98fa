"""What every protocol answers besides its own commands: a message for the client, and the end
of the connection; and the one command of the protocols that take raw audio on the socket."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass(frozen=True)
class Send:
    """A message for the client."""

    message: dict


@dataclass(frozen=True)
class Close:
    """Close the connection with `code` once what was sent has left; read nothing more."""

    code: int


@dataclass(frozen=True)
class Audio:
    """Raw audio for the stream's `ChannelStreams`: whole sample frames of its encoding and
    channels, interleaved (`/v1/stream`, Deepgram's `/v1/listen`)."""

    data: bytes


def logprobs_wire(token_bytes: Callable[[int], bytes], tokens: Iterable[tuple[int, float]]) -> list[dict]:
    """OpenAI's `logprobs` (file transcriptions, Realtime items): per text token of a transcript its
    text, log probability and bytes, from (token, log probability) pairs."""
    out = []
    for token, logprob in tokens:
        raw = token_bytes(token)
        out.append({"token": raw.decode("utf-8", "replace"), "logprob": round(logprob, 6), "bytes": list(raw)})
    return out
