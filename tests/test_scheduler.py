"""The continuous-batching scheduler, driven step by step with the runner's reports written by hand.

There is no model here: the scheduler's whole contract is plans in and reports out, so these
reports are the real input. `FakeRunner` holds slots the way the real runner does and checks
every plan against what it holds.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from streamer.engine.request import (
    MAX_WINDOW_SAMPLES,
    DecodeOptions,
    Priority,
    Request,
    RequestState,
)
from streamer.engine.scheduler import (
    QueueFull,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    StepOutput,
    StepPlan,
)

FINAL, PARTIAL, FILE = Priority.FINAL, Priority.PARTIAL, Priority.FILE
ONE_SECOND = np.zeros(16000, dtype=np.float32)


def make(rid, priority=PARTIAL, *, session=None, deadline=None, arrival=0.0, beam=1) -> Request:
    return Request(
        id=rid,
        audio=ONE_SECOND,
        options=DecodeOptions(beam_size=beam),
        priority=priority,
        session_id=session,
        deadline=arrival + 10.0 if deadline is None else deadline,
        arrival=arrival,
    )


def scheduler(max_slots=8, max_encoder_batch=8, max_queue=100, fraction=0.5, early_s=float("inf")) -> Scheduler:
    """(Deadlines here are small numbers against now=0: the early-window rule is off unless asked.)"""
    return Scheduler(SchedulerConfig(max_slots, max_encoder_batch, max_queue, fraction, early_s=early_s))


def step(s: Scheduler, now=0.0, finished=(), failed=None) -> StepPlan:
    """One engine step in which every admitted window is encoded and `finished` end."""
    plan = s.schedule(now)
    if not plan.empty:
        s.update(StepOutput(encoded=[r.id for r in plan.encode], finished=list(finished), failed=failed or {}))
    return plan


def ids(requests) -> list[str]:
    return [r.id for r in requests]


# Request types.


def test_decode_options_validation():
    with pytest.raises(ValueError, match="task"):
        DecodeOptions(task="summarize")
    with pytest.raises(ValueError, match="beam_size"):
        DecodeOptions(beam_size=0)
    with pytest.raises(ValueError, match="empty"):
        DecodeOptions(temperatures=())
    with pytest.raises(ValueError, match=">= 0"):
        DecodeOptions(temperatures=(0.0, -0.2))
    assert DecodeOptions(temperatures=[0.0, 0.5]).temperatures == (0.0, 0.5)
    assert DecodeOptions(task="translate", language="de").task == "translate"


def test_request_validation_and_defaults():
    with pytest.raises(TypeError, match="audio"):
        Request(id="a", priority=FILE, deadline=1.0, arrival=0.0)
    with pytest.raises(ValueError, match="longer than one 30-s window"):
        Request(id="a", audio=np.zeros(MAX_WINDOW_SAMPLES + 1, np.float32), priority=FILE, deadline=1.0, arrival=0.0)
    full = Request(id="a", audio=np.zeros(MAX_WINDOW_SAMPLES, np.float32), priority=1, deadline=1.0, arrival=0.0)
    assert full.priority is PARTIAL and full.state is RequestState.QUEUED
    assert full.n_slots == 1 and full.temperature == 0.0 and full.attempt == 0
    beam = Request(
        id="b", audio=ONE_SECOND, options=DecodeOptions(beam_size=5, temperatures=(0.3,)),
        priority=FINAL, deadline=1.0, arrival=0.0,
    )
    assert beam.n_slots == 5 and beam.temperature == 0.3


def test_scheduler_imports_no_torch():
    code = "import streamer.engine.scheduler, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# Ordering.


def test_finals_before_partials_before_files():
    s = scheduler(max_encoder_batch=1)
    # Deadlines favour the file and then the partial: the class must win over them.
    s.add(make("file", FILE, deadline=5.0))
    s.add(make("partial", PARTIAL, deadline=6.0))
    s.add(make("final", FINAL, deadline=7.0))
    order = [ids(step(s, now=0.0).encode) for _ in range(3)]
    assert order == [["final"], ["partial"], ["file"]]

    s = scheduler()
    for r in (make("f", FILE, deadline=5.0), make("p", PARTIAL, deadline=6.0), make("F", FINAL, deadline=7.0)):
        s.add(r)
    assert ids(s.schedule(0.0).encode) == ["F", "p", "f"]


def test_oldest_deadline_first_then_arrival():
    s = scheduler()
    s.add(make("late", deadline=3.0, arrival=0.0))
    s.add(make("early", deadline=1.0, arrival=0.5))
    s.add(make("tie-second", deadline=2.0, arrival=0.2))
    s.add(make("tie-first", deadline=2.0, arrival=0.1))
    assert ids(s.schedule(0.0).encode) == ["early", "tie-first", "tie-second", "late"]


def test_overdue_file_chunk_ranks_as_partial_but_never_before_finals():
    def order(now: float) -> list[str]:
        s = scheduler()
        s.add(make("file", FILE, deadline=1.0, arrival=0.5))
        s.add(make("partial", PARTIAL, deadline=1.5, arrival=0.0))
        s.add(make("final", FINAL, deadline=9.0))
        return ids(s.schedule(now).encode)

    # Before its deadline the chunk waits behind the partial; once due it goes before partials
    # with a later deadline, still after the final.
    assert order(0.5) == ["final", "partial", "file"]
    assert order(1.0) == ["final", "file", "partial"]


def test_file_chunks_not_starved_by_a_constant_stream_of_partials():
    def run(file_deadline: float) -> int | None:
        """One slot; every 0.1 s a new session sends a partial that ends in the step it is admitted.
        Returns the step in which the file chunk was admitted."""
        s = scheduler(max_slots=1, max_encoder_batch=1)
        s.add(make("file", FILE, deadline=file_deadline, arrival=0.0))
        for k in range(200):
            now = k * 0.1
            s.add(make(f"p{k}", PARTIAL, session=f"s{k}", deadline=now + 1.0, arrival=now))
            plan = s.schedule(now)
            admitted = plan.encode[0].id
            s.update(StepOutput(encoded=[admitted], finished=[admitted]))
            if admitted == "file":
                return k
        return None

    # Without a deadline the partials win every step; with one, the chunk runs once it is due.
    assert run(float("inf")) is None
    assert run(5.0) == 50


# Partial replacement.


def test_newer_partial_replaces_queued_one_of_same_session():
    s = scheduler()
    old = make("a1", PARTIAL, session="A", deadline=1.0)
    assert s.add(old) is None
    assert s.add(make("b1", PARTIAL, session="B")) is None
    assert s.add(make("none1", PARTIAL)) is None
    assert s.add(make("none2", PARTIAL)) is None  # no session: nothing to replace
    assert s.add(make("a-final", FINAL, session="A")) is None  # a final replaces nothing
    replaced = s.add(make("a2", PARTIAL, session="A", deadline=2.0))
    assert replaced is old and old.state is RequestState.CANCELLED
    assert s.queue_depth == 5
    assert sorted(ids(s.schedule(0.0).encode)) == ["a-final", "a2", "b1", "none1", "none2"]
    assert s.cancel("a1") is None  # replaced requests are gone


def test_decoding_partial_is_not_replaced():
    s = scheduler()
    first = make("a1", PARTIAL, session="A")
    s.add(first)
    step(s)
    assert first.state is RequestState.DECODING
    assert s.add(make("a2", PARTIAL, session="A")) is None
    plan = step(s)
    assert ids(plan.encode) == ["a2"] and plan.decode == ["a1"]
    assert first.state is RequestState.DECODING
    # With a2 live too, a third partial queues normally and a fourth replaces it.
    third = make("a3", PARTIAL, session="A")
    s.add(third)
    assert s.add(make("a4", PARTIAL, session="A")) is third


# Cancellation.


def test_cancel_queued():
    s = scheduler()
    r = make("q")
    s.add(r)
    assert s.cancel("q") is r and r.state is RequestState.CANCELLED
    assert s.queue_depth == 0 and not s.has_work
    assert s.schedule(0.0).empty
    assert s.cancel("q") is None and s.cancel("never") is None
    s.add(make("q"))  # the id is free again
    assert ids(s.schedule(0.0).encode) == ["q"]


def test_cancel_while_encoding():
    s = scheduler(max_slots=2)
    r = make("e", beam=2)
    s.add(r)
    plan = s.schedule(0.0)
    assert r.state is RequestState.ENCODING and s.live == 1
    assert s.cancel("e") is r and r.state is RequestState.CANCELLED
    assert s.live == 0 and s.free_slots == 0  # the runner still holds the slots
    with pytest.raises(SchedulerError, match="duplicate"):
        s.add(make("e"))
    s.update(StepOutput(encoded=["e"]))  # the runner finished the encode it had started
    assert r.state is RequestState.CANCELLED and s.free_slots == 0
    nxt = s.schedule(1.0)
    assert nxt.released == ["e"] and nxt.decode == [] and s.free_slots == 2
    assert plan.encode == [r]


def test_cancel_while_encoding_need_not_be_reported():
    s = scheduler()
    s.add(make("e"))
    s.schedule(0.0)
    s.cancel("e")
    s.update(StepOutput())
    assert s.schedule(1.0).released == ["e"]


def test_cancel_while_decoding():
    s = scheduler(max_slots=2)
    for rid in ("d", "other"):
        s.add(make(rid))
    step(s)
    r = s.cancel("d")
    assert r.state is RequestState.CANCELLED and s.free_slots == 0
    s.add(make("waiting"))
    plan = step(s, now=1.0)
    # The slot is released and taken again in the same step.
    assert plan.released == ["d"] and plan.decode == ["other"] and ids(plan.encode) == ["waiting"]
    assert s.cancel("d") is None


def test_cancelled_during_step_and_finished_is_not_released_again():
    s = scheduler()
    s.add(make("d"))
    step(s)
    s.schedule(1.0)
    s.cancel("d")
    s.update(StepOutput(finished=["d"]))  # the runner freed it anyway
    r = s.schedule(2.0)
    assert r.empty and r.released == [] and s.free_slots == 8 and not s.has_work


def test_cancel_after_finish_returns_none():
    s = scheduler()
    r = make("x")
    s.add(r)
    step(s)
    step(s, finished=["x"])
    assert r.state is RequestState.FINISHED and s.cancel("x") is None


# Limits.


def test_slot_and_encoder_batch_limits():
    s = scheduler(max_slots=4, max_encoder_batch=2)
    for k in range(6):
        s.add(make(f"r{k}", deadline=float(k)))
    plans = [step(s, now=-1.0) for _ in range(3)]
    assert [ids(p.encode) for p in plans] == [["r0", "r1"], ["r2", "r3"], []]
    assert [p.decode for p in plans] == [[], ["r0", "r1"], ["r0", "r1", "r2", "r3"]]
    assert s.free_slots == 0 and s.queue_depth == 2 and s.live == 4


def test_request_needing_more_slots_than_free_blocks_lower_ranked_ones():
    s = scheduler(max_slots=4)
    s.add(make("running", beam=2))
    step(s)
    s.add(make("beam", FILE, beam=3, deadline=1.0))
    s.add(make("small", FILE, deadline=2.0))
    plan = step(s)
    assert plan.encode == [] and plan.decode == ["running"]
    plan = step(s, finished=["running"])
    plan = step(s)
    assert ids(plan.encode) == ["beam", "small"]


def test_more_slots_than_exist_is_refused():
    s = scheduler(max_slots=4)
    with pytest.raises(SchedulerError, match="needs 5 decoder slots; the engine has 4"):
        s.add(make("big", beam=5))
    assert s.queue_depth == 0


def test_queue_bound_and_class_shares():
    s = scheduler(max_queue=4, fraction=0.5)
    s.add(make("file", FILE))
    s.add(make("p1", PARTIAL, session="A"))
    with pytest.raises(QueueFull, match="2 windows queued, partial requests are refused from 2") as e:
        s.add(make("p3", PARTIAL, session="C"))
    assert (e.value.depth, e.value.bound, e.value.priority, e.value.retry_after_s) == (2, 2, PARTIAL, 1.0)
    with pytest.raises(QueueFull, match="2 windows queued, file requests are refused from 2"):
        s.add(make("file2", FILE))  # uploads never take the room of live finals
    # Replacing a queued partial does not grow the queue, so it is taken.
    assert s.add(make("p1b", PARTIAL, session="A")).id == "p1"
    s.add(make("f1", FINAL))
    s.add(make("f1b", FINAL))
    with pytest.raises(QueueFull, match="4 windows queued, final requests are refused from 4"):
        s.add(make("f2", FINAL))
    assert s.queue_depth == 4
    step(s)
    s.add(make("f2", FINAL))  # room again once admitted


def test_many_cancelled_queued_requests_leave_order_intact():
    s = scheduler(max_slots=1, max_encoder_batch=1, max_queue=1000)
    s.add(make("running", FILE))
    step(s)
    rng = random.Random(0)
    deadlines = list(range(300))
    rng.shuffle(deadlines)
    kept = sorted(rng.sample(range(300), 40))
    for d in deadlines:  # cancelled ones pile up as stale heap entries until compacted
        s.add(make(f"f{d}", FILE, deadline=float(d)))
        if d not in kept:
            s.cancel(f"f{d}")
    assert s.queue_depth == 40
    step(s, finished=["running"])
    admitted: list[str] = []
    for _ in range(40):
        # One slot: each chunk ends in the step it is admitted, the next takes its slot.
        plan = s.schedule(-1.0)
        admitted += ids(plan.encode)
        s.update(StepOutput(encoded=ids(plan.encode), finished=ids(plan.encode)))
    assert admitted == [f"f{d}" for d in kept] and not s.has_work


# Preemption.


def test_final_preempts_newest_partials():
    s = scheduler(max_slots=4)
    s.add(make("file", FILE))
    step(s)
    for rid in ("p1", "p2", "p3"):
        s.add(make(rid, PARTIAL, session=rid))
        step(s)
    s.add(make("final", FINAL, beam=2))
    s.add(make("p4", PARTIAL, session="p4"))
    plan = step(s)
    assert ids(plan.preempted) == ["p3", "p2"] and plan.released == ["p3", "p2"]
    assert all(r.state is RequestState.CANCELLED for r in plan.preempted)
    assert ids(plan.encode) == ["final"] and plan.decode == ["file", "p1"]
    assert s.free_slots == 0 and s.queue_depth == 1


def test_no_preemption_when_it_cannot_make_room():
    s = scheduler(max_slots=3)
    s.add(make("file", FILE, beam=2))
    s.add(make("partial", PARTIAL))
    step(s)
    s.add(make("final", FINAL, beam=2))
    plan = step(s)
    # Evicting the partial would free 1 slot of the 2 needed: the final waits, nothing is lost.
    assert plan.preempted == [] and plan.encode == []
    assert s.live == 2
    plan = step(s, finished=["file"])
    plan = step(s)
    assert ids(plan.encode) == ["final"] and plan.decode == ["partial"] and plan.preempted == []


def test_only_finals_preempt():
    s = scheduler(max_slots=1)
    s.add(make("p1", PARTIAL))
    step(s)
    s.add(make("p2", PARTIAL, deadline=0.0))
    s.add(make("file", FILE, deadline=0.0))
    for _ in range(3):
        plan = step(s, now=5.0)
        assert plan.preempted == [] and plan.encode == [] and plan.decode == ["p1"]


# Continuous batching.


def test_finished_slot_is_taken_next_step_while_others_keep_decoding():
    s = scheduler(max_slots=3)
    for rid in ("a", "b", "c"):
        s.add(make(rid))
    assert ids(step(s).encode) == ["a", "b", "c"]
    s.add(make("d"))
    plan = step(s, finished=["a"])
    assert plan.encode == [] and plan.decode == ["a", "b", "c"]
    assert s.free_slots == 1
    plan = step(s)
    assert ids(plan.encode) == ["d"] and plan.decode == ["b", "c"]
    plan = step(s, finished=["d"])
    assert plan.decode == ["b", "c", "d"]
    assert step(s).decode == ["b", "c"]


def test_finished_in_its_encode_step_and_failures():
    s = scheduler(max_slots=2)
    s.add(make("eot"))
    s.add(make("bad"))
    plan = s.schedule(0.0)
    s.update(StepOutput(encoded=["eot"], finished=["eot"], failed={"bad": "CUDA error"}))
    assert [r.state for r in plan.encode] == [RequestState.FINISHED, RequestState.FAILED]
    assert plan.encode[1].error == "CUDA error" and plan.encode[0].error is None
    assert s.free_slots == 2 and not s.has_work


# Misuse.


def test_misuse_is_refused():
    s = scheduler()
    s.add(make("a"))
    with pytest.raises(SchedulerError, match="duplicate request id a"):
        s.add(make("a"))
    with pytest.raises(SchedulerError, match="not QUEUED"):
        s.add(Request(id="b", audio=ONE_SECOND, priority=FILE, deadline=1.0, arrival=0.0, state=RequestState.DECODING))
    with pytest.raises(SchedulerError, match="without a plan"):
        s.update(StepOutput())
    s.schedule(0.0)
    with pytest.raises(SchedulerError, match="before update"):
        s.schedule(0.0)
    with pytest.raises(SchedulerError, match="unknown request zz"):
        s.update(StepOutput(encoded=["a"], finished=["zz"]))
    with pytest.raises(SchedulerError, match="not reported"):
        s.update(StepOutput())
    with pytest.raises(SchedulerError, match="both finished and failed"):
        s.update(StepOutput(encoded=["a"], finished=["a"], failed={"a": "x"}))
    s.update(StepOutput(encoded=["a"]))
    with pytest.raises(SchedulerError, match="duplicate"):
        s.add(make("a"))
    s.schedule(1.0)
    with pytest.raises(SchedulerError, match="not to be encoded"):
        s.update(StepOutput(encoded=["a"]))


# Randomized simulation.


class FakeRunner:
    """Holds decoder slots as the real runner would; each sequence decodes a random number of tokens."""

    def __init__(self, config: SchedulerConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.slots: dict[str, int] = {}
        self.tokens_left: dict[str, int] = {}

    def execute(self, plan: StepPlan) -> StepOutput:
        for rid in plan.released:
            assert rid in self.slots, f"released {rid} that holds no slot"
            del self.slots[rid]
            self.tokens_left.pop(rid, None)
        assert len(plan.encode) <= self.config.max_encoder_batch
        out = StepOutput()
        assert not (plan.decode and plan.held)
        assert set(plan.decode) | set(plan.held) == set(self.slots), "a live sequence neither decodes nor is held"
        for rid in plan.decode:
            assert rid in self.slots, f"decoding {rid} that holds no slot"
            self.tokens_left[rid] -= 1
            if self.tokens_left[rid] <= 0:
                out.finished.append(rid)
        for r in plan.encode:
            assert r.id not in self.slots and r.state is RequestState.ENCODING
            self.slots[r.id] = r.n_slots
            out.encoded.append(r.id)
            self.tokens_left[r.id] = self.rng.randint(0, 12)  # 0: end-of-text right after prefill
            if self.tokens_left[r.id] == 0:
                out.finished.append(r.id)
        assert sum(self.slots.values()) <= self.config.max_slots
        for rid in list(out.finished):
            if self.rng.random() < 0.05:
                out.finished.remove(rid)
                out.failed[rid] = "decode error"
        for rid in [*out.finished, *out.failed]:
            del self.slots[rid]
            del self.tokens_left[rid]
        return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_simulation_keeps_invariants(seed):
    rng = random.Random(seed)
    config = SchedulerConfig(max_slots=8, max_encoder_batch=3, max_queue=30, partial_queue_fraction=0.5)
    s = Scheduler(config)
    runner = FakeRunner(config, rng)
    requests: dict[str, Request] = {}
    ends: Counter[str] = Counter()
    terminal: dict[str, RequestState] = {}
    counter = 0

    def add_some(now: float, busy: bool) -> None:
        nonlocal counter
        for _ in range(rng.randint(0, 3) if busy else int(rng.random() < 0.4)):
            counter += 1
            priority = rng.choice(list(Priority))
            r = make(
                f"r{counter}", priority, session=f"s{rng.randint(0, 5)}" if priority is not FILE else None,
                deadline=now + {FINAL: 0.2, PARTIAL: 0.5, FILE: 3.0}[priority], arrival=now,
                beam=rng.choice([1, 1, 1, 2, 4]),
            )
            try:
                replaced = s.add(r)
            except QueueFull:
                assert s.queue_depth >= (30 if priority is FINAL else 15)
                continue
            requests[r.id] = r
            if replaced is not None:
                ends[replaced.id] += 1

    def cancel_some() -> None:
        for _ in range(rng.choice([0, 0, 0, 1])):
            rid = rng.choice(list(requests))
            if s.cancel(rid) is not None:
                ends[rid] += 1

    def check() -> None:
        states = Counter(r.state for r in requests.values())
        assert s.queue_depth == states[RequestState.QUEUED]
        assert s.live == states[RequestState.ENCODING] + states[RequestState.DECODING]
        assert 0 <= s.free_slots and config.max_slots - s.free_slots == sum(runner.slots.values())
        for rid, r in requests.items():
            if r.state is RequestState.QUEUED:
                assert rid not in runner.slots
            if r.state in (RequestState.ENCODING, RequestState.DECODING):
                assert rid in runner.slots
            if r.state.done:
                assert terminal.setdefault(rid, r.state) is r.state, f"{rid} ended twice"

    for k in range(1000):
        now = k * 0.02
        add_some(now, busy=(k // 100) % 2 == 0)  # the queue fills and drains in turns
        cancel_some()
        plan = s.schedule(now)
        for r in plan.preempted:
            ends[r.id] += 1
        assert all(requests[rid].state is RequestState.DECODING for rid in plan.decode + plan.held)
        assert not {r.id for r in plan.encode} & set(plan.decode)
        if plan.empty:
            continue
        output = runner.execute(plan)
        cancel_some()  # cancels that arrive while the runner works
        s.update(output)
        for rid in [*output.finished, *output.failed]:
            if requests[rid].state in (RequestState.FINISHED, RequestState.FAILED):
                ends[rid] += 1
        check()

    # Drain: no new work, everything must end.
    for k in range(1000, 3000):
        plan = s.schedule(k * 0.02)
        if plan.empty:
            break
        ends.update(r.id for r in plan.preempted)
        s.update(output := runner.execute(plan))
        ends.update(rid for rid in [*output.finished, *output.failed])
        check()
    assert not s.has_work and s.free_slots == config.max_slots and not runner.slots
    assert all(r.state.done for r in requests.values())
    assert set(ends) == set(requests) and set(ends.values()) == {1}
    assert Counter(r.state for r in requests.values())[RequestState.FINISHED] > 100


# Finals first in time, and fairness between sessions.


def test_while_a_final_decodes_a_step_admits_few_other_windows():
    s = Scheduler(SchedulerConfig(max_slots=64, max_encoder_batch=8, encode_while_finals=2, early_s=float("inf")))
    for i in range(20):
        s.add(make(f"p{i}", PARTIAL, session=f"s{i}", deadline=1.0 + i))
    s.add(make("f", FINAL, session="x", deadline=5.0))
    plan = step(s, now=0.0)
    assert ids(plan.encode)[:3] == ["f", "p0", "p1"] and len(plan.encode) == 8  # no final decodes yet
    for _ in range(3):  # the final decodes: two others per step
        plan = step(s, now=0.0)
        assert len(plan.encode) == 2 and "f" in plan.decode
    plan = step(s, now=0.0, finished=["f"])
    assert len(plan.encode) == 2  # the plan was made before the final ended
    plan = step(s, now=0.0)
    assert len(plan.encode) == 5  # no final decodes: all that is left (21 - 8 - 3 * 2 - 2)


def test_a_fast_sender_cannot_delay_another_sessions_final():
    """Session A sends ten times faster than real time: its finals carry the wall times at which
    their audio would have ended (its clock runs ahead). Session B's final, submitted after all of
    A's, is admitted first, with one slot free per step."""
    s = Scheduler(SchedulerConfig(max_slots=1, max_encoder_batch=4))
    now = 100.0
    for k in range(10):  # A: ten 3-s utterances sent within 3 s; audio end k*3+3 s after its start
        s.add(make(f"a{k}", FINAL, session="A", deadline=97.0 + 3 * (k + 1), arrival=97.0 + 0.3 * k))
    s.add(make("b0", FINAL, session="B", deadline=now - 0.5, arrival=now))  # real time: ended 0.5 s ago
    order = []
    for _ in range(11):  # one slot: each window is admitted, then finishes, before the next
        plan = step(s, now=now)
        order += ids(plan.encode)
        step(s, now=now, finished=ids(plan.encode))
    assert order[0] == "b0"
    assert order[1:] == [f"a{k}" for k in range(10)]


