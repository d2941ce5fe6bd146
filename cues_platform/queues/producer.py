"""Producers: idempotent (Kafka's ``enable.idempotence``) with two durability levels (``acks``).

* ``Acks.ALL`` (default): ``send`` returns once the batch is committed; the offsets are final.
* ``Acks.NONE``: ``send`` buffers and returns a :class:`PendingAppend` at once; a background thread
  (after ``linger_seconds``) or an explicit ``flush()`` commits everything buffered as one batch.
  A crash loses what was buffered but not flushed; nothing is ever written twice.

Idempotence: each batch has a sequence number, committed atomically with the batch as the app
transaction ``prod:{producer_id}``. Resending a committed sequence (the acknowledgement was lost)
returns the original offsets and writes nothing; a gap raises :class:`SequenceError`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cues_platform.queues.appender import AppendResult, append_batches, prepare_batches
from cues_platform.queues.errors import QueueError, SequenceError
from cues_platform.queues.names import validate_id
from cues_platform.queues.schema import OFFSET, PARTITION, PRODUCER_ID, PRODUCER_SEQ

if TYPE_CHECKING:
    from cues_platform.queues.queue import Queue


class Acks(StrEnum):
    ALL = "all"
    NONE = "none"


def producer_app_id(producer_id: str) -> str:
    return f"prod:{producer_id}"


def find_sequence(
    queue: Queue, dt: DeltaTable, producer_id: str, sequence: int
) -> dict[str, tuple[int, int]]:
    """Offsets written by ``(producer_id, sequence)``, per partition (empty if none)."""
    dataset = dt.to_pyarrow_dataset()
    expr = (pc.field(PRODUCER_ID) == producer_id) & (pc.field(PRODUCER_SEQ) == sequence)
    rows = dataset.to_table(columns=[PARTITION, OFFSET], filter=expr)
    out: dict[str, tuple[int, int]] = {}
    for part in set(rows[PARTITION].to_pylist()):
        offs = rows.filter(pc.equal(rows[PARTITION], part))[OFFSET]
        out[part] = (pc.min(offs).as_py(), pc.max(offs).as_py() + 1)
    return out


def sequence_guard(queue: Queue, producer_id: str, sequence: int):
    """The idempotence check run on every append attempt (appender step 2)."""

    def guard(dt: DeltaTable) -> AppendResult | None:
        last = dt.transaction_version(producer_app_id(producer_id))
        expected = 0 if last is None else int(last) + 1
        if sequence == expected:
            return None
        if sequence > expected:
            raise SequenceError(
                f"queue {queue.name!r}: producer {producer_id!r} sent sequence {sequence} but the "
                f"next expected is {expected} (a gap: batches {expected}..{sequence - 1} were never "
                "committed); resend them in order",
                queue=queue.name,
                producer_id=producer_id,
                sequence=sequence,
                expected=expected,
            )
        ranges = find_sequence(queue, dt, producer_id, sequence)
        if not ranges:
            raise SequenceError(
                f"queue {queue.name!r}: producer {producer_id!r} sent sequence {sequence}, which is "
                f"behind the committed {expected - 1} and matches no stored batch (out of order)",
                queue=queue.name,
                producer_id=producer_id,
                sequence=sequence,
                expected=expected,
            )
        return AppendResult(queue=queue.name, ranges=ranges, duplicate=True)

    return guard


class Producer:
    """An idempotent producer to one queue (``Acks.ALL``: ``send`` waits for the commit)."""

    def __init__(self, queue: Queue, *, producer_id: str | None = None) -> None:
        self.queue = queue
        self.producer_id = validate_id(
            producer_id or f"anon-{uuid.uuid4().hex}", kind="producer id"
        )
        last = queue.refresh().transaction_version(producer_app_id(self.producer_id))
        self.next_sequence = 0 if last is None else int(last) + 1
        self._lock = threading.Lock()

    def send(
        self, data: Any, *, partition: str, sequence: int | None = None, **options: Any
    ) -> AppendResult:
        """Append one batch to ``partition``; see :meth:`send_many`."""
        return self.send_many({partition: data}, sequence=sequence, **options)

    def send_many(
        self, batches: Mapping[str, Any], *, sequence: int | None = None, **options: Any
    ) -> AppendResult:
        """Append ``{partition: batch}`` in one commit under the next (or the given) sequence.

        Passing ``sequence`` explicitly is how a resend after a lost acknowledgement is made: the
        same sequence returns the original offsets.
        """
        with self._lock:
            seq = self.next_sequence if sequence is None else sequence
            result = append_batches(
                self.queue,
                batches,
                guards=[
                    sequence_guard(self.queue, self.producer_id, seq),
                    *options.pop("guards", []),
                ],
                producer_id=self.producer_id,
                sequence=seq,
                app_transactions=[
                    (producer_app_id(self.producer_id), seq),
                    *options.pop("app_transactions", []),
                ],
                **options,
            )
            self.next_sequence = max(self.next_sequence, seq + 1)
            return result

    def flush(self) -> None:
        """Nothing is buffered with ``Acks.ALL``."""

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PendingAppend(Future):
    """The offsets of a buffered send, known once its flush commits."""


class AsyncProducer(Producer):
    """``Acks.NONE``: buffer sends, commit them on ``flush()`` or after ``linger_seconds``."""

    def __init__(
        self,
        queue: Queue,
        *,
        producer_id: str | None = None,
        linger_seconds: float = 0.05,
        max_buffered_rows: int = 100_000,
    ) -> None:
        super().__init__(queue, producer_id=producer_id)
        self.linger_seconds = linger_seconds
        self.max_buffered_rows = max_buffered_rows
        self._buffer: list[tuple[str, pa.Table, PendingAppend]] = []
        self._rows = 0
        self._cond = threading.Condition()
        self._closed = False
        self._commit_lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"cues-producer-{self.producer_id}", daemon=True
        )
        self._thread.start()

    def send(
        self, data: Any, *, partition: str, sequence: int | None = None, **options: Any
    ) -> PendingAppend:  # type: ignore[override]
        if sequence is not None or options:
            raise QueueError(
                "an async producer assigns sequences itself; use Acks.ALL to pass them"
            )
        table = prepare_batches(self.queue, {partition: data})[
            partition
        ]  # bad input fails here, now
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

    def _take(self) -> list[tuple[str, pa.Table, PendingAppend]]:
        with self._cond:
            items, self._buffer, self._rows = self._buffer, [], 0
            return items

    def _commit(self, items: list[tuple[str, pa.Table, PendingAppend]]) -> None:
        if not items:
            return
        by_part: dict[str, list[pa.Table]] = {}
        for partition, table, _ in items:
            by_part.setdefault(partition, []).append(table)
        try:
            result = Producer.send_many(
                self, {p: pa.concat_tables(ts) for p, ts in by_part.items()}, prepared=True
            )
        except BaseException as exc:
            for _, _, pending in items:
                pending.set_exception(exc)
            raise
        cursor = {p: start for p, (start, _) in result.ranges.items()}
        for partition, table, pending in items:
            start = cursor[partition]
            cursor[partition] = start + table.num_rows
            pending.set_result(
                AppendResult(
                    queue=self.queue.name,
                    ranges={partition: (start, start + table.num_rows)},
                    version=result.version,
                )
            )

    def _flush_once(self) -> None:
        with self._commit_lock:  # keeps buffered sends in order across the thread and flush()
            self._commit(self._take())

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
        self.flush()


def make_producer(
    queue: Queue, *, producer_id: str | None, acks: Acks | str = Acks.ALL, **kwargs: Any
) -> Producer:
    level = Acks(acks)
    if level is Acks.ALL:
        return Producer(queue, producer_id=producer_id, **kwargs)
    return AsyncProducer(queue, producer_id=producer_id, **kwargs)
