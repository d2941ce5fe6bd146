"""What a processor function sees besides its input DataFrames."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cues_platform.processing.model import Options
from cues_platform.queues import Lake, Producer, Queue, Tailer


@dataclass
class StepContext:
    """``processor_id``, ``step`` and ``delivery_hash`` identify the step: the hash is the same on
    every retry, so sinks use it as an idempotency key. ``resources`` are the user's own objects
    (a DB connection, a client) passed to the runner."""

    processor_id: str
    step: int
    delivery_hash: str
    options: Options
    lake: Lake
    spark: Any = None
    resources: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)  # binding -> Range, for information
    # the host's own context: Dagster's AssetExecutionContext in a ``@processor_asset`` body
    # (``ctx.host.log.info(...)``), None under ``cues run``
    host: Any = None

    # Imperative and source processors get raw access:
    def queue(self, name: str) -> Queue:
        return self.lake.queue(name)

    def producer(self, queue: str) -> Producer:
        """An idempotent producer whose id is the processor id."""
        return self.lake.queue(queue).producer(producer_id=self.processor_id)

    def tailer(self, queue: str, *, partition: str = "0") -> Tailer:
        return self.lake.queue(queue).tailer(self.processor_id, partition=partition)