def test_a_batch_in_its_encoder_pass_across_steps_holds_back_new_admissions():
    """The runner may keep a batch in its encoder pass (on a side stream) while decode steps go on:
    no new window is admitted meanwhile, the batch is listed in every plan until it is reported
    encoded, and a cancel reaches it through `released`."""
    s = scheduler(max_slots=8, max_encoder_batch=4)
    s.add(make("d", FILE))
    step(s)  # `d` decodes from now on
    s.add(make("a1", PARTIAL, session="A"))
    s.add(make("a2", PARTIAL, session="B"))
    plan = s.schedule(0.0)
    assert [r.id for r in plan.encode] == ["a1", "a2"] and plan.decode == ["d"]
    s.update(StepOutput(encoding=["a1", "a2"]))
    s.add(make("f", FINAL))
    plan = s.schedule(0.0)
    assert plan.encode == [] and plan.encoding == ["a1", "a2"] and plan.decode == ["d"]
    with pytest.raises(SchedulerError, match="f was not being encoded"):
        s.update(StepOutput(encoding=["f"]))
    s.update(StepOutput(encoding=["a1", "a2"]))
    s.cancel("a1")
    plan = s.schedule(0.0)
    assert plan.released == ["a1"] and plan.encoding == ["a2"] and plan.encode == []
    s.update(StepOutput(encoded=["a2"]))
    plan = s.schedule(0.0)  # the pass is done: the final goes in, and a2 decodes
    assert [r.id for r in plan.encode] == ["f"] and sorted(plan.decode) == ["a2", "d"] and plan.encoding == []
    with pytest.raises(SchedulerError, match="were to be encoded but were not reported"):
        s.update(StepOutput())
    s.update(StepOutput(encoded=["f"], finished=["a2"]))
    assert s.free_slots == 8 - 2


