"""A step's output written by Spark's executors and committed by reference (no row on the driver).

Used for a step whose function returns one Spark DataFrame for one output with a fixed partition
and no pandas contract to check row by row (``Options.output_writer``; see :class:`~cues_platform.processing.model.OutputWriter`).
For that output, :func:`write_by_executors`:

1. Checks the DataFrame's columns against the queue's payload schema (names and Spark types,
   without running anything). A mismatch is not an error here: the step is written by the
   driver, whose ``conform`` names the column and what to change.
2. Reads the partition's next offset ``start`` (the step's commit re-checks it).
3. Job 1: runs the user's plan with each row's Spark partition id and its index inside that
   partition (``monotonically_increasing_id`` is ``partition_id << 33 | index``) and counts the
   rows of each Spark partition. The driver turns the counts into one base offset per Spark
   partition: ``start`` plus the rows before it. The plan is not cached by default (``cache``):
   on 1M rows, building Spark's in-memory cache cost more than running a read-and-transform plan
   twice (measured: count 0.36 s + write 1.33 s recomputed, 2.4 s + 0.96 s cached). A plan that
   is not deterministic may number its rows differently in job 2: step 5 then finds the gap or
   repeat and the rows are rewritten, so the result stays right, only slower.
4. Job 2: the executors write the rows as Parquet files into a fresh folder of the queue
   (``_partition={p}/step-{hash8}-{uuid}``), each row with ``_offset = base + index`` and the
   other metadata columns (delivery hash, message type, append time) as literals.
5. The driver reads the files' footers only and verifies them
   (:func:`cues_platform.queues.by_reference.verify_written`): the offsets tile
   ``[start, start + rows)`` with no gap or repeat, the payload types are the queue's, required
   columns hold no null. Files that fail are read back as Arrow (payload columns only) and
   the step continues on the driver path with those rows; nothing is computed twice.

The step's commit (``processing/home.py`` for exactly_once, ``outputs.commit_direct`` otherwise)
then commits the files by reference; if another writer appended to the partition in between,
the rows are read back and appended with new offsets (``by_reference.append_written``).

A queue with based offsets (``OffsetLayout.BASED``, ``queues/based.py``) is written in ONE job
instead (:func:`write_based`): Step 1 as above; the executors write each row with ``_offset`` =
its index in its task's file (``monotonically_increasing_id`` minus the task's shift: no counting
job, the plan runs once); the driver reads the footers and checks each file holds ``0 .. n-1``
(``by_reference.verify_based``); the commit assigns each file its base from the partition's next
offset at that moment, so a writer that moved the partition meanwhile costs a new base, not a
rewrite. A task that wrote its rows in another order or split them over files fails the check
and the rows go the driver path, as in Step 5.

On abort anywhere here (exception, SIGKILL) nothing is committed: the files are orphans in no
snapshot, which ``cues queue maintain`` (vacuum) removes after the retention; the step is planned
again by recovery exactly as on the driver path. Driver memory holds the counts and the footers,
not the rows: it does not grow with the step's size.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyarrow import fs

from cues_platform import clock
from cues_platform.processing.contracts import checked_in_step
from cues_platform.processing.graph import Graph
from cues_platform.processing.model import Out, OutputWriter, Processor, Strategy
from cues_platform.processing.outputs import to_arrow
from cues_platform.queues import Queue
from cues_platform.queues.by_reference import (
    NotCommittableError,
    WrittenPart,
    filesystem_of,
    read_footer,
    read_written_paths,
    verify_based,
    verify_written,
)
from cues_platform.queues.names import join_uri
from cues_platform.queues.schema import (
    APPEND_TIME,
    DELIVERY_HASH,
    MESSAGE_TYPE,
    OFFSET,
    PRODUCER_ID,
    PRODUCER_SEQ,
    RESERVED,
    TXN_ID,
    check_batch_rows,
)
from cues_platform.queues.spark_values import step_constant

# OutputWriter.AUTO: executors only for steps reading more than this many input rows. Measured on
# 2 local cores (docs/benchmarks.md): Spark's Parquet writer took 2.1 s for 1M rows in one task
# where collecting to Arrow and delta-rs' writer took 1.3 s for the whole step, so below this the
# driver is faster; above it the driver's memory grows with the step and the executors' does not.
AUTO_EXECUTOR_ROWS = 1_000_000
# The same for a queue with based offsets, where the executors' write is ONE job: measured on 2
# quiet local cores (docs/benchmarks.md, write_cost-4.json), the executors' write of a 1M backlog
# step and the driver's are level (0.98x), and 10 steps of 100k are slower on the executors (Spark's
# Parquet writer, row by row, against Arrow and delta-rs), so the threshold stays; above it the one
# job saves the counting job and the rewrite when another writer moved the partition.
_PID, _MID = "__cues_pid", "__cues_mid"


def is_spark_frame(value: Any) -> bool:
    return hasattr(value, "sparkSession") and hasattr(value, "write") and hasattr(value, "schema")


def executor_output(
    processor: Processor, graph: Graph, by_binding: Mapping[str, Any], *, home: str | None,
    input_rows: int,
) -> Out | None:
    """The output the executors can write for this step's result, or None (the driver writes)."""
    writer = processor.options.output_writer
    if writer is OutputWriter.DRIVER or len(by_binding) != 1:
        return None
    binding, value = next(iter(by_binding.items()))
    out = processor.outputs[binding]
    if not is_spark_frame(value) or out.partition_column is not None or out.partition is None:
        return None
    if checked_in_step(graph.queues[out.queue].contract):
        return None  # rows to split off on the driver (a pyspark contract is the Dagster check's)
    if processor.strategy is Strategy.EXACTLY_ONCE and out.queue != home:
        return None  # an attempt over several queues stages its files; not this path
    if writer is OutputWriter.AUTO and input_rows <= AUTO_EXECUTOR_ROWS:
        return None
    return out


