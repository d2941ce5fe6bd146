"""Producers: idempotent (Kafka's ``enable.idempotence``) with two durability levels (``acks``).

* ``Acks.ALL`` (default): ``send`` returns once the batch is committed; the offsets are final.
* ``Acks.NONE``: ``send`` buffers and returns a :class:`PendingAppend` at once; a background thread
  (after ``linger_seconds``) or an explicit ``flush()`` commits everything buffered as one batch.
  A crash loses what was buffered but not flushed; nothing is ever written twice.

Idempotence (the numbered contract is in ``idempotence.py``): opening a producer (its first send,
or ``open()``) bumps the epoch of its id and fences older instances (their next send raises :class:`ProducerFencedError`). Each
batch has a sequence number and a digest of its content, committed atomically with the batch.
Resending a committed sequence with the same content (the acknowledgement was lost) returns the
original offsets with ``duplicate=True`` and writes nothing; different content raises
:class:`SequenceMismatchError`; a gap raises :class:`SequenceError`. An id idle longer than the
queue's app-transaction retention expires: the instance that held it raises
:class:`UnknownProducerIdError` (nothing written; open a new producer, whose sequences start at
0), and a resend under a sequence the queue no longer knows is acknowledged only if the log
still holds that commit with the same digest. After a failed send the only
accepted call is the same batch again (:class:`PendingSendError` otherwise) or a new producer.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from enum import StrEnum
from typing import Any

import pyarrow as pa

from cues_platform.queues.appender import AppendResult, prepare_batches
from cues_platform.queues.errors import (
    InvalidNameError,
    ProducerFencedError,
    QueueError,
    SequenceError,
)
from cues_platform.queues.handle import QueueHandle
from cues_platform.queues.idempotence import (
    SequenceState,
    UnknownProducerIdError,
)
from cues_platform.queues.names import validate_id
from cues_platform.queues.schema import (
    SEND_OPTIONS,
    argument_error,
    check_callable,
    check_choice,
    check_int,
    check_options,
    check_seconds,
)

__all__ = ["Acks", "AsyncProducer", "PendingAppend", "Producer", "UnknownProducerIdError",
           "make_producer"]


class Acks(StrEnum):
    ALL = "all"
    NONE = "none"


def check_producer_id(queue: Any, producer_id: object, *, call: str) -> str:
    """``producer_id`` if it is a legal producer id, a new anonymous id for None. Anything else
    (an empty or blank string, a trailing newline, not a string) is refused: an empty id must not
    silently become an anonymous producer, which would lose its idempotence across restarts."""
    if producer_id is None:
        return f"anon-{uuid.uuid4().hex}"
    try:
        return validate_id(producer_id, kind="producer id")
    except InvalidNameError as exc:
        raise InvalidNameError(
            f"queue {getattr(queue, 'name', queue)!r}: {call}: producer_id={producer_id!r} is not "
            "a valid producer id; pass up to 200 letters, digits, '_', '.', ':', '@' or '-', "
            "starting with a letter or digit (no '..'), or None for an anonymous producer "
            "(which cannot resend after a restart)",
            name=producer_id, kind="producer id", argument="producer_id",
            queue=getattr(queue, "name", None),
        ) from exc


def check_queue(queue: object, *, call: str) -> None:
    if not isinstance(queue, QueueHandle):
        raise argument_error(call, "queue", queue, f"a {type(queue).__name__}, not a Queue",
                             "a Queue (lake.queue(name))")


class Producer:
    """An idempotent producer to one queue (``Acks.ALL``: ``send`` waits for the commit).

    Its first send (or :meth:`open`) opens a new epoch of ``producer_id`` (one small commit) and
    fences every older instance of the same id; constructing one only reads ``next_sequence``. ``hook`` is called with ``"committed"`` right after each commit,
    before ``send`` returns: an exception there is a lost acknowledgement (crash tests use it).
    """

    def __init__(
        self,
        queue: QueueHandle,
        *,
        producer_id: str | None = None,
        hook: Callable[[str], None] | None = None,
    ) -> None:
        call = f"{type(self).__name__}()"
        check_queue(queue, call=call)
        self.producer_id = check_producer_id(queue, producer_id, call=call)
        check_callable(hook, call=call, argument="hook", queue=queue.name)
        self.queue = queue
        self._state = SequenceState(queue, producer_id=self.producer_id)
        self._hook = hook or (lambda _step: None)
        self._lock = threading.Lock()

    @property
    def epoch(self) -> int | None:
        return self._state.epoch

    def open(self) -> int:
        """Open this instance's epoch now (the first send does it otherwise); return it."""
        with self._lock:
            self._state.check_usable()
            return self._state.open()

    @property
    def next_sequence(self) -> int:
        return self._state.next_sequence

    @property
    def pending_sequence(self) -> int | None:
        """The sequence of a failed send that must be resent before anything else (or None)."""
        return None if self._state.pending is None else self._state.pending[0]

    def send(
        self, data: Any, *, partition: str, sequence: int | None = None, **options: Any
    ) -> AppendResult:
        """Append one batch to ``partition``; see :meth:`send_many`."""
        return self.send_many({partition: data}, sequence=sequence, **options)

    def send_many(
        self, batches: Mapping[str, Any], *, sequence: int | None = None, **options: Any
    ) -> AppendResult:
        """Append ``{partition: batch}`` in one commit under the next (or the given) sequence.

        Passing ``sequence`` explicitly is how a resend after a lost acknowledgement is made from a
        new producer: the same sequence with the same content returns the original offsets.
        ``options``: ``delivery_hash``, ``message_type``, ``txn_id``, ``commit_metadata``,
        ``max_attempts``. Every argument is checked before anything changes: a bad one raises
        :class:`~cues_platform.queues.schema.InvalidArgumentError` (or the data's
        :class:`SchemaError`) and leaves the producer as it was.
        """
        prepared = options.pop("prepared", False)
        call = "Producer.send"
        if not isinstance(batches, Mapping):
            raise argument_error(call, "batches", batches, f"a {type(batches).__name__}",
                                 "a dict {partition: batch}", queue=self.queue.name)
        if sequence is not None:
            sequence = check_int(sequence, call=call, argument="sequence", queue=self.queue.name,
                                 expected="an int >= 0 (the batch's sequence number), or None "
                                 "for the producer's next one")
        options = check_options(options, call=call, allowed=SEND_OPTIONS, queue=self.queue.name)
        with self._lock:
            self._state.check_usable()
            tables = dict(batches) if prepared else prepare_batches(self.queue, batches)
            return self._state.send(
                tables, sequence=sequence, after_commit=lambda: self._hook("committed"), **options
            )

    def flush(self) -> None:
        """Nothing is buffered with ``Acks.ALL``."""

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PendingAppend(Future):
    """The offsets of a buffered send, known once its flush commits (``duplicate`` kept)."""