def test_a_client_ahead_of_real_time_waits_for_the_others_and_never_shares_their_batch():
    """Live windows due more than `early_s` ahead (a client sending faster than real time) rank
    after every window that is due, file chunks too, and are not encoded in a batch with them; with
    nothing else queued they are served at once (the engine stays work-conserving)."""
    s = scheduler(max_slots=8, max_encoder_batch=4, early_s=1.0)
    s.add(make("fast-final", FINAL, session="F", deadline=30.0))  # 30 s ahead of now=0
    s.add(make("fast-partial", PARTIAL, session="F", deadline=29.0))
    s.add(make("slow-partial", PARTIAL, session="S", deadline=0.5))
    s.add(make("file", FILE, deadline=5.0))
    plan = step(s)
    assert [r.id for r in plan.encode] == ["slow-partial", "file"]  # the due ones; no early one joins
    plan = step(s, finished=["slow-partial", "file"])
    assert plan.encode == []  # nor runs beside them while they decode
    plan = step(s)
    assert [r.id for r in plan.encode] == ["fast-final", "fast-partial"]  # then the early ones, at once
    s.add(make("fast-final2", FINAL, session="F", deadline=31.0))
    s.add(make("slow-final", FINAL, session="S", deadline=0.9))
    plan = step(s, now=0.0, finished=["fast-final", "fast-partial"])
    assert [r.id for r in plan.encode] == ["slow-final"]
    # Time passes: a window within `early_s` of its deadline is an ordinary one again.
    plan = step(s, now=30.5)
    assert [r.id for r in plan.encode] == ["fast-final2"]


