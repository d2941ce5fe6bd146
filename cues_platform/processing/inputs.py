"""A step's inputs as the function gets them: Spark DataFrames or pyarrow Tables (``ReadAs``).

Both forms hold the same rows: the step's half-open range ``[start, end)`` of one queue
partition, planned once by :func:`~cues_platform.queues.reader.plan_read` (the snapshot's files
pruned by their ``_offset`` statistics, aborted transactions hidden), with the queue's metadata
columns. A Spark frame is lazy (Spark reads the files when the function's plan runs); an Arrow
table is read here, by the driver, sorted by offset. Isolation narrows either form to a sub-range
(:func:`rows_between`) and reads the failing rows back (:func:`rows_at`) without planning again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cues_platform.processing.model import ReadAs
from cues_platform.queues.handle import QueueHandle
from cues_platform.queues.reader import ReadPlan, execute_arrow, execute_spark, where_offsets
from cues_platform.queues.schema import OFFSET
from cues_platform.spark.client import is_connect


def read_input(queue: QueueHandle, plan: ReadPlan, *, read_as: ReadAs, spark: Any) -> Any:
    """The planned range as the function gets it. A missing data file fails HERE for both forms
    (Arrow reads now; a Connect frame resolves its schema now), inside the caller's READ phase."""
    if read_as is ReadAs.ARROW:
        return execute_arrow(queue, plan)
    frame = execute_spark(queue, spark, plan)
    if is_connect(spark):
        frame.schema  # noqa: B018 - Connect resolves lazily: a missing file fails HERE
    return frame


def rows_between(frame: Any, start: int, end: int) -> Any:
    """The rows of ``frame`` with ``start <= _offset < end``, in the frame's own form."""
    if isinstance(frame, pa.Table):
        return frame.filter((pc.field(OFFSET) >= start) & (pc.field(OFFSET) < end))
    # the bounds as data: each half isolation reads runs the stage compiled once (spark_values.py)
    return where_offsets(frame, start, end, connect=is_connect(frame.sparkSession))


def rows_at(frame: Any, offsets: Sequence[int]) -> pa.Table:
    """The rows of ``frame`` at ``offsets``, as Arrow (a Spark frame runs one job for them)."""
    if isinstance(frame, pa.Table):
        return frame.filter(pc.field(OFFSET).isin(pa.array(list(offsets), pa.int64())))
    listed = ", ".join(str(int(o)) for o in offsets)
    return frame.where(f"{OFFSET} IN ({listed})").toArrow()
