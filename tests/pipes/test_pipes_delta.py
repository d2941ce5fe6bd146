"""The stream pipe over the platform's Delta queue (``cues_platform.queues``)."""

from __future__ import annotations

from pathlib import Path

from cues_platform.pipes import (
    Clock,
    FaultSchedule,
    MemoryIndexStore,
    Property,
    Simulation,
    StreamConfig,
    StreamPipe,
    StreamStore,
    check,
    memory_route,
)
from cues_platform.pipes.delta import DeltaStreamStore
from cues_platform.pipes.messages import Indexed
from tests.pipes.pipe_harness import Harness


def test_delta_store_has_monotonic_offsets_and_persists(tmp_path: Path) -> None:
    store = DeltaStreamStore.open(root=str(tmp_path / "lake"), name="pipes_stream")
    assert isinstance(store, StreamStore)
    assert store.end() == 0
    assert [store.append(p) for p in ("a", {"k": 1}, Indexed(3, "x"))] == [0, 1, 2]
    reopened = DeltaStreamStore.open(root=str(tmp_path / "lake"), name="pipes_stream")
    assert reopened.end() == 3
    assert reopened.read(1, 10) == [(1, {"k": 1}), (2, Indexed(3, "x"))]
    assert reopened.read(3, 10) == []


def test_stream_pipe_over_delta_is_at_least_once_with_faults_and_crashes(tmp_path: Path) -> None:
    clock = Clock()
    faults = FaultSchedule(seed=4, drop=0.2, duplicate=0.2, delay=0.3, max_delay=6, heal_at=150)
    index_store = MemoryIndexStore()
    pipe = StreamPipe(
        store=DeltaStreamStore.open(root=str(tmp_path / "lake"), name="pipes_faulty"),
        writer_route=memory_route(clock, faults, name="writer"),
        reader_route=memory_route(clock, faults, name="reader"),
        index_store=index_store,
        index_route=memory_route(clock, faults, name="index"),
        config=StreamConfig(batch=8),
    )
    h = Harness(Simulation(clock), pipe)
    h.feed(list(range(12)), gap=2)
    for worker, at in ((pipe.engine, 6), (pipe.receiver, 14)):
        h.sim.at(at, worker.crash)
        h.sim.at(at + 5, worker.restart)
    assert h.run_to_completion(fed_until=25, extra=20)
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is None
    assert index_store.load() is not None


def test_delta_storage_survives_the_whole_pipe(tmp_path: Path) -> None:
    """Stream data is in Delta, not in any worker: a brand-new pipe (new process, say) over the
    same queue and index delivers what the old one stored but never sent on."""
    root, index_store = str(tmp_path / "lake"), MemoryIndexStore()

    def build(clock: Clock, reader: FaultSchedule) -> StreamPipe:
        return StreamPipe(
            store=DeltaStreamStore.open(root=root, name="pipes_restart"),
            writer_route=memory_route(clock, name="writer"),
            reader_route=memory_route(clock, reader, name="reader"),
            index_store=index_store,
            index_route=memory_route(clock, name="index"),
        )

    clock = Clock()
    first = Harness(Simulation(clock), build(clock, FaultSchedule(partitions=((1, 10_000),))))
    first.feed(["a", "b", "c"], gap=0)
    assert first.settle(lambda: first.pipe.sender.pending == 0)
    assert first.received == []  # stored and confirmed, but the reader was cut off

    clock = Clock()
    second = Harness(Simulation(clock), build(clock, FaultSchedule()))
    assert second.settle(lambda: len(second.received) == 3)
    assert second.received == ["a", "b", "c"]
