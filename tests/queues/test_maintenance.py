"""Compaction, vacuum and checkpoints never change what a reader or tailer sees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cues_platform.errors import ConfigurationError
from cues_platform.queues import Lake, TransactionalProducer
from cues_platform.queues.errors import ConcurrentAppendError, UnsafeRetentionError
from cues_platform.queues.maintenance import (
    MIN_SAFE_RETENTION_HOURS,
    checkpoint,
    compact,
    maintain,
    vacuum,
)
from cues_platform.queues.positions import CHECKPOINT_INTERVAL, PositionStore
from tests.support import PAYLOAD, ROOT, rows


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
    vacuum(q, retention_hours=0, unsafe_allow_short_retention=True)
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
    maintain(q, retention_hours=0, unsafe_allow_short_retention=True)
    after = q.read_arrow(partition="0", start=min(cut, start)).drop_columns(["_append_time"])
    assert after.equals(before)
    assert q.next_offset("0") == start
    assert len(q.files()) == 1  # one partition compacts into one file
    assert len(list(Path(q.uri).glob("_partition=*/*.parquet"))) == 1  # vacuum removed the rest


_APPENDER = """
import sys
from cues_platform.queues import Lake
from tests.support import rows
q = Lake(root=sys.argv[1]).queue("race")
part, count = sys.argv[2], int(sys.argv[3])
for i in range(count):
    q.append(rows(i * 3, 3), partition=part)
