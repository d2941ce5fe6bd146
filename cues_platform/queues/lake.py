"""The lake users hold: the location (``location.py``) opening and creating :class:`Queue`\\ s.

Floor 4 of ``queues/`` (docs/architecture.md), beside ``queue.py``. Layout::

    {root}/queues/{name}/          one Delta table per queue
    {root}/_cues/positions/        durable tailer positions (one small Delta table)
    {root}/_cues/transactions/     the transaction coordinator's log
    {root}/_cues/backing/{proc}/   processors' backing queues (processing layer)
    {root}/_cues/staging/          prepared, not yet committed outputs (processing layer)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from cues_platform.queues.errors import QueueExistsError
from cues_platform.queues.layout import OffsetLayout
from cues_platform.queues.location import DEFAULT_MAX_BATCH_ROWS, LakeLocation
from cues_platform.queues.queue import Queue


@dataclass(frozen=True)
class Lake(LakeLocation):
    """Where queues live, and the door to them. ``storage_options`` go to delta-rs unchanged
    (credentials come from the environment or these options; they are never logged)."""

    def queue(self, name: str, *, uri: str | None = None) -> Queue:
        """Open an existing queue (``uri`` places system queues outside ``queues/``)."""
        return Queue(lake=self, name=name, uri=uri)

    def create_queue(
        self,
        name: str,
        *,
        schema: pa.Schema,
        partitions: Sequence[str] = ("0",),
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        description: str = "",
        exist_ok: bool = False,
        uri: str | None = None,
        properties: Mapping[str, str] | None = None,
        offset_layout: OffsetLayout = OffsetLayout.ABSOLUTE,
    ) -> Queue:
        """Create a queue (an empty Delta table) and return its handle.

        With ``exist_ok`` an existing queue of the same payload schema is returned; a different
        schema raises :class:`QueueExistsError` rather than silently mixing contracts.
        ``properties`` are extra Delta table properties set at creation (``delta.*`` only).
        ``offset_layout`` (:class:`~cues_platform.queues.layout.OffsetLayout`) is fixed at
        creation; an existing queue keeps its own.
        """
        table = self.create_queue_table(
            name, schema=schema, partitions=partitions, max_batch_rows=max_batch_rows,
            description=description, uri=uri, properties=properties, offset_layout=offset_layout)
        existing = self.queue(name, uri=table.uri)
        if table.created:
            return existing
        # there already, or another creator won the race: its queue, under the same checks
        if not existing.payload_schema.equals(table.payload):
            raise QueueExistsError(
                f"queue {name!r} already exists with schema {existing.payload_schema}; "
                "pick another name or drop the old queue",
                queue=name,
            )
        if not exist_ok:
            raise QueueExistsError(
                f"queue {name!r} already exists; pass exist_ok=True to reuse it", queue=name
            )
        missing = [p for p in table.partitions if p not in existing.partitions]
        if missing:
            existing.add_partitions(missing)
        return existing
