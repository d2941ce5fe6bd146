"""Durable tailer positions: one small Delta table for the whole lake.

A position commit appends one row (for humans and audits) and sets the app transaction
``pos:{queue}/{tailer}/{partition}`` to the next offset to read, so loading a position is one O(1)
lookup in the snapshot. Seeking backwards is allowed (delta-rs accepts a lower version).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from cues_platform.queues.lake import Lake

SCHEMA = pa.schema(
    [
        pa.field("queue", pa.string(), nullable=False),
        pa.field("tailer", pa.string(), nullable=False),
        pa.field("partition", pa.string(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


def open_system_table(lake: Lake, name: str, schema: pa.Schema) -> DeltaTable:
    """Open (creating on first use, race-free across processes) a system Delta table."""
    uri = lake.system_uri(name)
    if not DeltaTable.is_deltatable(uri, storage_options=lake.options):
        try:
            DeltaTable.create(uri, schema, mode="ignore", storage_options=lake.options)
        except (CommitFailedError, DeltaError):
            if not DeltaTable.is_deltatable(uri, storage_options=lake.options):
                raise
    return DeltaTable(uri, storage_options=lake.options)


def position_app_id(queue: str, tailer: str, partition: str) -> str:
    return f"pos:{queue}/{tailer}/{partition}"


class PositionStore:
    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self._dt = open_system_table(lake, "positions", SCHEMA)

    def get(self, *, queue: str, tailer: str, partition: str) -> int | None:
        self._dt.update_incremental()
        version = self._dt.transaction_version(position_app_id(queue, tailer, partition))
        return None if version is None else int(version)

    def commit(self, *, queue: str, tailer: str, partition: str, position: int) -> None:
        self.commit_many([(queue, tailer, partition, position)])

    def commit_many(self, positions: list[tuple[str, str, str, int]]) -> None:
        """Commit several ``(queue, tailer, partition, position)`` in ONE Delta commit (atomic)."""
        if not positions:
            return
        now = datetime.now(UTC)
        rows = pa.table(
            {
                "queue": [p[0] for p in positions],
                "tailer": [p[1] for p in positions],
                "partition": [p[2] for p in positions],
                "position": [p[3] for p in positions],
                "committed_at": [now] * len(positions),
            },
            schema=SCHEMA,
        )
        self._dt.update_incremental()
        write_deltalake(
            self._dt,
            rows,
            mode="append",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(position_app_id(q, t, p), pos) for q, t, p, pos in positions],
                max_commit_retries=50,
            ),
        )