"""


def test_vacuum_racing_appends_with_a_fractional_retention_keeps_every_committed_row(lake) -> None:
    """0.9 h used to become int(0.9) == 0 h: a full vacuum then deleted the Parquet files of
    appends that had written them but not yet committed, and those commits pointed at nothing."""
    q = lake.create_queue("race", schema=PAYLOAD, partitions=("a", "b"))
    per_writer = 40
    writers = [
        subprocess.Popen([sys.executable, "-c", _APPENDER, lake.root, part, str(per_writer)], cwd=ROOT)
        for part in ("a", "b")
    ]
    rounds = 0
    while any(w.poll() is None for w in writers) or rounds == 0:
        try:
            maintain(q, retention_hours=0.9, unsafe_allow_short_retention=True)
        except ConcurrentAppendError:  # compaction lost its commit races: retryable, nothing changed
            continue
        rounds += 1
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    for part in ("a", "b"):
        table = q.read_arrow(partition=part)
        assert table["_offset"].to_pylist() == list(range(per_writer * 3))
        assert table["id"].to_pylist() == list(range(per_writer * 3))
    # every file the log references is still on disk
    assert all((Path(q.uri) / f.path).exists() for f in q.files())


def test_short_retention_is_refused_unless_asked_for_explicitly(make_queue) -> None:
    q = make_queue()
    q.append(rows(0, 2), partition="0")
    q.append(rows(2, 2), partition="0")
    compact(q)
    files = sorted(Path(q.uri).rglob("*.parquet"))
    for call in (lambda: vacuum(q, retention_hours=0.5), lambda: maintain(q, retention_hours=0)):
        with pytest.raises(UnsafeRetentionError) as info:
            call()
        err = info.value
        assert err.queue == "events" and err.minimum_hours == MIN_SAFE_RETENTION_HOURS
        assert err.keyword == "unsafe_allow_short_retention" and not err.retryable
        assert "unsafe_allow_short_retention=True" in str(err) and "'events'" in str(err)
    assert sorted(Path(q.uri).rglob("*.parquet")) == files  # nothing deleted
    with pytest.raises(ConfigurationError, match="retention_hours must be a number >= 0"):
        vacuum(q, retention_hours=-1, unsafe_allow_short_retention=True)
    # a safe retention keeps the compacted-away files (they are younger than an hour)
    assert vacuum(q, retention_hours=MIN_SAFE_RETENTION_HOURS).files_vacuumed == 0
    assert vacuum(q, retention_hours=1.5).files_vacuumed == 0
    assert vacuum(q, retention_hours=0, unsafe_allow_short_retention=True).files_vacuumed == 2
    assert q.read_arrow(partition="0")["id"].to_pylist() == [0, 1, 2, 3]


def test_commits_leave_expired_log_entries_to_maintenance(make_queue) -> None:
    """delta-rs' per-commit log cleanup lists the whole log (O(log files) per commit); queue
    commits skip it and ``checkpoint`` (``cues queue maintain``) drops the expired entries."""
    q = make_queue(properties={"delta.logRetentionDuration": "interval 0 hours",
                               "delta.checkpointInterval": "5"})
    assert q.refresh().metadata().configuration["delta.enableExpiredLogCleanup"] == "false"
    for i in range(12):
        q.append(rows(i * 2, 2), partition="0")
    log = q.lake.local_path(q.uri) / "_delta_log"
    assert len(list(log.glob("*.json"))) == 13  # versions 0..12, checkpoints at 5 and 10
    before = _snapshot_reads(q, q.partitions)
    report = checkpoint(q)
    assert report.checkpoint_version == 12
    # delta-rs wrote checkpoints at 4 and 9, checkpoint() one at 12: every version from the
    # second-newest checkpoint (9) on stays, so a reader that chose 9 still finds its entries
    assert sorted(p.name for p in log.glob("*.json")) == [f"{v:020d}.json" for v in (9, 10, 11, 12)]
    assert report.log_entries_removed == 10  # versions 0..8's commits and 4's checkpoint
    assert _snapshot_reads(q, q.partitions) == before


def test_a_handle_the_log_was_trimmed_past_opens_again_and_sees_every_commit(make_queue, lake) -> None:
    """A handle at version v decides it is the newest when entry v+1 is missing; after a cleanup
    removed v+1 (and v) that would keep it stale forever. It opens the table again instead."""
    q = make_queue(properties={"delta.logRetentionDuration": "interval 0 hours",
                               "delta.checkpointInterval": "5"})
    stale = lake.queue("events")
    assert stale.refresh().version() == 0
    for i in range(12):
        q.append(rows(i * 2, 2), partition="0")
    checkpoint(q)  # drops entries 0..8 (below the second-newest checkpoint, 9)
    assert stale.refresh().version() == 12
    assert _snapshot_reads(stale, ["0"]) == _snapshot_reads(q, ["0"])
    assert stale.next_offset("0") == 24


def test_a_position_handle_sees_positions_committed_past_another_handles_cleanup(lake) -> None:
    """System tables drop entries older than their second-newest checkpoint (positions.py): a
    handle idle across that opens the table again instead of reading an old position forever."""
    writer, idle = PositionStore(lake), PositionStore(lake)
    assert idle.get(queue="q", tailer="t", partition="0") is None
    for pos in range(1, 2 * CHECKPOINT_INTERVAL + 5):
        writer.commit(queue="q", tailer="t", partition="0", position=pos)
    log = lake.local_path(writer.table.uri) / "_delta_log"
    assert not (log / f"{1:020d}.json").exists()  # trimmed past the idle handle
    assert idle.get(queue="q", tailer="t", partition="0") == 2 * CHECKPOINT_INTERVAL + 4


def test_trim_log_keeps_every_version_from_the_second_newest_checkpoint_at_or_below_upto(lake) -> None:
    from deltalake import DeltaTable

    from cues_platform.queues.integrity import TableStorage
    from cues_platform.queues.maintenance import trim_log

    q = lake.create_queue("q", schema=PAYLOAD)
    q.refresh().alter.set_table_properties({"delta.checkpointInterval": "3"})
    for i in range(10):
        q.append(rows(i, 1), partition="0")
    storage = TableStorage(q.uri, lake.options)
    checkpoints = sorted(int(n[:20]) for n in storage.log_entries() if ".checkpoint." in n)
    top = q.version()
    assert len(checkpoints) >= 3
    assert trim_log(storage, upto=checkpoints[0]) == 0  # one checkpoint at or below: nothing goes
    removed = trim_log(storage, upto=checkpoints[2])
    cut = checkpoints[1]
    left = sorted(int(n[:20]) for n in storage.log_entries() if n.endswith(".json") and n[:20].isdigit())
    assert removed > 0 and left[0] == cut and left[-1] == top
    for version in range(cut, top + 1):  # every kept version still loads, from any fresh reader
        assert DeltaTable(q.uri, version=version).version() == version
    assert Lake(root=lake.root).queue("q").read_arrow(partition="0")["id"].to_pylist() == list(range(10))
    q.append(rows(10, 1), partition="0")  # and the queue takes appends
    assert q.next_offset("0") == 11


def test_trim_log_stopped_halfway_leaves_a_log_that_loads_and_a_second_trim_finishes(lake) -> None:
    """A crash (or a second process trimming at the same time) in the middle of trim_log: the
    oldest entries are gone first, so the newest checkpoint and every later entry remain."""
    from deltalake import DeltaTable

    from cues_platform.queues.integrity import LOG_DIR, TableStorage
    from cues_platform.queues.maintenance import trim_log

    q = lake.create_queue("q", schema=PAYLOAD)
    q.refresh().alter.set_table_properties({"delta.checkpointInterval": "3"})
    for i in range(10):
        q.append(rows(i, 1), partition="0")
    storage = TableStorage(q.uri, lake.options)
    checkpoints = sorted(int(n[:20]) for n in storage.log_entries() if ".checkpoint." in n)
    doomed = [n for n in storage.log_entries() if n[:20].isdigit() and int(n[:20]) < checkpoints[-2]]
    storage.delete(f"{LOG_DIR}/{n}" for n in doomed[: len(doomed) // 2])  # the crash: half done
    assert DeltaTable(q.uri).version() == q.version()
    assert Lake(root=lake.root).queue("q").read_arrow(partition="0")["id"].to_pylist() == list(range(10))
    assert trim_log(storage) == len(doomed) - len(doomed) // 2  # idempotent: the rest goes now
    assert trim_log(storage) == 0
