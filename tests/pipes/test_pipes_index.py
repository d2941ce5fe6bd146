"""Strict monotonic index pipe and its relaxed (``<=``) variant."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cues_platform.pipes import (
    LOSSLESS,
    Check,
    Clock,
    FaultSchedule,
    FaultyLink,
    Property,
    Simulation,
    StrictIndexPipe,
    check,
)
from tests.pipes.pipe_harness import (
    PROPERTY_SETTINGS,
    Harness,
    fault_schedules,
)


def _pipe(faults: FaultSchedule, check_: Check = Check.STRICT) -> Harness:
    clock = Clock()
    return Harness(Simulation(clock), StrictIndexPipe(FaultyLink(clock, faults), check=check_))


@PROPERTY_SETTINGS
@given(faults=fault_schedules(max_drop=0.5), n=st.integers(1, 60), gap=st.integers(0, 3))
def test_strict_is_strictly_monotonic_under_any_route_faults(
    faults: FaultSchedule, n: int, gap: int
) -> None:
    """Loss possible, duplicates never, never backwards."""
    h = _pipe(faults)
    h.feed(list(range(n)), gap=gap)
    h.run(1 + n * gap + 60)
    assert check(Property.STRICTLY_MONOTONIC, h.sent, h.received) is None


@PROPERTY_SETTINGS
@given(faults=fault_schedules(max_drop=0.5), n=st.integers(1, 60), gap=st.integers(0, 3))
def test_relaxed_is_monotonic_under_any_route_faults(
    faults: FaultSchedule, n: int, gap: int
) -> None:
    h = _pipe(faults, Check.RELAXED)
    h.feed(list(range(n)), gap=gap)
    h.run(1 + n * gap + 60)
    assert check(Property.MONOTONIC, h.sent, h.received) is None


@PROPERTY_SETTINGS
@given(faults=fault_schedules(max_drop=0.5), n=st.integers(1, 30))
def test_tolerates_route_faults_once_the_route_is_accessible_again(
    faults: FaultSchedule, n: int
) -> None:
    """Messages sent after the route heals are all delivered, in order."""
    h = _pipe(faults)
    h.run(faults.heal_at or 0)
    h.feed(list(range(n)), start=h.sim.now + 1)
    h.run(n + 60)
    assert h.received == list(range(n))


def test_strict_drops_a_late_message() -> None:
    """Message 'a' is delayed and overtaken by 'b': it is dropped, not sent backwards."""
    h = _pipe(FaultSchedule(delay_nth=((1, 5),)))
    h.feed(["a", "b", "c"])
    h.run(30)
    assert h.received == ["b", "c"]
    assert h.pipe.receiver.dropped == 1


@pytest.mark.parametrize(
    ("check_", "expected"), [(Check.STRICT, ["a", "b"]), (Check.RELAXED, ["a", "a", "b", "b"])]
)
def test_relaxed_check_lets_an_adjacent_duplicate_through(
    check_: Check, expected: list[str]
) -> None:
    h = _pipe(FaultSchedule(seed=0, duplicate=1.0), check_)
    h.feed(["a"])
    h.feed(["b"], start=10)
    h.run(20)
    # Every message is duplicated; the copy of the current index passes only with "<=".
    assert h.received == expected


def test_does_not_tolerate_sender_crash() -> None:
    """Non-tolerance: a restarted sender re-uses indexes the receiver has passed: all dropped."""
    h = _pipe(LOSSLESS)
    h.feed(list(range(5)))
    h.sim.at(10, h.pipe.sender.crash)
    h.sim.at(11, h.pipe.sender.restart)
    h.feed(list(range(5, 10)), start=12)
    h.run(40)
    assert h.sent == list(range(10))
    assert h.received == [0, 1, 2, 3, 4]  # 5..9 got indexes 1..5 again and were dropped
    assert h.pipe.receiver.dropped == 5


def test_does_not_tolerate_receiver_crash() -> None:
    """Non-tolerance: a restarted receiver forgets its index and sends a late message
    backwards, breaking monotonic order."""
    h = _pipe(FaultSchedule(delay_nth=((1, 10),)))
    h.feed(["a", "b"])
    h.sim.at(5, h.pipe.receiver.crash)
    h.sim.at(6, h.pipe.receiver.restart)
    h.run(30)
    assert h.received == ["b", "a"]
    assert check(Property.STRICTLY_MONOTONIC, h.sent, h.received) == "'a' received after 'b'"
