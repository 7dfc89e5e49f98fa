"""How often live streams may send a partial window to the engine, adapted to the engine's load.

Partials are the work a server may thin out; finals are what users wait for. One `PartialCadence`
is shared by the live streams of a gateway process: each final's time in the engine (from submit
to result) is observed, and every `period_s` the cadence is set from them:

    p90 of the period's finals  >  final_budget_s         -> interval *= widen   (up to max_interval_s)
    p90                         <= final_budget_s * 0.5,
    or no final for `quiet_periods` periods in a row      -> interval *= narrow  (down to min_interval_s)
    otherwise (no final this period, or in between)       -> unchanged

(a period without a final says nothing about the load: with a few streams on a CPU most periods
have none, and narrowing on each undid every widening: 4 clients, cadence at most 1.7 s.)

so that under load each session's partials come further apart before its finals are delayed
(a multiplicative controller: it reacts within a period or two and never oscillates faster than
the period). A stream then submits a partial only when `interval(now)` has passed since its last
one (`streaming/live.py`), whatever pace its audio arrives at: a client sending faster than real
time gets no more partials per second than one at real-time pace.

No I/O, no clock of its own: the caller passes `now` (monotonic seconds).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CadenceConfig:
    """Bounds and gains of the partial cadence controller."""

    min_interval_s: float = 0.5
    """The cadence with an idle engine (the sessions' `partial_interval_s`)."""
    max_interval_s: float = 4.0
    """The widest it gets: a partial at least this often while someone speaks."""
    final_budget_s: float = 0.3
    """Finals' time in the engine (p90 of a period) above which partials thin out."""
    period_s: float = 0.5
    """How often the interval may change."""
    widen: float = 1.5
    narrow: float = 0.85
    quiet_periods: int = 4
    """Periods in a row without any final after which the interval narrows anyway."""

    def __post_init__(self) -> None:
        if not 0 < self.min_interval_s <= self.max_interval_s:
            raise ValueError(f"need 0 < min_interval_s <= max_interval_s, not {self.min_interval_s}, {self.max_interval_s}")
        if self.final_budget_s <= 0 or self.period_s <= 0:
            raise ValueError("final_budget_s and period_s must be positive")
        if not (self.widen > 1.0 and 0.0 < self.narrow < 1.0):
            raise ValueError(f"need widen > 1 and 0 < narrow < 1, not {self.widen}, {self.narrow}")


def budget_for(device: str) -> float:
    """Default `final_budget_s` for an engine device: a GPU decodes a final in tens of ms when idle;
    on the CPU (tiny.en, 2 cores) a final alone takes 0.2 s for 3 s of speech and 0.9 s for 25 s
    (bfloat16 encoder, session 10). 0.4 on the CPU was measured too (4 clients, 60 s: p95 1.54 /
    1.52 s against 1.57 / 1.66, partials 1.5 s apart instead of 1.1): not adopted on two runs."""
    return 0.3 if device.startswith("cuda") else 0.6


class PartialCadence:
    """The shared partial interval of a gateway's live streams."""

    def __init__(self, config: CadenceConfig = CadenceConfig()):
        self.config = config
        self._interval = config.min_interval_s
        self._period_start: float | None = None
        self._observed: list[float] = []
        self._quiet = 0
        self.widened = 0
        """Times the interval was widened (a metric of sustained load)."""

    def observe_final(self, engine_s: float, now: float) -> None:
        """A final came back after `engine_s` seconds in the engine."""
        self._roll(now)
        self._observed.append(engine_s)

    def interval(self, now: float) -> float:
        """Seconds that must pass between two partial submissions of one stream."""
        self._roll(now)
        return self._interval

    def _roll(self, now: float) -> None:
        if self._period_start is None:
            self._period_start = now
            return
        if now - self._period_start < self.config.period_s:
            return
        c = self.config
        seen = sorted(self._observed)
        p90 = seen[min(len(seen) - 1, int(0.9 * len(seen)))] if seen else None
        self._quiet = 0 if seen else self._quiet + 1
        if p90 is not None and p90 > c.final_budget_s:
            self._interval = min(c.max_interval_s, self._interval * c.widen)
            self.widened += 1
        elif (p90 is not None and p90 <= 0.5 * c.final_budget_s) or self._quiet >= c.quiet_periods:
            self._interval = max(c.min_interval_s, self._interval * c.narrow)
        self._observed.clear()
        self._period_start = now
