"""Continuous batching at token level, as a pure data structure: no torch, no I/O, no threads.

One engine step is `plan = scheduler.schedule(now)`, the runner executes the plan,
`scheduler.update(output)`. A plan admits queued windows (encoder pass + prefill; their decoder
slots are reserved at once) and lists every live sequence that decodes one token. Sequences join
after their encoder pass and leave at end-of-text or their token limit; no step waits for the
longest, and a slot freed in `update()` is taken by a queued window in the next `schedule()`.

Rules:
- Rank: (class, deadline, arrival). The class is the request's priority (finals, then partials,
  then file chunks) except for aging: a FILE chunk whose deadline has come (deadline <= now) is
  ranked as a PARTIAL. It then goes before every partial with a later deadline, so a constant
  stream of partials cannot starve file uploads, while finals are never delayed by them.
- Admission is in strict rank order while the encoder batch has room: the first request that does
  not fit in the free slots stops admission for this step, so a request that needs many slots
  (a beam search) is not overtaken forever by small ones.
- Preemption: a FINAL that does not fit evicts running (DECODING) PARTIAL sequences, the most
  recently admitted first, when that frees enough slots; the evicted partials are CANCELLED.
- Finals first in time too: while a FINAL sequence decodes, a step admits at most
  `encode_while_finals` windows of the other classes. Each step encodes its admissions and then
  advances every live sequence by one token, so a 15-token final would otherwise wait through
  15 full encoder batches of partials and file chunks (measured: 2.6 s median final latency at 200
  large-v3-turbo sessions, where each decodes in well under 0.5 s alone). vLLM v1 budgets a
  step's tokens for the same reason.
- One encoder batch at a time: the runner may keep a batch in its encoder pass across steps (the
  encoder on its own CUDA stream, decode steps going on beside it); while one is, nothing new is
  admitted, so a final that arrives waits for at most that batch, never for a queue of them.
- Within a class, the earliest deadline goes first: live windows carry the wall time at which
  their audio ended at real-time pace, so a client that sends faster than real time queues
  behind the windows of the others instead of pushing their finals back.
- Early windows: a live window whose deadline is more than `early_s` ahead (its client is that far
  ahead of real time) ranks after every window that is not, and is admitted only while no window
  that is due is queued, encoding or decoding: a fast sender gets the engine when the others leave
  it free, and its passes neither lengthen theirs nor share their decode steps (on the CPU a batch
  of two costs about twice one).
- Files fill the batch first: while every live sequence is a file chunk, a step that admits file
  chunks while more of them wait and fit in the free slots decodes nothing (`StepPlan.held`). A
  decode step costs nearly as much half empty as full (the weights, ~550 kernel launches), so the
  steps of a half-admitted batch are mostly waste: an upload's first tokens come a few encoder
  passes later, its last ones sooner. Any live window, queued or decoding, turns this off (vLLM's
  first scheduler also ran prefills before decodes; its v1 mixes them under a token budget).
- Queue bound: `add()` refuses a request once the queue is filled to its class's share
  (`engine/admission.py`: finals the whole `max_queue`, partials and file windows half of it), so
  that finals keep room. A partial that replaces its session's queued partial does not grow the
  queue and is always taken; a fallback retry of admitted work is bounded by `max_queue` only.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from dataclasses import dataclass, field

from streamer.engine.admission import Kind, QueueFull, Quotas, check
from streamer.engine.request import Priority, Request, RequestState

__all__ = ["QueueFull", "Scheduler", "SchedulerConfig", "SchedulerError", "StepOutput", "StepPlan"]

# Heap entry: (deadline, arrival, sequence number, request); the unique sequence number keeps
# tuples from ever comparing two Requests and makes the order deterministic.
_Entry = tuple[float, float, int, Request]


class SchedulerError(Exception):
    """The scheduler was misused: a duplicate id, an unknown id in update(), steps out of order."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one engine (one GPU)."""

    max_slots: int
    """Decoder slots: live sequences at once (a beam of n takes n)."""
    max_encoder_batch: int
    """Windows admitted (encoded and prefilled) in one step."""
    max_queue: int = 4096
    """Queued windows beyond which add() raises QueueFull."""
    partial_queue_fraction: float = 0.5
    """Partials are refused once this fraction of `max_queue` is queued, leaving room for finals."""
    file_queue_fraction: float = 0.5
    """File windows are refused from this fraction: uploads never take the room of live finals."""
    stream_queue_fraction: float = 0.5
    """New live streams are refused from this fraction (when partials are refused already)."""
    early_s: float = 1.0
    """A live window due more than this far ahead ranks after the others (see the module doc)."""
    fill_files_first: bool = True
    """See "Files fill the batch first" in the module doc (measured in docs/benchmarks.md, session 33)."""
    encode_while_finals: int = 1
    """Windows other than finals admitted per step while a final decodes. H200, tiny.en, 400
    live streams: p95 finalisation 1.17 s with 4 (of 16), 0.91 s with 1; partials then come
    every 1.7 s instead of 1.3 s (the cadence the policy is allowed to widen). 0: none (the CPU's
    engine default: 4 clients p95 1.88 -> 1.56 s)."""

    def __post_init__(self) -> None:
        for name in ("max_slots", "max_encoder_batch", "max_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        self.quotas  # checks the shares
        if self.encode_while_finals < 0:
            raise ValueError(f"encode_while_finals must be at least 0, not {self.encode_while_finals}")

    @functools.cached_property
    def quotas(self) -> Quotas:
        """The admission shares of this engine's queue (`engine/admission.py`)."""
        return Quotas(max_queue=self.max_queue, partial_share=self.partial_queue_fraction,
                      file_share=self.file_queue_fraction, stream_share=self.stream_queue_fraction)

    @property
    def partial_queue_limit(self) -> int:
        """Queue depth from which partials are refused."""
        return self.quotas.bound(Kind.PARTIAL)


@dataclass
class StepPlan:
    """What the runner does in one step. It frees `released` first, then runs the rest."""

    encode: list[Request] = field(default_factory=list)
    """Admitted this step, in rank order: encoder pass and prefill; their slots are reserved."""
    decode: list[str] = field(default_factory=list)
    """Ids of the sequences admitted in earlier steps that decode one token now."""
    encoding: list[str] = field(default_factory=list)
    """Ids admitted in earlier steps whose encoder pass is still running: the runner admits those
    that are done (reporting them `encoded`) and reports the rest as `encoding` again."""
    preempted: list[Request] = field(default_factory=list)
    """Running partials evicted for a final; they are CANCELLED and their ids are in `released`."""
    released: list[str] = field(default_factory=list)
    """Ids of live sequences that were cancelled or preempted: the runner frees their slots."""
    held: list[str] = field(default_factory=list)
    """Ids of decoding sequences that skip this step (files filling the batch first): with `decode`,
    every sequence the runner holds; either list is empty."""

    @property
    def empty(self) -> bool:
        """Nothing for the runner to do; such a plan needs no update()."""
        return not (self.encode or self.decode or self.released or self.encoding or self.held)


@dataclass
class StepOutput:
    """What the runner reports after executing a plan."""

    encoded: list[str] = field(default_factory=list)
    """Ids of `plan.encode` whose encoder pass and prefill are done: they now decode."""
    finished: list[str] = field(default_factory=list)
    """Ids that produced end-of-text or reached their token limit; the runner freed their slots."""
    failed: dict[str, str] = field(default_factory=dict)
    """Id -> error, for sequences the runner gave up on; the runner freed their slots."""
    encoding: list[str] = field(default_factory=list)
    """Ids of `plan.encode` or `plan.encoding` still in their encoder pass (they stay ENCODING)."""


class Scheduler:
    """Queues windows of every session and upload, and plans each engine step."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._queued: dict[str, Request] = {}
        # One heap per priority, with lazy deletion: a cancelled or replaced request stays in its
        # heap until it reaches the top (or the heaps are compacted) and is skipped there.
        self._heaps: dict[Priority, list[_Entry]] = {p: [] for p in Priority}
        self._heap_entries = 0
        self._sequence = itertools.count()
        # session_id -> its queued partial (at most one, by replacement).
        self._queued_partial: dict[str, Request] = {}
        # ENCODING and DECODING requests, in admission order.
        self._live: dict[str, Request] = {}
        # Cancelled while live: their slots stay taken until the runner is told to free them.
        self._releasing: dict[str, Request] = {}
        self._used_slots = 0
        # Every request of the plan the runner is executing (encode and decode), or None.
        self._in_flight: dict[str, Request] | None = None
        self._in_flight_encode: set[str] = set()

    # Metrics.

    @property
    def queue_depth(self) -> int:
        """Requests waiting for admission."""
        return len(self._queued)

    @property
    def live(self) -> int:
        """Sequences holding decoder slots (being encoded or decoding), cancelled ones excluded."""
        return len(self._live)

    @property
    def free_slots(self) -> int:
        """Decoder slots neither held by a live sequence nor waiting to be released."""
        return self.config.max_slots - self._used_slots

    @property
    def has_work(self) -> bool:
        """schedule() would return a non-empty plan."""
        return bool(self._queued or self._live or self._releasing)

    # The three verbs, plus cancel.

    def add(self, request: Request) -> Request | None:
        """Queue a request; return the queued partial of the same session it replaced, if any.

        The replaced request is CANCELLED so that the caller can resolve its waiter. Raises
        QueueFull when the queue is at its bound, SchedulerError for a duplicate id, a request
        that is not QUEUED, or one that needs more slots than exist.
        """
        if request.state is not RequestState.QUEUED:
            raise SchedulerError(f"request {request.id} is {request.state.name}, not QUEUED")
        if request.id in self._queued or request.id in self._live or request.id in self._releasing:
            raise SchedulerError(f"duplicate request id {request.id}")
        if request.n_slots > self.config.max_slots:
            raise SchedulerError(
                f"request {request.id} needs {request.n_slots} decoder slots; the engine has {self.config.max_slots}"
            )
        replaced = None
        if request.priority is Priority.PARTIAL and request.session_id is not None:
            replaced = self._queued_partial.get(request.session_id)
        if replaced is None:
            self._check_room(request)
        else:
            self._unqueue(replaced)
            replaced.state = RequestState.CANCELLED
        self._queued[request.id] = request
        if request.priority is Priority.PARTIAL and request.session_id is not None:
            self._queued_partial[request.session_id] = request
        entry = (request.deadline, request.arrival, next(self._sequence), request)
        heapq.heappush(self._heaps[request.priority], entry)
        self._heap_entries += 1
        if self._heap_entries > 2 * len(self._queued) + 64:
            self._compact()
        return replaced

    def cancel(self, request_id: str) -> Request | None:
        """Cancel a queued or live request and return it; None when the id is unknown or ended.

        A queued request is dropped at once. A live one is CANCELLED now, and its slots are freed
        (and listed in `StepPlan.released` for the runner) at the next schedule().
        """
        request = self._queued.get(request_id)
        if request is not None:
            self._unqueue(request)
        else:
            request = self._live.pop(request_id, None)
            if request is None:
                return None
            self._releasing[request_id] = request
        request.state = RequestState.CANCELLED
        return request

    def schedule(self, now: float) -> StepPlan:
        """Plan one step at time `now` (the clock of the requests' deadlines)."""
        if self._in_flight is not None:
            raise SchedulerError("schedule() called before update() of the previous plan")
        plan = StepPlan(released=list(self._releasing))
        self._used_slots -= sum(r.n_slots for r in self._releasing.values())
        self._releasing.clear()
        finals_decoding = any(r.priority is Priority.FINAL for r in self._live.values())
        plan.encoding = [i for i, r in self._live.items() if r.state is RequestState.ENCODING]
        others = 0
        while not plan.encoding and len(plan.encode) < self.config.max_encoder_batch:
            heap = self._first(now)
            if heap is None:
                break
            request = heap[0][3]
            if self._early(request, now) and any(not self._early(r, now) for r in self._live.values()):
                break  # every request left is early: none joins a batch of due ones, nor runs beside them
            if request.priority is not Priority.FINAL:
                if finals_decoding and others >= self.config.encode_while_finals:
                    break  # finals rank first, so every request left is of another class
                others += 1
            if request.n_slots > self.free_slots and not (
                request.priority is Priority.FINAL and self._preempt_for(request.n_slots, plan)
            ):
                break
            heapq.heappop(heap)
            self._heap_entries -= 1
            self._unqueue(request)
            request.state = RequestState.ENCODING
            self._live[request.id] = request
            self._used_slots += request.n_slots
            plan.encode.append(request)
        decoding = [i for i, r in self._live.items() if r.state is RequestState.DECODING]
        if plan.encode and not plan.encoding and self._fill_first(now):
            plan.held = decoding
        else:
            plan.decode = decoding
        if not plan.empty:
            self._in_flight = {r.id: r for r in plan.encode} | {i: self._live[i] for i in decoding + plan.encoding}
            self._in_flight_encode = {r.id for r in plan.encode} | set(plan.encoding)
        return plan

    def update(self, output: StepOutput) -> None:
        """Apply the runner's report on the plan in flight; ended sequences free their slots now.

        Every request of `plan.encode` must be reported as encoded, finished or failed, unless it
        was cancelled during the step. Requests cancelled during the step are ignored here.
        """
        if self._in_flight is None:
            raise SchedulerError("update() called without a plan in flight")
        self._check_output(output)
        for request_id in output.encoded:
            request = self._in_flight[request_id]
            if request.state is RequestState.ENCODING:
                request.state = RequestState.DECODING
        for request_id in output.finished:
            self._end(self._in_flight[request_id], RequestState.FINISHED)
        for request_id, error in output.failed.items():
            self._end(self._in_flight[request_id], RequestState.FAILED, error)
        self._in_flight = None
        self._in_flight_encode = set()

    # Helpers.

    def _check_room(self, request: Request) -> None:
        # A fallback retry is admitted work: only the whole queue's bound holds it back.
        check(request.priority, len(self._queued), self.config.quotas, Kind.FINAL if request.attempt > 0 else None)

    def _unqueue(self, request: Request) -> None:
        """Forget a queued request; its heap entry goes stale and is skipped later."""
        del self._queued[request.id]
        if request.session_id is not None and self._queued_partial.get(request.session_id) is request:
            del self._queued_partial[request.session_id]

    def _is_queued(self, entry: _Entry) -> bool:
        # Identity, not id: a cancelled id may be queued again as a new request.
        return self._queued.get(entry[3].id) is entry[3]

    def _compact(self) -> None:
        for heap in self._heaps.values():
            heap[:] = [e for e in heap if self._is_queued(e)]
            heapq.heapify(heap)
        self._heap_entries = len(self._queued)

    def _first(self, now: float) -> list[_Entry] | None:
        """The heap whose top is the best-ranked queued request at `now`, or None when empty."""
        best: tuple | None = None
        for priority, heap in self._heaps.items():
            while heap and not self._is_queued(heap[0]):
                heapq.heappop(heap)
                self._heap_entries -= 1
            if heap:
                deadline, arrival, sequence, _ = heap[0]
                # Aging; the top of a heap has its earliest deadline, so it is the one that is due
                # (and if it is early, so is every request under it).
                rank = min(priority, Priority.PARTIAL) if deadline <= now else priority
                key = (self._early(heap[0][3], now), rank, deadline, arrival, sequence)
                if best is None or key < best[0]:
                    best = (key, heap)
        return None if best is None else best[1]

    def _fill_first(self, now: float) -> bool:
        """Whether this step's decoding waits (see "Files fill the batch first"): only file chunks
        are live, and the best-ranked queued request is a file chunk that fits in the free slots."""
        if not self.config.fill_files_first or any(r.priority is not Priority.FILE for r in self._live.values()):
            return False
        heap = self._first(now)
        if heap is None:
            return False
        request = heap[0][3]
        return request.priority is Priority.FILE and request.n_slots <= self.free_slots

    def _early(self, request: Request, now: float) -> bool:
        """A live window whose client is more than `early_s` ahead of real time."""
        return request.priority is not Priority.FILE and request.deadline > now + self.config.early_s

    def _preempt_for(self, n_slots: int, plan: StepPlan) -> bool:
        """Evict the newest running partials until `n_slots` are free; False (and no eviction)
        when even all of them would not be enough."""
        victims = [
            r for r in reversed(self._live.values())
            if r.priority is Priority.PARTIAL and r.state is RequestState.DECODING
        ]
        if self.free_slots + sum(r.n_slots for r in victims) < n_slots:
            return False
        for victim in victims:
            if self.free_slots >= n_slots:
                break
            del self._live[victim.id]
            self._used_slots -= victim.n_slots
            victim.state = RequestState.CANCELLED
            plan.preempted.append(victim)
            plan.released.append(victim.id)
        return True

    def _check_output(self, output: StepOutput) -> None:
        """Refuse a report that does not match the plan in flight, before changing anything."""
        for request_id in output.encoded:
            if request_id not in self._in_flight_encode:
                raise SchedulerError(f"update(): {request_id} was not to be encoded in this step")
        for request_id in [*output.finished, *output.failed]:
            if request_id not in self._in_flight:
                raise SchedulerError(f"update(): unknown request {request_id} (not in the plan in flight)")
        both = set(output.finished) & set(output.failed)
        if both:
            raise SchedulerError(f"update(): {sorted(both)} both finished and failed")
        for request_id in output.encoding:
            if request_id not in self._in_flight_encode:
                raise SchedulerError(f"update(): {request_id} was not being encoded in this step")
        reported = set(output.encoded) | set(output.finished) | set(output.failed) | set(output.encoding)
        missing = [
            i for i in self._in_flight_encode
            if i not in reported and self._in_flight[i].state is RequestState.ENCODING
        ]
        if missing:
            raise SchedulerError(f"update(): {sorted(missing)} were to be encoded but were not reported")

    def _end(self, request: Request, state: RequestState, error: str | None = None) -> None:
        if request.state is RequestState.CANCELLED:
            # Cancelled during the step, and the runner let it go anyway: nothing left to release.
            if self._releasing.pop(request.id, None) is not None:
                self._used_slots -= request.n_slots
            return
        del self._live[request.id]
        self._used_slots -= request.n_slots
        request.state = state
        request.error = error
