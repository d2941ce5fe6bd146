"""Composition: pipes are links, so one pipe can be the route of another."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cues_platform.pipes import (
    Check,
    Clock,
    FaultSchedule,
    FaultyLink,
    Property,
    ResendMultiPipe,
    Simulation,
    StrictIndexPipe,
    check,
    exactly_once_pipe,
    memory_route,
)
from tests.pipes.pipe_harness import (
    PROPERTY_SETTINGS,
    Harness,
    crash_plans,
    fault_schedules,
    schedule_crashes,
)


@PROPERTY_SETTINGS
@given(
    faults=fault_schedules(max_drop=0.5),
    n=st.integers(1, 50),
    gap=st.integers(0, 3),
    inner_receiver_crashes=crash_plans(),
)
def test_continuous_index_over_resend_multi_is_exactly_once_in_order(
    faults: FaultSchedule, n: int, gap: int, inner_receiver_crashes: list[tuple[int, int]]
) -> None:
    """Over a route that drops, duplicates, reorders and partitions, and with the inner
    (stateless) receiver crashing: exactly the submitted payloads, in submission order."""
    clock = Clock()
    pipe = exactly_once_pipe(clock, faults)
    h = Harness(Simulation(clock), pipe)
    schedule_crashes(h.sim, pipe.forward.receiver, inner_receiver_crashes)
    h.feed(list(range(n)), gap=gap)
    assert h.run_to_completion(fed_until=1 + n * gap)
    assert check(Property.ABSOLUTELY_ORDERED, h.sent, h.received) is None


def test_composed_pipe_fixes_what_the_wire_breaks() -> None:
    """Same faulty wire: the bare strict index pipe loses messages, the composed pipe
    delivers every message exactly once, in order."""
    faults = FaultSchedule(seed=7, drop=0.3, duplicate=0.3, delay=0.5, max_delay=10, heal_at=300)
    clock = Clock()
    bare = Harness(Simulation(clock), StrictIndexPipe(FaultyLink(clock, faults)))
    bare.feed(list(range(40)))
    bare.run(400)
    assert check(Property.AT_LEAST_ONCE, bare.sent, bare.received) is not None  # lossy

    clock = Clock()
    composed = Harness(Simulation(clock), exactly_once_pipe(clock, faults))
    composed.feed(list(range(40)))
    composed.run(400)
    assert composed.received == list(range(40))


def test_index_pipe_over_resend_multi_keeps_its_own_contract() -> None:
    """A strict index pipe over an at-least-once route: no loss from the wire, but reordering
    inside the inner pipe still makes it drop late messages; never a duplicate."""
    clock = Clock()
    faults = FaultSchedule(seed=3, drop=0.2, duplicate=0.2, delay=0.5, max_delay=8, heal_at=200)
    inner = ResendMultiPipe(memory_route(clock, faults))
    h = Harness(Simulation(clock), StrictIndexPipe(inner, check=Check.STRICT))
    h.feed(list(range(40)))
    h.run(400)
    assert check(Property.STRICTLY_MONOTONIC, h.sent, h.received) is None
    assert h.pipe.receiver.dropped > 0
