"""Idempotence of a producer id on one queue: epochs (fencing), sequences and batch digests.

Kafka's model on Delta. Three app transactions of the queue table and two commit-metadata keys
carry everything; nothing is read from the rows:

* ``pepoch:{producer_id} = epoch``: the newest instance of the producer id. Opening a producer
  bumps it with one (empty) commit; every commit of the producer restates it.
* ``prod:{producer_id} = sequence``: the newest committed sequence.
* the commit of sequence ``s`` carries ``cues.producer = "{id}#{s}"``, ``cues.digest`` (BLAKE2b of
  the batch, see :func:`batch_digest`) and ``cues.ranges`` (its offsets) in its commit metadata.

Delivery contract of one send of batch ``B`` under ``(producer id P, epoch E, sequence S)``:

0. Check the arguments: ``S`` an int >= 0 (a NumPy integer is one; a bool or a float is not),
   the options known and of their types. A bad one raises ``InvalidArgumentError`` (schema.py)
   before anything below: no epoch opened, nothing pending, the instance as it was.
1. Open (once per instance, before its first send): read ``pepoch:P`` (``e``, or none) and commit
   ``pepoch:P = e + 1`` alone, on the snapshot ``e`` was read from (both under the handle's lock,
   ``Queue.writing``); ``E = e + 1``; then read ``prod:P`` for the next sequence. Two opens racing
   in two processes (or handles) both carry ``pepoch:P``: delta-rs rejects the second with a
   concurrent-transaction conflict, which re-reads and takes the next epoch; two threads of one
   handle take turns on the lock. Each opened instance therefore holds a distinct epoch, and the
   newest open holds the largest.
2. Digest ``D = batch_digest(B)`` over the conformed Arrow payload (partitions sorted).
3. If this instance has a failed send pending (``S'``, ``D'``), only ``S = S'`` with ``D = D'`` is
   accepted; anything else raises :class:`PendingSendError` and writes nothing.
4. Guard, on the snapshot the commit is built on (appender step 2): ``pepoch:P != E`` raises
   :class:`ProducerFencedError` (a newer instance opened). Then with ``last = prod:P``:
   ``S = last + 1`` goes on; ``S > last + 1`` is a gap (:class:`SequenceError`); ``S <= last``
   looks up the commit of ``P#S`` in the log (newest first): same digest returns its offsets with
   ``duplicate=True`` and writes nothing; a different digest raises
   :class:`SequenceMismatchError`; no such commit (log cleaned up, or written before digests)
   raises :class:`SequenceError`: the resend cannot be verified, so it is never acknowledged.
5. Commit ``B`` with the app transactions ``prod:P = S`` and ``pepoch:P = E`` (restated) and the
   metadata of step 4. Why the fence is race-free: a newer open commits ``pepoch:P`` at some
   version ``w``. If ``w`` is in the snapshot of step 4, the guard raises. If not, ``w`` landed
   after that snapshot and before this commit; both carry ``pepoch:P``, so delta-rs rejects this
   commit (conflict), the appender goes back to its step 1 and step 4 now sees ``w``. Either way no
   commit of epoch ``E`` lands after a newer epoch's open, so every batch the fenced instance had
   acknowledged was written before the new instance read ``prod:P`` and is counted there.
6. On success the next sequence is ``S + 1`` and nothing is pending. On an exception from step 5
   (storage error, crash of the acknowledgement after the commit, ...) the commit may or may not
   have landed: ``(S, D)`` becomes pending (step 3). Errors of step 4 prove nothing was written by
   this call and leave the state as it was; a fence is final for the instance.

So a sequence number is acknowledged only for the batch whose digest the log holds: a lost
acknowledgement followed by a different batch raises instead of returning ``duplicate=True``.

Expiry (issue 23; Kafka's producer-id expiration and ``UnknownProducerId``). ``prod:P`` and
``pepoch:P`` carry ``lastUpdated`` (appender.py) and are always written together with the same
stamp (an open restates ``prod:P``), so with ``delta.setTransactionRetentionDuration`` set they
vanish together once the id is idle that long. Then:

* the instance that held the expired epoch finds no ``pepoch:P`` at step 4 and raises
  :class:`UnknownProducerIdError` (final for it, nothing written): open a new producer;
* an open that finds no ``pepoch:P`` on a table with that retention (a new id, or an expired
  one) takes the epoch ``clock.now_ms()`` instead of 0 (:func:`first_epoch`): never the epoch of
  an instance that expired (that one was taken at least the retention earlier), so an old
  instance is fenced, not revived, by it;
* a send under ``S > 0`` while ``prod:P`` is absent (no committed sequence: a new id, or an
  expired one, so a resend cannot be told from a gap) looks for the commit of ``P#S`` in the log
  as step 4 does: the same digest returns the original offsets (``duplicate=True``), a different
  one raises :class:`SequenceMismatchError`, none raises :class:`UnknownProducerIdError`. It is
  never written again, and never told to "resend the gap" (which would duplicate what expired).
  A new instance's own sequences start again at 0 (such a duplicate does not move them).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from cues_platform.clock import now_ms
from cues_platform.queues.appender import AppendResult, Guard, app_transaction, append_batches
from cues_platform.queues.errors import (
    ConcurrentAppendError,
    PendingSendError,
    ProducerFencedError,
    SequenceError,
    SequenceMismatchError,
    UnknownProducerIdError,
)
from cues_platform.queues.layout import COMMIT_HOOKS, PRODUCER, PRODUCER_EPOCH, TXN_RETENTION_KEY
from cues_platform.queues.schema import (
    DEFAULT_MESSAGE_TYPE,
    SEND_OPTIONS,
    check_app_transactions,
    check_callable,
    check_int,
    check_options,
)

if TYPE_CHECKING:
    from cues_platform.queues.handle import QueueHandle

DIGEST_VERSION = b"cues-batch-digest-v1"
HISTORY_FIRST = 16  # commits read first when looking up a sequence's commit (x4 each round)
UNKNOWN_PRODUCER_KEY = "cues.unknown_producer"  # metadata of a duplicate found for an unknown id


def committed_sequence(queue: QueueHandle, producer_id: str, dt: DeltaTable | None = None) -> int | None:
    """The newest committed sequence of ``producer_id`` on ``queue`` (None if it never sent).

    Reading it opens nothing and fences nobody."""
    last = (dt or queue.refresh()).transaction_version(PRODUCER.id(producer_id))
    return None if last is None else int(last)


# -- digest --------------------------------------------------------------------------------------
def _canonical(column: pa.ChunkedArray) -> list[pa.Array | pa.ChunkedArray]:
    """The column as one chunk; with nulls, its validity plus the values with nulls set to one
    constant (the bytes under a null slot differ between builders, e.g. pandas NaN vs None)."""
    column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not column.null_count:
        return [column]
    try:
        filled = pc.fill_null(column, pa.scalar(0).cast(column.type))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return [column]  # nested types: the IPC bytes as they are
    return [pc.is_valid(column), filled]


def batch_digest(tables: Mapping[str, pa.Table], *, header: Sequence[str | None] = ()) -> str:
    """BLAKE2b-128 (hex) of conformed batches ``{partition: table}``.

    Canonical input: a version tag, the ``header`` strings, then per partition in sorted order its
    name and the Arrow IPC stream of its columns (one chunk each, null slots normalized, no schema
    metadata). The tables are already conformed to the queue's payload schema, so the column
    order and the chunking of the caller's input do not change the digest; the same values built
    from a list of dicts, a dict of columns or pandas give the same digest in any process.
    """
    h = hashlib.blake2b(DIGEST_VERSION, digest_size=16)
    for item in header:
        h.update(b"\x00" if item is None else b"\x01" + item.encode() + b"\x00")
    for partition in sorted(tables):
        table = tables[partition]
        arrays, names = [], []
        for name, column in zip(table.column_names, table.columns, strict=True):
            for i, array in enumerate(_canonical(column)):
                arrays.append(array)
                names.append(f"{name}#{i}")
        canonical = pa.Table.from_arrays(arrays, names=names)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, canonical.schema) as writer:
            writer.write_table(canonical)
        body = sink.getvalue()
        h.update(f"{len(partition)}:{partition}:{body.size}:".encode())
        h.update(memoryview(body))
    return h.hexdigest()


# -- epochs --------------------------------------------------------------------------------------
def open_epoch(queue: QueueHandle, producer_id: str, *, max_attempts: int = 200) -> int:
    """Step 1: commit ``pepoch:{producer_id} = newest + 1`` and return that epoch."""
    app_id = PRODUCER_EPOCH.id(producer_id)
    delay = 0.002
    for _ in range(max_attempts):
        try:
            # the newest epoch read and the next one committed on the same snapshot, under the
            # handle's lock: another thread of this handle cannot commit the same epoch in between
            # (its commit would move the snapshot and delta-rs would see no conflict)
            with queue.writing() as dt:
                newest = dt.transaction_version(app_id)
                epoch = int(newest) + 1 if newest is not None else first_epoch(dt)
                at_ms = now_ms()
                txns = [app_transaction(app_id, epoch, at_ms=at_ms)]
                last = dt.transaction_version(PRODUCER.id(producer_id))
                if last is not None:  # restated: prod: and pepoch: always expire together
                    txns.append(app_transaction(PRODUCER.id(producer_id), int(last),
                                                at_ms=at_ms))
                write_deltalake(
                    dt,
                    queue.table_schema.empty_table(),
                    mode="append",
                    commit_properties=CommitProperties(
                        app_transactions=txns,
                        custom_metadata={
                            "cues.queue": queue.name,
                            "cues.epoch": f"{producer_id}@{epoch}",
                        },
                    ),
                    post_commithook_properties=COMMIT_HOOKS,
                )
        except CommitFailedError:  # another process opened it first: read the newest again
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)
            continue
        return epoch
    raise ConcurrentAppendError(
        f"queue {queue.name!r}: could not open producer {producer_id!r}: other instances kept "
        f"opening it at the same time ({max_attempts} attempts); retry later",
        queue=queue.name,
        producer_id=producer_id,
    )


def first_epoch(dt: DeltaTable) -> int:
    """The epoch of an open that finds none: 0 on a table that expires nothing; on a table with
    ``delta.setTransactionRetentionDuration`` (the id may be new or expired) the clock's
    milliseconds, never the epoch of an instance that expired (taken at least the retention
    earlier, or a small counter)."""
    if TXN_RETENTION_KEY in dt.metadata().configuration:
        return now_ms()
    return 0


# -- the guard -----------------------------------------------------------------------------------
def find_commit(queue: QueueHandle, dt: DeltaTable, producer_id: str, sequence: int) -> dict | None:
    """The commit info of ``producer_id#sequence`` in ``dt``'s log, newest first (None if absent)."""
    key = f"{producer_id}#{sequence}"
    total = dt.version() + 1
    limit = HISTORY_FIRST
    while True:
        with queue._lock:
            commits = dt.history(limit=min(limit, total))
        for commit in commits:
            if commit.get("cues.producer") == key:
                return commit
        if limit >= total or len(commits) < limit:
            return None
        limit *= 4


