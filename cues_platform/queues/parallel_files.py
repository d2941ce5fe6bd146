"""A big append's Parquet files written on several threads, and committed as add actions.

delta-rs' ``write_deltalake`` writes an append's files on one thread and splits the rows by the
``_partition`` column first. Measured on this machine kind (2 cores; ``bench/bench_append_files.py``,
``bench/results/append_files.json``, medians of 10 alternating rounds), one append with a step's
delivery hash and app transaction: 1M rows 327 ms with delta-rs against 185 ms as two pyarrow
files on two threads (2.00x), 100k rows 51 against 29 ms, 30k rows 19 against 16 ms; 10k rows
10 against 11 ms and 1,000 rows 5 against 8 ms (the commit's search for its version costs more
than the write saves). :func:`write_parts` is ``appender._attempt``'s Step 4 for an append of at
least :data:`PARALLEL_MIN_ROWS` rows on a local lake:

1. Each partition's rows (already numbered on the step's snapshot, the partition columns
   dropped: their values go into the add actions, as delta-rs does) are cut into at most one
   slice per core, each at least ``PARALLEL_MIN_ROWS // 2`` rows, in offset order.
2. The slices are written as Parquet files under ``_partition={p}/`` on a thread pool (pyarrow
   releases the GIL while it encodes), with Parquet statistics of the :data:`STATS` columns
   only (the queue's Delta statistics are of those: min/max of every payload column cost a
   sixth of a 500k-row file's write, ``bench/results/parquet_stats.json``) and dictionary
   encoding of the variable-length (string, binary) columns only (:func:`dictionary_columns`:
   pyarrow's default tries a dictionary for every column and gives it up for unique numbers
   such as ``_offset`` after hashing a megabyte of them; ``bench/results/parquet_encoding.json``);
   each file's statistics come from its footer, read back (:func:`delta_stats`, the same reading
   the executors' files get).
3. ONE Delta commit of the add actions with the append's app transactions and metadata, on the
   snapshot the offsets were read from (``create_write_transaction``): exactly what
   ``write_deltalake`` commits, files written by us instead of by delta-rs.
4. The commit's version is found by a token in its metadata (:func:`committed_version`):
   ``create_write_transaction`` returns none and delta-rs may have rebased the commit.

On abort anywhere before Step 3's commit (exception, SIGKILL) no row is visible: the files
written so far are in no snapshot (orphans) and ``cues queue maintain`` (vacuum) removes them
after the retention, as it removes ``write_deltalake``'s. A concurrent-transaction conflict in
Step 3 is the appender's Step 5: it retries from a new snapshot with new offsets and new files;
the first attempt's files are orphans too. Remote lakes keep ``write_deltalake`` (their writes go
through delta-rs' object store from Python, one request at a time).
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction

from cues_platform.queues.filesystems import is_local_uri
from cues_platform.queues.integrity import TableStorage, commit_path
from cues_platform.queues.layout import COMMIT_HOOKS, STATS_COLUMNS
from cues_platform.queues.names import join_uri
from cues_platform.queues.schema import BASE, PARTITION

if TYPE_CHECKING:
    from cues_platform.queues.handle import QueueHandle

STATS = tuple(STATS_COLUMNS.split(","))  # the columns queues keep statistics of
# An append of at least this many rows is written on several threads (below it, delta-rs' one
# call is as fast and its commit needs no search for its version)
PARALLEL_MIN_ROWS = 32_768
COMMIT_TOKEN = "cues.commit"  # the commit metadata key :func:`committed_version` searches for


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says, as a container's
    cpuset does; else the machine's count)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def pays(queue: QueueHandle, rows: int) -> bool:
    """Whether an append of ``rows`` rows to ``queue`` is written by :func:`write_parts`."""
    return rows >= PARALLEL_MIN_ROWS and cores() > 1 and is_local_uri(queue.uri)


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat(timespec="microseconds").replace("+00:00", "Z")
    return value


def delta_stats(meta: pq.FileMetaData) -> tuple[dict[str, Any], dict[str, int]]:
    """A Parquet footer as Delta statistics (``numRecords`` and the :data:`STATS` columns'
    min/max/null count) and every column's null count (-1: unknown)."""
    schema = meta.schema.to_arrow_schema()
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for i, name in enumerate(schema.names):
        lo = hi = None
        count = 0
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(i).statistics
            if st is None:
                count = -1  # unknown, never taken for "no null"
                continue
            count = count + st.null_count if count >= 0 and st.has_null_count else -1
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
        nulls[name] = count
        if name in STATS and lo is not None:
            mins[name], maxs[name] = _iso(lo), _iso(hi)
    stats = {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs,
             "nullCount": {k: v for k, v in nulls.items() if k in STATS and v >= 0}}
    return stats, nulls


