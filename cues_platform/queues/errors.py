"""Typed errors of the queue layer (all under :class:`cues_platform.errors.CuesError`)."""

from __future__ import annotations

from cues_platform.errors import CuesError, TransientStorageError


class QueueError(CuesError):
    """Root of queue-layer errors."""


class InvalidNameError(QueueError):
    """A queue, partition, producer or tailer name is empty, too long, or has illegal characters."""


class QueueNotFoundError(QueueError):
    """The named queue does not exist under the lake root."""


class QueueExistsError(QueueError):
    """A queue of that name already exists with a different definition."""


class ConcurrentCreateError(QueueError):
    """Another creator's CREATE TABLE was rebased over ours (remote lakes only): the table's
    metadata is the last creator's. Not retryable: check the table's definition
    (``cues queue show``) and drop and recreate it if it is not the intended one."""


class SchemaError(QueueError):
    """A batch or a declared schema does not fit the queue's contract."""


class ReservedColumnError(SchemaError):
    """A payload column uses a name reserved for queue metadata."""


class NullValueError(SchemaError):
    """A required (non-nullable) column holds nulls."""


class BatchError(QueueError):
    """A batch is empty or larger than the queue accepts."""


class UnknownPartitionError(QueueError):
    """A partition that the queue does not declare."""


class SequenceError(QueueError):
    """An idempotent producer sent a sequence number out of order (a gap or a regression)."""



class UnknownProducerIdError(SequenceError):
    """The queue holds no state of this producer id (Kafka's ``UnknownProducerIdException``): the
    instance's epoch expired (``delta.setTransactionRetentionDuration``), or a send under a
    sequence above 0 found no committed sequence and no commit of that sequence to verify it
    against. Nothing was written. Not retryable: open a new producer (a new epoch; its sequences
    start at 0) and check on the queue whether the data of an unacknowledged send landed.

    Carries ``queue``, ``producer_id``, ``sequence``, ``epoch`` (this instance's, or None) and
    ``expected`` (0). An instance whose epoch expired is finished (every later call raises it)."""

    retryable = False

class SequenceMismatchError(SequenceError):
    """A resend of a committed (producer id, sequence) whose content differs from what was stored.

    Carries ``queue``, ``producer_id``, ``sequence``, ``digest`` (of the resend) and
    ``stored_digest``. Nothing was written and nothing was acknowledged."""


class PendingSendError(SequenceError):
    """A send failed (its commit may have landed); the producer accepts only the same batch again.

    Carries ``producer_id`` and ``pending_sequence``. Resend the same batch, or open a new
    producer (which reads what was committed)."""


class OffsetRangeError(QueueError):
    """A read asked for offsets outside what the partition holds."""


class OffsetOutOfRangeError(OffsetRangeError):
    """A read (or a position) below a partition's start offset (Kafka's name): the rows there were
    removed by the queue's retention (``queues/retention.py``), on purpose, after every reader
    that still needed them had read them. Not retryable: read from ``start_offset`` (omit
    ``start``, or seek to ``'start'``).

    Carries ``queue``, ``partition``, ``offset`` (the one asked for) and ``start_offset``."""

    retryable = False


class InvalidArgumentError(QueueError):
    """A call got an argument of the wrong type or value and was refused before anything changed.

    Not retryable as is: pass what the message says. Carries ``call``, ``argument``, ``value``,
    ``expected`` and ``queue`` (when known)."""


class InvalidRangeError(InvalidArgumentError, OffsetRangeError):
    """An offset, a count of messages or a range that is not one (a float, a bool, a string, a
    negative number, an end before its start)."""


class ConcurrentAppendError(QueueError):
    """Another writer kept winning the same partition's offsets; retrying later can succeed."""

    retryable = True


class PositionConflictError(QueueError):
    """Other writers kept committing the same tailer positions; retrying later can succeed."""

    retryable = True


class ProducerFencedError(QueueError):
    """A newer instance of this producer id (or transactional id) started; this instance must stop.

    Not retryable for this instance: open a new producer (which fences the other one in turn)."""


class TransactionStateError(QueueError):
    """A transactional call made in the wrong state (no open transaction, already decided, ...)."""



class UnknownTransactionError(TransactionStateError):
    """A transaction id the coordinator never began (``cues txn abort`` of a mistyped id)."""

class ReadTimeoutError(QueueError):
    """A blocking read saw no message before its timeout."""

    retryable = True


class UnsafeRetentionError(QueueError):
    """A vacuum asked for a retention shorter than the safe minimum without saying it is safe.

    Files younger than the retention may belong to an append that has not committed yet, or to a
    snapshot a reader still uses; deleting them loses data. Carries ``queue``,
    ``retention_hours``, ``minimum_hours`` and ``keyword`` (the argument that overrides it).
    """


class LogIntegrityError(QueueError):
    """A queue's Delta log disagrees with itself or with its files (an emptied, truncated or
    missing commit, a lost data file): appending on top would reuse or skip offsets.

    Not retryable: the log must be repaired first (restore the named file from a backup). Carries
    ``queue``, ``path`` (the damaged commit or the missing file) and ``version`` when known.
    """


class MissingLogError(LogIntegrityError):
    """A queue or system-table folder holds files but no Delta log: the log was lost.

    Creating a new, empty table there would restart offsets at 0 and let vacuum delete the old
    data files, so it is refused. Carries ``queue`` and ``path``.
    """


class PositionRangeError(OffsetRangeError):
    """A tailer was asked to commit a position outside ``[0, next offset]`` of its partition.

    Carries ``queue``, ``tailer``, ``partition``, ``position`` and ``valid`` (the inclusive range).
    """


class StorageUnreachableError(QueueError, TransientStorageError):
    """The lake's object store did not answer (connection refused or reset, a timeout, an unknown
    host) after delta-rs' own retries (storage options ``max_retries``, ``retry_timeout``).

    Retryable (a :class:`TransientStorageError`: what retrying can fix): nothing was lost. Carries ``table``, ``uri``, ``endpoint`` (when known),
    ``during`` (what was being done) and ``reason`` (the innermost cause). A failed commit may
    still have landed if its request reached the store before the fault: a producer resends the
    same batch (its sequence makes the resend a no-op), a step is recovered from its records.
    """

    retryable = True



class StorageFullError(QueueError):
    """The lake's storage has no room (a full disk, a quota, a file size limit): ENOSPC, EDQUOT,
    EFBIG. Carries ``table``, ``uri``, ``during`` and ``reason`` (the innermost cause). Retryable
    once space is freed; a commit that failed may still have landed (the message says how to
    find out for that path)."""

    retryable = True


class StorageNotWritableError(QueueError):
    """The lake's storage refuses the write: a read-only file system (EROFS) or a permission
    (EACCES, EPERM; S3's AccessDenied). Not retryable until the mount or the permissions are
    fixed. Carries ``table``, ``uri``, ``during`` and ``reason``."""


class CommitOutcomeUnknownError(QueueError):
    """A commit's request failed in a way that does not say whether it landed (a lost
    acknowledgement: the store took it, the answer was lost). Retryable only in the way the
    message names for that path (a producer's resend, a transactional ``commit()`` again, a look
    at the partition's end offset before a plain append is sent again), never by resending a
    plain append blindly. Carries ``table``, ``uri``, ``during`` and ``reason``."""

    retryable = True