def _parse_ranges(text: str) -> dict[str, tuple[int, int]]:
    out = {}
    for item in text.split(";"):
        partition, _, span = item.rpartition(":")
        start, _, end = span.partition("-")
        out[partition] = (int(start), int(end))
    return out


def idempotence_guard(
    queue: QueueHandle, *, producer_id: str, sequence: int, digest: str, epoch: int
) -> Guard:
    """Step 4 (run by the appender on the snapshot its commit is built on)."""

    def guard(dt: DeltaTable) -> AppendResult | None:
        newest = dt.transaction_version(PRODUCER_EPOCH.id(producer_id))
        if newest is None:
            raise UnknownProducerIdError(
                f"queue {queue.name!r}: producer {producer_id!r} (epoch {epoch}) is unknown to the "
                "queue: its epoch and sequence expired after the app-transaction retention "
                "(delta.setTransactionRetentionDuration) while it was idle; nothing was written "
                f"(sequence {sequence}). This instance cannot send again: open a new producer "
                "(a new epoch, sequences from 0) and check on the queue whether an "
                "unacknowledged batch landed before sending it again",
                queue=queue.name, producer_id=producer_id, sequence=sequence, epoch=epoch,
                expected=0, expired=True,
            )
        if int(newest) != epoch:
            raise ProducerFencedError(
                f"queue {queue.name!r}: producer {producer_id!r} (epoch {epoch}) was fenced: "
                f"a newer instance opened the same producer id (epoch {newest}); this instance "
                "cannot send again: stop it, or open a new producer (which fences the other)",
                queue=queue.name,
                producer_id=producer_id,
                epoch=epoch,
                newest=None if newest is None else int(newest),
            )
        last = committed_sequence(queue, producer_id, dt)
        expected = 0 if last is None else last + 1
        if sequence == expected:
            return None
        data = {"queue": queue.name, "producer_id": producer_id, "sequence": sequence}
        if last is None:
            # no committed sequence: a new id or an expired one; a resend cannot be told from a
            # gap, so only the log can acknowledge it
            return _unknown_sequence(queue, dt, producer_id=producer_id, sequence=sequence,
                                     digest=digest, epoch=epoch)
        if sequence > expected:
            raise SequenceError(
                f"queue {queue.name!r}: producer {producer_id!r} sent sequence {sequence} but the "
                f"next expected is {expected} (a gap: batches {expected}..{sequence - 1} were never "
                "committed); resend them in order",
                expected=expected,
                **data,
            )
        commit = find_commit(queue, dt, producer_id, sequence)
        stored = None if commit is None else commit.get("cues.digest")
        if commit is None or stored is None or "cues.ranges" not in commit:
            raise SequenceError(
                f"queue {queue.name!r}: producer {producer_id!r} resent sequence {sequence} "
                f"(committed up to {expected - 1}) but the log holds no digest of that commit "
                "(written before digests, or the log was cleaned up), so the resend cannot be "
                "verified and is not acknowledged; check the data and send new batches with the "
                f"next sequence {expected}",
                expected=expected,
                **data,
            )
        if stored != digest:
            raise SequenceMismatchError(
                f"queue {queue.name!r}: producer {producer_id!r} resent sequence {sequence} with "
                f"different content (digest {digest}, stored {stored}): a sequence number is used "
                f"once; send this batch under the next sequence {expected} (or without a "
                "sequence)",
                digest=digest,
                stored_digest=stored,
                expected=expected,
                **data,
            )
        return AppendResult(
            queue=queue.name,
            ranges=_parse_ranges(commit["cues.ranges"]),
            duplicate=True,
            metadata={"cues.version": commit.get("version"), "cues.digest": stored},
        )

    return guard


