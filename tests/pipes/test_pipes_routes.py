"""Routes, fault schedules, the simulation loop, workers and the wire codec."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cues_platform.pipes import (
    Clock,
    CodecError,
    ConfigError,
    FaultSchedule,
    FaultyLink,
    Ordering,
    PipeError,
    ResendPipe,
    Simulation,
    SimulationTimeout,
    Status,
    WorkerDownError,
    memory_route,
)
from cues_platform.pipes.messages import Batch, Confirm, Data, Indexed, decode, encode


def _run(link: FaultyLink, clock: Clock, n: int, ticks: int) -> list[int]:
    out: list[int] = []
    for i in range(n):
        link.send(i)
        clock.advance()
        out.extend(link.receive())
    for _ in range(ticks):
        clock.advance()
        out.extend(link.receive())
    return out


def test_lossless_link_delivers_in_order_after_latency() -> None:
    clock = Clock()
    link = FaultyLink(clock, FaultSchedule(latency=3))
    link.send("x")
    clock.advance()
    clock.advance()
    assert link.receive() == []
    clock.advance()
    assert link.receive() == ["x"]


def test_same_seed_same_faults_different_seed_different_faults() -> None:
    faults = FaultSchedule(seed=11, drop=0.3, duplicate=0.3, delay=0.5, max_delay=9)
    runs = []
    for schedule in (faults, faults, replace(faults, seed=12)):
        clock = Clock()
        runs.append(_run(FaultyLink(clock, schedule), clock, 200, 30))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_faults_happen_at_roughly_the_configured_rates() -> None:
    clock = Clock()
    link = FaultyLink(clock, FaultSchedule(seed=1, drop=0.2, duplicate=0.1, delay=0.5, max_delay=9))
    out = _run(link, clock, 2000, 30)
    assert 300 < link.stats.dropped < 500
    assert 100 < link.stats.duplicated < 220
    assert len(out) == 2000 - link.stats.dropped + link.stats.duplicated
    assert out != sorted(out)  # reordered


def test_fifo_ordering_delays_without_reordering() -> None:
    clock = Clock()
    faults = FaultSchedule(seed=1, duplicate=0.2, delay=0.5, max_delay=9, ordering=Ordering.FIFO)
    out = _run(FaultyLink(clock, faults), clock, 300, 30)
    assert out == sorted(out) and set(out) == set(range(300))


def test_partition_loses_everything_sent_inside_the_window() -> None:
    clock = Clock()
    out = _run(FaultyLink(clock, FaultSchedule(partitions=((5, 10),))), clock, 20, 5)
    assert out == [0, 1, 2, 3, 4, *range(10, 20)]  # message i is sent at tick i


def test_heal_at_stops_random_faults() -> None:
    clock = Clock()
    link = FaultyLink(clock, FaultSchedule(seed=1, drop=0.9, heal_at=50))
    out = _run(link, clock, 100, 5)
    assert set(range(50, 100)) <= set(out)
    assert len(out) < 60


@pytest.mark.parametrize(
    "kwargs",
    [
        {"drop": 1.5},
        {"drop": 1.0},
        {"delay": 0.5},
        {"latency": -1},
        {"partitions": ((5, 5),)},
    ],
)
def test_invalid_schedules_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        FaultSchedule(**kwargs)  # type: ignore[arg-type]


def test_errors_share_the_pipe_error_root() -> None:
    assert issubclass(ConfigError, PipeError) and issubclass(ConfigError, ValueError)
    for exc in (WorkerDownError, CodecError, SimulationTimeout):
        assert issubclass(exc, PipeError)


def test_simulation_runs_scheduled_actions_and_times_out() -> None:
    sim = Simulation()
    seen: list[int] = []
    sim.at(3, lambda: seen.append(sim.now))
    sim.run(5)
    assert seen == [3]
    with pytest.raises(ConfigError):
        sim.at(2, lambda: None)
    with pytest.raises(SimulationTimeout):
        sim.run_until(lambda: False, max_ticks=10)
    with pytest.raises(ConfigError):
        sim.add(object())


def test_crashed_worker_refuses_work_and_restarts_with_fresh_state() -> None:
    clock = Clock()
    pipe = ResendPipe(memory_route(clock, FaultSchedule(latency=50)))
    sim = Simulation(clock).add(pipe)
    pipe.submit("a")
    pipe.submit("b")
    sim.step()
    assert pipe.sender.pending == 2
    pipe.sender.crash()
    assert pipe.sender.status is Status.DOWN and pipe.sender.pending == 0
    with pytest.raises(WorkerDownError):
        pipe.submit("c")
    pipe.send("c")  # the Link form drops silently, like a datagram to a dead process
    assert pipe.lost_on_send == 1
    pipe.sender.restart()
    assert pipe.sender.up and pipe.sender.incarnation == 1
    pipe.submit("d")
    assert pipe.sender.pending == 1


def test_codec_round_trips_nested_envelopes() -> None:
    items = [
        Data("s/0/1", Indexed(3, {"k": [1, 2]})),
        Confirm("s/0/1"),
        Batch(7, 2, ((2, "x"), (3, Indexed(1, None)))),
    ]
    for item in items:
        assert decode(encode(item)) == item


def test_codec_rejects_garbage() -> None:
    with pytest.raises(CodecError):
        decode(b"\xff")
    with pytest.raises(CodecError):
        decode(b'{"__envelope__": "Nope"}')
    with pytest.raises(CodecError):
        encode(object())
