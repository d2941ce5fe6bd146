"""Tailers: durable named positions, batches, blocking reads, seek and backward reads."""

from __future__ import annotations

import threading

import pytest

from cues_platform.queues import Lake, OffsetRangeError, ReadTimeoutError
from cues_platform.queues.errors import PositionRangeError
from tests.support import rows


def test_read_batches_and_commit_survives_a_new_instance(make_queue, lake) -> None:
    q = make_queue()
    q.append(rows(0, 25), partition="0")
    tailer = q.tailer("billing", partition="0")
    assert tailer.read_arrow(10)["_offset"].to_pylist() == list(range(10))
    assert tailer.read_arrow(10)["_offset"].to_pylist() == list(range(10, 20))
    tailer.commit()
    again = lake.queue("events").tailer("billing", partition="0")
    assert again.position == 20
    assert again.read_arrow(10)["_offset"].to_pylist() == list(range(20, 25))
    assert again.read_arrow(10).num_rows == 0
    assert again.lag() == 0
    # another name has its own position
    assert q.tailer("audit", partition="0").position == 0


def test_spark_batch_advances_the_position(make_queue, spark) -> None:
    q = make_queue()
    q.append(rows(0, 30), partition="0")
    tailer = q.tailer("s", partition="0")
    assert sorted(r["_offset"] for r in tailer.read_spark(spark, 12).collect()) == list(range(12))
    assert tailer.position == 12


def test_seek_and_backward_and_last_offset(make_queue) -> None:
    q = make_queue()
    q.append(rows(0, 10), partition="0")
    tailer = q.tailer("t", partition="0")
    assert tailer.seek("end") == 10 and tailer.last_offset() == 9
    assert tailer.read_backward(3)["_offset"].to_pylist() == [9, 8, 7]
    assert tailer.seek(4) == 4
    assert tailer.read_arrow(2)["_offset"].to_pylist() == [4, 5]
    assert tailer.seek("start") == 0
    with pytest.raises(OffsetRangeError):
        tailer.seek(11)
    # seeking back and committing is durable too
    tailer.commit(3)
    assert q.tailer("t", partition="0").position == 3


def test_blocking_read_wakes_on_new_data(make_queue) -> None:
    q = make_queue()
    tailer = q.tailer("b", partition="0")
    appended = threading.Event()

    def produce() -> None:
        q.append(rows(0, 2), partition="0")
        appended.set()

    thread = threading.Thread(target=produce)
    thread.start()
    table = tailer.read_blocking(10, timeout=60)
    thread.join()
    assert table["_offset"].to_pylist() == [0, 1]


def test_blocking_read_times_out_and_can_be_unblocked(make_queue) -> None:
    q = make_queue()
    tailer = q.tailer("b", partition="0")
    with pytest.raises(ReadTimeoutError):
        tailer.read_blocking(10, timeout=0.05)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(tailer.read_blocking(10).num_rows))
    thread.start()
    tailer.unblock()
    thread.join(timeout=60)
    assert result == [0]


@pytest.mark.parametrize("bad", [-7, 10**12, 11, True, "3"])
def test_commit_outside_the_partition_raises_and_keeps_the_committed_position(make_queue, lake, bad) -> None:
    q = make_queue()
    q.append(rows(0, 10), partition="0")
    tailer = q.tailer("billing", partition="0")
    tailer.commit(4)
    with pytest.raises(PositionRangeError) as info:
        tailer.commit(bad)
    err = info.value
    assert (err.queue, err.tailer, err.partition, err.position, err.valid) == ("events", "billing", "0", bad, (0, 10))
    assert isinstance(err, OffsetRangeError) and not err.retryable
    assert "'billing'" in str(err) and "events/0" in str(err) and "[0, 10]" in str(err)
    assert lake.queue("events").tailer("billing", partition="0").position == 4
    assert tailer.commit(10) == 10 and tailer.commit(0) == 0  # both ends are valid


def test_position_commits_keep_a_bounded_log_and_a_fresh_handle(make_queue, lake) -> None:
    """A position commit used to slow down with every commit (the handle was never reopened and
    delta-rs lists the whole log per commit): the handle is reopened from a checkpoint every
    checkpoint interval (10 commits) and the log keeps at most two checkpoints' worth of entries."""
    from pathlib import Path

    from cues_platform.queues.positions import CHECKPOINT_INTERVAL, PositionStore

    q = make_queue()
    q.append(rows(0, 10), partition="0")
    tailer = q.tailer("t", partition="0")
    log = Path(lake.system_uri("positions")) / "_delta_log"
    opened = []
    for i in range(3 * CHECKPOINT_INTERVAL + 20):
        tailer.commit(i % 11)
        table = tailer._store.table
        assert table.reopen_every == CHECKPOINT_INTERVAL == 10
        assert table.snapshot().version() - table.opened_at < CHECKPOINT_INTERVAL
        opened.append(table.opened_at)
        assert len(list(log.glob("*.json"))) <= 3 * CHECKPOINT_INTERVAL + 1
    assert len(set(opened)) >= 3  # reopened as it went
    assert len(list(log.glob("*.checkpoint.parquet"))) >= 2
    # nothing a reader needs was cleaned away
    assert PositionStore(lake).get(queue="events", tailer="t", partition="0") == (3 * CHECKPOINT_INTERVAL + 19) % 11
    assert q.tailer("t", partition="0").position == (3 * CHECKPOINT_INTERVAL + 19) % 11


def test_a_positions_table_created_before_keeps_reopening_at_its_own_interval(lake, monkeypatch) -> None:
    """Positions tables are created with a checkpoint interval of 10 since 2026-11-29; a handle
    on one created before (100) reopens after its own interval, where its checkpoints are."""
    from cues_platform.queues import positions

    monkeypatch.setattr(positions, "CHECKPOINT_INTERVAL", 100)  # as created before
    assert positions.PositionStore(lake).table.reopen_every == 100
    monkeypatch.undo()
    assert positions.CHECKPOINT_INTERVAL == 10
    assert positions.PositionStore(lake).table.reopen_every == 100  # the table's property wins
    fresh = Lake(root=lake.root + "-new")
    assert positions.PositionStore(fresh).table.reopen_every == 10
