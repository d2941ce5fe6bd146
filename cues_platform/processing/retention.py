"""Retention that never deletes what a reader still needs (issue 23 item 1).

The queue layer (``queues/retention.py``) knows a queue's policy, its start offsets and how to
delete below a cut. This module decides the cut, because only here is every reader known:

1. The *low-water mark* of each partition is the minimum of
   - every registered processor lane's position on it (``_cues/deployments``, read where the
     processor's strategy keeps it: its home queue, or the positions table; a lane that never
     read holds the start; processors of a lake written before the registry are found from their
     backing queues),
   - every tailer's committed position, unless the tailer is expendable,
   - the last stable offset (the first offset of any undecided transaction; computing it aborts
     transactions past their timeout, as any reader does).
   Each mark says who holds it (``Hold.holder``), so an operator sees why nothing was removed.
2. The policy's cut per partition (``queues.retention.cuts``: age on the platform clock, size in
   whole files), never past the low-water mark.
3. One delete commit per queue moves the starts (``queues.retention.delete_below``).
4. Expendable tailers below a new start are moved to it (one positions commit,
   ``PositionStore.move_up``: each compared again on the snapshot the commit is built on, so one
   that committed past the start meanwhile is never moved back); each learns it on its next read
   (``Tailer.retained_away``). A tailer's own commit racing this one is made again, not lost.

Time only chooses among rows every reader has passed, so a clock that runs ahead (a skewed
machine) can remove consumed rows early but never a row someone still needs. On abort: a crash
before step 3 changes nothing; between 3 and 4 the expendable tailers catch up themselves on their
next read. A reader that registers *while* retention runs (a new tailer committing a position
below the cut, a processor deployed for the first time) may find its first offsets gone: it
starts at the start offset (a new processor lane) or gets :class:`OffsetOutOfRangeError` (a tailer
that is not expendable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError

from cues_platform import clock
from cues_platform.processing.deployments import Registry, derived_shape, progress
from cues_platform.processing.discovery import backing_processors
from cues_platform.processing.history import digest_before_maintenance
from cues_platform.queues.coordinator import abort_expired
from cues_platform.queues.errors import ConcurrentAppendError
from cues_platform.queues.layout import COMMIT_HOOKS
from cues_platform.queues.maintenance import (
    COMPACT_COMMIT_RETRIES,
    delta_retention_hours,
    maintain,
    platform_ahead_ms,
    retention_whole_hours,
)
from cues_platform.queues.positions import PositionStore
from cues_platform.queues.reader import Isolation, plan_read
from cues_platform.queues.retention import (
    Deleted,
    RetentionPolicy,
    cuts,
    delete_below,
    policy_of,
    start_offsets,
)

if TYPE_CHECKING:
    from cues_platform.queues.lake import Lake
    from cues_platform.queues.queue import Queue


@dataclass(frozen=True)
class Hold:
    offset: int
    holder: str  # "processor P (binding B)", "tailer T", "open transaction", "end of partition"


@dataclass(frozen=True)
class PartitionRetention:
    partition: str
    old_start: int
    new_start: int
    low_water: Hold
    end: int


@dataclass
class RetentionReport:
    queue: str
    policy: RetentionPolicy
    partitions: list[PartitionRetention] = field(default_factory=list)
    moved_tailers: list[tuple[str, str, int, int]] = field(default_factory=list)  # t, p, from, to

    @property
    def removed_offsets(self) -> int:
        return sum(p.new_start - p.old_start for p in self.partitions)

    def lines(self) -> list[str]:
        out = [f"{self.queue}: retention {self.policy.describe()}"]
        for p in self.partitions:
            moved = (f"start {p.old_start} -> {p.new_start}" if p.new_start > p.old_start
                     else f"start stays {p.old_start}")
            out.append(f"  partition {p.partition}: {moved} (next offset {p.end}; readers need "
                       f"from {p.low_water.offset}: {p.low_water.holder})")
        for tailer, part, old, new in self.moved_tailers:
            out.append(f"  expendable tailer {tailer!r} on partition {part} moved {old} -> {new}")
        return out


def _lower(holds: dict[str, Hold], partition: str, hold: Hold) -> None:
    if partition in holds and hold.offset < holds[partition].offset:
        holds[partition] = hold


def processor_holds(lake: Lake, queue: Queue, holds: dict[str, Hold]) -> None:
    """Lower ``holds`` to every processor lane's position on ``queue``."""
    shapes = Registry(lake).shapes()
    for pid in backing_processors(lake):  # a lake written before the registry
        if pid not in shapes and (derived := derived_shape(lake, pid)) is not None:
            shapes[pid] = derived
    for shape in shapes.values():
        for binding, name, partition in shape.inputs:
            if name == queue.name and partition in holds:
                pos = progress(lake, shape, (name, partition))
                _lower(holds, partition, Hold(pos, f"processor {shape.processor!r} "
                                                   f"(input {binding!r})"))