def _unknown_sequence(
    queue: QueueHandle, dt: DeltaTable, *, producer_id: str, sequence: int, digest: str, epoch: int
) -> AppendResult:
    commit = find_commit(queue, dt, producer_id, sequence)
    stored = None if commit is None else commit.get("cues.digest")
    if commit is None or stored is None or "cues.ranges" not in commit:
        raise UnknownProducerIdError(
            f"queue {queue.name!r}: producer {producer_id!r} sent sequence {sequence} but the "
            "queue holds no committed sequence of it (it never sent here, or its state expired "
            "after the app-transaction retention) and no commit of that sequence to verify a "
            "resend against; nothing was written. If this is a resend, check on the queue whether "
            "the data landed; send new batches from sequence 0 (or without a sequence)",
            queue=queue.name, producer_id=producer_id, sequence=sequence, epoch=epoch,
            expected=0, expired=False,
        )
    if stored != digest:
        raise SequenceMismatchError(
            f"queue {queue.name!r}: producer {producer_id!r} resent sequence {sequence} with "
            f"different content (digest {digest}, stored {stored}) and the queue holds no "
            "committed sequence of it (expired, or never sent since): nothing was written; send "
            "this batch from sequence 0 (or without a sequence)",
            queue=queue.name, producer_id=producer_id, sequence=sequence, digest=digest,
            stored_digest=stored, expected=0,
        )
    return AppendResult(
        queue=queue.name,
        ranges=_parse_ranges(commit["cues.ranges"]),
        duplicate=True,
        # acknowledged from the log of an id the queue no longer knows: the instance's own
        # sequences are not moved by it (they start at 0 again)
        metadata={"cues.version": commit.get("version"), "cues.digest": stored,
                  UNKNOWN_PRODUCER_KEY: "true"},
    )


