"""A handle on one queue: its contract, partitions, snapshot and offsets.

The handle caches one delta-rs ``DeltaTable`` and moves it forward with ``update_incremental``, so
opening stays cheap however many commits the table has (checkpoints every 100 commits).
A handle is safe to share between threads: snapshot access is serialized by a lock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from cues_platform.queues.errors import (
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
    handle_is_current,
)
from cues_platform.queues.lake import MAX_ROWS_KEY, PARTITIONS_KEY, Lake
from cues_platform.queues.names import validate_name, validate_partition, validate_processor_id
from cues_platform.queues.schema import OFFSET, PARTITION, payload_schema_of
from cues_platform.queues.snapshot_cache import SnapshotCache

if TYPE_CHECKING:
    from cues_platform.queues.appender import AppendResult
    from cues_platform.queues.producer import Acks, Producer
    from cues_platform.queues.reader import Isolation
    from cues_platform.queues.tailer import Tailer

PARTITION_TXN = "part:"
REOPEN_EVERY = 100  # commits; the default checkpoint interval  # app id prefix: version = next offset of that partition


def partition_app_id(partition: str) -> str:
    return f"{PARTITION_TXN}{partition}"


@dataclass(frozen=True)
class FileInfo:
    """One data file of a partition and the offsets it holds (from Delta statistics)."""

    path: str
    partition: str
    min_offset: int
    max_offset: int
    rows: int
    txn_rows: int  # rows that belong to a producer transaction (non-null _txn_id)


class Queue:
    """An append-only Delta table of messages with dense offsets per partition."""

    def __init__(self, *, lake: Lake, name: str, uri: str | None = None) -> None:
        self.lake = lake
        # a system queue (``uri`` given) may be a lane's backing queue: ``processor.partition``
        self.name = validate_name(name) if uri is None else validate_processor_id(name)
        self.uri = uri or lake.queue_uri(name)
        self._lock = threading.RLock()
        self._dt = lake.open_table(self.uri, what=f"queue {name!r}")
        self._opened_at = self._dt.version()
        # local tables: the log folder, to see whether a newer commit exists with one stat()
        self._log_dir = lake.local_path(self.uri) / "_delta_log" if lake.is_local else None
        # log integrity: the newest version whose commit entry this handle checked, and the damage
        # found so far (see ensure_appendable)
        self._verified: int | None = None
        self._damage: list[Inconsistency] = []
        self._storage = TableStorage(self.uri, lake.options)
        self.cache = SnapshotCache()  # what each version says, read once (snapshot_cache.py)
        self._load_metadata()

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, partitions={list(self.partitions)})"

    def _load_metadata(self) -> None:
        config = self._dt.metadata().configuration
        if PARTITIONS_KEY not in config:
            raise QueueError(
                f"{self.uri} is a Delta table but not a cues queue (no {PARTITIONS_KEY} property)",
                queue=self.name,
            )
        self.partitions: tuple[str, ...] = tuple(json.loads(config[PARTITIONS_KEY]))
        self.max_batch_rows = int(config.get(MAX_ROWS_KEY, "5000000"))
        self.table_schema: pa.Schema = pa.schema(self._dt.schema())
        self.payload_schema: pa.Schema = payload_schema_of(self.table_schema)

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
            try:
                with translated(table=f"queue {self.name!r}", uri=self.uri, during="refresh"):
                    return self._refresh()
            except StorageUnreachableError:
                raise
            except DeltaError as exc:
                raise self.lake.diagnose_log(self.uri, what=f"queue {self.name!r}", error=exc) from exc

    def _refresh(self) -> DeltaTable:  # under self._lock
        current = False if self._log_dir is None else handle_is_current(self._log_dir, self._dt.version())
        if current is False:
            self._dt.update_incremental()
        if current is None or self._dt.version() - self._opened_at >= REOPEN_EVERY:
            # Trimmed past this handle (None), or: delta-rs snapshots updated commit by commit get
            # slower with every commit (measured: 17 ms appends at 100 commits, 104 ms at 1,000);
            # a fresh handle starts from the newest checkpoint instead.
            self._dt = self.lake.open_table(self.uri, what=f"queue {self.name!r}")
            self._opened_at = self._dt.version()
        if PARTITIONS_KEY in self._dt.metadata().configuration:
            parts = tuple(json.loads(self._dt.metadata().configuration[PARTITIONS_KEY]))
            if parts != self.partitions:
                self.partitions = parts
        return self._dt

    def ensure_appendable(self, dt: DeltaTable) -> None:
        """Raise :class:`LogIntegrityError` if the log of snapshot ``dt`` is damaged where an
        append would build on it (an empty, truncated or inconsistent commit entry, or a missing
        data file of such a commit): appending would reuse or skip offsets.

        Each commit is checked once per handle: the first call checks the newest commit, later
        calls only the commits that appeared since (one small JSON read and one stat per new data
        file each). Older damage is the auditor's (:func:`integrity.verify_log`). Damage once
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
        """Declare more partitions (subjects). Existing ones are kept; order is preserved."""
        new = [validate_partition(p) for p in partitions]
        with self._lock:
            dt = self.refresh()
            merged = list(self.partitions) + [p for p in new if p not in self.partitions]
            dt.alter.set_table_properties(
                {PARTITIONS_KEY: json.dumps(merged)}, raise_if_not_exists=False
            )
            self.refresh()

    # -- offsets -----------------------------------------------------------------------------------
    def next_offset(self, partition: str, *, snapshot: DeltaTable | None = None) -> int:
        """The offset the next message of ``partition`` gets (0 for an empty partition).

        The partition's app transaction holds it; if the transaction was expired by retention,
        the Delta statistics of the partition's files give the same number.
        """
        dt = snapshot or self.refresh()
        version = self.txn_version(partition_app_id(partition), snapshot=dt)
        if version is not None:
            return int(version)
        files = self.files(partition=partition, snapshot=dt)
        return max((f.max_offset for f in files), default=-1) + 1

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
        ``start``/``end``, only files overlapping ``[start, end)`` (filtered in Arrow)."""
        dt = snapshot or self.refresh()
        with self._lock:
            actions = self.cache.add_actions(dt)
        if actions.num_rows == 0:
            return []
        part_col = f"partition.{PARTITION}"
        if partition is not None:
            actions = actions.filter(pc.equal(actions[part_col], partition))
        if start is not None:
            actions = actions.filter(pc.greater_equal(actions[f"max.{OFFSET}"], start))
        if end is not None:
            actions = actions.filter(pc.less(actions[f"min.{OFFSET}"], end))
        txn_nulls = (
            actions["null_count._txn_id"].to_pylist()
            if "null_count._txn_id" in actions.column_names
            else [None] * actions.num_rows
        )
        out = []
        for path, part, lo, hi, rows, nulls in zip(
            actions["path"].to_pylist(),
            actions[part_col].to_pylist(),
            actions[f"min.{OFFSET}"].to_pylist(),
            actions[f"max.{OFFSET}"].to_pylist(),
            actions["num_records"].to_pylist(),
            txn_nulls,
            strict=True,
        ):
            txn_rows = rows if nulls is None else rows - nulls
            out.append(FileInfo(path, part, int(lo), int(hi), int(rows), int(txn_rows)))
        return out

    def count(self) -> int:
        return sum(f.rows for f in self.files())

    # -- writing (see appender.py / producer.py) ---------------------------------------------------
    def append(self, data: Any, *, partition: str, **kwargs: Any) -> AppendResult:
        """Append one batch to one partition as exactly one Delta commit (see ``appender``)."""
        from cues_platform.queues.appender import append_batches

        return append_batches(self, {partition: data}, **kwargs)

    def append_many(self, batches: Mapping[str, Any], **kwargs: Any) -> AppendResult:
        """Append batches to several partitions of this queue in one Delta commit."""
        from cues_platform.queues.appender import append_batches

        return append_batches(self, batches, **kwargs)

    def producer(
        self, *, producer_id: str | None = None, acks: Acks | str = "all", **kwargs: Any
    ) -> Producer:
        from cues_platform.queues.producer import make_producer

        return make_producer(self, producer_id=producer_id, acks=acks, **kwargs)

    # -- reading (see reader.py / tailer.py) -------------------------------------------------------
    def read_arrow(
        self, *, partition: str, start: int = 0, end: int | None = None, **kwargs: Any
    ) -> pa.Table:
        from cues_platform.queues.reader import read_arrow

        return read_arrow(self, partition=partition, start=start, end=end, **kwargs)

    def read_spark(
        self, spark: Any, *, partition: str, start: int = 0, end: int | None = None, **kwargs: Any
    ) -> Any:
        from cues_platform.queues.reader import read_spark

        return read_spark(self, spark, partition=partition, start=start, end=end, **kwargs)

    def tailer(
        self, name: str, *, partition: str, isolation: Isolation | str = "read_committed"
    ) -> Tailer:
        from cues_platform.queues.tailer import Tailer

        return Tailer(queue=self, name=name, partition=partition, isolation=isolation)
