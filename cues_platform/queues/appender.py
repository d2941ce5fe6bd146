"""Appending: one batch = one Delta commit, dense offsets per partition without a broker.

Delivery contract of :func:`append_batches` (every retry starts again at step 1). On a local lake
steps 1-4 run in turn with the queue's other writers on this machine (``writer_lock.py``: an
advisory lock, waited for at most 2 s; it saves step 5's wasted attempts, safety never rests on it):

1. Load the newest snapshot of the queue table (``Queue.refresh``: one stat() when nothing is new
   on a local lake, else ``update_incremental``, O(new commits)).
2. Run the guards on that snapshot. The idempotent producer's guard (``idempotence.py``) checks
   its epoch (fencing), then compares the batch's sequence with the producer's app transaction: an
   already committed sequence with the same batch digest makes the whole call a no-op that returns
   the original offsets; a different digest, a gap or a regression raises a :class:`SequenceError`.
   Other guards (processor steps) work the same way.
3. For each partition, read its next offset from its app transaction ``part:{partition}`` and number
   the rows ``next, next+1, ...``.
4. Write the Parquet files and commit them in ONE Delta commit that also carries the app
   transactions ``part:{partition} = next + rows`` (one per written partition), the producer's
   ``prod:{id} = sequence`` and ``pepoch:{id} = epoch`` and any extra ones, and the commit metadata
   (``cues.producer = {id}#{sequence}``, ``cues.digest``, ``cues.ranges``). delta-rs'
   ``write_deltalake`` writes the files, except for an append of at least
   ``parallel_files.PARALLEL_MIN_ROWS`` rows to a local lake: its files are written on a thread
   per core and committed as add actions, in the same one commit (``parallel_files.py``).
5. If another writer committed an app transaction with the same id since step 1 (it took the same
   offsets, or it is another instance of the same producer), delta-rs rejects the commit with a
   concurrent-transaction conflict: back off with jitter and go to 1. Writers to other partitions
   never conflict: delta-rs rebases the commit over theirs, up to ``REBASE_RETRIES`` times (its
   default, 15, was exceeded by four loaded writers of 15 commits each, which cost a retry of this
   loop: a new snapshot and files written again).

On abort (exception, SIGKILL) before step 4's commit, no row is visible; Parquet files already
written are orphans that vacuum removes (they are in no snapshot). After the commit, the batch is
durable even if the caller never hears back: resending with the same producer id and sequence
returns the same offsets instead of writing twice.

delta-rs records app transactions but does not enforce their order (a lower version is accepted),
which is why step 2 checks versions itself; step 5's conflict makes that check race-free.

Expiry (issue 23): only the app transactions whose loss is detected and typed carry
``lastUpdated`` (:func:`app_transaction`, stamped with :func:`cues_platform.clock.now_ms` at the
commit), so ``delta.setTransactionRetentionDuration`` forgets them once idle that long: a
producer's ``prod:`` and ``pepoch:`` (an instance whose epoch is gone raises
``UnknownProducerIdError``, never writes twice) and a queue's per-transaction marker ``txn:``
(readers ask the coordinator, which keeps every decision). Every other app transaction
(``part:`` offsets, a processor's ``proc:``, ``pos:``, ``epoch:``) has no ``lastUpdated`` and
never expires: delta-rs keeps such an entry whatever the retention (tests/queues/test_expiry.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from cues_platform.clock import now_ms
from cues_platform.queues import parallel_files
from cues_platform.queues.errors import BatchError, ConcurrentAppendError
from cues_platform.queues.faults import translated
from cues_platform.queues.layout import COMMIT_HOOKS, expires
from cues_platform.queues.layout import PARTITION as PARTITION_ID
from cues_platform.queues.schema import (
    APPEND_OPTIONS,
    APPEND_TIME,
    BASE,
    DEFAULT_MESSAGE_TYPE,
    DELIVERY_HASH,
    MESSAGE_TYPE,
    METADATA_FIELDS,
    OFFSET,
    PARTITION,
    PRODUCER_ID,
    PRODUCER_SEQ,
    TXN_ID,
    argument_error,
    check_options,
    conform,
)
from cues_platform.queues.writer_lock import writer_turn

if TYPE_CHECKING:
    from cues_platform.queues.handle import QueueHandle

def app_transaction(app_id: str, version: int, *, at_ms: int) -> Transaction:
    """The Delta app transaction ``app_id = version``; with ``lastUpdated`` only if
    :func:`expires` says it may expire.

    ``lastUpdated`` is the earlier of ``at_ms`` (the platform clock) and the real clock: delta-rs
    judges expiry with the real clock of the process loading a snapshot, and never expires a
    stamp in its future, so a platform clock running ahead (a skewed machine, the time nemesis)
    would otherwise make producer ids immortal; a clock behind (tests aging ids) stamps older,
    which only expires an idle id sooner (safe: ``UnknownProducerIdError``, a new epoch)."""
    if expires(app_id):
        return Transaction(app_id, version, last_updated=min(at_ms, time.time_ns() // 1_000_000))
    return Transaction(app_id, version)


DEFAULT_MAX_ATTEMPTS = 200
REBASE_RETRIES = 100  # delta-rs rebases over non-conflicting commits (step 5)


@dataclass(frozen=True)
class AppendResult:
    """Where a batch landed: half-open offset ranges ``[start, end)`` per partition."""

    queue: str
    ranges: Mapping[str, tuple[int, int]]
    version: int | None = None  # the Delta version of the commit; None for a duplicate no-op
    duplicate: bool = False
    attempts: int = 1
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def _single(self) -> tuple[int, int]:
        if len(self.ranges) != 1:
            raise BatchError(
                f"this append wrote {len(self.ranges)} partitions; use .ranges", queue=self.queue
            )
        return next(iter(self.ranges.values()))

    @property
    def first_offset(self) -> int:
        return self._single()[0]

    @property
    def last_offset(self) -> int:
        return self._single()[1] - 1

    @property
    def rows(self) -> int:
        return sum(end - start for start, end in self.ranges.values())


# A guard sees the fresh snapshot before each attempt. It returns None to go on, an AppendResult
# to turn the call into a no-op (the data is already there), or raises to refuse the append.
Guard = Callable[[DeltaTable], AppendResult | None]


@dataclass(frozen=True)
class AppendOptions:
    producer_id: str | None = None
    sequence: int | None = None
    delivery_hash: str | None = None
    digest: str | None = None  # the idempotent producer's batch digest (idempotence.py)
    message_type: str = DEFAULT_MESSAGE_TYPE
    txn_id: str | None = None
    app_transactions: Sequence[tuple[str, int]] = ()
    commit_metadata: Mapping[str, str] = field(default_factory=dict)


_METADATA_NAMES = [f.name for f in METADATA_FIELDS]  # the table's metadata columns, in order


def _with_metadata(
    table: pa.Table, *, partition: str, start: int, opts: AppendOptions, now: pa.TimestampScalar,
    schema: pa.Schema, based: bool,
) -> pa.Table:
    """``table`` (a conformed payload) with the metadata columns of rows numbered from ``start``
    (on a based queue, ``_base`` = 0: the driver writes absolute offsets), under the table's
    ``schema``. When the columns are the schema's in name and type (the usual case: only the
    nullability flags differ) the table is built once with the schema, relabelled, not cast (a
    cast of a 100-row step's table cost more than building it); any other difference goes
    through ``cast``, which converts or refuses."""
    n = table.num_rows

    def const(value: Any, typ: pa.DataType) -> pa.Array:
        return pa.nulls(n, typ) if value is None else pa.repeat(pa.scalar(value, typ), n)

    metadata = {
        PARTITION: const(partition, pa.string()),
        OFFSET: pa.array(np.arange(start, start + n, dtype=np.int64)),
        PRODUCER_ID: const(opts.producer_id, pa.string()),
        PRODUCER_SEQ: const(opts.sequence, pa.int64()),
        DELIVERY_HASH: const(opts.delivery_hash, pa.string()),
        MESSAGE_TYPE: const(opts.message_type, pa.string()),
        APPEND_TIME: pa.repeat(now, n),
        TXN_ID: const(opts.txn_id, pa.string()),
    }
    if based:
        metadata[BASE] = pa.array(np.zeros(n, np.int64))
    names = [*table.column_names, *_METADATA_NAMES, *([BASE] if based else [])]
    columns = [*table.columns, *(metadata[name] for name in names[table.num_columns:])]
    if names == schema.names and all(c.type.equals(f.type) for c, f in zip(columns, schema, strict=True)):
        return pa.Table.from_arrays(columns, schema=schema)
    return pa.Table.from_arrays(columns, names=names).cast(schema)


def prepare_batches(
    queue: QueueHandle, batches: Mapping[str, Any], *, call: str = "Queue.append_many"
) -> dict[str, pa.Table]:
    """Validate and conform each partition's batch (before any offset is taken). ``call`` names
    the public call in the error for ``batches`` that is not a mapping."""
    if not isinstance(batches, Mapping):
        raise argument_error(call, "batches", batches, f"a {type(batches).__name__}",
                             "a dict {partition: batch}", queue=queue.name)
    if not batches:
        raise BatchError(f"queue {queue.name!r}: nothing to append", queue=queue.name)
    prepared: dict[str, pa.Table] = {}
    for partition, data in batches.items():
        queue.check_partition(partition)
        prepared[partition] = conform(
            data, queue.payload_schema, queue=queue.name, max_rows=queue.max_batch_rows
        )
    return prepared


def append_batches(
    queue: QueueHandle,
    batches: Mapping[str, Any],
    *,
    guards: Sequence[Guard] = (),
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    prepared: bool = False,
    allow_empty: bool = False,
    **options: Any,
) -> AppendResult:
    """Append ``{partition: batch}`` to ``queue`` in one Delta commit. See the module docstring.

    ``allow_empty``: with no batch at all, commit no rows but still the app transactions and the
    metadata (a processor's nil step); without it, an empty call is a :class:`BatchError`.

    Every option is checked first (an unknown or mistyped one is an
    :class:`~cues_platform.queues.errors.InvalidArgumentError` naming it), before anything is
    read or written."""
    own = {"guards": guards, "max_attempts": max_attempts, "prepared": prepared,
           "allow_empty": allow_empty}
    checked = check_options({**options, **own}, call="Queue.append", allowed=APPEND_OPTIONS,
                            queue=queue.name)
    guards, max_attempts = checked["guards"], checked["max_attempts"]
    prepared, allow_empty = checked["prepared"], checked["allow_empty"]
    opts = AppendOptions(**{k: v for k, v in checked.items() if k not in own})
    if allow_empty and not batches:
        tables: dict[str, pa.Table] = {}
    else:
        tables = dict(batches) if prepared else prepare_batches(queue, batches)
    metadata = {"cues.queue": queue.name, **dict(opts.commit_metadata)}
    if opts.producer_id is not None:
        metadata["cues.producer"] = f"{opts.producer_id}#{opts.sequence}"
    if opts.delivery_hash is not None:
        metadata["cues.hash"] = opts.delivery_hash
    if opts.digest is not None:
        metadata["cues.digest"] = opts.digest
    delay = 0.002
    # a store that stops answering (after delta-rs' retries) is one typed error, wherever it hits,
    # with the advice of this path: a producer's send is resent as is (its sequence makes a landed
    # one a no-op), a plain append is never resent blindly (faults.CONSEQUENCE)
    during = "send" if opts.producer_id is not None else "commit"
    with translated(table=f"queue {queue.name!r}", uri=queue.uri, during=during):
        for attempt in range(1, max_attempts + 1):
            try:
                # Steps 1-4 under the handle's lock: no other thread of this handle moves the
                # snapshot between the offsets read from it and the commit built on it; on a
                # local lake, in turn with the other writers of the queue (writer_lock.py)
                with writer_turn(queue.writer_lock), queue.writing() as dt:
                    result = _attempt(queue, dt, tables, guards=guards, opts=opts,
                                      metadata=metadata, attempt=attempt)
            except CommitFailedError:
                # Step 5 (the back-off sleeps outside the lock)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.25)
                continue
            return result
    raise ConcurrentAppendError(
        f"queue {queue.name!r}: gave up after {max_attempts} attempts because other writers kept "
        f"taking the same offsets of {sorted(tables)}; retry later or spread writers over partitions",
        queue=queue.name,
        partitions=sorted(tables),
    )


def _attempt(
    queue: QueueHandle, dt: DeltaTable, tables: Mapping[str, pa.Table], *, guards: Sequence[Guard],
    opts: AppendOptions, metadata: Mapping[str, str], attempt: int,
) -> AppendResult:
    """Steps 1-4 on snapshot ``dt``; the caller holds ``queue``'s lock (``Queue.writing``)."""
    queue.ensure_appendable(dt)  # a damaged log (storage fault) refuses: LogIntegrityError
    # Step 2
    for guard in guards:
        done = guard(dt)
        if done is not None:
            return done
    # Step 3
    at_ms = now_ms()  # the platform's clock: retention by age reads _append_time (clock.py)
    now = pa.scalar(at_ms * 1000, pa.timestamp("us", tz="UTC"))
    parts: dict[str, pa.Table] = {}
    ranges, txns = {}, []
    for partition, table in tables.items():
        start = queue.next_offset(partition, snapshot=dt)
        end = start + table.num_rows
        ranges[partition] = (start, end)
        parts[partition] = _with_metadata(table, partition=partition, start=start, opts=opts, now=now,
                                          schema=queue.table_schema, based=queue.based)
        txns.append(Transaction(PARTITION_ID.id(partition), end))
    txns += [app_transaction(app_id, version, at_ms=at_ms)
             for app_id, version in opts.app_transactions]
    properties = CommitProperties(
        app_transactions=txns, max_commit_retries=REBASE_RETRIES,
        custom_metadata={**metadata, "cues.ranges": _ranges_text(ranges)},
    )
    # Step 4
    before = queue.cache.key(dt)
    rows = sum(t.num_rows for t in parts.values())
    if parallel_files.pays(queue, rows):
        # a big append: its files written on several threads, committed on this snapshot
        version = parallel_files.write_parts(queue, dt, parts, at_ms=at_ms, properties=properties)
    else:
        data = (queue.table_schema.empty_table() if not parts
                else pa.concat_tables(parts.values()) if len(parts) > 1 else next(iter(parts.values())))
        write_deltalake(dt, data, mode="append", partition_by=queue.partition_columns,
                        commit_properties=properties, post_commithook_properties=COMMIT_HOOKS)
        version = dt.version()
    queue.committed(dt, before=before, txns=[(t.app_id, t.version) for t in txns])
    return AppendResult(queue=queue.name, ranges=ranges, version=version, attempts=attempt,
                        metadata=dict(metadata))


def _ranges_text(ranges: Mapping[str, tuple[int, int]]) -> str:
    return ";".join(f"{p}:{s}-{e}" for p, (s, e) in sorted(ranges.items()))
