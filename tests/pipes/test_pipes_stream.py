"""Stream pipe: persistent storage, monotonic offsets, optional index storage."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cues_platform.pipes import (
    LOSSLESS,
    Clock,
    FaultSchedule,
    MemoryIndexStore,
    MemoryStreamStore,
    Property,
    Simulation,
    StorageError,
    StreamConfig,
    StreamPipe,
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


def _stream(
    clock: Clock,
    *,
    writer: FaultSchedule = LOSSLESS,
    reader: FaultSchedule = LOSSLESS,
    index: FaultSchedule | None = LOSSLESS,
    store: MemoryStreamStore | None = None,
    index_store: MemoryIndexStore | None = None,
) -> StreamPipe:
    with_index = index is not None
    return StreamPipe(
        store=store or MemoryStreamStore(),
        writer_route=memory_route(clock, writer, name="writer"),
        reader_route=memory_route(clock, reader, name="reader"),
        index_store=(index_store or MemoryIndexStore()) if with_index else None,
        index_route=memory_route(clock, index, name="index") if index is not None else None,
        config=StreamConfig(batch=4),
    )


@PROPERTY_SETTINGS
@given(
    writer=fault_schedules(),
    reader=fault_schedules(),
    index=st.one_of(st.none(), fault_schedules()),
    n=st.integers(1, 30),
    gap=st.integers(0, 3),
    receiver_crashes=crash_plans(),
    engine_crashes=crash_plans(2),
    index_crashes=crash_plans(2),
)
def test_at_least_once_under_route_faults_and_receiver_engine_index_crashes(
    writer: FaultSchedule,
    reader: FaultSchedule,
    index: FaultSchedule | None,
    n: int,
    gap: int,
    receiver_crashes: list[tuple[int, int]],
    engine_crashes: list[tuple[int, int]],
    index_crashes: list[tuple[int, int]],
) -> None:
    clock = Clock()
    pipe = _stream(clock, writer=writer, reader=reader, index=index)
    h = Harness(Simulation(clock), pipe)
    schedule_crashes(h.sim, pipe.receiver, receiver_crashes)
    schedule_crashes(h.sim, pipe.engine, engine_crashes)
    if pipe.index_storage is not None:
        schedule_crashes(h.sim, pipe.index_storage, index_crashes)
    h.feed(list(range(n)), gap=gap)
    assert h.run_to_completion(fed_until=1 + n * gap)
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is None
    assert h.settle(lambda: pipe.sender.pending == 0)


def test_offsets_are_monotonic_and_storage_outlives_workers() -> None:
    store = MemoryStreamStore()
    assert [store.append(x) for x in "abc"] == [0, 1, 2]
    assert store.read(1, 10) == [(1, "b"), (2, "c")]
    assert store.read(3, 10) == []
    clock = Clock()
    h = Harness(Simulation(clock), _stream(clock, store=store, index=None))
    h.pipe.engine.crash()
    h.pipe.engine.restart()
    h.feed(["d"])
    h.settle(lambda: "d" in h.received)
    assert store.read(0, 10) == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]


def test_store_rejects_bad_reads() -> None:
    store = MemoryStreamStore()
    for start, limit in ((-1, 1), (0, 0)):
        try:
            store.read(start, limit)
        except StorageError:
            continue
        raise AssertionError(f"read({start}, {limit}) was accepted")


def test_index_storage_lets_a_restarted_receiver_resume_where_it_left_off() -> None:
    clock = Clock()
    index_store = MemoryIndexStore()
    h = Harness(Simulation(clock), _stream(clock, index_store=index_store))
    h.feed(list(range(20)), gap=0)
    assert h.settle(h.all_delivered)
    h.run(10)
    assert index_store.load() == 20
    h.pipe.receiver.crash()
    h.pipe.receiver.restart()
    h.feed(["new"], start=h.sim.now + 1)
    assert h.settle(lambda: "new" in h.received)
    assert h.received == [*range(20), "new"]  # no re-reads


def test_without_index_storage_a_restarted_receiver_rereads_from_zero() -> None:
    """Still at-least-once, but every earlier message is delivered again."""
    clock = Clock()
    h = Harness(Simulation(clock), _stream(clock, index=None))
    h.feed(list(range(5)), gap=0)
    assert h.settle(h.all_delivered)
    h.pipe.receiver.crash()
    h.pipe.receiver.restart()
    h.run(40)
    assert h.received == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]


def test_tolerates_lost_commits_at_the_price_of_duplicates() -> None:
    clock = Clock()
    index_store = MemoryIndexStore()
    pipe = _stream(clock, index=FaultSchedule(partitions=((1, 1000),)), index_store=index_store)
    h = Harness(Simulation(clock), pipe)
    h.sim.at(2, pipe.index_storage.crash)  # the index worker is down from the start, too
    h.sim.at(50, pipe.index_storage.restart)
    h.feed(list(range(5)), gap=0)
    h.run(1500)
    # The receiver cannot load its index until the index route heals, then delivers everything.
    assert h.received == [0, 1, 2, 3, 4]
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) is None


def test_lost_append_confirms_duplicate_messages_in_the_stream() -> None:
    clock = Clock()
    pipe = StreamPipe(
        store=MemoryStreamStore(),
        writer_route=memory_route(
            clock, LOSSLESS, FaultSchedule(drop_nth=frozenset({1})), name="writer"
        ),
        reader_route=memory_route(clock, name="reader"),
    )
    h = Harness(Simulation(clock), pipe)
    h.feed(["a"])
    assert h.settle(lambda: pipe.sender.pending == 0)
    h.run(20)
    assert h.received == ["a", "a"]  # the lost Appended confirm made the sender append twice
    assert pipe.store.end() == 2


def test_does_not_tolerate_sender_crash() -> None:
    """Non-tolerance: appends not yet confirmed by the stream are lost with the sender."""
    clock = Clock()
    pipe = _stream(clock, writer=FaultSchedule(partitions=((1, 30),)))
    h = Harness(Simulation(clock), pipe)
    h.feed(list(range(5)), gap=0)
    h.sim.at(10, pipe.sender.crash)
    h.sim.at(11, pipe.sender.restart)
    h.run(300)
    assert h.sent == [0, 1, 2, 3, 4]
    assert h.received == []
    assert pipe.store.end() == 0


def test_does_not_tolerate_data_loss_in_the_storage() -> None:
    """Non-tolerance: confirmed messages the storage forgets are never delivered."""
    clock = Clock()
    store = MemoryStreamStore()
    pipe = _stream(clock, store=store, reader=FaultSchedule(partitions=((1, 40),)))
    h = Harness(Simulation(clock), pipe)
    h.feed(list(range(5)), gap=0)
    h.run(20)
    assert pipe.sender.pending == 0 and store.end() == 5  # all five stored and confirmed
    assert store.lose_from(2) == 3  # the disk loses offsets 2..4
    h.run(300)
    assert h.received == [0, 1]
    assert check(Property.AT_LEAST_ONCE, h.sent, h.received) == "lost 3 payload(s), first 2"
