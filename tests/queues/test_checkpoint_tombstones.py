"""``maintenance.checkpoint`` on a local lake writes a second checkpoint, one version later (an
empty commit of its own), without the tombstones the files' modification times stand for
(``maintenance.checkpoint_without_tombstones``): every open of the queue stops reading one
tombstone per compacted file, and full vacuum still keeps a compacted-away file until its removal
is older than the retention (it judges a file no tombstone names by its modification time, which
the checkpoint moved to at or after the removal).

Real queues, real files, assertions on the log and the directory listing. A file "written two
days ago" has its modification time set two days back (vacuum reads it from the file system).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
from deltalake import DeltaTable

from cues_platform import clock
from cues_platform.dagster.maintenance import describe_maintenance
from cues_platform.queues import maintenance
from cues_platform.queues.layout import DEFAULT_VACUUM_RETENTION_HOURS
from cues_platform.queues.maintenance import (
    STAGED_CHECKPOINT_GLOB,
    checkpoint,
    checkpoint_without_tombstones,
    compact,
    maintain,
    sweep_staged_checkpoints,
    tombstone_is_redundant,
    vacuum,
)
from tests.support import rows

TWO_DAYS_S = 48 * 3600


def _root(q) -> Path:
    return Path(q.uri.removeprefix("file://"))


def _data_files(q) -> set[str]:
    root = _root(q)
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def _active(q) -> set[str]:
    return {str(Path(u.removeprefix("file://")).relative_to(_root(q))) for u in DeltaTable(q.uri).file_uris()}


def _age(q, names: set[str], seconds: float) -> None:
    past = time.time() - seconds
    for name in names:
        os.utime(_root(q) / name, (past, past))


def _checkpoints(q) -> list[int]:
    return sorted(int(p.name[:20]) for p in (_root(q) / "_delta_log").glob("*.checkpoint.parquet"))


def _tombstones(q, version: int) -> dict[str, int]:
    """``{path: deletionTimestamp}`` of the remove actions in the checkpoint of ``version``."""
    file = _root(q) / "_delta_log" / f"{version:020d}.checkpoint.parquet"
    return {r["path"]: r["deletionTimestamp"]
            for r in pq.read_table(file, columns=["remove"]).column("remove").to_pylist() if r}


def _old_files_compacted(q, *, files: int = 3, age_s: float = TWO_DAYS_S) -> tuple[DeltaTable, set[str]]:
    """``files`` appends written ``age_s`` ago, a reader's snapshot, then one compaction."""
    for i in range(files):
        q.append(rows(i * 4, 4), partition="0")
    old = _data_files(q)
    _age(q, old, age_s)
    reader = DeltaTable(q.uri, version=q.version())
    assert compact(q).files_removed == files
    return reader, old


def test_the_newest_checkpoint_holds_no_tombstone_and_the_queue_reads_the_same(make_queue, lake) -> None:
    q = make_queue()  # the queue tombstone retention: 24 h
    _, old = _old_files_compacted(q)
    top = q.version()
    before = (q.read_arrow(partition="0").to_pylist(), q.next_offset("0"),
              DeltaTable(q.uri).transaction_version("part:0"))

    report = checkpoint(q)

    # delta-rs' checkpoint of the compaction keeps the tombstones (younger than 24 h) ...
    assert set(_tombstones(q, top)) == old
    # ... the one a version later, after an empty commit of the checkpoint's own, has none
    assert report.checkpoint_version == top + 1 == q.version() == _checkpoints(q)[-1]
    assert _tombstones(q, top + 1) == {}
    entry = [json.loads(line) for line in
             (_root(q) / "_delta_log" / f"{top + 1:020d}.json").read_text().splitlines()]
    assert [next(iter(a)) for a in entry] == ["commitInfo"]  # no add, remove or txn
    assert entry[0]["commitInfo"]["cues.maintenance"] == "checkpoint"
    assert json.loads((_root(q) / "_delta_log" / "_last_checkpoint").read_text())["version"] == top + 1
    # a new process loads from it and sees the same queue; the older versions still load
    fresh = lake.queue("events")
    assert (fresh.read_arrow(partition="0").to_pylist(), fresh.next_offset("0"),
            DeltaTable(q.uri).transaction_version("part:0")) == before
    assert DeltaTable(q.uri, version=top).version() == top
    fresh.append(rows(12, 2), partition="0")
    assert lake.queue("events").read_arrow(partition="0")["id"].to_pylist() == list(range(14))


def test_a_reader_of_the_snapshot_before_the_compaction_keeps_its_files_for_the_retention(make_queue) -> None:
    """Files written two days ago, compacted away now: without the tombstone a full vacuum judges
    them by their modification time, which the checkpoint moved to at or after the removal, so
    the reader whose snapshot is seconds old keeps them, at 24 h and at 1 h."""
    q = make_queue()
    reader, old = _old_files_compacted(q)
    removed_at = _tombstones(q, checkpoint(q).checkpoint_version - 1)
    assert _tombstones(q, _checkpoints(q)[-1]) == {}
    for name in old:
        assert (_root(q) / name).stat().st_mtime_ns >= removed_at[name] * 1_000_000
    assert vacuum(q.lake.queue("events"), retention_hours=DEFAULT_VACUUM_RETENTION_HOURS).files_vacuumed == 0
    assert vacuum(q.lake.queue("events"), retention_hours=1).files_vacuumed == 0
    assert old <= _data_files(q)
    assert sorted(reader.to_pyarrow_table().column("id").to_pylist()) == list(range(12))