def _matches(frame: Any, queue: Queue) -> bool:
    """Step 1: the frame's payload columns are the queue's, in Spark types equal to its own."""
    from pyspark.sql.pandas.types import from_arrow_type

    types = {f.name: f.dataType for f in frame.schema.fields if f.name not in RESERVED}
    payload = queue.payload_schema
    if set(types) != set(payload.names):
        return False
    try:
        return all(types[f.name] == from_arrow_type(f.type) for f in payload)
    except TypeError:  # an Arrow type Spark has no equivalent of
        return False


def write_by_executors(
    frame: Any, queue: Queue, *, partition: str, delivery_hash: str, message_type: str = "message",
    cache: bool = False,
) -> WrittenPart | pa.Table | None:
    """Steps 1-5 of the module docstring: the verified files (``WrittenPart``), or the rows as an
    Arrow table for the driver path (Step 1 or Step 5 refused), or None when the step has no row."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    # Step 1
    if not _matches(frame, queue):
        return to_arrow(frame)
    queue.check_partition(partition)
    if queue.based:
        return write_based(frame, queue, partition=partition, delivery_hash=delivery_hash,
                           message_type=message_type)
    spark = frame.sparkSession
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    # Step 2
    start = queue.next_offset(partition)
    # Step 3
    payload = queue.payload_schema
    cached = frame.select(*[F.col(n) for n in payload.names],
                          F.spark_partition_id().alias(_PID),
                          F.monotonically_increasing_id().alias(_MID))
    if cache:
        cached = cached.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counts = {int(r[0]): int(r[1]) for r in cached.groupBy(_PID).count().collect()}
        rows = sum(counts.values())
        if rows == 0:
            return None
        check_batch_rows(rows, queue=queue.name, max_rows=queue.max_batch_rows)
        bases, acc = [], start
        for pid in sorted(counts):
            bases += [F.lit(pid), F.lit(acc)]
            acc += counts[pid]
        base = F.create_map(*bases)[F.col(_PID)]
        index = F.col(_MID) - F.shiftleft(F.col(_PID).cast("long"), 33)
        # Step 4
        relative = _step_folder(partition, delivery_hash)
        out = cached.select(*[F.col(n) for n in payload.names],
                            *_metadata_columns(base + index, delivery_hash, message_type))
        # "error" (= errorifexists): the one spelling Spark Connect's writer accepts too
        out.write.mode("error").parquet(join_uri(queue.uri, relative))
    finally:
        if cache:
            cached.unpersist()
    # Step 5
    names = _parquet_files(queue, relative)
    try:
        footers = [read_footer(queue, f"{relative}/{name}") for name in names]
        return verify_written(queue, partition, start, footers)
    except NotCommittableError:
        return read_written_paths(queue, [f"{relative}/{name}" for name in names])


def write_based(frame: Any, queue: Queue, *, partition: str, delivery_hash: str,
                message_type: str = "message") -> WrittenPart | pa.Table | None:
    """The one-job write of a queue with based offsets (module docstring); Step 1 is the
    caller's. The verified files (``WrittenPart`` with ``based``), the rows as Arrow when the
    files cannot be committed as written, or None when the step has no row."""
    from pyspark.sql import functions as F  # lazy: Spark only where a step's output is a DataFrame

    spark = frame.sparkSession
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    start = queue.next_offset(partition)  # what the commit expects; the bases are set there
    relative = _step_folder(partition, delivery_hash)
    index = F.monotonically_increasing_id() - F.shiftleft(F.spark_partition_id().cast("long"), 33)
    out = frame.select(*[F.col(n) for n in queue.payload_schema.names],
                       *_metadata_columns(index, delivery_hash, message_type))
    # one file per task: a file's rows are its task's rows, indexed 0..n-1 in order
    out.write.mode("error").option("maxRecordsPerFile", 0).parquet(join_uri(queue.uri, relative))
    names = _parquet_files(queue, relative)
    try:
        footers = [read_footer(queue, f"{relative}/{name}") for name in names]
        written = verify_based(queue, partition, start, footers)
    except NotCommittableError:
        return read_written_paths(queue, [f"{relative}/{name}" for name in names], based=True)
    if written.rows == 0:
        return None
    check_batch_rows(written.rows, queue=queue.name, max_rows=queue.max_batch_rows)
    return written


def _step_folder(partition: str, delivery_hash: str) -> str:
    return f"_partition={partition}/step-{delivery_hash[:8]}-{uuid.uuid4().hex[:12]}"


def _metadata_columns(offset: Any, delivery_hash: str, message_type: str) -> list[Any]:
    """The metadata columns of rows the executors write, ``offset`` as ``_offset``."""
    from pyspark.sql import functions as F  # lazy: Spark only where a step's output is a DataFrame

    return [
        offset.cast("long").alias(OFFSET),
        F.lit(None).cast("string").alias(PRODUCER_ID),
        F.lit(None).cast("long").alias(PRODUCER_SEQ),
        F.lit(delivery_hash).alias(DELIVERY_HASH),  # a string literal: a reference, not code
        F.lit(message_type).alias(MESSAGE_TYPE),
        # the platform's clock, like the driver's appends (retention by age reads it); data, not
        # code: a new literal every step recompiled the write's stage (spark_values.py)
        F.timestamp_micros(step_constant(clock.now_ms() * 1000)).alias(APPEND_TIME),
        F.lit(None).cast("string").alias(TXN_ID),
    ]


def _parquet_files(queue: Queue, relative: str) -> list[str]:
    filesystem, path = filesystem_of(join_uri(queue.uri, relative), queue.lake.options)
    infos = filesystem.get_file_info(fs.FileSelector(path))
    return sorted(i.base_name for i in infos
                  if i.base_name.endswith(".parquet") and not i.base_name.startswith((".", "_")))
