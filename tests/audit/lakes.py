"""The audit tests' lake: a map + fork graph (a source file, so that `cues run` subprocesses load
exactly the same one) and helpers that append what a buggy processor would."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from cues_platform.audit import AuditReport
from cues_platform.processing import BackingQueue, Graph, Range, Record, RecordType
from cues_platform.processing.history import processor_history
from cues_platform.processing.runner import create_queues
from cues_platform.processing.step import Snapshot
from cues_platform.queues import Lake

# The graph is a source file so that `cues run` subprocesses load exactly the same one.
GRAPH_SOURCE = '''
"""Test graph: enrich (map) doubles amounts, split (fork) routes them by size."""
import pyarrow as pa
from pyspark.sql import functions as F

from cues_platform.processing import ERROR_SCHEMA, Graph, In, Kind, OnError, Options, Out, Processor, QueueDef

ORDERS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.int64())])
ENRICHED = pa.schema([pa.field("id", pa.int64()), pa.field("amount", pa.int64()),
                      pa.field("double", pa.int64())])


def enrich(ctx, orders):
    if ctx.step == 2:
        raise ValueError("bad batch")  # handled: one row to the error queue (whole_step)
    return orders.select("id", "amount", (F.col("amount") * 2).alias("double"))


def split(ctx, enriched):
    if ctx.step == 1:
        return None  # a nil step
    return {"big": enriched.where(F.col("amount") >= 50).select("id", "amount"),
            "small": enriched.where(F.col("amount") < 50).select("id", "amount")}


graph = Graph.build(
    name="shop",
    queues=[QueueDef("orders", ORDERS), QueueDef("enriched", ENRICHED), QueueDef("big", ORDERS),
            QueueDef("small", ORDERS), QueueDef("errors", ERROR_SCHEMA)],
    processors=[
        Processor("enrich", Kind.MAP, enrich, {"orders": In("orders")}, {"out": Out("enriched")},
                  options=Options(batch_size=10, poll_interval=0.2, on_error=OnError.WHOLE_STEP)),
        Processor("split", Kind.FORK, split, {"enriched": In("enriched")},
                  {"big": Out("big"), "small": Out("small")},
                  options=Options(batch_size=10, poll_interval=0.2)),
    ],
    error_queue="errors",
)
'''
MODULE = "tests_graph_module"
ORDERS = 30  # enrich: steps 0, 1 (output) and 2 (error) over [0,10) [10,20) [20,30);
# split: step 0 (output) and 1 (nil) over enriched [0,10) [10,20)


def write_graph(folder: Path) -> Path:
    path = folder / f"{MODULE}.py"
    path.write_text(GRAPH_SOURCE)
    return path


def orders(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "amount": pa.array([i * 7 % 100 for i in ids], pa.int64()),
        }
    )


def seed(graph: Graph, lake: Lake, count: int = ORDERS) -> None:
    create_queues(graph, lake)
    lake.queue("orders").append(orders(0, count), partition="0")


def attempts(lake: Lake, processor: str) -> list[Record]:
    """Every step's attempt (backing records and one-commit steps' home commits)."""
    return [r for r in processor_history(lake, processor) if r.is_attempt]


def append_step(
    lake: Lake,
    processor: str,
    inputs: dict[str, Range],
    *,
    alts: str | None = None,
    kind: RecordType = RecordType.ATTEMPT_NIL,
    outputs: dict | None = None,
    attempt: bool = True,
) -> Snapshot:
    """Append what a buggy processor would: the next step's snapshot and (by default) attempt."""
    backing = BackingQueue(lake, processor)
    epoch = backing.epoch()
    step = processor_history(lake, processor)[-1].step + 1
    snapshot = Snapshot(processor, step, inputs, alts)
    backing.append(Record(RecordType.SNAPSHOT, snapshot, epoch))
    if attempt:
        backing.append(Record(kind, snapshot, epoch, outputs or {}))
    return snapshot


def only(report: AuditReport, kind: str) -> list:
    assert not report.ok
    assert {v.kind for v in report.violations} == {kind}, report.to_text()
    return report.by_kind(kind)


