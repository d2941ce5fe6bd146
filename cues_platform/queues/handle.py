"""A handle on one queue: its contract, partitions, snapshot and offsets (the handle only).

Floor 2 of ``queues/`` (docs/architecture.md): it knows the table's layout and log checks below
it, and nothing of the operations above it (appender, producers, reader, tailer, maintenance),
which each take a handle. The user's :class:`~cues_platform.queues.queue.Queue` is this handle
with those operations as methods.

The handle caches one delta-rs ``DeltaTable`` and moves it forward with ``update_incremental``, so
opening stays cheap however many commits the table has (checkpoints every 100 commits).

Threads. A handle is safe to share between threads. Its snapshot is one ``DeltaTable`` object that
every refresh and every commit through the handle moves forward, so a writer must not read from it
outside the handle's lock and commit on it later: another thread's commit would move the object
in between, the commit would be built on the moved snapshot, and delta-rs would see no conflict
(the offsets read before would be taken twice). Every commit path therefore runs its whole
attempt (read the newest snapshot, check, number the rows, commit) inside :meth:`QueueHandle.writing`,
which holds the lock; back-off sleeps happen outside. Reads outside the lock are safe: a queue is
append-only, and a snapshot moved forward still holds every row an older one did.

A table replaced under a handle (the queue deleted and created again at the same path) is
noticed on the next refresh: on a local lake by the identity of the commit entry of the handle's
version (one ``stat``, as cheap as the existence check it replaces), anywhere by the table id in
its metadata. The handle then opens the new table from scratch (its metadata, partitions, schema,
cache and integrity checks are the new table's), rather than replaying the new table's commits on
top of the old table's state.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from cues_platform.queues.based import file_bases
from cues_platform.queues.errors import (
    ConcurrentAppendError,
    LogIntegrityError,
    QueueError,
    StorageUnreachableError,
    UnknownPartitionError,
)
from cues_platform.queues.faults import translated
from cues_platform.queues.integrity import (
    Inconsistency,
    TableStorage,
    check_commits,
    find_inconsistencies,
)
from cues_platform.queues.layout import (
    FORMAT_KEY,
    MAX_ROWS_KEY,
    PARTITIONS_KEY,
    START,
    OffsetLayout,
)
from cues_platform.queues.layout import PARTITION as PARTITION_ID
from cues_platform.queues.location import LakeLocation, partition_names
from cues_platform.queues.names import validate_name, validate_partition, validate_processor_id
from cues_platform.queues.schema import BASE, OFFSET, PARTITION, payload_schema_of
from cues_platform.queues.snapshot_cache import SnapshotCache
from cues_platform.queues.writer_lock import lock_path

REOPEN_EVERY = 100  # commits; the default checkpoint interval
ADD_PARTITIONS_ATTEMPTS = 200  # conflicting metadata changes retried by add_partitions
METADATA_REBASE_RETRIES = 100  # delta-rs rebases a metadata change over plain appends


@dataclass(frozen=True)
class FileInfo:
    """One data file of a partition and the offsets it holds (from Delta statistics)."""

    path: str
    partition: str
    min_offset: int  # absolute: base + the file's smallest _offset
    max_offset: int
    rows: int
    txn_rows: int  # rows that belong to a producer transaction (non-null _txn_id)
    base: int = 0  # what the file's _offset values are relative to (OffsetLayout.BASED)


class QueueHandle:
    """An append-only Delta table of messages with dense offsets per partition."""

    def __init__(self, *, lake: LakeLocation, name: str, uri: str | None = None) -> None:
        self.lake = lake
        # a system queue (``uri`` given) may be a lane's backing queue: ``processor.partition``
        self.name = validate_name(name) if uri is None else validate_processor_id(name)
        self.uri = uri or lake.queue_uri(name)
        self._lock = threading.RLock()
        self._pinned = False  # True while the lock's owner is inside writing()
        self._dt = lake.open_table(self.uri, what=f"queue {name!r}")
        self._opened_at = self._dt.version()
        self._table_id = self._dt.metadata().id
        # local tables: the log folder, to see whether a newer commit exists with one stat()
        self._log_dir = lake.local_path(self.uri) / "_delta_log" if lake.is_local else None
        # local tables: the lock writers of this table take turns on (writer_lock.py)
        self.writer_lock = (lock_path(lake.local_path(lake.system_uri("locks")), lake.local_path(self.uri))
                            if lake.is_local else None)
        # (version, identity of its commit entry): a different file there means a new table
        self._entry: tuple[int, tuple[int, int, int, int]] | None = None
        self._note_entry()
        # log integrity: the newest version whose commit entry this handle checked, and the damage
        # found so far (see ensure_appendable)
        self._verified: int | None = None
        self._damage: list[Inconsistency] = []
        self._storage = TableStorage(self.uri, lake.options)
        self.cache = SnapshotCache()  # what each version says, read once (snapshot_cache.py)
        # the files of one (version, partition), listed once (files())
        self._listed: tuple[tuple[Any, str | None], list[FileInfo]] | None = None
        self._load_metadata()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, partitions={list(self.partitions)})"

    def _load_metadata(self) -> None:
        config = self._dt.metadata().configuration
        if PARTITIONS_KEY not in config:
            raise QueueError(
                f"{self.uri} is a Delta table but not a cues queue (no {PARTITIONS_KEY} property)",
                queue=self.name,
            )
        self.partitions: tuple[str, ...] = tuple(json.loads(config[PARTITIONS_KEY]))
        self.max_batch_rows = int(config.get(MAX_ROWS_KEY, "5000000"))
        # the Delta table's schema (with ``_base`` for based offsets: what writers write)
        self.table_schema: pa.Schema = pa.schema(self._dt.schema())
        self.payload_schema: pa.Schema = payload_schema_of(self.table_schema)
        version = config.get(FORMAT_KEY, "1")
        self.based = BASE in self._dt.metadata().partition_columns
        if version not in ("1", "2") or (version == "2") != self.based:
            raise QueueError(
                f"queue {self.name!r} at {self.uri} has format {version!r}"
                f"{' with' if self.based else ' without'} a {BASE} partition column: this version "
                "of cues_platform reads formats '1' (absolute offsets) and '2' (based offsets, "
                f"partitioned by {PARTITION} and {BASE}); upgrade cues_platform to read it",
                queue=self.name, format=version)
        self.offset_layout = OffsetLayout.BASED if self.based else OffsetLayout.ABSOLUTE
        self.partition_columns: list[str] = [PARTITION, BASE] if self.based else [PARTITION]
        # what every read returns: offsets absolute, no ``_base`` column
        self.read_schema: pa.Schema = pa.schema([f for f in self.table_schema if f.name != BASE])

    # -- snapshot ----------------------------------------------------------------------------------
    def refresh(self) -> DeltaTable:
        """Move the cached snapshot to the latest version and return it.

        On a local lake, when the next version's log entry does not exist yet, the snapshot is
        already the newest (Delta versions are contiguous and a commit is visible exactly when
        its entry exists), so the log listing of ``update_incremental`` is skipped. A commit
        landing right after the check is the same race as one landing right after a listing:
        writers catch it by their app-transaction conflict.

        A log delta-rs cannot load (a truncated commit entry) raises :class:`LogIntegrityError`
        naming the damaged file."""
        with self._lock:
            if self._pinned:  # inside writing(): the snapshot a commit is being built on stays
                return self._dt
            try:
                with translated(table=f"queue {self.name!r}", uri=self.uri, during="refresh"):
                    return self._refresh()
            except StorageUnreachableError:
                raise
            except DeltaError as exc:
                raise self.lake.diagnose_log(self.uri, what=f"queue {self.name!r}", error=exc) from exc

    def _refresh(self) -> DeltaTable:  # under self._lock
        state = "remote" if self._log_dir is None else self._log_state()
        if state == "changed":
            state = self._entry_changed()
            if state == "damaged":  # appends refuse it (ensure_appendable checks it again)
                return self._dt
        if state in ("newer", "remote"):
            self._dt.update_incremental()
            self._note_entry()
        if state == "remote" and self._dt.metadata().id != self._table_id:
            state = "replaced"  # the new table's commits were replayed over the old one's state
        if state in ("gone", "replaced") or self._dt.version() - self._opened_at >= REOPEN_EVERY:
            # Trimmed past this handle, its entry rewritten, or a new table at the path, or:
            # delta-rs snapshots updated commit by commit get slower with every commit (measured:
            # 17 ms appends at 100 commits, 104 ms at 1,000); a fresh handle starts from the
            # newest checkpoint instead.
            self._dt = self.lake.open_table(self.uri, what=f"queue {self.name!r}")
            self._opened_at = self._dt.version()
            self._note_entry()
            if self._dt.metadata().id != self._table_id:
                self._replaced()
        if PARTITIONS_KEY in self._dt.metadata().configuration:
            parts = tuple(json.loads(self._dt.metadata().configuration[PARTITIONS_KEY]))
            if parts != self.partitions:
                self.partitions = parts
        return self._dt

    def _log_state(self) -> str:  # under self._lock; local lakes
        """Where the handle stands, from two stats and no listing: "current" (no entry after its
        version), "newer" (newer commits exist), "gone" (its own entry is gone: the log was
        trimmed past it, or the table was deleted, so it must be opened again from the newest
        checkpoint; updating it entry by entry would find nothing and keep it stale) or
        "changed" (its version's entry is another file than the one it loaded: the table was
        deleted and created again, or the entry was rewritten)."""
        log_dir, version = self._log_dir or Path(), self._dt.version()
        try:
            stat = os.stat(log_dir / f"{version:020d}.json")
        except FileNotFoundError:
            return "gone"
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if self._entry is not None and self._entry[0] == version and self._entry[1] != identity:
            return "changed"
        if self._entry is None or self._entry[0] != version:
            # moved by a commit made on this handle's snapshot since the last refresh
            self._entry = (version, identity)
        return "newer" if (log_dir / f"{version + 1:020d}.json").exists() else "current"

    def _entry_changed(self) -> str:  # under self._lock
        """The commit entry of the handle's version is another file than the one it loaded.
        Either the table was replaced ("replaced" once reopened: the table id differs), or that
        entry was rewritten in place (damage, or a restore from a backup): "damaged" when the
        entry itself is unreadable or inconsistent, else the table is opened again. Either way the
        entry is checked again before the next append (``ensure_appendable``)."""
        version = self._dt.version()
        self._note_entry()
        if self._verified is not None:
            self._verified = min(self._verified, version - 1)
        if check_commits(self.name, self._storage, [version], files=False):
            return "damaged"
        return "replaced"

    def _note_entry(self) -> None:  # under self._lock (or in __init__)
        """Remember the identity of the commit entry of the snapshot's version (local lakes)."""
        if self._log_dir is None:
            return
        version = self._dt.version()
        try:
            stat = os.stat(self._log_dir / f"{version:020d}.json")
        except FileNotFoundError:  # trimmed already: the next refresh reopens
            self._entry = None
            return
        self._entry = (version, (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns))

    def _replaced(self) -> None:  # under self._lock
        """The table at this handle's path is another one than the handle had open: forget
        everything read from the old one."""
        self._table_id = self._dt.metadata().id
        self.cache = SnapshotCache()
        self._listed = None
        self._verified = None
        self._damage = []
        self._load_metadata()

    @contextmanager
    def writing(self) -> Iterator[DeltaTable]:
        """The newest snapshot, with this handle's lock held until the block ends.

        Build a commit inside the block from what is read from the snapshot inside the block
        (offsets, app-transaction versions, guards), and commit on the snapshot inside it too
        (``write_deltalake(dt, ...)``, ``dt.create_write_transaction``, ``dt.alter``): then no
        other thread of this handle moves the snapshot in between (and :meth:`refresh` inside the
        block returns it unmoved), and delta-rs' conflict check covers every commit since what
        was read. Sleep (back off) outside the block. Guards run inside the block must not take
        another handle's lock."""
        with self._lock:
            pinned = self._pinned
            dt = self.refresh()
            self._pinned = True  # refresh() inside the block returns dt unmoved
            try:
                yield dt
            finally:
                self._pinned = pinned
                if dt is self._dt and (self._entry is None or self._entry[0] != dt.version()):
                    self._note_entry()

    def committed(self, dt: DeltaTable, *, before: tuple[str, int],
                  txns: Iterable[tuple[str, int]]) -> None:
        """``dt`` (this handle's snapshot) just committed on top of ``before`` (``cache.key`` read
        before the commit) with app transactions ``txns``: seed the cache of the new version and
        remember its commit entry. Call inside :meth:`writing`."""
        with self._lock:
            self.cache.committed(dt, before=before, txns=txns)
            if dt is self._dt:
                self._note_entry()

    def ensure_appendable(self, dt: DeltaTable) -> None:
        """Raise :class:`LogIntegrityError` if the log of snapshot ``dt`` is damaged where an
        append would build on it (an empty, truncated or inconsistent commit entry, or a missing
        data file of such a commit): appending would reuse or skip offsets.

        Each commit is checked once per handle: the first call checks the newest commit, later
        calls only the commits that appeared since (one small JSON read and one stat per new data
        file each). Older damage is the auditor's (:func:`handle.verify_log`). Damage once
        found keeps this handle refusing: repair the log and open the queue again.
        """
        with self._lock:
            top = dt.version()
            first = top if self._verified is None else self._verified + 1
            if first <= top:
                found = check_commits(self.name, self._storage, range(max(first, 0), top + 1))
                if any(p.kind == "missing-file" for p in found):
                    # a file compacted away and vacuumed since is not lost: only files the
                    # snapshot still references count (read only on this rare path)
                    live = set(dt.get_add_actions(flatten=True)["path"].to_pylist())
                    found = [p for p in found if p.kind != "missing-file" or p.path in live]
                self._damage += found
                self._verified = top
            if self._damage:
                worst = self._damage[0]
                raise LogIntegrityError(
                    f"queue {self.name!r} refuses appends: {worst.detail}"
                    + (f" ({len(self._damage) - 1} more problem(s))" if len(self._damage) > 1 else "")
                    + "; then open the queue again",
                    queue=self.name, path=self._storage.location(worst.path or ""),
                    version=worst.version, problems=list(self._damage))

    @property
    def table(self) -> DeltaTable:
        return self._dt

    def version(self) -> int:
        return self.refresh().version()

    def check_partition(self, partition: str) -> str:
        validate_partition(partition)
        if partition not in self.partitions:
            self.refresh()
        if partition not in self.partitions:
            raise UnknownPartitionError(
                f"queue {self.name!r} has no partition {partition!r} (it has "
                f"{list(self.partitions)}); add it with Queue.add_partitions",
                queue=self.name,
                partition=partition,
            )
        return partition

    def add_partitions(self, partitions: Sequence[str]) -> None:
        """Declare more partitions (subjects). Existing ones are kept; order is preserved.

        Idempotent and safe against concurrent callers in any process: the declared partitions
        are read from the newest snapshot and the union committed on it; when another process
        changed the metadata first (delta-rs: "Metadata changed since last commit") the call reads
        again and merges again, so every partition any caller asked for ends up declared, in the
        order they were first declared. Raises :class:`ConcurrentAppendError` (retryable) only if
        the metadata kept changing for ``ADD_PARTITIONS_ATTEMPTS`` attempts."""
        new = list(dict.fromkeys(partition_names(
            partitions, where=f"queue {self.name!r}: add_partitions")))
        delay = 0.002
        for _ in range(ADD_PARTITIONS_ATTEMPTS):
            try:
                with self.writing() as dt:
                    current = self._declared(dt)
                    missing = [p for p in new if p not in current]
                    if not missing:
                        self.partitions = current
                        return
                    dt.alter.set_table_properties(
                        {PARTITIONS_KEY: json.dumps([*current, *missing])},
                        raise_if_not_exists=False,
                        commit_properties=CommitProperties(max_commit_retries=METADATA_REBASE_RETRIES),
                    )
            except CommitFailedError:  # another metadata change won: read it and merge again
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.25)
                continue
            self.refresh()  # the partitions just declared (and any declared since)
            return
        raise ConcurrentAppendError(
            f"queue {self.name!r}: could not add partitions {new}: other writers kept changing the "
            f"queue's metadata ({ADD_PARTITIONS_ATTEMPTS} attempts); retry later",
            queue=self.name, partitions=new)

    def _declared(self, dt: DeltaTable) -> tuple[str, ...]:
        config = dt.metadata().configuration
        if PARTITIONS_KEY not in config:
            raise QueueError(
                f"{self.uri} is a Delta table but not a cues queue (no {PARTITIONS_KEY} property)",
                queue=self.name,
            )
        return tuple(json.loads(config[PARTITIONS_KEY]))

    # -- offsets -----------------------------------------------------------------------------------
    def next_offset(self, partition: str, *, snapshot: DeltaTable | None = None) -> int:
        """The offset the next message of ``partition`` gets (0 for an empty partition).

        The partition's app transaction holds it (it carries no ``lastUpdated`` and never
        expires); without one, the Delta statistics of the partition's files (or its start offset,
        when retention removed every row) give the same number.
        """
        dt = snapshot or self.refresh()
        version = self.txn_version(PARTITION_ID.id(partition), snapshot=dt)
        if version is not None:
            return int(version)
        files = self.files(partition=partition, snapshot=dt)
        return max(max((f.max_offset for f in files), default=-1) + 1,
                   self.start_offset(partition, snapshot=dt))

    def start_offset(self, partition: str, *, snapshot: DeltaTable | None = None) -> int:
        """The first offset of ``partition`` still in the queue: 0 until retention removed rows
        (``retention.py``); a read below it raises :class:`OffsetOutOfRangeError`."""
        self.check_partition(partition)
        version = self.txn_version(START.id(partition), snapshot=snapshot)
        return 0 if version is None else int(version)

    def start_offsets(self) -> dict[str, int]:
        """Start offset of every partition, from one snapshot."""
        dt = self.refresh()
        return {p: self.start_offset(p, snapshot=dt) for p in self.partitions}

    def txn_version(self, app_id: str, *, snapshot: DeltaTable | None = None) -> int | None:
        """The version of app transaction ``app_id`` in ``snapshot`` (default: the newest), read
        once per Delta version (``snapshot_cache.py``)."""
        dt = snapshot or self.refresh()
        with self._lock:
            return self.cache.transaction_version(dt, app_id)

    def last_offset(self, partition: str) -> int | None:
        """The offset of the newest message of ``partition``, or None when it is empty."""
        self.check_partition(partition)
        nxt = self.next_offset(partition)
        return nxt - 1 if nxt else None

    def end_offsets(self) -> dict[str, int]:
        """Next offset of every partition, from one snapshot."""
        dt = self.refresh()
        return {p: self.next_offset(p, snapshot=dt) for p in self.partitions}

    def files(
        self,
        *,
        partition: str | None = None,
        snapshot: DeltaTable | None = None,
        start: int | None = None,
        end: int | None = None,
    ) -> list[FileInfo]:
        """Data files of the snapshot with their offset ranges, from Delta statistics; with
        ``start``/``end``, only files overlapping ``[start, end)``.

        One (version, partition)'s list is built once and kept (a version never changes; the key
        holds the table's id): a step plans the same version two or three times, and building
        the list took 0.6 ms of a 100-row step's 0.8 ms of planning."""
        dt = snapshot or self.refresh()
        key = (self.cache.key(dt), partition)
        with self._lock:
            listed = self._listed
        if listed is None or listed[0] != key:
            listed = (key, self._list_files(dt, partition))
            with self._lock:
                self._listed = listed
        return [f for f in listed[1] if (start is None or f.max_offset >= start)
                and (end is None or f.min_offset < end)]

    def _list_files(self, dt: DeltaTable, partition: str | None) -> list[FileInfo]:
        """Every data file of ``partition`` (None: all) in ``dt``, offsets absolute."""
        with self._lock:
            actions = self.cache.add_actions(dt)
        if actions.num_rows == 0:
            return []
        part_col = f"partition.{PARTITION}"
        if partition is not None:
            actions = actions.filter(pc.equal(actions[part_col], partition))
        bases = file_bases(actions)
        lows = pc.add(actions[f"min.{OFFSET}"], bases)  # absolute offsets (based.py)
        highs = pc.add(actions[f"max.{OFFSET}"], bases)
        txn_nulls = (
            actions["null_count._txn_id"].to_pylist()
            if "null_count._txn_id" in actions.column_names
            else [None] * actions.num_rows
        )
        out = []
        for path, part, lo, hi, rows, nulls, base in zip(
            actions["path"].to_pylist(),
            actions[part_col].to_pylist(),
            lows.to_pylist(),
            highs.to_pylist(),
            actions["num_records"].to_pylist(),
            txn_nulls,
            bases.to_pylist(),
            strict=True,
        ):
            txn_rows = rows if nulls is None else rows - nulls
            out.append(FileInfo(path, part, int(lo), int(hi), int(rows), int(txn_rows), int(base)))
        return out

    def count(self) -> int:
        return sum(f.rows for f in self.files())


def verify_log(queue: QueueHandle) -> list[Inconsistency]:
    """The full check (:func:`~cues_platform.queues.integrity.find_inconsistencies`) of a queue
    handle's newest snapshot.

    Opening or refreshing a queue whose newest commit cannot be parsed raises
    :class:`LogIntegrityError` instead (``Lake.queue``/``QueueHandle.refresh``); an auditor
    reports that error's message as the violation.
    """
    return find_inconsistencies(queue.name, queue.refresh(), queue.partitions)
