"""Maintenance: compaction, vacuum, log checkpoints and app-transaction retention.

None of these change what any reader sees: compaction rewrites a partition's small files into
larger ones holding the same rows with the same offsets (one commit that removes the old files and
adds the new); vacuum deletes only files that are in no snapshot newer than the retention window
(orphans of failed appends included), so a reader still working on an older snapshot keeps its
files; checkpoints only speed up opening the table.

Vacuum's retention is a safety margin, not a tuning knob: an append writes its Parquet files
*before* its commit, so a file younger than the retention may be about to become committed data,
and a snapshot a reader opened within the retention still needs the files it lists. A retention
shorter than :data:`MIN_SAFE_RETENTION_HOURS` is refused (as Delta's ``retentionDurationCheck``
does) unless the caller passes ``unsafe_allow_short_retention=True`` (tests, tables no one is
writing). delta-rs takes whole hours: a fraction is rounded *up*, never down.

Time (issue 23 item 5, "one clock"). Both age rules here read the platform's clock
(:func:`cues_platform.clock.now_ms`), which tests and the fault harness's time nemesis advance:

* **Vacuum horizon.** delta-rs judges a file's age (a tombstone's deletion time, an unreferenced
  file's modification time) against the real clock of the vacuuming process and takes no other
  clock, so :func:`vacuum` hands it the retention shifted by how far the platform's clock is ahead
  of real time (:func:`delta_retention_hours`): a file is deleted when it is older than the
  retention *by the platform's clock*. The shift never takes the retention below
  :data:`MIN_SAFE_RETENTION_HOURS` of real time (nor below a shorter retention the caller chose
  with ``unsafe_allow_short_retention``): a clock running ahead, by a skew or by the time
  nemesis, can never delete the files of an append about to commit or of a snapshot a reader
  opened within the last hour. A clock behind real time only keeps files longer.
* **Log retention.** :func:`checkpoint` drops log entries (:func:`trim_expired_log`) only below
  the second-newest checkpoint, whose state holds everything they held, and only those whose
  commit timestamp (``commitInfo.timestamp``, stamped by the committing writer) is older than the
  table's ``delta.logRetentionDuration`` (default 30 days) by the platform's clock. A clock
  however far ahead costs time travel to old versions, never a row. delta-rs'
  ``cleanup_metadata`` is not used: it judges by the real clock and keeps entries only down to
  the newest checkpoint. The one other thing entries below a checkpoint hold, the step records of
  a processor's home queue, is judged by the *earlier* of the platform's and the real clock: a
  clock ahead never expires a step record that is not yet in a digest (``cues queue maintain``
  digests a home first; see :func:`trim_expired_log`).

Tombstones (local lakes). A compaction's remove actions serve vacuum alone, yet every open of the
table reads them for ``delta.deletedFileRetentionDuration``. :func:`checkpoint` writes, a version
later, a checkpoint without those whose file is gone or whose modification time it moved to at or
after the removal (:func:`checkpoint_without_tombstones`): a full vacuum judges a file no
tombstone names by that time, so it keeps the file until the removal is older than the
retention, as the tombstone did (and for any vacuum retention, not only up to the tombstone
retention). A lite vacuum would leak such a file, never delete it early; the platform's is full.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, WriterProperties, write_deltalake
from deltalake.exceptions import CommitFailedError

from cues_platform import clock
from cues_platform.errors import ConfigurationError
from cues_platform.queues.errors import ConcurrentAppendError, UnsafeRetentionError
from cues_platform.queues.integrity import LOG_DIR, TableStorage
from cues_platform.queues.layout import (
    DEFAULT_VACUUM_RETENTION_HOURS,
    NO_HOOKS,
    TXN_RETENTION_KEY,
)
from cues_platform.queues.schema import PARTITION

if TYPE_CHECKING:
    from cues_platform.queues.handle import QueueHandle

DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
# The shortest retention vacuum accepts without ``unsafe_allow_short_retention=True``: far longer
# than any append takes between writing its files and committing them.
MIN_SAFE_RETENTION_HOURS = 1.0
UNSAFE_RETENTION_KEYWORD = "unsafe_allow_short_retention"

# Row groups of compacted files: small enough that a tail read (the last few offsets) decodes one
# 16k-row group, found by its _offset statistics, instead of a whole compacted file.
COMPACT_ROW_GROUP_ROWS = 16_384


@dataclass(frozen=True)
class MaintenanceReport:
    queue: str
    files_removed: int = 0
    files_added: int = 0
    files_vacuumed: int = 0
    checkpoint_version: int | None = None
    log_entries_removed: int = 0
    # staged checkpoint files a crashed writer left in the log folder (sweep_staged_checkpoints)
    staged_removed: int = 0
    # the whole hours handed to delta-rs' vacuum (the retention shifted to the platform's clock)
    vacuum_hours: int | None = None


COMPACT_COMMIT_RETRIES = 100


def compact(
    queue: QueueHandle,
    *,
    partition: str | None = None,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    row_group_rows: int = COMPACT_ROW_GROUP_ROWS,
) -> MaintenanceReport:
    """Merge small files, one partition at a time (so files keep one partition and, in a queue
    with absolute offsets, dense offset ranges), in row groups of ``row_group_rows``.

    In a queue with based offsets (``queues/based.py``) delta-rs bins files by both partition
    columns: files of one nonzero base are never merged (there is one per base), and the base-0
    files (the driver's appends) are merged with each other even when executor-written files lie
    between them in offset order. Every row keeps its offset (``_base + _offset``); such a merged
    file's statistics span the holes, so a read of a range inside one may open it too (its row
    groups' ``_offset`` statistics then skip the groups outside the range)."""
    if row_group_rows < 1:
        raise ConfigurationError("row_group_rows must be >= 1")
    removed = added = 0
    parts = [queue.check_partition(partition)] if partition else list(queue.partitions)
    for part in parts:
        dt = queue.refresh()
        try:
            metrics = dt.optimize.compact(
                partition_filters=[(PARTITION, "=", part)],
                target_size=target_file_bytes,
                writer_properties=WriterProperties(max_row_group_size=row_group_rows),
                # appenders commit all the time; delta-rs' default of 15 rebases lost the race
                commit_properties=CommitProperties(max_commit_retries=COMPACT_COMMIT_RETRIES),
            )
        except CommitFailedError as exc:
            raise ConcurrentAppendError(
                f"queue {queue.name!r}: compacting partition {part!r} lost {COMPACT_COMMIT_RETRIES} "
                "commit races to concurrent appends; nothing was changed, run maintenance again",
                queue=queue.name, partition=part) from exc
        removed += int(metrics.get("numFilesRemoved", 0))
        added += int(metrics.get("numFilesAdded", 0))
    queue.refresh()
    return MaintenanceReport(queue.name, files_removed=removed, files_added=added)


def retention_whole_hours(queue: str, retention_hours: float, *, unsafe: bool) -> int:
    """The retention to give delta-rs (whole hours, rounded up), after the safety check.

    Raises :class:`ConfigurationError` for a negative or non-finite value and
    :class:`UnsafeRetentionError` for one below :data:`MIN_SAFE_RETENTION_HOURS` unless ``unsafe``.
    """
    if isinstance(retention_hours, bool) or not isinstance(retention_hours, int | float) or not (
        math.isfinite(retention_hours) and retention_hours >= 0
    ):
        raise ConfigurationError(
            f"queue {queue!r}: retention_hours must be a number >= 0, got {retention_hours!r}",
            queue=queue, retention_hours=retention_hours)
    if retention_hours < MIN_SAFE_RETENTION_HOURS and not unsafe:
        raise UnsafeRetentionError(
            f"queue {queue!r}: a vacuum retention of {retention_hours} h is shorter than the safe "
            f"minimum of {MIN_SAFE_RETENTION_HOURS:g} h: it can delete the files of appends that "
            "are about to commit and of snapshots readers still use. Use a retention of at least "
            f"{MIN_SAFE_RETENTION_HOURS:g} h, or pass {UNSAFE_RETENTION_KEYWORD}=True only when no "
            "one writes to or reads the queue",
            queue=queue, retention_hours=retention_hours,
            minimum_hours=MIN_SAFE_RETENTION_HOURS, keyword=UNSAFE_RETENTION_KEYWORD)
    return math.ceil(retention_hours)


def platform_ahead_ms() -> int:
    """How far the platform's clock is ahead of this process's real clock (negative: behind),
    in whole seconds: the two readings are microseconds apart, and a sub-second difference must
    not move a retention that delta-rs rounds to whole hours."""
    real_ms = time.time_ns() // 1_000_000
    return 1000 * round((clock.now_ms() - real_ms) / 1000)


def delta_retention_hours(retention_hours: float, *, ahead_ms: int) -> int:
    """The whole hours to give delta-rs' vacuum (which judges ages by the real clock) so that it
    deletes what is older than ``retention_hours`` by a platform clock ``ahead_ms`` ahead of real
    time: ``retention_hours - ahead``, but never below ``min(retention_hours,``
    :data:`MIN_SAFE_RETENTION_HOURS` ``)`` of real time; rounded up."""
    floor = min(retention_hours, MIN_SAFE_RETENTION_HOURS)
    return math.ceil(max(floor, retention_hours - ahead_ms / 3_600_000))


def vacuum(
    queue: QueueHandle,
    *,
    retention_hours: float = DEFAULT_VACUUM_RETENTION_HOURS,
    unsafe_allow_short_retention: bool = False,
) -> MaintenanceReport:
    """Delete files no snapshot within ``retention_hours`` references (and orphaned files of
    failed appends older than that), ages judged by the platform's clock but never below
    :data:`MIN_SAFE_RETENTION_HOURS` of real time (:func:`delta_retention_hours`). The retention
    is rounded up to whole hours; below :data:`MIN_SAFE_RETENTION_HOURS` it needs
    ``unsafe_allow_short_retention=True`` (see the module docstring)."""
    retention_whole_hours(queue.name, retention_hours, unsafe=unsafe_allow_short_retention)
    hours = delta_retention_hours(retention_hours, ahead_ms=platform_ahead_ms())
    dt = queue.refresh()
    deleted = dt.vacuum(
        retention_hours=hours,
        dry_run=False,
        enforce_retention_duration=False,
        full=True,
    )
    return MaintenanceReport(queue.name, files_vacuumed=len(deleted), vacuum_hours=hours)


def checkpoint(queue: QueueHandle) -> MaintenanceReport:
    """Write a Delta checkpoint at the current version, on a local lake a second one without the
    tombstones the files' modification times stand for (:func:`checkpoint_without_tombstones`),
    and drop the log entries that expired by the platform's clock (:func:`trim_expired_log`)."""
    storage = TableStorage(queue.uri, queue.lake.options)
    # a reader that listed the log before this call chose at most this checkpoint: it stays
    listed = checkpoint_versions(versioned_entries(storage))
    dt = queue.refresh()
    dt.create_checkpoint()
    version = dt.version()
    swept = 0
    if queue.lake.is_local:
        swept = sweep_staged_checkpoints(queue.lake.local_path(queue.uri) / LOG_DIR)
        version = checkpoint_without_tombstones(queue, version=version) or version
    retention_ms = log_retention_ms(queue.name, dt.metadata().configuration)
    removed = trim_expired_log(storage, retention_ms=retention_ms, now_ms=clock.now_ms(),
                               real_now_ms=time.time_ns() // 1_000_000,
                               keep_from=max(listed, default=0))
    return MaintenanceReport(queue.name, checkpoint_version=version,
                             log_entries_removed=removed, staged_removed=swept)


def tombstone_is_redundant(root: Path, path: str, deleted_ms: int | None) -> bool:
    """Whether full vacuum keeps the file of tombstone ``path`` (removed at ``deleted_ms``) at
    least as long without the tombstone: the file is gone, or its modification time is at or
    after its removal (set to now when older: a full vacuum judges a file no tombstone names by
    that time, so it then keeps it until the removal is older than the retention, as the
    tombstone would). Absolute paths and tombstones without a time are kept."""
    if "://" in path or path.startswith("/"):
        return False
    found = [f for f in dict.fromkeys((root / path, root / unquote(path))) if f.exists()]
    if not found:
        return True  # deleted already: the tombstone protects nothing
    if deleted_ms is None:
        return False
    try:
        for file in found:
            if file.stat().st_mtime_ns < deleted_ms * 1_000_000:
                os.utime(file)  # now, on the real clock (vacuum's and delta-rs' deletionTimestamp)
        return all(f.stat().st_mtime_ns >= deleted_ms * 1_000_000 for f in found)
    except OSError:  # not ours to touch, or gone meanwhile: keep the tombstone
        return False


_STAGED_PREFIX, _STAGED_SUFFIX = ".cues-checkpoint-", ".tmp"  # names no log reader takes
STAGED_CHECKPOINT_GLOB = f"{_STAGED_PREFIX}*{_STAGED_SUFFIX}"  # checkpoint_without_tombstones' files
# A staged file lives for the milliseconds between its write and its link. One older than this is
# a crashed writer's (SIGKILL between the two): the next checkpoint of the queue deletes it.
STAGED_CHECKPOINT_MAX_AGE_S = 3600.0


def sweep_staged_checkpoints(log: Path, *, max_age_s: float = STAGED_CHECKPOINT_MAX_AGE_S) -> int:
    """Delete the staged files of :func:`checkpoint_without_tombstones` in ``log`` (a local
    ``_delta_log`` folder) last modified more than ``max_age_s`` ago; returns how many went.

    Owner: the process writing the checkpoint, for the milliseconds it takes; no log reader takes
    the name. Age is judged by the file's modification time against the clock of the machine the
    disk is on (a local lake: the same clock wrote it), never the platform's clock. Should a
    jumping clock make a live writer's file look old, that writer finds it gone and writes no
    checkpoint (its empty commit stands; the older checkpoint serves), so nothing is lost."""
    cut = time.time() - max_age_s
    removed = 0
    for staged in log.glob(STAGED_CHECKPOINT_GLOB):
        try:
            if staged.stat().st_mtime < cut:
                staged.unlink()
                removed += 1
        except FileNotFoundError:  # its writer linked and removed it meanwhile
            continue
    return removed


def checkpoint_without_tombstones(queue: QueueHandle, *, version: int) -> int | None:
    """The checkpoint of ``version`` (a local lake's) again at ``version + 1``, an empty commit of
    this function, without the tombstones :func:`tombstone_is_redundant` finds; returns that
    version, or None when there were none or another commit came first (nothing dropped).

    Tombstones serve vacuum alone, yet every open of the table reads all of them: 10,000
    compacted step files cost each open of a home queue 3-4 ms and its recovery 5-7 ms for the
    24 h tombstone retention. The new checkpoint is a new file (never one a reader may be
    reading, linked in only if no checkpoint of that version exists); delta-rs loads the newest
    checkpoint it lists. Readers of older versions and handles that replayed the compaction's
    entry keep the tombstones (only safer)."""
    log = queue.lake.local_path(queue.uri) / LOG_DIR
    source = log / f"{version:020d}.checkpoint.parquet"
    if not source.exists():
        return None
    state = pq.read_table(source)
    if "remove" not in state.column_names:
        return None
    root = log.parent
    drop = [r is not None and tombstone_is_redundant(root, r["path"], r.get("deletionTimestamp"))
            for r in state.column("remove").to_pylist()]
    if not any(drop):
        return None
    try:
        with queue.writing() as dt:
            if dt.version() != version:
                return None
            key = queue.cache.key(dt)
            # no checkpoint by delta-rs' hook even when version + 1 is on the interval (one
            # maintain in 10 at queues' interval of 10): the filtered one below takes its place
            write_deltalake(dt, queue.table_schema.empty_table(), mode="append",
                            commit_properties=CommitProperties(
                                custom_metadata={"cues.queue": queue.name,
                                                 "cues.maintenance": "checkpoint"},
                                max_commit_retries=0),
                            post_commithook_properties=NO_HOOKS)
            if dt.version() != version + 1:
                return None
            queue.committed(dt, before=key, txns=[])
    except CommitFailedError:
        return None
    kept = state.filter(pa.array([not d for d in drop]))
    target = log / f"{version + 1:020d}.checkpoint.parquet"
    staged = log / f"{_STAGED_PREFIX}{uuid.uuid4().hex}{_STAGED_SUFFIX}"
    try:
        pq.write_table(kept, staged)
        os.link(staged, target)  # atomic, and never over an existing checkpoint
    except (FileExistsError, FileNotFoundError):  # another checkpoint of it; or swept meanwhile
        return None
    finally:
        staged.unlink(missing_ok=True)
    # the hint readers start listing from (delta-rs takes the newest checkpoint listed anyway)
    hint_file = log / "_last_checkpoint"
    hint = json.loads(hint_file.read_text()) if hint_file.exists() else {}
    if hint.get("version", -1) < version + 1:
        hint.update(version=version + 1, size=kept.num_rows, sizeInBytes=target.stat().st_size)
        try:
            staged.write_text(json.dumps(hint))
            os.replace(staged, hint_file)
        except FileNotFoundError:  # swept meanwhile: the hint stays older (only a hint)
            pass
    return version + 1


LOG_RETENTION_PROPERTY = "delta.logRetentionDuration"
DEFAULT_LOG_RETENTION_MS = 30 * 24 * 3_600_000  # Delta's default: 30 days
# A commit holding a processor step's record (processing/home.py's STEP_RECORD_KEY): by age it
# expires only by the earlier of the platform's and the real clock (trim_expired_log).
STEP_RECORD_COMMIT_KEY = "cues.step_record"
_INTERVAL_UNITS_MS = {
    "nanosecond": 1e-6, "microsecond": 1e-3, "millisecond": 1, "second": 1_000,
    "minute": 60_000, "hour": 3_600_000, "day": 86_400_000, "week": 604_800_000,
}
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+([a-z]+?)s?\s*$", re.IGNORECASE)


def log_retention_ms(queue: str, configuration: dict[str, str]) -> int:
    """The table's ``delta.logRetentionDuration`` in milliseconds (``interval <n> <unit>``, as
    Delta writes it; 30 days when unset)."""
    text = configuration.get(LOG_RETENTION_PROPERTY)
    if text is None:
        return DEFAULT_LOG_RETENTION_MS
    found = _INTERVAL.match(text)
    if found is None or found.group(2).lower() not in _INTERVAL_UNITS_MS:
        raise ConfigurationError(
            f"queue {queue!r}: table property {LOG_RETENTION_PROPERTY} = {text!r} is not an "
            "interval Cues can read; set it to 'interval <n> <unit>' (unit: second, minute, hour, "
            "day or week), e.g. 'interval 30 days'",
            queue=queue, property=LOG_RETENTION_PROPERTY, value=text)
    return math.ceil(int(found.group(1)) * _INTERVAL_UNITS_MS[found.group(2).lower()])


def _commit_info(entry: bytes) -> dict | None:
    """The ``commitInfo`` action of a commit entry, or None (no such line, or unreadable)."""
    for line in entry.splitlines():
        if b'"commitInfo"' not in line:
            continue
        try:
            action = json.loads(line)
        except ValueError:
            return None
        info = action.get("commitInfo") if isinstance(action, dict) else None
        if isinstance(info, dict):
            return info
    return None


def trim_expired_log(storage: TableStorage, *, retention_ms: int, now_ms: int,
                     real_now_ms: int, keep_from: int | None = None) -> int:
    """Delete the log entries (commits, checkpoints, checksums) of the versions below the
    second-newest checkpoint (and below ``keep_from``) whose commit is older than
    ``retention_ms`` at ``now_ms`` (the platform's clock); returns how many files went.

    ``keep_from``: :func:`checkpoint` passes the newest checkpoint that existed before it wrote
    its own two (the checkpoint and the one without tombstones): a reader that listed the log
    just before chose that one and must still find it, even when the two new ones make it only
    the third-newest (seen in the time nemesis: a producer's open failed on a checkpoint trimmed
    between its listing and its read).

    Versions go oldest first and the trim stops at the first one it may not delete, so the log
    never has a hole and a crash in the middle leaves a log that loads. It stops at a commit that
    is younger than the retention, or that it cannot read a ``commitInfo.timestamp`` from (the
    integrity check reports such a commit; nothing is judged on a guess). Everything below the
    second-newest checkpoint is held by that checkpoint's state, so no row is ever lost, whatever
    the clock says: only time travel to the versions deleted, and a reader that chose the
    previous checkpoint still finds its entries.

    The exception is a commit holding a processor step's record (:data:`STEP_RECORD_COMMIT_KEY`),
    which the auditor reads until a digest holds it (``processing/history.py``): it must be older
    than the retention at ``min(now_ms, real_now_ms)``, so a platform clock ahead of real time
    (a skew, the fault harness's time nemesis) never expires one early; ``cues queue maintain``
    digests a home before this trim, and the stepper trims its home by count below its digests
    (``home.trim_home_log``)."""
    names = versioned_entries(storage)
    checkpoints = checkpoint_versions(names)
    if len(checkpoints) < 2:
        return 0
    cut = checkpoints[-2] if keep_from is None else min(checkpoints[-2], keep_from)
    horizon = now_ms - retention_ms
    step_horizon = min(now_ms, real_now_ms) - retention_ms
    versions: dict[int, list[str]] = {}
    for name in names:
        if int(name[:20]) < cut:
            versions.setdefault(int(name[:20]), []).append(name)
    removed = 0
    for version in sorted(versions):
        commit = f"{version:020d}.json"
        entry = storage.read(f"{LOG_DIR}/{commit}") if commit in versions[version] else None
        if entry is not None:
            info = _commit_info(entry)
            stamp = info.get("timestamp") if info is not None else None
            if not isinstance(stamp, int) or stamp > horizon:
                break
            if STEP_RECORD_COMMIT_KEY in info and stamp > step_horizon:
                break
        # the commit entry last: a crash before it leaves the version to be judged again
        doomed = sorted(versions[version], key=lambda n: n == commit)
        storage.delete(f"{LOG_DIR}/{n}" for n in doomed)
        removed += len(doomed)
    return removed


def versioned_entries(storage: TableStorage) -> list[str]:
    """The names in the table's ``_delta_log`` that start with a version (commits, checkpoints)."""
    return [n for n in storage.log_entries() if n[:20].isdigit()]


def checkpoint_versions(names: list[str]) -> list[int]:
    """The versions that have a checkpoint among the log entry ``names``, ascending, each once."""
    return sorted({int(n[:20]) for n in names if ".checkpoint." in n})


def trim_log(storage: TableStorage, *, upto: int | None = None) -> int:
    """Delete the log entries older than the second-newest checkpoint at or below version
    ``upto`` (default: any); returns how many. Nothing is deleted with fewer than two such
    checkpoints.

    What stays loads every version from that checkpoint on: a reader that chose the previous
    checkpoint still finds its entries, and a writer's conflict check reads only entries after
    its own snapshot. Time travel to older versions is gone, which is why only tables whose old
    entries nobody reads are trimmed: system tables (``positions.py``) and a processor's home
    queue below what its digests hold (``processing/home.py``). Entries go oldest first, so a
    crash in the middle leaves a log that still loads."""
    names = versioned_entries(storage)
    checkpoints = [v for v in checkpoint_versions(names) if upto is None or v <= upto]
    if len(checkpoints) < 2:
        return 0
    old = [f"{LOG_DIR}/{n}" for n in names if int(n[:20]) < checkpoints[-2]]
    storage.delete(old)
    return len(old)


def set_app_transaction_retention(queue: QueueHandle, *, days: int) -> None:
    """Let Delta forget producer ids and transaction markers idle for ``days``.

    Only producer ids (``prod:``), producer epochs (``pepoch:``) and a queue's per-transaction
    markers (``txn:``) carry ``lastUpdated`` and can expire (``layout.expires``): an expired
    producer id's old instance raises ``UnknownProducerIdError`` and a new instance opens a new
    epoch and starts again at sequence 0 (``idempotence.py``); an expired transaction marker is
    resolved from the coordinator, which keeps every decision. Offsets (``part:``), processor
    state, tailer positions, the coordinator's and sinks' state carry no ``lastUpdated`` and never
    expire.
    """
    if days < 1:
        raise ConfigurationError("app-transaction retention must be at least 1 day")
    queue.refresh().alter.set_table_properties(
        {TXN_RETENTION_KEY: f"interval {days} days"},
        raise_if_not_exists=False,
    )
    queue.refresh()


def maintain(
    queue: QueueHandle,
    *,
    retention_hours: float = DEFAULT_VACUUM_RETENTION_HOURS,
    row_group_rows: int = COMPACT_ROW_GROUP_ROWS,
    unsafe_allow_short_retention: bool = False,
) -> list[MaintenanceReport]:
    """Compact, checkpoint and vacuum, in that order (the retention is checked first, so a
    refused retention changes nothing)."""
    retention_whole_hours(queue.name, retention_hours, unsafe=unsafe_allow_short_retention)
    return [
        compact(queue, row_group_rows=row_group_rows),
        checkpoint(queue),
        vacuum(queue, retention_hours=retention_hours,
               unsafe_allow_short_retention=unsafe_allow_short_retention),
    ]
