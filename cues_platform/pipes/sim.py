"""Logical time: a tick counter and a deterministic simulation loop.

Nothing in the pipes reads the wall clock. Time advances only when :meth:`Simulation.step` is
called, and every time-out (re-send, fetch poll) is measured in ticks. A simulation is therefore
fully determined by its components, their order, and the seeded fault schedules of its routes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from .errors import ConfigError, SimulationTimeout


class Clock:
    """A monotonically increasing logical tick counter shared by routes and the simulation."""

    def __init__(self, start: int = 0) -> None:
        self._now = start

    @property
    def now(self) -> int:
        return self._now

    def advance(self) -> int:
        self._now += 1
        return self._now


@runtime_checkable
class Tickable(Protocol):
    """Anything that acts once per tick (workers, fault-injecting routes)."""

    def tick(self, now: int) -> None: ...


@runtime_checkable
class Composite(Protocol):
    """Anything made of tickables (a pipe is made of its workers and of inner pipes)."""

    def tickables(self) -> list[Tickable]: ...


def flatten(items: Iterable[object]) -> list[Tickable]:
    """Expand composites depth-first into their tickables, dropping duplicates by identity."""
    out: list[Tickable] = []
    seen: set[int] = set()

    def visit(item: object) -> None:
        if isinstance(item, Composite):
            for inner in item.tickables():
                visit(inner)
        elif isinstance(item, Tickable):
            if id(item) not in seen:
                seen.add(id(item))
                out.append(item)
        else:
            raise ConfigError(f"{type(item).__name__} is neither tickable nor composite")

    for item in items:
        visit(item)
    return out


class Simulation:
    """Drives tickables in a fixed order, one logical tick per :meth:`step`.

    ``at(tick, action)`` schedules an action (a crash, a restart, a submit) to run at the start of
    that tick, before the components act, which is how tests express crash schedules.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self._tickables: list[Tickable] = []
        self._actions: dict[int, list[Callable[[], None]]] = {}

    @property
    def now(self) -> int:
        return self.clock.now

    def add(self, *items: object) -> Simulation:
        known = {id(t) for t in self._tickables}
        for t in flatten(items):
            if id(t) not in known:
                known.add(id(t))
                self._tickables.append(t)
        return self

    def at(self, tick: int, action: Callable[[], None]) -> None:
        if tick <= self.clock.now:
            raise ConfigError(f"tick {tick} is not in the future (now={self.clock.now})")
        self._actions.setdefault(tick, []).append(action)

    def step(self) -> int:
        now = self.clock.advance()
        for action in self._actions.pop(now, ()):
            action()
        for t in self._tickables:
            t.tick(now)
        return now

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.step()

    def run_until(
        self, done: Callable[[], bool], *, max_ticks: int, what: str = "condition"
    ) -> int:
        """Step until ``done()``; return the ticks taken or raise :class:`SimulationTimeout`."""
        for taken in range(1, max_ticks + 1):
            self.step()
            if done():
                return taken
        raise SimulationTimeout(max_ticks, what)

    def settle(self, done: Callable[[], bool], *, max_ticks: int) -> bool:
        """Like :meth:`run_until` but report failure as ``False`` (for liveness checks)."""
        for _ in range(max_ticks):
            self.step()
            if done():
                return True
        return False
