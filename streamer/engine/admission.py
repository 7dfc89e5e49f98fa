"""Admission of new work, in one place: how much of an engine's queue each class may fill, and
what a refusal tells the client (why, and when to come back).

    refusal = admit(kind, queue_depth, quotas)    # None: accepted

One engine's queue holds the windows of every live stream and upload; a class is refused once
the queue is filled to its share, so that the classes that matter more keep room:

    FINAL    the whole queue            a live utterance's text: refused last (and retried, not dropped)
    PARTIAL  partial_share  (50 %)      provisional text: the first thing to go under load
    FILE     file_share     (50 %)      an upload's windows: live finals must never wait for uploads
    STREAM   stream_share   (50 %)      a new live stream: not accepted while partials are refused

Every refusal carries `retry_after_s` (HTTP `Retry-After`, or a stream error's `retry_after_s`).
The engine's scheduler, the gateways' client of remote engine cores, the long-form decoder and
the gateway's stream admission all call `admit`; the gateway adds its own limits (streams per
process, event-loop lag, shutdown) through `refuse` so that every refusal has the same shape.
No torch, no I/O.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from streamer.engine.request import Priority


class Kind(enum.Enum):
    FINAL = "final"
    PARTIAL = "partial"
    FILE = "file"
    STREAM = "stream"

    @classmethod
    def of(cls, priority: Priority) -> "Kind":
        return _OF_PRIORITY[priority]


_OF_PRIORITY = {Priority.FINAL: Kind.FINAL, Priority.PARTIAL: Kind.PARTIAL, Priority.FILE: Kind.FILE}


@dataclass(frozen=True)
class Quotas:
    """Shares of one engine's queue per class, and how long a refused client should wait."""

    max_queue: int = 4096
    """Queued windows beyond which even finals are refused."""
    partial_share: float = 0.5
    file_share: float = 0.5
    stream_share: float = 0.5
    retry_after_s: float = 1.0
    """What a refusal of a window asks for; a refused new stream is told `stream_retry_after_s`."""
    stream_retry_after_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, not {self.max_queue}")
        for name in ("partial_share", "file_share", "stream_share"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], not {getattr(self, name)}")

    def bound(self, kind: Kind) -> int:
        """Queue depth from which `kind` is refused."""
        share = {Kind.FINAL: 1.0, Kind.PARTIAL: self.partial_share, Kind.FILE: self.file_share,
                 Kind.STREAM: self.stream_share}[kind]
        return math.floor(share * self.max_queue)


@dataclass(frozen=True)
class Refused:
    """Why new work was not accepted, for the client."""

    kind: Kind
    reason: str
    retry_after_s: float
    code: str = "overloaded"
    """`overloaded` (come back later) or `shutting_down` (go to another server)."""


class QueueFull(Exception):
    """A window was refused: the engine queue is filled to its class's share (HTTP 429 / stream error)."""

    def __init__(self, depth: int, bound: int, priority: Priority, retry_after_s: float = 1.0,
                 message: str | None = None) -> None:
        """`message`: the engine core's own words, where its figures are newer than the caller's."""
        self.depth = depth
        self.bound = bound
        self.priority = priority
        self.retry_after_s = retry_after_s
        super().__init__(message or f"engine queue full: {depth} windows queued, {priority.name.lower()} requests "
                                    f"are refused from {bound}; retry later")


def admit(kind: Kind, queue_depth: int, quotas: Quotas) -> Refused | None:
    """None when `kind` may queue one more at `queue_depth`; else the refusal."""
    bound = quotas.bound(kind)
    if queue_depth < bound:
        return None
    if kind is Kind.STREAM:
        return Refused(kind, f"the engine is at capacity ({queue_depth} windows queued); retry later",
                       quotas.stream_retry_after_s)
    return Refused(kind, f"engine queue full: {queue_depth} windows queued, {kind.value} requests are refused "
                         f"from {bound}; retry later", quotas.retry_after_s)


def check(priority: Priority, queue_depth: int, quotas: Quotas, kind: Kind | None = None) -> None:
    """Raise QueueFull when a window of `priority` is refused at `queue_depth` (judged as `kind`,
    by default its priority's)."""
    kind = kind or Kind.of(priority)
    refused = admit(kind, queue_depth, quotas)
    if refused is not None:
        raise QueueFull(queue_depth, quotas.bound(kind), priority, refused.retry_after_s)


def refuse(reason: str, retry_after_s: float, code: str = "overloaded") -> Refused:
    """A refusal of a new stream by the gateway's own limits, in the same shape."""
    return Refused(Kind.STREAM, reason, retry_after_s, code)