def test_the_files_go_once_their_removal_is_older_than_the_retention_and_nothing_leaks(make_queue) -> None:
    q = make_queue()
    _, old = _old_files_compacted(q)
    maintain(q)  # compaction done above: checkpoint, vacuum
    assert old <= _data_files(q)
    _age(q, old, DEFAULT_VACUUM_RETENTION_HOURS * 3600 + 60)  # as if a day had passed
    assert vacuum(q.lake.queue("events")).files_vacuumed == len(old)
    assert _data_files(q) == _active(q)
    assert q.lake.queue("events").read_arrow(partition="0")["id"].to_pylist() == list(range(12))


def test_nothing_to_drop_makes_no_commit(make_queue) -> None:
    q = make_queue()
    for i in range(3):
        q.append(rows(i, 1), partition="0")
    top = q.version()
    assert checkpoint(q).checkpoint_version == top == q.version()
    assert _checkpoints(q) == [top]


def test_a_commit_after_the_checkpoint_drops_nothing(make_queue) -> None:
    """The filtered checkpoint is the state of the version it copies plus an empty commit: with
    another commit in between it would be wrong, so nothing is written."""
    q = make_queue()
    _old_files_compacted(q, age_s=0)
    DeltaTable(q.uri).create_checkpoint()
    version = q.version()
    q.append(rows(12, 1), partition="0")
    assert checkpoint_without_tombstones(q, version=version) is None
    assert q.version() == version + 1 and _checkpoints(q)[-1] == version
    assert q.lake.queue("events").read_arrow(partition="0")["id"].to_pylist() == list(range(13))


def test_the_empty_commit_on_the_checkpoint_interval_gets_the_checkpoint_without_tombstones(
        make_queue) -> None:
    """The empty commit is made without delta-rs' checkpoint hook: when its version lands on the
    checkpoint interval (one maintain in 10 at queues' interval of 10), its checkpoint is still
    the one without the redundant tombstones."""
    q = make_queue(properties={"delta.checkpointInterval": "1000"})
    _old_files_compacted(q, age_s=0)  # versions 1-3 the appends, 4 the compaction
    # version 5; delta-rs' hook checkpoints a commit whose version + 1 is a multiple: 6
    q.refresh().alter.set_table_properties({"delta.checkpointInterval": "7"})
    DeltaTable(q.uri).create_checkpoint()
    assert q.version() == 5
    assert checkpoint_without_tombstones(q, version=5) == 6
    assert q.version() == 6 and _checkpoints(q)[-1] == 6 and _tombstones(q, 6) == {}
    assert q.lake.queue("events").read_arrow(partition="0")["id"].to_pylist() == list(range(12))


def test_a_checkpoint_another_writer_wrote_at_that_version_is_never_replaced(make_queue,
                                                                             monkeypatch) -> None:
    """Another writer checkpointing the empty commit's version first (``create_checkpoint`` between
    the empty commit and the link): its checkpoint (tombstones kept) stays as it is."""
    q = make_queue(properties={"delta.checkpointInterval": "1000"})
    _old_files_compacted(q, age_s=0)
    DeltaTable(q.uri).create_checkpoint()
    assert q.version() == 4
    write_table = maintenance.pq.write_table

    def first_another_checkpoint(table, where, *args, **kwargs):
        DeltaTable(q.uri).create_checkpoint()  # version 5, the empty commit's, with tombstones
        return write_table(table, where, *args, **kwargs)

    monkeypatch.setattr(maintenance.pq, "write_table", first_another_checkpoint)
    hooked = _root(q) / "_delta_log" / f"{5:020d}.checkpoint.parquet"
    assert checkpoint_without_tombstones(q, version=4) is None
    monkeypatch.undo()
    assert q.version() == 5 and hooked.exists() and len(_tombstones(q, 5)) == 3
    assert not [p for p in (_root(q) / "_delta_log").iterdir() if p.name.endswith(".tmp")]
    assert q.lake.queue("events").read_arrow(partition="0")["id"].to_pylist() == list(range(12))


def test_which_tombstones_are_redundant(tmp_path) -> None:
    now_ms = time.time_ns() // 1_000_000
    old = tmp_path / "_partition=0" / "old.parquet"
    old.parent.mkdir()
    old.write_bytes(b"x")
    os.utime(old, (time.time() - TWO_DAYS_S,) * 2)
    # an existing file older than its removal: moved to now, then redundant
    assert tombstone_is_redundant(tmp_path, "_partition=0/old.parquet", now_ms)
    assert old.stat().st_mtime_ns >= now_ms * 1_000_000
    # a percent-encoded path names the same file
    assert tombstone_is_redundant(tmp_path, "_partition%3D0/old.parquet", now_ms)
    # a file already deleted: nothing left to protect
    assert tombstone_is_redundant(tmp_path, "_partition=0/gone.parquet", now_ms)
    # kept: no removal time to compare with, or a path outside the table
    assert not tombstone_is_redundant(tmp_path, "_partition=0/old.parquet", None)
    assert not tombstone_is_redundant(tmp_path, "s3://bucket/t/old.parquet", now_ms)
    assert not tombstone_is_redundant(tmp_path, str(old), now_ms)