def test_encode_while_finals_zero_admits_only_finals_while_one_decodes():
    """The CPU's setting: an encoder pass there takes ~0.25 s, so no other window is admitted while
    a final decodes; finals still are, and the others go in once no final is left."""
    s = Scheduler(SchedulerConfig(max_slots=8, max_encoder_batch=4, encode_while_finals=0, early_s=float("inf")))
    s.add(make("f1", FINAL, session="A"))
    step(s)  # f1 decodes
    s.add(make("p", PARTIAL, session="B"))
    s.add(make("f2", FINAL, session="C"))
    assert [r.id for r in step(s).encode] == ["f2"]
    assert step(s, finished=["f1", "f2"]).encode == []  # planned while they still decoded
    assert [r.id for r in step(s).encode] == ["p"]


# Files fill the batch first.


def test_files_fill_the_batch_before_any_decodes():
    s = scheduler(max_slots=8, max_encoder_batch=2)
    for k in range(6):
        s.add(make(f"f{k}", FILE, deadline=10.0 + k))
    plans = [step(s) for _ in range(4)]
    assert [ids(p.encode) for p in plans] == [["f0", "f1"], ["f2", "f3"], ["f4", "f5"], []]
    assert [p.held for p in plans] == [[], ["f0", "f1"], [], []]
    # The last admission leaves nothing queued: the step decodes, and so does every one after it.
    assert [p.decode for p in plans] == [[], [], ["f0", "f1", "f2", "f3"], ["f0", "f1", "f2", "f3", "f4", "f5"]]