Item = tuple[str, pa.Table, PendingAppend]


class AsyncProducer(Producer):
    """``Acks.NONE``: buffer sends, commit them on ``flush()`` or after ``linger_seconds``.

    Delivery contract of a flush:

    1. If a previous flush failed in a way that may have committed, send that same merged batch
       again first (same sequence, same digest): it is written once, or found with
       ``duplicate=True``. Its futures stay unresolved until then.
    2. Merge what is buffered into one batch per partition and send it under the next sequence.
    3. On success resolve each future with its own offsets and the ``duplicate`` flag.
    4. On a refusal that proves nothing was written (fenced, sequence or digest mismatch) fail the
       futures with that error. On any other error keep the batch for step 1 and raise it from
       ``flush()``; ``close()`` fails what is still unresolved after its last try. A future never
       resolves OK for data whose digest the log does not hold.
    """

    def __init__(
        self,
        queue: QueueHandle,
        *,
        producer_id: str | None = None,
        linger_seconds: float = 0.05,
        max_buffered_rows: int = 100_000,
        hook: Callable[[str], None] | None = None,
    ) -> None:
        # checked before the producer exists: a bad value never starts the background thread
        call = "AsyncProducer()"
        check_queue(queue, call=call)
        linger = check_seconds(linger_seconds, call=call, argument="linger_seconds",
                               queue=queue.name)
        max_rows = check_int(max_buffered_rows, call=call, argument="max_buffered_rows",
                             minimum=1, queue=queue.name)
        super().__init__(queue, producer_id=producer_id, hook=hook)
        self.linger_seconds = linger
        self.max_buffered_rows = max_rows
        self._buffer: list[Item] = []
        self._rows = 0
        self._cond = threading.Condition()
        self._closed = False
        self._commit_lock = threading.Lock()
        self._error: BaseException | None = None
        self._retry: tuple[dict[str, pa.Table], list[Item]] | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"cues-producer-{self.producer_id}", daemon=True
        )
        self._thread.start()

    def send(
        self, data: Any, *, partition: str, sequence: int | None = None, **options: Any
    ) -> PendingAppend:  # type: ignore[override]
        if sequence is not None or options:
            argument, value = ("sequence", sequence) if sequence is not None else next(
                iter(options.items()))
            raise argument_error(
                "AsyncProducer.send", argument, value,
                "not accepted by an async producer (it assigns sequences and sends the buffered "
                "batches together)", f"no {argument}, or use acks='all' to pass it",
                queue=self.queue.name)
        self._state.check_usable()
        table = prepare_batches(self.queue, {partition: data})[partition]  # bad input fails now
        pending = PendingAppend()
        with self._cond:
            if self._closed:
                raise QueueError(
                    f"producer {self.producer_id!r} is closed", producer_id=self.producer_id
                )
            self._buffer.append((partition, table, pending))
            self._rows += table.num_rows
            if self._rows >= self.max_buffered_rows:
                self._cond.notify_all()
        return pending

    def _take(self) -> list[Item]:
        with self._cond:
            items, self._buffer, self._rows = self._buffer, [], 0
            return items

    def _deliver(self, tables: dict[str, pa.Table], items: list[Item]) -> None:
        try:
            result = Producer.send_many(self, tables, prepared=True)
        except (ProducerFencedError, SequenceError) as exc:
            # Step 4: refused before any commit
            self._retry = None
            for _, _, pending in items:
                pending.set_exception(exc)
            raise
        except BaseException:
            self._retry = (tables, items)  # Step 4: may have committed; resent by step 1
            raise
        self._retry = None
        # Step 3
        cursor = {p: start for p, (start, _) in result.ranges.items()}
        for partition, table, pending in items:
            start = cursor[partition]
            cursor[partition] = start + table.num_rows
            pending.set_result(
                AppendResult(
                    queue=self.queue.name,
                    ranges={partition: (start, start + table.num_rows)},
                    version=result.version,
                    duplicate=result.duplicate,
                )
            )

    def _flush_once(self) -> None:
        with self._commit_lock:  # keeps buffered sends in order across the thread and flush()
            # Step 1
            if self._retry is not None:
                self._deliver(*self._retry)
            # Step 2
            items = self._take()
            if not items:
                return
            by_part: dict[str, list[pa.Table]] = {}
            for partition, table, _ in items:
                by_part.setdefault(partition, []).append(table)
            self._deliver({p: pa.concat_tables(ts) for p, ts in by_part.items()}, items)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._closed:
                    self._cond.wait(self.linger_seconds)
                closed = self._closed
            try:
                self._flush_once()
            except Exception as exc:  # noqa: BLE001 - surfaced to the caller on flush/close
                self._error = exc
            if closed:
                return

    def flush(self) -> None:
        """Commit everything buffered now; raise the first error a background commit hit."""
        self._flush_once()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        try:
            self.flush()
        except BaseException as exc:
            # Step 4: nothing resolves OK after close; what may have committed is reported
            with self._commit_lock:
                left = ([] if self._retry is None else self._retry[1]) + self._take()
                self._retry = None
            for _, _, pending in left:
                if not pending.done():
                    pending.set_exception(exc)
            raise


ASYNC_ARGUMENTS = ("hook", "linger_seconds", "max_buffered_rows")


def make_producer(
    queue: QueueHandle, *, producer_id: str | None, acks: Acks | str = Acks.ALL, **kwargs: Any
) -> Producer:
    call = "Queue.producer"
    level = check_choice(acks, Acks, call=call, argument="acks", queue=queue.name)
    allowed = ("hook",) if level is Acks.ALL else ASYNC_ARGUMENTS
    for name, value in kwargs.items():
        if name not in allowed:
            problem = ("accepted only with acks='none'" if name in ASYNC_ARGUMENTS
                       else "not an argument of a producer")
            raise argument_error(call, name, value, problem,
                                 f"only {', '.join(allowed)} with acks={level.value!r}",
                                 queue=queue.name)
    if level is Acks.ALL:
        return Producer(queue, producer_id=producer_id, **kwargs)
    return AsyncProducer(queue, producer_id=producer_id, **kwargs)
