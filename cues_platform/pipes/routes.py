"""Routes: how envelopes travel between workers, with seeded fault injection.

A :class:`Link` carries envelopes one way: ``send`` is fire-and-forget, ``receive`` returns what
has arrived. A :class:`Route` pairs a forward link with a back link, which is what the seed calls
a *backtraceable* route (confirms travel back). Pipes are links too, so they compose.

:class:`FaultyLink` is the in-memory route. Its :class:`FaultSchedule` is seeded, so a given
schedule always drops, duplicates, delays and reorders exactly the same messages.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigError
from .sim import Clock


@runtime_checkable
class Link(Protocol):
    """One-way carrier of envelopes."""

    def send(self, item: Any) -> None: ...

    def receive(self) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class Route:
    """A forward link (sender → receiver) and a back link (receiver → sender, for confirms)."""

    forward: Link
    back: Link


class Ordering(Enum):
    """Whether a link may let a delayed message be overtaken by a later one."""

    REORDER = "reorder"
    FIFO = "fifo"


@dataclass(frozen=True, slots=True)
class FaultSchedule:
    """A seeded description of the faults a link injects.

    ``drop``/``duplicate``/``delay`` are per-message probabilities; a delayed message waits an
    extra ``1..max_delay`` ticks, which reorders it unless ``ordering`` is FIFO. ``partitions`` are
    half-open tick windows ``[start, end)`` during which everything sent is lost. After
    ``heal_at`` (if set) the link stops injecting random faults, so liveness can be checked.
    ``drop_nth``/``delay_nth`` script faults for the n-th message sent on the link (1-based;
    ``delay_nth`` pairs are ``(n, extra_ticks)``), for tests that need one exact scenario.
    """

    seed: int = 0
    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    max_delay: int = 0
    latency: int = 1
    ordering: Ordering = Ordering.REORDER
    partitions: tuple[tuple[int, int], ...] = ()
    heal_at: int | None = None
    drop_nth: frozenset[int] = frozenset()
    delay_nth: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "delay"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ConfigError(f"{name} must be a probability, got {p}")
        if self.drop == 1.0 and self.heal_at is None:
            raise ConfigError("drop=1.0 without heal_at would never deliver anything")
        if self.latency < 0 or self.max_delay < 0:
            raise ConfigError("latency and max_delay must be >= 0")
        if self.delay > 0 and self.max_delay == 0:
            raise ConfigError("delay > 0 needs max_delay >= 1")
        for start, end in self.partitions:
            if end <= start:
                raise ConfigError(f"empty partition window [{start}, {end})")

    def active(self, now: int) -> bool:
        return self.heal_at is None or now < self.heal_at

    def partitioned(self, now: int) -> bool:
        return any(start <= now < end for start, end in self.partitions)


LOSSLESS = FaultSchedule()


@dataclass(slots=True)
class LinkStats:
    sent: int = 0
    dropped: int = 0
    partitioned: int = 0
    duplicated: int = 0
    delayed: int = 0
    delivered: int = 0


@dataclass(order=True, slots=True)
class _InFlight:
    due: int
    seq: int
    item: Any = field(compare=False)


class FaultyLink:
    """In-memory link driven by a :class:`FaultSchedule` and a logical :class:`Clock`.

    Without ``inner`` the link is a complete in-memory route: messages become receivable once
    their due tick has come. With ``inner`` (e.g. a loopback endpoint) it is a sender-side fault
    injector: :meth:`tick` forwards due messages into ``inner`` and :meth:`receive` delegates.
    """

    def __init__(
        self,
        clock: Clock,
        schedule: FaultSchedule = LOSSLESS,
        *,
        name: str = "link",
        inner: Link | None = None,
    ) -> None:
        self.clock = clock
        self.schedule = schedule
        self.name = name
        self.inner = inner
        self.stats = LinkStats()
        self._rng = random.Random(f"{schedule.seed}:{name}")
        self._heap: list[_InFlight] = []
        self._seq = 0
        self._last_due = 0
        self._scripted_delay = dict(schedule.delay_nth)

    def send(self, item: Any) -> None:
        now, s = self.clock.now, self.schedule
        self.stats.sent += 1
        nth = self.stats.sent
        if nth in s.drop_nth:
            self.stats.dropped += 1
            return
        faulty = s.active(now)
        if faulty and s.partitioned(now):
            self.stats.partitioned += 1
            return
        if faulty and self._rng.random() < s.drop:
            self.stats.dropped += 1
            return
        copies = 2 if faulty and self._rng.random() < s.duplicate else 1
        self.stats.duplicated += copies - 1
        for _ in range(copies):
            due = now + s.latency + self._scripted_delay.get(nth, 0)
            if faulty and self._rng.random() < s.delay:
                self.stats.delayed += 1
                due += self._rng.randint(1, s.max_delay)
            if s.ordering is Ordering.FIFO:
                due = max(due, self._last_due)
            self._last_due = due
            self._seq += 1
            heapq.heappush(self._heap, _InFlight(due, self._seq, item))

    def _due(self) -> list[Any]:
        now, out = self.clock.now, []
        while self._heap and self._heap[0].due <= now:
            out.append(heapq.heappop(self._heap).item)
        self.stats.delivered += len(out)
        return out

    def receive(self) -> list[Any]:
        if self.inner is not None:
            return self.inner.receive()
        return self._due()

    def tick(self, now: int) -> None:
        if self.inner is not None:
            for item in self._due():
                self.inner.send(item)

    def in_flight(self) -> int:
        return len(self._heap)


def memory_route(
    clock: Clock,
    forward: FaultSchedule = LOSSLESS,
    back: FaultSchedule | None = None,
    *,
    name: str = "route",
) -> Route:
    """A backtraceable in-memory route; the back link reuses ``forward``'s schedule by default."""
    return Route(
        forward=FaultyLink(clock, forward, name=f"{name}.forward"),
        back=FaultyLink(clock, forward if back is None else back, name=f"{name}.back"),
    )