def test_files_decode_once_the_next_one_does_not_fit():
    s = scheduler(max_slots=4, max_encoder_batch=2)
    for k in range(6):
        s.add(make(f"f{k}", FILE, deadline=10.0 + k))
    step(s)
    plan = step(s)  # fills the last two slots: nothing more fits, so the first two decode
    assert ids(plan.encode) == ["f2", "f3"] and plan.decode == ["f0", "f1"] and plan.held == []


def test_a_live_window_queued_or_decoding_turns_filling_off():
    s = scheduler(max_slots=8, max_encoder_batch=1)
    s.add(make("f0", FILE, deadline=10.0))
    s.add(make("f1", FILE, deadline=11.0))
    s.add(make("f2", FILE, deadline=12.0))
    step(s)
    s.add(make("p", PARTIAL, session="a", deadline=5.0))
    plan = step(s)  # the partial ranks first: admitted, and the file decodes beside it
    assert ids(plan.encode) == ["p"] and plan.decode == ["f0"] and plan.held == []
    plan = step(s)  # a partial is live: files no longer wait
    assert ids(plan.encode) == ["f1"] and plan.decode == ["f0", "p"] and plan.held == []


def test_filling_first_can_be_turned_off():
    s = Scheduler(SchedulerConfig(8, 2, 100, fill_files_first=False))
    for k in range(6):
        s.add(make(f"f{k}", FILE, deadline=10.0 + k))
    plans = [step(s) for _ in range(3)]
    assert [p.decode for p in plans] == [[], ["f0", "f1"], ["f0", "f1", "f2", "f3"]]
    assert all(p.held == [] for p in plans)
