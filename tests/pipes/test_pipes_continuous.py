"""Continuous index pipe (send queue) and its relaxed (``<=``) variant."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cues_platform.pipes import (
    LOSSLESS,
    Check,
    Clock,
    ContinuousIndexPipe,
    FaultSchedule,
    FaultyLink,
    Property,
    ResendMultiPipe,
    Simulation,
    check,
    memory_route,
)
from tests.pipes.pipe_harness import PROPERTY_SETTINGS, Harness, fault_schedules


def _over_link(faults: FaultSchedule, check_: Check = Check.STRICT) -> Harness:
    clock = Clock()
    return Harness(Simulation(clock), ContinuousIndexPipe(FaultyLink(clock, faults), check=check_))


def _over_resend(faults: FaultSchedule, check_: Check) -> Harness:
    clock = Clock()
    inner = ResendMultiPipe(memory_route(clock, faults))
    return Harness(Simulation(clock), ContinuousIndexPipe(inner, check=check_))


@PROPERTY_SETTINGS
@given(faults=fault_schedules(), n=st.integers(1, 40), gap=st.integers(0, 3))
def test_strict_is_absolutely_ordered_over_an_at_least_once_route(
    faults: FaultSchedule, n: int, gap: int
) -> None:
    """Exactly the submitted payloads, in order: no loss, no duplicates."""
    h = _over_resend(faults, Check.STRICT)
    h.feed(list(range(n)), gap=gap)
    assert h.run_to_completion(fed_until=1 + n * gap)
    assert check(Property.ABSOLUTELY_ORDERED, h.sent, h.received) is None


@PROPERTY_SETTINGS
@given(faults=fault_schedules(), n=st.integers(1, 40), gap=st.integers(0, 3))
def test_relaxed_is_continuously_ordered_over_an_at_least_once_route(
    faults: FaultSchedule, n: int, gap: int
) -> None:
    """In order and complete; a payload may repeat right after itself."""
    h = _over_resend(faults, Check.RELAXED)
    h.feed(list(range(n)), gap=gap)
    assert h.run_to_completion(fed_until=1 + n * gap)
    assert check(Property.CONTINUOUSLY_ORDERED, h.sent, h.received) is None
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is None


def test_relaxed_sends_an_adjacent_duplicate_strict_does_not() -> None:
    for check_, expected in ((Check.STRICT, ["a"]), (Check.RELAXED, ["a", "a"])):
        h = _over_link(FaultSchedule(duplicate=1.0), check_)
        h.feed(["a"])
        h.run(10)
        assert h.received == expected


def test_send_queue_holds_early_messages_until_the_gap_is_filled() -> None:
    h = _over_link(FaultSchedule(delay_nth=((1, 10),)))
    h.feed(["a", "b", "c"])
    h.run(6)
    assert h.received == []
    assert h.pipe.receiver.queue == {2: "b", 3: "c"}
    h.run(10)
    assert h.received == ["a", "b", "c"]
    assert h.pipe.receiver.queue == {}


def test_requires_an_at_least_once_route_it_stalls_at_the_first_gap() -> None:
    h = _over_link(FaultSchedule(drop_nth=frozenset({2})))
    h.feed(list(range(6)))
    h.run(500)
    assert h.received == [0]  # nothing after the lost message 1 is ever sent on
    assert sorted(h.pipe.receiver.queue) == [3, 4, 5, 6]


def test_does_not_tolerate_sender_crash() -> None:
    """Non-tolerance: a restarted sender starts again at index 1; the receiver drops those."""
    h = _over_link(LOSSLESS)
    h.feed([0, 1, 2])
    h.sim.at(10, h.pipe.sender.crash)
    h.sim.at(11, h.pipe.sender.restart)
    h.feed([3, 4], start=12)
    h.run(40)
    assert h.sent == [0, 1, 2, 3, 4]
    assert h.received == [0, 1, 2]
    assert h.pipe.receiver.dropped == 2


def test_does_not_tolerate_receiver_crash() -> None:
    """Non-tolerance: the restarted receiver waits for index 1 again; everything else queues
    for ever (and whatever sat in the old send queue is gone)."""
    h = _over_link(FaultSchedule(delay_nth=((2, 20),)))
    h.feed([0, 1, 2, 3])
    h.sim.at(10, h.pipe.receiver.crash)  # 2 and 3 are queued behind the late 1 by now
    h.sim.at(11, h.pipe.receiver.restart)
    h.feed([4, 5], start=12)
    h.run(500)
    assert h.received == [0]
    assert sorted(h.pipe.receiver.queue) == [2, 5, 6]