@functools.lru_cache(maxsize=64)
def dictionary_columns(schema: pa.Schema) -> tuple[str, ...]:
    """The Parquet leaf columns of ``schema`` (dot paths, nested ones included, as Parquet names
    them) whose values are variable-length bytes (strings, binaries): the columns a file of
    :func:`write_parts` dictionary-encodes. Read from the footer of an empty file of the schema,
    so the paths are pyarrow's own (``tags.list.element``)."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    meta = pq.read_metadata(pa.BufferReader(sink.getvalue())).schema
    return tuple(meta.column(i).path for i in range(len(meta))
                 if meta.column(i).physical_type == "BYTE_ARRAY")


def _slices(table: pa.Table) -> list[pa.Table]:
    """Step 1: at most one slice per core, each at least half of ``PARALLEL_MIN_ROWS``."""
    count = max(1, min(cores(), table.num_rows // (PARALLEL_MIN_ROWS // 2)))
    size = -(-table.num_rows // count)
    return [table.slice(i * size, size) for i in range(count)]


def write_parts(queue: QueueHandle, dt: DeltaTable, parts: Mapping[str, pa.Table], *,
                at_ms: int, properties: CommitProperties) -> int | None:
    """Steps 1-4 of the module docstring on snapshot ``dt`` (the caller holds the queue's lock):
    ``parts`` are ``{partition: rows}`` with every column of the table; returns the commit's
    version (None if it could not be found). A conflict raises delta-rs' ``CommitFailedError``."""
    partition_columns = queue.partition_columns
    jobs: list[tuple[dict[str, str], str, pa.Table]] = []
    for partition, table in parts.items():
        # Step 1 (a based queue's driver rows carry absolute offsets: _base 0, as delta-rs writes)
        values = {PARTITION: partition, **({BASE: "0"} if queue.based else {})}
        rows = table.drop_columns(partition_columns)
        stem = f"{PARTITION}={partition}/part-{uuid.uuid4().hex}"
        jobs += [(values, f"{stem}-c{i:03d}.snappy.parquet", piece)
                 for i, piece in enumerate(_slices(rows))]

    def write(job: tuple[dict[str, str], str, pa.Table]) -> AddAction:
        values, relative, rows = job
        path = join_uri(queue.uri, relative).removeprefix("file://")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # the footer read back, not write_table's metadata_collector: with it, a failed write
        # (EFBIG, ENOSPC) surfaced as "file metadata is only available after writer close", a
        # RuntimeError no storage-fault translation recognizes (the read is of the file's tail)
        pq.write_table(rows, path, compression="snappy",
                       write_statistics=[c for c in STATS if c in rows.column_names],
                       use_dictionary=list(dictionary_columns(rows.schema)))
        stats, _ = delta_stats(pq.read_metadata(path))
        return AddAction(relative, os.path.getsize(path), values, at_ms, True, json.dumps(stats))

    # Step 2
    with ThreadPoolExecutor(max_workers=min(len(jobs), cores())) as pool:
        actions = list(pool.map(write, jobs))
    # Step 3
    token = uuid.uuid4().hex
    metadata = {**(properties.custom_metadata or {}), COMMIT_TOKEN: token}
    before = dt.version()
    dt.create_write_transaction(
        actions, mode="append", schema=queue.table_schema, partition_by=partition_columns,
        commit_properties=CommitProperties(app_transactions=properties.app_transactions,
                                           custom_metadata=metadata,
                                           max_commit_retries=properties.max_commit_retries),
        post_commithook_properties=COMMIT_HOOKS)
    # Step 4
    return committed_version(queue, dt, before, token)


def committed_version(queue: QueueHandle, dt: DeltaTable, before: int, token: str) -> int | None:
    """The version of the commit carrying ``token``, committed on snapshot ``dt`` of version
    ``before`` (inside ``queue.writing()``). ``create_write_transaction`` returns no version and
    leaves ``dt`` where it was, and delta-rs may have rebased the commit over other writers'
    commits: ``dt`` is moved to the newest version and every commit since ``before`` searched."""
    dt.update_incremental()
    # each commit entry is read by its version's own file name: delta-rs' history() lists the
    # newest entries in storage but numbers them from the handle's version, so a commit another
    # handle made in between shifted every number by one (a wrong version, seen under threads)
    storage = TableStorage(queue.uri, queue.lake.options)
    needle = token.encode()
    for version in range(dt.version(), before, -1):
        raw = storage.read(commit_path(version))
        if raw is not None and needle in raw:
            return version
    return None


__all__: Sequence[str] = ["PARALLEL_MIN_ROWS", "committed_version", "cores", "delta_stats",
                          "dictionary_columns", "pays", "write_parts"]
