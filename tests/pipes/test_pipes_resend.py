"""Re-send pipe and re-send pipe with multiple unconfirmed messages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cues_platform.pipes import (
    LOSSLESS,
    Clock,
    FaultSchedule,
    Property,
    ResendConfig,
    ResendMultiPipe,
    ResendPipe,
    Simulation,
    check,
    memory_route,
)
from tests.pipes.pipe_harness import (
    PROPERTY_SETTINGS,
    Harness,
    crash_plans,
    fault_schedules,
    schedule_crashes,
)

PIPES = [ResendPipe, ResendMultiPipe]


def _harness(pipe_cls: type, faults: FaultSchedule) -> Harness:
    clock = Clock()
    return Harness(Simulation(clock), pipe_cls(memory_route(clock, faults)))


@pytest.mark.parametrize("pipe_cls", PIPES)
@PROPERTY_SETTINGS
@given(
    faults=fault_schedules(),
    n=st.integers(1, 40),
    gap=st.integers(0, 3),
    crashes=crash_plans(),
)
def test_at_least_once_under_route_faults_and_receiver_crashes(
    pipe_cls: type, faults: FaultSchedule, n: int, gap: int, crashes: list[tuple[int, int]]
) -> None:
    """Drops, duplicates, delays/reordering, partitions and receiver crashes lose nothing."""
    h = _harness(pipe_cls, faults)
    schedule_crashes(h.sim, h.pipe.receiver, crashes)
    h.feed(list(range(n)), gap=gap)
    assert h.run_to_completion(fed_until=1 + n * gap)
    assert h.refused == []
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is None
    assert h.settle(lambda: h.pipe.sender.pending == 0)  # every message ends up confirmed


@pytest.mark.parametrize("pipe_cls", PIPES)
def test_lost_confirms_cause_duplicates(pipe_cls: type) -> None:
    """At-least-once, not exactly-once: when a confirm is lost the message is sent again."""
    clock = Clock()
    route = memory_route(clock, LOSSLESS, FaultSchedule(drop_nth=frozenset({1})))
    h = Harness(Simulation(clock), pipe_cls(route, config=ResendConfig(timeout=5)))
    h.feed(["a", "b"], gap=0)
    assert h.run_to_completion(fed_until=1)
    assert sorted(h.received) == ["a", "a", "b"]
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is None


@pytest.mark.parametrize("pipe_cls", PIPES)
def test_tolerates_a_partition_once_the_receiver_is_accessible_again(pipe_cls: type) -> None:
    h = _harness(pipe_cls, FaultSchedule(partitions=((1, 80),)))
    h.feed(list(range(10)))
    h.run(79)
    assert h.received == []  # nothing got through the partition...
    assert h.settle(h.all_delivered)  # ...but everything arrives once it heals
    assert h.pipe.sender.resent > 0


@pytest.mark.parametrize("pipe_cls", PIPES)
def test_tolerates_receiver_crash(pipe_cls: type) -> None:
    h = _harness(pipe_cls, LOSSLESS)
    h.sim.at(2, h.pipe.receiver.crash)
    h.sim.at(30, h.pipe.receiver.restart)
    h.feed(list(range(10)))
    assert h.run_to_completion(fed_until=11)
    assert h.pipe.receiver.discarded > 0  # messages did reach the crashed receiver and vanish
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is None


def test_single_unconfirmed_message_buffers_the_rest() -> None:
    """State: one current unconfirmed message and its id, a buffer of the others."""
    h = _harness(ResendPipe, FaultSchedule(latency=3))
    h.feed(["a", "b", "c"], gap=0)
    h.run(1)
    sender = h.pipe.sender
    assert sender.current is not None and sender.current.payload == "a"
    assert [m.payload for m in sender.buffer] == ["b", "c"]
    assert h.pipe.route.forward.in_flight() == 1


def test_multi_sends_everything_and_tracks_all_unconfirmed() -> None:
    h = _harness(ResendMultiPipe, FaultSchedule(latency=3))
    h.feed(["a", "b", "c"], gap=0)
    h.run(1)
    assert [m.payload for m, _ in h.pipe.sender.unconfirmed.values()] == ["a", "b", "c"]
    assert h.pipe.route.forward.in_flight() == 3


def test_message_ids_are_unique_across_sender_restarts() -> None:
    h = _harness(ResendMultiPipe, FaultSchedule(latency=5))
    h.pipe.submit("a")
    first = set(h.pipe.sender._fresh)
    h.pipe.sender.crash()
    h.pipe.sender.restart()
    h.pipe.submit("b")
    second = set(h.pipe.sender._fresh)
    assert {i for i, _ in first}.isdisjoint({i for i, _ in second})


@pytest.mark.parametrize("pipe_cls", PIPES)
def test_does_not_tolerate_sender_crash(pipe_cls: type) -> None:
    """Non-tolerance: unconfirmed and buffered messages live in sender memory and are lost."""
    h = _harness(pipe_cls, FaultSchedule(partitions=((1, 20),)))
    h.feed(list(range(5)), gap=0)
    h.sim.at(10, h.pipe.sender.crash)
    h.sim.at(11, h.pipe.sender.restart)
    h.feed([100], start=12)
    h.run(300)
    assert h.sent == [0, 1, 2, 3, 4, 100]  # all five were accepted by the sender...
    assert h.received == [100]  # ...none of them was ever delivered
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is not None
