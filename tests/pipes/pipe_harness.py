"""Shared helpers for the pipe tests: a run harness, hypothesis strategies and settings.

Imported as ``tests.pipes.pipe_harness`` (pytest runs with ``pythonpath = ["."]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cues_platform.pipes import (
    FaultSchedule,
    Ordering,
    Pipe,
    Simulation,
    Worker,
    WorkerDownError,
)

# Bounded and derandomized: the same examples run on every machine, and the suite stays fast.
PROPERTY_SETTINGS = settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

HEAL_AT = 260  # random faults stop here, so "eventually delivered" can be checked
SETTLE_TICKS = 4000


@st.composite
def fault_schedules(
    draw: st.DrawFn,
    *,
    ordering: Ordering = Ordering.REORDER,
    max_drop: float = 0.4,
    heal_at: int | None = HEAL_AT,
) -> FaultSchedule:
    """Random drop / duplicate / delay-reorder / partition schedules, seeded and shrinkable."""
    drops = [p for p in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5) if p <= max_drop]
    windows = draw(st.lists(st.tuples(st.integers(1, 200), st.integers(1, 40)), max_size=2))
    return FaultSchedule(
        seed=draw(st.integers(0, 2**20)),
        drop=draw(st.sampled_from(drops)),
        duplicate=draw(st.sampled_from([0.0, 0.1, 0.3])),
        delay=draw(st.sampled_from([0.0, 0.2, 0.5])),
        max_delay=draw(st.integers(1, 15)),
        latency=draw(st.integers(1, 3)),
        ordering=ordering,
        partitions=tuple((s, s + n) for s, n in windows),
        heal_at=heal_at,
    )


def crash_plans(max_crashes: int = 3) -> st.SearchStrategy[list[tuple[int, int]]]:
    """Lists of ``(crash_tick, downtime)``; crashes happen before the faults heal."""
    return st.lists(st.tuples(st.integers(2, 220), st.integers(1, 40)), max_size=max_crashes)


def schedule_crashes(sim: Simulation, worker: Worker, plan: list[tuple[int, int]]) -> None:
    """Crash ``worker`` at each planned tick and restart it after the downtime (merged)."""
    windows = sorted((t, t + d) for t, d in plan)
    merged: list[list[int]] = []
    for start, end in windows:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    for start, end in merged:
        sim.at(start, worker.crash)
        sim.at(end + 1, worker.restart)


class Harness:
    """Feeds a pipe, steps the simulation and records what comes out."""

    def __init__(self, sim: Simulation, pipe: Pipe) -> None:
        self.sim = sim
        self.pipe = pipe
        self.sent: list[Any] = []
        self.refused: list[Any] = []
        self.received: list[Any] = []
        sim.add(pipe)

    def _submit(self, payload: Any) -> None:
        try:
            self.pipe.submit(payload)
        except WorkerDownError:
            self.refused.append(payload)
        else:
            self.sent.append(payload)

    def feed(self, payloads: list[Any], *, start: int = 1, gap: int = 1) -> None:
        """Submit ``payloads[i]`` at tick ``start + i * gap`` (``gap=0``: all at ``start``)."""
        for i, payload in enumerate(payloads):
            self.sim.at(start + i * gap, lambda p=payload: self._submit(p))

    def step(self) -> None:
        self.sim.step()
        self.received.extend(self.pipe.receive())

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.step()

    def settle(self, done: Callable[[], bool], *, max_ticks: int = SETTLE_TICKS) -> bool:
        for _ in range(max_ticks):
            self.step()
            if done():
                return True
        return False

    def all_delivered(self) -> bool:
        return set(self.received) >= set(self.sent)

    def run_to_completion(self, *, fed_until: int, extra: int = 60) -> bool:
        """Run past the last submit, wait for every accepted payload, then ``extra`` ticks
        more so late duplicates can surface. Returns whether everything was delivered."""
        self.run(max(0, fed_until - self.sim.now))
        ok = self.settle(self.all_delivered)
        self.run(extra)
        return ok
