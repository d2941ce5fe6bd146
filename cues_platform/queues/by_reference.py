"""Committing Parquet files that someone else wrote (Spark executors) to a queue, by reference.

The writer numbers the rows of one partition ``start, start+1, ...`` itself, from the partition's
next offset read before it wrote. Delivery contract of :func:`commit_files` (every retry starts
again at step 1):

1. Read every written file's Parquet footer: row count, ``_offset`` min/max and null counts.
   Verify density: the files' offset ranges, sorted, tile ``[start, start + rows)`` exactly (no
   gap, no repeat), each file holds ``max - min + 1`` rows, the payload columns have the queue's
   types and required columns no null. Then read each file's ``_offset`` column (one int64
   column, not the payload) and verify it holds exactly ``min..min+rows-1``, each once: the
   footer's min, max and count agree for ``[s, s, s+2]`` too, so they alone prove nothing (1M
   rows: ~11 ms on this machine, next to ~1.3 s for the executors to write them). A file set that fails raises
   :class:`NotCommittableError`: nothing is committed, the caller rewrites the rows through
   :func:`~cues_platform.queues.appender.append_batches`.
2. Load the newest snapshot and run the guards (as ``append_batches`` step 2).
3. If a partition's next offset is no longer ``start`` (another writer appended since): files
   with absolute offsets raise :class:`OffsetsMovedError` (their offsets are taken, so the caller
   rewrites them); files with based offsets (``WrittenPart.based``, ``based.py``) take the new
   next offset as their ``start``: their bases are assigned below, nothing is rewritten.
4. Commit the files' add actions (with statistics built from the footers; in a queue with based
   offsets each file's ``_base`` partition value: 0 for absolute files, ``start`` plus the rows
   of the part's files before it for based ones) in ONE Delta commit carrying
   ``part:{partition} = start + rows``, the extra app transactions and the metadata.
5. A concurrent-transaction conflict (the same ``part:`` or guard app id): back off, go to 2.

On abort before step 4's commit the files are orphans in no snapshot (vacuum removes them).
Off by one: ``start`` is the first offset written; ``part:{partition}`` becomes the next free one.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction
from pyarrow import fs

from cues_platform import clock
from cues_platform.queues.appender import (
    DEFAULT_MAX_ATTEMPTS,
    REBASE_RETRIES,
    AppendResult,
    Guard,
    append_batches,
)
from cues_platform.queues.based import assign_bases
from cues_platform.queues.errors import ConcurrentAppendError, QueueError
from cues_platform.queues.filesystems import filesystem_for
from cues_platform.queues.layout import COMMIT_HOOKS
from cues_platform.queues.layout import PARTITION as PARTITION_ID
from cues_platform.queues.names import join_uri
from cues_platform.queues.parallel_files import COMMIT_TOKEN, committed_version, delta_stats
from cues_platform.queues.schema import BASE, OFFSET, PARTITION

if TYPE_CHECKING:
    from cues_platform.queues.handle import QueueHandle


class NotCommittableError(QueueError):
    """Written files that cannot be committed as they are (a gap or repeat in their offsets, a
    payload type other than the queue's); the rows must be rewritten. Not retryable as is."""


class OffsetsMovedError(QueueError):
    """The partition's next offset moved after the files were written: another writer took the
    offsets the files carry. Retryable by rewriting the rows with new offsets."""

    retryable = True


@dataclass(frozen=True)
class FileFooter:
    path: str  # relative to the table root
    size: int
    rows: int
    min_offset: int
    max_offset: int
    stats: str  # Delta statistics JSON
    nulls: Mapping[str, int]  # payload column -> null count
    schema: pa.Schema


@dataclass(frozen=True)
class WrittenPart:
    """One partition's rows written as files under the queue's folder, offsets from ``start``."""

    partition: str
    start: int
    rows: int
    files: tuple[FileFooter, ...]
    # True: each file's _offset holds 0..n-1 and its base is assigned at the commit (based.py);
    # ``start`` is then only the next offset seen when the files were written
    based: bool = False

    @property
    def end(self) -> int:
        return self.start + self.rows


def filesystem_of(uri: str, storage_options: Mapping[str, str] | None = None) -> tuple[fs.FileSystem, str]:
    """The pyarrow file system and path of a URI (a bare path is local; a remote one goes
    through delta-rs' object store with the lake's ``storage_options``)."""
    return filesystem_for(uri, storage_options)


def read_footer(queue: QueueHandle, relative: str) -> FileFooter:
    """A written file's footer as statistics (Step 1); reads no row."""
    filesystem, path = filesystem_of(join_uri(queue.uri, relative), queue.lake.options)
    info = filesystem.get_file_info(path)
    with filesystem.open_input_file(path) as handle:
        meta = pq.ParquetFile(handle).metadata
    stats, nulls = delta_stats(meta)
    mins = stats["minValues"]
    if meta.num_rows and (OFFSET not in mins or nulls.get(OFFSET, -1) != 0):
        raise NotCommittableError(f"queue {queue.name!r}: written file {relative} has no "
                                  f"{OFFSET} statistics; rewrite its rows", queue=queue.name)
    return FileFooter(relative, info.size, meta.num_rows, int(mins.get(OFFSET, 0)),
                      int(stats["maxValues"].get(OFFSET, -1)), json.dumps(stats), nulls,
                      meta.schema.to_arrow_schema())


def check_offsets(queue: QueueHandle, partition: str, footer: FileFooter, first: int) -> None:
    """Raise :class:`NotCommittableError` unless the file's ``_offset`` column holds exactly
    ``first, first+1, ..., first+rows-1`` (in any order, each once, no null).

    Reads that one column (its column chunks, located by the footer), never the payload. Written
    files are in offset order, so the check is one comparison with ``arange``; a file in another
    order is sorted first (reads sort by offset, so such a file is still dense)."""
    filesystem, path = filesystem_of(join_uri(queue.uri, footer.path), queue.lake.options)
    with filesystem.open_input_file(path) as handle:
        column = pq.ParquetFile(handle).read(columns=[OFFSET]).column(OFFSET)
    due = np.arange(first, first + footer.rows, dtype=np.int64)
    values = column.to_numpy() if column.null_count == 0 else None
    dense = (values is not None and len(values) == footer.rows
             and (np.array_equal(values, due) or np.array_equal(np.sort(values), due)))
    if not dense:
        seen = "nulls" if values is None else _describe(values, due)
        raise NotCommittableError(
            f"queue {queue.name!r} partition {partition!r}: written file {footer.path} claims "
            f"offsets [{first}, {first + footer.rows - 1}] in {footer.rows} rows (its footer) but "
            f"its {OFFSET} column holds {seen}; rewrite the rows", queue=queue.name,
            partition=partition, path=footer.path, start=first, rows=footer.rows)


def _describe(values: np.ndarray, due: np.ndarray) -> str:
    """What is wrong with a file's offsets, for the error message."""
    if len(values) != len(due):
        return f"{len(values)} values"
    ordered = np.sort(values)
    wrong = int(np.flatnonzero(ordered != due)[0])
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    missing = np.setdiff1d(due, ordered)
    parts = [f"{OFFSET} {int(repeated[0])} more than once"] if len(repeated) else []
    parts += [f"no {OFFSET} {int(missing[0])}"] if len(missing) else []
    return ", ".join(parts) or f"{int(ordered[wrong])} where {int(due[wrong])} was due"


def verify_written(queue: QueueHandle, partition: str, start: int, files: Sequence[FileFooter]) -> WrittenPart:
    """Step 1's density and type checks; returns the part to commit (rows may be 0)."""
    kept = sorted((f for f in files if f.rows), key=lambda f: f.min_offset)
    expected = start
    for f in kept:
        if f.min_offset != expected or f.max_offset - f.min_offset + 1 != f.rows:
            raise NotCommittableError(
                f"queue {queue.name!r} partition {partition!r}: written file {f.path} holds offsets "
                f"[{f.min_offset}, {f.max_offset}] in {f.rows} rows where [{expected}, "
                f"{expected + f.rows - 1}] was due; rewrite the rows", queue=queue.name,
                partition=partition, path=f.path)
        _check_payload(queue, f)
        check_offsets(queue, partition, f, expected)
        expected += f.rows
    return WrittenPart(partition, start, expected - start, tuple(kept))


def verify_based(queue: QueueHandle, partition: str, start: int, files: Sequence[FileFooter]) -> WrittenPart:
    """Step 1 for files with based offsets: each file's ``_offset`` holds exactly ``0 .. n-1``
    (one file per Spark task, the row's index in it) and its payload has the queue's types; the
    files' order (by name: Spark's task number) is the order their bases are assigned in."""
    kept = tuple(sorted((f for f in files if f.rows), key=lambda f: f.path))
    for f in kept:
        if f.min_offset != 0 or f.max_offset != f.rows - 1:
            raise NotCommittableError(
                f"queue {queue.name!r} partition {partition!r}: written file {f.path} holds "
                f"{OFFSET} [{f.min_offset}, {f.max_offset}] in {f.rows} rows where [0, "
                f"{f.rows - 1}] (each row's index in its file) was due; rewrite the rows",
                queue=queue.name, partition=partition, path=f.path)
        _check_payload(queue, f)
        check_offsets(queue, partition, f, 0)
    return WrittenPart(partition, start, sum(f.rows for f in kept), kept, based=True)


def _check_payload(queue: QueueHandle, f: FileFooter) -> None:
    for field in queue.payload_schema:
        if field.name not in f.schema.names or not f.schema.field(field.name).type.equals(field.type):
            got = f.schema.field(field.name).type if field.name in f.schema.names else "nothing"
            raise NotCommittableError(
                f"queue {queue.name!r}: written file {f.path} has {got} for column "
                f"{field.name!r}, declared {field.type}; rewrite the rows", queue=queue.name,
                column=field.name)
        if not field.nullable and f.nulls.get(field.name, -1) != 0:
            raise NotCommittableError(
                f"queue {queue.name!r}: written file {f.path} may hold nulls in required "
                f"column {field.name!r}; rewrite the rows", queue=queue.name, column=field.name)


def read_written(queue: QueueHandle, files: Sequence[FileFooter]) -> pa.Table:
    """The payload columns of written files, in offset order: the rows to rewrite."""
    return read_written_paths(queue, [f.path for f in files])


def read_written_paths(queue: QueueHandle, paths: Sequence[str], *, based: bool = False) -> pa.Table:
    """:func:`read_written` by relative paths (files whose footers could not be used); ``based``:
    the files' ``_offset`` values are indexes in each file (kept in file order, not sorted)."""
    tables = []
    for relative in paths:
        filesystem, path = filesystem_of(join_uri(queue.uri, relative), queue.lake.options)
        tables.append(pq.read_table(path, filesystem=filesystem))
    if not tables:
        return queue.payload_schema.empty_table()
    table = pa.concat_tables(tables, promote_options="permissive")
    if OFFSET in table.column_names and not based:
        table = table.sort_by(OFFSET)
    return table.select([n for n in queue.payload_schema.names if n in table.column_names])


def append_written(
    queue: QueueHandle,
    parts: Mapping[str, WrittenPart],
    *,
    guards: Sequence[Guard] = (),
    app_transactions: Sequence[tuple[str, int]] = (),
    commit_metadata: Mapping[str, str] | None = None,
    **options: Any,
) -> AppendResult:
    """Commit written parts by reference or, when another writer took their offsets, append their
    rows again with new ones (``append_batches``, same guards and app transactions): either
    way exactly one commit of these rows. ``options`` are ``append_batches``' (delivery hash,
    message type)."""
    metadata = dict(commit_metadata or {})
    if options.get("delivery_hash") is not None:
        metadata["cues.hash"] = options["delivery_hash"]
    try:
        return commit_files(queue, parts, guards=guards, app_transactions=app_transactions,
                            commit_metadata=metadata)
    except OffsetsMovedError:
        tables = {p: read_written_paths(queue, [f.path for f in w.files], based=w.based)
                  for p, w in parts.items()}
        return append_batches(queue, tables, guards=guards, app_transactions=app_transactions,
                              commit_metadata=commit_metadata or {}, **options)


def commit_files(
    queue: QueueHandle,
    parts: Mapping[str, WrittenPart],
    *,
    guards: Sequence[Guard] = (),
    app_transactions: Sequence[tuple[str, int]] = (),
    commit_metadata: Mapping[str, str] | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> AppendResult:
    """Steps 2-5 of the module docstring for parts verified by :func:`verify_written` or
    :func:`verify_based`."""
    if any(w.based for w in parts.values()) and not queue.based:
        raise QueueError(f"queue {queue.name!r} has absolute offsets: files with based offsets "
                         "cannot be committed to it; rewrite the rows", queue=queue.name)
    token = uuid.uuid4().hex  # finds this commit's version afterwards
    at_ms = clock.now_ms()  # the add actions' modificationTime, on the platform's clock
    delay = 0.002
    for attempt in range(1, max_attempts + 1):
        try:
            # Steps 2-4 under the handle's lock (Queue.writing): no other thread of this handle
            # moves the snapshot between the offsets checked on it and the commit built on it
            with queue.writing() as dt:
                # Step 2
                queue.ensure_appendable(dt)
                for guard in guards:
                    done = guard(dt)
                    if done is not None:
                        return done
                # Step 3
                ranges: dict[str, tuple[int, int]] = {}
                for p, w in sorted(parts.items()):
                    now = queue.next_offset(p, snapshot=dt)
                    if now != w.start and not w.based:
                        raise OffsetsMovedError(
                            f"queue {queue.name!r} partition {p!r}: next offset is {now}, the "
                            f"written files start at {w.start}; rewrite them", queue=queue.name,
                            partition=p, expected=w.start, found=now)
                    ranges[p] = (now, now + w.rows)
                # Step 4 (the bases, on this snapshot's next offsets)
                actions = _add_actions(queue, parts, ranges, at_ms)
                txns = [Transaction(PARTITION_ID.id(p), end) for p, (_, end) in ranges.items()]
                txns += [Transaction(app_id, version) for app_id, version in app_transactions]
                metadata = {"cues.queue": queue.name, **dict(commit_metadata or {}),
                            "cues.ranges": ";".join(f"{p}:{s}-{e}" for p, (s, e) in ranges.items()),
                            COMMIT_TOKEN: token}
                # the version before the commit, so that the search for this commit's version
                # covers every commit delta-rs may have rebased it over
                before = dt.version()
                dt.create_write_transaction(
                    actions, mode="append", schema=queue.table_schema,
                    partition_by=queue.partition_columns,
                    commit_properties=CommitProperties(app_transactions=txns,
                                                       custom_metadata=metadata,
                                                       max_commit_retries=REBASE_RETRIES),
                    post_commithook_properties=COMMIT_HOOKS)
                version = committed_version(queue, dt, before, token)
        except CommitFailedError:
            # Step 5 (the back-off sleeps outside the lock)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)
            continue
        return AppendResult(queue=queue.name, ranges=ranges, version=version, attempts=attempt,
                            metadata=metadata)
    raise ConcurrentAppendError(
        f"queue {queue.name!r}: gave up committing written files after {max_attempts} attempts; "
        "retry later", queue=queue.name, partitions=sorted(parts))


def _add_actions(queue: QueueHandle, parts: Mapping[str, WrittenPart],
                 ranges: Mapping[str, tuple[int, int]], at_ms: int) -> list[AddAction]:
    """Step 4's add actions: in a queue with based offsets each carries its ``_base`` (0 for a
    file of absolute offsets; ``based.assign_bases`` from the partition's ``start`` otherwise)."""
    actions = []
    for p, w in sorted(parts.items()):
        bases = (assign_bases(ranges[p][0], [f.rows for f in w.files]) if w.based
                 else [0] * len(w.files))
        for f, base in zip(w.files, bases, strict=True):
            values = {PARTITION: p, BASE: str(base)} if queue.based else {PARTITION: p}
            actions.append(AddAction(f.path, f.size, values, at_ms, True, f.stats))
    return actions
