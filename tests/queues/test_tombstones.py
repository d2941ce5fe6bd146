"""What delta-rs 1.6 vacuum does with a compacted file whose tombstone is gone from the checkpoint,
and why a queue keeps its tombstones exactly as long as the vacuum retention
(``maintenance.QUEUE_TOMBSTONE_RETENTION``).

Real queues, real files, assertions on the directory listing. Ages are real file ages: a file
"written two days ago" has its modification time set two days back (vacuum reads it from the
file system); a tombstone "older than the tombstone retention" is one the queue's
``delta.deletedFileRetentionDuration`` of 0 hours lets the next checkpoint drop, as a checkpoint
written more than the retention after the compaction does.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from cues_platform.queues import Lake
from cues_platform.queues.layout import (
    DEFAULT_VACUUM_RETENTION_HOURS,
    QUEUE_TOMBSTONE_PROPERTY,
    QUEUE_TOMBSTONE_RETENTION,
)
from cues_platform.queues.maintenance import (
    checkpoint,
    compact,
    vacuum,
)
from tests.support import PAYLOAD, rows

EXPIRED_AT_CHECKPOINT = {"delta.deletedFileRetentionDuration": "interval 0 hours"}
TWO_DAYS_S = 48 * 3600


def _data_files(q) -> set[str]:
    root = Path(q.uri.removeprefix("file://"))
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def _active(q) -> set[str]:
    root = Path(q.uri.removeprefix("file://"))
    return {str(Path(u.removeprefix("file://")).relative_to(root))
            for u in DeltaTable(q.uri).file_uris()}


def _age_every_data_file(q, seconds: float) -> None:
    root = Path(q.uri.removeprefix("file://"))
    past = time.time() - seconds
    for name in _data_files(q):
        os.utime(root / name, (past, past))


def _fresh(q):
    """The queue as a new process opens it (``cues queue maintain``): its snapshot loaded from
    the newest checkpoint. A long-lived handle that replayed the compaction's log entry keeps
    those tombstones in memory, which only protects more."""
    return q.lake.queue(q.name)


def _checkpoint_tombstones(q) -> set[str]:
    log = Path(q.uri.removeprefix("file://")) / "_delta_log"
    newest = max(log.glob("*.checkpoint.parquet"))
    return {r["path"] for r in pq.read_table(newest, columns=["remove"]).column("remove").to_pylist()
            if r}


def _three_small_files_then_compact(q) -> tuple[int, set[str]]:
    """Three appends (three files), the reader's version, then one compaction of them."""
    for i in range(3):
        q.append(rows(i * 4, 4), partition="0")
    old = _data_files(q)
    assert len(old) == 3
    reader_version = q.version()
    assert compact(q).files_removed == 3
    return reader_version, old


def test_a_file_whose_tombstone_the_checkpoint_dropped_is_vacuumed_once_older_than_retention(
    make_queue,
) -> None:
    q = make_queue(properties=EXPIRED_AT_CHECKPOINT)
    _, old = _three_small_files_then_compact(q)
    checkpoint(q)
    # the tombstones are gone: not in the checkpoint, and the log replay from it sees none
    assert _checkpoint_tombstones(q) == set()
    assert DeltaTable(q.uri).vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False,
                              full=False) == []
    assert old.isdisjoint(_active(q))
    # younger than the vacuum retention: kept (it could be an append about to commit)
    assert vacuum(_fresh(q), retention_hours=DEFAULT_VACUUM_RETENTION_HOURS).files_vacuumed == 0
    assert old <= _data_files(q)
    # older than it: deleted by the platform's full vacuum, not leaked
    _age_every_data_file(q, TWO_DAYS_S)
    assert vacuum(_fresh(q), retention_hours=DEFAULT_VACUUM_RETENTION_HOURS).files_vacuumed == 3
    assert _data_files(q) == _active(q)
    assert q.read_arrow(partition="0").column("id").to_pylist() == list(range(12))


def test_a_lite_vacuum_would_leak_it(make_queue) -> None:
    """Why the platform vacuums in full mode: lite deletes only files its tombstones name."""
    q = make_queue(properties=EXPIRED_AT_CHECKPOINT)
    _, old = _three_small_files_then_compact(q)
    checkpoint(q)
    _age_every_data_file(q, TWO_DAYS_S)
    assert DeltaTable(q.uri).vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False,
                              full=False) == []
    assert old <= _data_files(q)


