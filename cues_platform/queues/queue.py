"""The queue users hold: the snapshot handle (``handle.py``) with the operations as methods.

Floor 4 of ``queues/`` (docs/architecture.md), the face: each method hands this handle to the
operation that implements it (``appender``, ``producer``, ``reader``, ``tailer``), which take any
:class:`~cues_platform.queues.handle.QueueHandle` and know nothing of this class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from cues_platform.queues.appender import AppendResult, append_batches
from cues_platform.queues.handle import QueueHandle
from cues_platform.queues.producer import Acks, Producer, make_producer
from cues_platform.queues.reader import Isolation, read_arrow, read_spark
from cues_platform.queues.tailer import Tailer


class Queue(QueueHandle):
    """A queue: its contract, partitions, snapshot and offsets, and what can be done with it."""

    # -- writing (appender.py / producer.py) -------------------------------------------------------
    def append(self, data: Any, *, partition: str, **kwargs: Any) -> AppendResult:
        """Append one batch to one partition as exactly one Delta commit (see ``appender``)."""
        return append_batches(self, {partition: data}, **kwargs)

    def append_many(self, batches: Mapping[str, Any], **kwargs: Any) -> AppendResult:
        """Append batches to several partitions of this queue in one Delta commit."""
        return append_batches(self, batches, **kwargs)

    def producer(
        self, *, producer_id: str | None = None, acks: Acks | str = "all", **kwargs: Any
    ) -> Producer:
        return make_producer(self, producer_id=producer_id, acks=acks, **kwargs)

    # -- reading (reader.py / tailer.py) -----------------------------------------------------------
    def read_arrow(
        self, *, partition: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> pa.Table:
        return read_arrow(self, partition=partition, start=start, end=end, **kwargs)

    def read_spark(
        self, spark: Any, *, partition: str, start: int | None = None, end: int | None = None,
        **kwargs: Any
    ) -> Any:
        return read_spark(self, spark, partition=partition, start=start, end=end, **kwargs)

    def tailer(
        self, name: str, *, partition: str, isolation: Isolation | str = "read_committed",
        expendable: bool = False,
    ) -> Tailer:
        """A named, durable read position (``tailer.py``). An ``expendable`` tailer does not hold
        back retention: when retention passes it, it is moved to the start offset and told so
        (``Tailer.retained_away``)."""
        return Tailer(queue=self, name=name, partition=partition, isolation=isolation,
                      expendable=expendable)