# -- the per-instance state ----------------------------------------------------------------------
class SequenceState:
    """One producer instance's idempotence on one queue (steps 1, 2, 3 and 6 of the contract).

    The epoch opens at the first send (or :meth:`open`): constructing a producer only to read
    its next sequence commits nothing and fences nobody."""

    def __init__(self, queue: QueueHandle, *, producer_id: str) -> None:
        self.queue = queue
        self.producer_id = producer_id
        self.epoch: int | None = None
        last = committed_sequence(queue, producer_id)
        self.next_sequence = 0 if last is None else last + 1
        self.pending: tuple[int, str] | None = None
        self.fenced: ProducerFencedError | UnknownProducerIdError | None = None

    def open(self) -> int:
        """Step 1 (once): open a new epoch, then read the committed sequence on a snapshot that
        includes it (an older instance cannot commit after that)."""
        if self.epoch is None:
            self.epoch = open_epoch(self.queue, self.producer_id)
            last = committed_sequence(self.queue, self.producer_id)
            self.next_sequence = max(self.next_sequence, 0 if last is None else last + 1)
        return self.epoch

    def check_usable(self) -> None:
        if self.fenced is not None:
            raise type(self.fenced)(self.fenced.message, **self.fenced.data)

    def reset(self) -> None:
        """Forget a pending send: read the committed sequence again (the call that failed has
        returned, so the log now tells whether its commit landed)."""
        self.pending = None
        last = committed_sequence(self.queue, self.producer_id)
        self.next_sequence = 0 if last is None else last + 1

    def send(
        self,
        tables: Mapping[str, pa.Table],
        *,
        sequence: int | None = None,
        guards: Sequence[Guard] = (),
        app_transactions: Sequence[tuple[str, int]] = (),
        after_commit: Callable[[], None] | None = None,
        **options: Any,
    ) -> AppendResult:
        """Send prepared ``tables`` under the next (or the given) sequence.

        The arguments are checked first (step 0): a bad one raises
        :class:`~cues_platform.queues.schema.InvalidArgumentError` before the epoch opens and
        before anything becomes pending, so it can never wedge the producer."""
        # Step 0
        call, queue = "Producer.send", self.queue.name
        if sequence is not None:
            sequence = check_int(sequence, call=call, argument="sequence", queue=queue,
                                 expected="an int >= 0 (the batch's sequence number), or None "
                                 "for the producer's next one")
        options = check_options(options, call=call, allowed=SEND_OPTIONS, queue=queue)
        app_transactions = check_app_transactions(app_transactions, call=call, queue=queue)
        guards = check_options({"guards": guards}, call=call, allowed=("guards",),
                               queue=queue)["guards"]
        check_callable(after_commit, call=call, argument="after_commit", queue=queue)
        self.check_usable()
        self.open()
        # Step 2
        digest = batch_digest(
            tables,
            header=[
                options.get("message_type", DEFAULT_MESSAGE_TYPE),
                options.get("delivery_hash"),
                options.get("txn_id"),
            ],
        )
        # Step 3
        if self.pending is not None:
            pending_seq, pending_digest = self.pending
            if (sequence is not None and sequence != pending_seq) or digest != pending_digest:
                raise PendingSendError(
                    f"queue {self.queue.name!r}: producer {self.producer_id!r} has an "
                    f"unacknowledged send of sequence {pending_seq} (it failed and may have been "
                    "committed); send that same batch again first (it is written once), or open "
                    f"a new producer; this batch (sequence {sequence}) was not written",
                    queue=self.queue.name,
                    producer_id=self.producer_id,
                    pending_sequence=pending_seq,
                    sequence=sequence,
                )
            seq = pending_seq
        else:
            seq = self.next_sequence if sequence is None else sequence
        try:
            # Steps 4-5
            result = append_batches(
                self.queue,
                tables,
                prepared=True,
                guards=[
                    idempotence_guard(
                        self.queue,
                        producer_id=self.producer_id,
                        sequence=seq,
                        digest=digest,
                        epoch=self.epoch,
                    ),
                    *guards,
                ],
                producer_id=self.producer_id,
                sequence=seq,
                digest=digest,
                app_transactions=[
                    (PRODUCER.id(self.producer_id), seq),
                    (PRODUCER_EPOCH.id(self.producer_id), self.epoch),
                    *app_transactions,
                ],
                **options,
            )
            if after_commit is not None:
                after_commit()
        except ProducerFencedError as exc:
            # Step 6: final for this instance
            self.fenced, self.pending = exc, None
            raise
        except UnknownProducerIdError as exc:
            if exc.data.get("expired"):  # this instance's epoch is gone: final, like a fence
                self.fenced, self.pending = exc, None
            raise
        except (SequenceError, ConcurrentAppendError):
            raise  # Step 6: refused before any commit of this call
        except BaseException:
            self.pending = (seq, digest)  # Step 6: may have landed
            raise
        self.pending = None
        if UNKNOWN_PRODUCER_KEY not in result.metadata:
            self.next_sequence = max(self.next_sequence, seq + 1)
        return result