def test_a_tombstone_retention_shorter_than_vacuums_deletes_files_a_reader_still_needs(
    make_queue,
) -> None:
    """Files written two days ago, compacted away now: the tombstones expire at the checkpoint,
    and a 24 h vacuum then judges the files by their age alone and deletes them under a reader
    whose snapshot is seconds old."""
    q = make_queue(properties=EXPIRED_AT_CHECKPOINT)
    for i in range(3):
        q.append(rows(i * 4, 4), partition="0")
    _age_every_data_file(q, TWO_DAYS_S)
    reader = DeltaTable(q.uri, version=q.version())
    old = _data_files(q)
    compact(q)
    checkpoint(q)
    assert vacuum(_fresh(q), retention_hours=DEFAULT_VACUUM_RETENTION_HOURS).files_vacuumed == 3
    assert old.isdisjoint(_data_files(q))
    with pytest.raises(OSError):
        reader.to_pyarrow_table()


def test_at_the_queue_tombstone_retention_a_reader_within_the_vacuum_retention_keeps_its_files(
    make_queue,
) -> None:
    assert f"interval {DEFAULT_VACUUM_RETENTION_HOURS} hours" == QUEUE_TOMBSTONE_RETENTION
    q = make_queue(properties=QUEUE_TOMBSTONE_PROPERTY)
    for i in range(3):
        q.append(rows(i * 4, 4), partition="0")
    _age_every_data_file(q, TWO_DAYS_S)
    reader = DeltaTable(q.uri, version=q.version())
    old = _data_files(q)
    compact(q)
    checkpoint(q)
    # delta-rs' checkpoint kept them (younger than the tombstone retention); the one checkpoint()
    # writes a version later has none: the files' modification times now stand for them
    assert _checkpoint_tombstones(q) == set()
    assert vacuum(_fresh(q), retention_hours=DEFAULT_VACUUM_RETENTION_HOURS).files_vacuumed == 0
    assert old <= _data_files(q)
    assert sorted(reader.to_pyarrow_table().column("id").to_pylist()) == list(range(12))
    # a shorter vacuum retention (the fault harness uses 1 h) is as safe: it keeps them too
    assert vacuum(_fresh(q), retention_hours=1).files_vacuumed == 0
    assert old <= _data_files(q)


TOMBSTONE_RETENTION_HOURS = {"interval 0 hours": 0, "interval 1 hours": 1,
                             QUEUE_TOMBSTONE_RETENTION: DEFAULT_VACUUM_RETENTION_HOURS,
                             "interval 7 days": 168}


@settings(max_examples=25, deadline=None)
@given(tombstone_retention=st.sampled_from(sorted(TOMBSTONE_RETENTION_HOURS)),
       vacuum_hours=st.sampled_from([1, DEFAULT_VACUUM_RETENTION_HOURS]),
       file_age_hours=st.sampled_from([0, 0.5, 2, 30, 200]))
def test_full_vacuum_after_a_compaction_deletes_exactly_what_the_model_says(
    tombstone_retention: str, vacuum_hours: int, file_age_hours: float,
) -> None:
    """delta-rs 1.6 full vacuum, for files compacted away seconds ago: a file whose tombstone the
    checkpoint kept stays (its tombstone is younger than any vacuum retention); one whose tombstone
    it dropped goes exactly when its modification time is older than the vacuum retention. Hence
    a reader of the snapshot before the compaction keeps every file whenever the tombstone
    retention is at least the vacuum's, and nothing older than the retention is left over."""
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(root=str(Path(tmp) / "lake"))
        q = lake.create_queue("events", schema=PAYLOAD,
                              properties={"delta.deletedFileRetentionDuration": tombstone_retention})
        for i in range(3):
            q.append(rows(i * 4, 4), partition="0")
        _age_every_data_file(q, file_age_hours * 3600)
        reader = DeltaTable(q.uri, version=q.version())
        old = _data_files(q)
        compact(q)
        checkpoint(q)
        vacuum(_fresh(q), retention_hours=vacuum_hours)
        tombstones_kept = TOMBSTONE_RETENTION_HOURS[tombstone_retention] > 0
        deleted = not tombstones_kept and file_age_hours > vacuum_hours
        assert _data_files(q) == _active(q) | (set() if deleted else old)
        assert _active(q).isdisjoint(old)
        if TOMBSTONE_RETENTION_HOURS[tombstone_retention] >= vacuum_hours:
            assert sorted(reader.to_pyarrow_table().column("id").to_pylist()) == list(range(12))
        assert q.read_arrow(partition="0").column("id").to_pylist() == list(range(12))


def test_a_new_queue_keeps_tombstones_for_the_vacuum_retention(make_queue):
    from deltalake import DeltaTable

    from cues_platform.queues.layout import QUEUE_TOMBSTONE_RETENTION

    config = DeltaTable(make_queue().uri).metadata().configuration
    assert config["delta.deletedFileRetentionDuration"] == QUEUE_TOMBSTONE_RETENTION == "interval 24 hours"
