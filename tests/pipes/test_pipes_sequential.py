"""Sequential confirm pipe (send queue)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cues_platform.pipes import (
    LOSSLESS,
    Clock,
    FaultSchedule,
    Ordering,
    Property,
    Route,
    SequentialConfirmPipe,
    Simulation,
    check,
    memory_route,
    sequential_over_resend,
)
from tests.pipes.pipe_harness import PROPERTY_SETTINGS, Harness, fault_schedules


@PROPERTY_SETTINGS
@given(
    faults=fault_schedules(ordering=Ordering.FIFO),
    n=st.integers(1, 25),
    gap=st.integers(0, 3),
)
def test_continuously_ordered_over_at_least_once_routes(
    faults: FaultSchedule, n: int, gap: int
) -> None:
    """Over re-send pipes (at-least-once) on a FIFO wire with drops, duplicates, delays and
    partitions: in order, no gaps, everything delivered; repeats only right after themselves."""
    clock = Clock()
    h = Harness(Simulation(clock), sequential_over_resend(clock, faults))
    h.feed(list(range(n)), gap=gap)
    assert h.run_to_completion(fed_until=1 + n * gap)
    assert check(Property.CONTINUOUSLY_ORDERED, h.sent, h.received) is None
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is None


def test_one_message_in_flight_per_round_trip() -> None:
    """The sender waits for each confirm: n messages cost n round trips."""
    clock = Clock()
    pipe = SequentialConfirmPipe(memory_route(clock, FaultSchedule(latency=5)))
    h = Harness(Simulation(clock), pipe)
    h.feed(list(range(10)), gap=0)
    h.run(1)
    assert pipe.sender.waiting_for is not None and pipe.sender.waiting_for.payload == 0
    assert len(pipe.sender.buffer) == 9
    assert pipe.route.forward.in_flight() == 1
    assert h.settle(h.all_delivered, max_ticks=1000)
    assert h.sim.now >= 9 * 2 * 5  # nine full round trips before the last message can leave
    assert h.received == list(range(10))


def test_requires_an_at_least_once_route_a_lost_message_stalls_it_for_ever() -> None:
    clock = Clock()
    pipe = SequentialConfirmPipe(memory_route(clock, FaultSchedule(drop_nth=frozenset({2}))))
    h = Harness(Simulation(clock), pipe)
    h.feed(list(range(5)), gap=0)
    h.run(2000)
    assert h.received == [0]  # message 1 was dropped and is never sent again
    assert pipe.sender.waiting_for is not None and pipe.sender.waiting_for.payload == 1


def test_requires_that_duplicates_are_not_overtaken() -> None:
    """Over at-least-once routes that *reorder*, a stale duplicate arrives after later
    messages and is sent on: continuity breaks. The seed's route requirement is not enough."""
    clock = Clock()
    faults = FaultSchedule(seed=2, duplicate=0.3, delay=0.5, max_delay=12)
    h = Harness(Simulation(clock), sequential_over_resend(clock, faults))
    h.feed(list(range(6)), gap=0)
    h.run(400)
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is None
    assert check(Property.CONTINUOUSLY_ORDERED, h.sent, h.received) == "0 received after 1"


def test_does_not_tolerate_sender_crash() -> None:
    """Non-tolerance: the buffer of unsent messages lives in sender memory."""
    clock = Clock()
    h = Harness(Simulation(clock), sequential_over_resend(clock, FaultSchedule(latency=3)))
    h.feed(list(range(5)), gap=0)
    h.sim.at(3, h.pipe.sender.crash)
    h.sim.at(4, h.pipe.sender.restart)
    h.run(500)
    assert h.sent == [0, 1, 2, 3, 4]
    assert h.received == [0]
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is not None


def test_does_not_tolerate_receiver_crash() -> None:
    """Non-tolerance: a message reaching a crashed receiver is confirmed by the inner route but
    never by the receiver, so the sender waits for ever and nothing after it is delivered."""
    clock = Clock()
    h = Harness(Simulation(clock), sequential_over_resend(clock, LOSSLESS))
    h.feed(list(range(5)), gap=0)
    h.sim.at(2, h.pipe.receiver.crash)
    h.sim.at(10, h.pipe.receiver.restart)
    h.run(2000)
    assert h.pipe.receiver.discarded == 1
    assert h.received == []
    assert h.pipe.sender.waiting_for is not None and h.pipe.sender.waiting_for.payload == 0


def test_does_not_tolerate_a_lost_confirm() -> None:
    """The back route must be at-least-once too: one lost confirm stalls the pipe."""
    clock = Clock()
    back = FaultSchedule(drop_nth=frozenset({1}))
    route = memory_route(clock, LOSSLESS, back)
    h = Harness(Simulation(clock), SequentialConfirmPipe(Route(route.forward, route.back)))
    h.feed(list(range(3)), gap=0)
    h.run(1000)
    assert h.received == [0]