def low_water_marks(queue: Queue) -> tuple[dict[str, Hold], list[tuple[str, str, int]]]:
    """Step 1: the low-water mark of every partition of ``queue`` and the expendable tailers
    (name, partition, committed position) it does not count."""
    lake = queue.lake
    dt = queue.refresh()
    holds: dict[str, Hold] = {}
    for p in queue.partitions:
        stable = plan_read(queue, partition=p, start=None, end=None,
                           isolation=Isolation.READ_COMMITTED, call="retention").end
        end = queue.next_offset(p, snapshot=dt)
        holds[p] = Hold(stable, "end of partition" if stable == end else "open transaction")
    processor_holds(lake, queue, holds)
    expendable = []
    for t in PositionStore(lake).tailers(queue.name):
        if t.partition not in holds:
            continue
        if t.expendable:
            expendable.append((t.tailer, t.partition, t.position))
        else:
            _lower(holds, t.partition, Hold(t.position, f"tailer {t.tailer!r}"))
    return holds, expendable


def retain(queue: Queue, *, now_ms: int | None = None) -> RetentionReport:
    """Apply ``queue``'s retention policy (steps 1-4); nothing happens without a policy."""
    policy = policy_of(queue)
    before = start_offsets(queue)
    report = RetentionReport(queue.name, policy)
    if not policy.enabled:
        return report
    # Step 1
    holds, expendable = low_water_marks(queue)
    # Step 2
    now = clock.now_ms() if now_ms is None else now_ms
    wanted = cuts(queue, policy, now_ms=now, below={p: h.offset for p, h in holds.items()})
    # Step 3
    deleted: dict[str, Deleted] = {d.partition: d for d in delete_below(queue, wanted)}
    ends = queue.end_offsets()
    for p in queue.partitions:
        new = deleted[p].new_start if p in deleted else before[p]
        report.partitions.append(PartitionRetention(p, before[p], new, holds[p], ends[p]))
    # Step 4
    starts = {p.partition: p.new_start for p in report.partitions}
    behind = [(t, p, pos) for t, p, pos in expendable if pos < starts[p]]
    if behind:
        # compared again on the snapshot the move is committed on: a tailer that committed past
        # the new start meanwhile is not moved back (it would read those rows again)
        report.moved_tailers = PositionStore(queue.lake).move_up(
            [(queue.name, t, p, starts[p]) for t, p, _ in behind])
    return report


def maintain_queue(queue: Queue, *, retention_hours: float = 24.0,
                   unsafe_allow_short_retention: bool = False) -> tuple[RetentionReport, list]:
    """Everything maintenance does to one queue, in order: abort transactions past their timeout,
    digest a processor home's step records, apply retention, then compact, checkpoint and vacuum
    (``queues/maintenance.py``; the vacuum retention is checked before anything changes)."""
    retention_whole_hours(queue.name, retention_hours, unsafe=unsafe_allow_short_retention)
    abort_expired(queue.lake)
    digest_before_maintenance(queue)
    report = retain(queue)
    return report, maintain(queue, retention_hours=retention_hours,
                            unsafe_allow_short_retention=unsafe_allow_short_retention)


SYSTEM_TABLES = ("positions", "transactions")  # one file per commit, thousands a day


def maintain_system_tables(lake: Lake, *, retention_hours: float = 24.0,
                           unsafe_allow_short_retention: bool = False) -> dict[str, int]:
    """Compact and vacuum the lake's busy system tables (tailer positions, the transaction
    coordinator): each commit adds a small file, so after a year of commits every open of them
    read an add action per commit. Their rows all stay (positions and decisions are history and
    state); only the files are merged, and the log is trimmed as their handles always do.
    Returns the files compacted away per table (a table never used is skipped)."""
    retention_whole_hours("system tables", retention_hours, unsafe=unsafe_allow_short_retention)
    hours = delta_retention_hours(retention_hours, ahead_ms=platform_ahead_ms())
    out = {}
    for name in SYSTEM_TABLES:
        uri = lake.system_uri(name)
        if not DeltaTable.is_deltatable(uri, storage_options=lake.options):
            continue
        dt = DeltaTable(uri, storage_options=lake.options)
        try:
            metrics = dt.optimize.compact(
                commit_properties=CommitProperties(max_commit_retries=COMPACT_COMMIT_RETRIES),
                post_commithook_properties=COMMIT_HOOKS)
        except CommitFailedError as exc:
            raise ConcurrentAppendError(
                f"system table {name!r}: compaction lost {COMPACT_COMMIT_RETRIES} commit races; "
                "nothing was changed, run maintenance again", table=name, retryable=True) from exc
        dt = DeltaTable(uri, storage_options=lake.options)
        dt.vacuum(retention_hours=hours, dry_run=False,
                  enforce_retention_duration=False, full=True)
        out[name] = int(metrics.get("numFilesRemoved", 0))
    return out
