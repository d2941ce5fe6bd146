"""Compaction, vacuum and checkpoints never change what a reader or tailer sees."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cues_platform.queues import Lake, TransactionalProducer
from cues_platform.queues.maintenance import checkpoint, compact, maintain, vacuum
from tests.support import PAYLOAD, rows


def _snapshot_reads(q, partitions, isolation="read_committed"):
    return {
        p: q.read_arrow(partition=p, isolation=isolation).drop_columns(["_append_time"]).to_pylist()
        for p in partitions
    }


def test_compaction_and_vacuum_keep_every_tailer_reading_the_same(make_queue, lake) -> None:
    q = make_queue(partitions=("a", "b"))
    for i in range(12):
        q.append(rows(i * 3, 3), partition="a" if i % 3 else "b")
    producer = TransactionalProducer(lake, transactional_id="m")
    producer.init_transactions()
    producer.begin()
    producer.send(q, rows(500, 2), partition="a")  # open: read_committed must still stop here
    tailer = q.tailer("t", partition="a")
    first = tailer.read_arrow(5)
    tailer.commit()
    before = _snapshot_reads(q, ("a", "b"))
    before_all = _snapshot_reads(q, ("a", "b"), "read_uncommitted")
    files_before = len(q.files())

    report = compact(q)
    assert report.files_removed > report.files_added >= 1
    vacuum(q, retention_hours=0)
    checkpoint(q)

    assert len(q.files()) < files_before
    assert _snapshot_reads(q, ("a", "b")) == before
    assert _snapshot_reads(q, ("a", "b"), "read_uncommitted") == before_all
    resumed = lake.queue("events").tailer("t", partition="a")
    assert resumed.position == first.num_rows
    rest = resumed.read_arrow(1000)
    assert rest["_offset"].to_pylist() == list(range(5, 24))  # stops before the open transaction
    producer.commit()
    assert resumed.read_arrow(1000)["id"].to_pylist() == [500, 501]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=12), cut=st.integers(0, 60))
def test_property_maintenance_is_invisible(tmp_path_factory, sizes, cut) -> None:
    lake = Lake(root=str(tmp_path_factory.mktemp("lake")))
    q = lake.create_queue("p", schema=PAYLOAD)
    start = 0
    for size in sizes:
        q.append(rows(start, size), partition="0")
        start += size
    before = q.read_arrow(partition="0", start=min(cut, start)).drop_columns(["_append_time"])
    maintain(q, retention_hours=0)
    after = q.read_arrow(partition="0", start=min(cut, start)).drop_columns(["_append_time"])
    assert after.equals(before)
    assert q.next_offset("0") == start
    assert len(q.files()) == 1  # one partition compacts into one file
    assert len(list(Path(q.uri).glob("_partition=*/*.parquet"))) == 1  # vacuum removed the rest
