"""A :class:`~cues_platform.pipes.storage.StreamStore` over the platform's Delta queues.

Each payload becomes one row of a one-column queue (``payload``: the payload encoded with the
pipes' JSON codec, so envelopes nest as they do on the loopback route). The queue's dense
``_offset`` column is the stream offset: offsets start at 0 and grow by one per append, which is
exactly the monotonic index the stream pipe requires. The data lives in the Delta table, so it
survives the crash of every worker and of the process; a new :class:`DeltaStreamStore` over the
same lake root and queue name sees everything appended before.

Only this module of :mod:`cues_platform.pipes` imports the queue layer (the package's
``__init__`` does not import it): the in-memory pipes need no Delta.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from cues_platform.queues import Lake, Queue, QueueError

from .errors import StorageError
from .messages import decode, encode

PAYLOAD = "payload"
OFFSET = "_offset"


class DeltaStreamStore:
    """Stream storage backed by one partition of a Delta queue."""

    def __init__(self, *, queue: Queue, partition: str = "0", producer_id: str = "pipes") -> None:
        self.queue = queue
        self.partition = partition
        self._producer = queue.producer(producer_id=producer_id)

    @classmethod
    def open(
        cls,
        *,
        root: str,
        name: str,
        partition: str = "0",
        producer_id: str = "pipes",
    ) -> DeltaStreamStore:
        """Create (or reuse) the queue ``name`` under the lake ``root`` and wrap it."""
        try:
            queue = Lake(root=root).create_queue(
                name,
                schema=pa.schema([(PAYLOAD, pa.string())]),
                partitions=[partition],
                exist_ok=True,
            )
        except QueueError as exc:
            raise StorageError(f"cannot open Delta queue {name!r}: {exc}") from exc
        return cls(queue=queue, partition=partition, producer_id=producer_id)

    def append(self, payload: Any) -> int:
        batch = pa.table({PAYLOAD: pa.array([encode(payload).decode()], pa.string())})
        try:
            result = self._producer.send(batch, partition=self.partition)
        except QueueError as exc:
            raise StorageError(f"append to {self.queue.name!r} failed: {exc}") from exc
        return int(result.first_offset)

    def read(self, start: int, limit: int) -> list[tuple[int, Any]]:
        if start < 0 or limit < 1:
            raise StorageError(f"bad read window start={start} limit={limit}")
        try:
            table = self.queue.read_arrow(partition=self.partition, start=start, end=start + limit)
        except QueueError as exc:
            raise StorageError(f"read from {self.queue.name!r} failed: {exc}") from exc
        offsets = table.column(OFFSET).to_pylist()
        payloads = table.column(PAYLOAD).to_pylist()
        return [(int(o), decode(p.encode())) for o, p in zip(offsets, payloads, strict=True)]

    def end(self) -> int:
        last = self.queue.last_offset(partition=self.partition)
        return 0 if last is None else last + 1