def test_the_files_modification_time_holds_them_for_any_vacuum_retention(make_queue) -> None:
    """A tombstone held a file for the tombstone retention (24 h) at most; the modification time
    holds it for whatever retention the vacuum is given: 30 h after the compaction, a 48 h vacuum
    keeps the files and a 24 h one deletes them."""
    q = make_queue()
    _, old = _old_files_compacted(q)
    checkpoint(q)
    _age(q, old, 30 * 3600)
    assert vacuum(q.lake.queue("events"), retention_hours=48).files_vacuumed == 0
    assert old <= _data_files(q)
    assert vacuum(q.lake.queue("events"), retention_hours=DEFAULT_VACUUM_RETENTION_HOURS).files_vacuumed == len(old)
    assert _data_files(q) == _active(q)


def _staged(q) -> set[str]:
    return {p.name for p in (_root(q) / "_delta_log").glob(STAGED_CHECKPOINT_GLOB)}


def test_a_staged_checkpoint_a_killed_writer_left_goes_with_the_next_checkpoint_after_an_hour(make_queue) -> None:
    """A writer killed between writing its staged checkpoint and linking it leaves the file in the
    log folder; its owner never comes back. The next ``checkpoint`` (``cues queue maintain``)
    deletes it once it is an hour old, and keeps a fresh one (a live writer's)."""
    q = make_queue()
    _old_files_compacted(q)
    log = _root(q) / "_delta_log"
    dead, live = log / ".cues-checkpoint-dead.tmp", log / ".cues-checkpoint-live.tmp"
    dead.write_bytes(b"PAR1 half a checkpoint")
    live.write_bytes(b"PAR1 being written")
    past = time.time() - 2 * 3600
    os.utime(dead, (past, past))
    report = checkpoint(q)
    assert report.staged_removed == 1
    assert _staged(q) == {live.name}
    assert describe_maintenance(report).count("1 staged checkpoint file(s) of a crashed writer removed") == 1
    assert q.lake.queue("events").read_arrow(partition="0")["id"].to_pylist() == list(range(12))


def test_a_writer_whose_staged_file_is_swept_meanwhile_writes_no_checkpoint_and_loses_nothing(
        make_queue, monkeypatch) -> None:
    """Should a jumping clock make a live writer's staged file look old to another maintenance
    run, the writer finds it gone at the link: no filtered checkpoint, its empty commit stands,
    the queue reads the same and the next checkpoint works."""
    q = make_queue()
    _old_files_compacted(q)
    DeltaTable(q.uri).create_checkpoint()
    version = q.version()
    real_link = os.link

    def swept_first(src, dst):  # noqa: ANN001, ANN202 - os.link's own signature
        assert sweep_staged_checkpoints(Path(src).parent, max_age_s=-60) == 1
        return real_link(src, dst)

    monkeypatch.setattr(maintenance.os, "link", swept_first)
    assert checkpoint_without_tombstones(q, version=version) is None
    monkeypatch.undo()
    assert q.version() == version + 1 and _checkpoints(q)[-1] == version
    assert _staged(q) == set()
    assert q.lake.queue("events").read_arrow(partition="0")["id"].to_pylist() == list(range(12))
    assert checkpoint(q).checkpoint_version == version + 2 and len(_tombstones(q, version + 2)) == 0


def test_the_checkpoint_a_reader_just_chose_survives_the_two_new_ones_and_the_trim(make_queue) -> None:
    """Maintenance writes two checkpoints (with and without tombstones) and then trims expired
    log entries. A reader that listed the log just before chose the newest checkpoint then: with
    every entry expired (a clock a year ahead; an idle queue's month) it must still find that
    checkpoint and every entry after it. The next maintenance may trim it."""
    q = make_queue()
    _old_files_compacted(q)
    DeltaTable(q.uri).create_checkpoint()
    chosen = q.version()  # the newest checkpoint a reader listing the log now would load
    for i in range(2):
        q.append(rows(100 + i, 1), partition="0")
    clock.advance(seconds=400 * 86_400)
    try:
        report = checkpoint(q)
        assert report.checkpoint_version > chosen and len(_checkpoints(q)) >= 3
        assert chosen in _checkpoints(q)
        assert DeltaTable(q.uri, version=chosen).version() == chosen  # the reader's snapshot loads
        assert report.log_entries_removed > 0  # entries below it did go
        q.append(rows(200, 1), partition="0")
        checkpoint(q)
        assert chosen not in _checkpoints(q)  # the next run trims it
    finally:
        clock.reset()
    assert q.lake.queue("events").read_arrow(partition="0")["id"].to_pylist() == [*range(12), 100, 101, 200]
