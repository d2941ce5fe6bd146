"""Reading offset ranges of one partition, as Arrow (small reads) or Spark (large reads).

Both paths plan the same way: the snapshot's data files are pruned by their per-file ``_offset``
statistics (Delta ``add`` actions), so a read of 100k offsets from a 10M-row queue touches only
the files that hold them; Spark then reads those Parquet files itself (nothing passes through the
driver). Ranges are half-open, ``[start, end)``.

Isolation (Kafka's): ``read_uncommitted`` returns every row. ``read_committed`` hides rows of
aborted producer transactions and stops before the first row of an undecided one (the last stable
offset), so a reader never skips a row that later becomes visible. An undecided transaction past
its deadline is aborted while the last stable offset is computed (``transactions.
resolve_statuses``: a fenced coordinator decision), so a reader waits at most its timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from cues_platform.queues.based import bases_by_name, spark_offset
from cues_platform.queues.coordinator import TxnStatus, resolve_statuses
from cues_platform.queues.errors import OffsetOutOfRangeError
from cues_platform.queues.names import join_uri, validate_partition
from cues_platform.queues.schema import (
    BASE,
    OFFSET,
    PARTITION,
    TXN_ID,
    InvalidArgumentError,
    InvalidRangeError,
    argument_error,
    check_choice,
    check_int,
)
from cues_platform.queues.spark_values import step_constant, step_constant_sql

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from cues_platform.queues.handle import FileInfo, QueueHandle


# A stage compiled again costs 0.1-0.3 s on 2 local cores (bench_write_cost.py), about what
# decoding a quarter of a million rows does: fewer rows outside a read's range are read anyway.
PRUNING_MIN_ROWS = 1 << 18


class Isolation(StrEnum):
    READ_COMMITTED = "read_committed"
    READ_UNCOMMITTED = "read_uncommitted"


@dataclass(frozen=True)
class ReadPlan:
    """What a read touches: the files, the (possibly shortened) range and hidden transactions."""

    queue: str
    partition: str
    start: int
    end: int  # exclusive; shortened to the last stable offset under read_committed
    requested_end: int
    files: tuple[FileInfo, ...]
    hidden_txns: tuple[str, ...]  # aborted transactions whose rows are filtered out

    @property
    def empty(self) -> bool:
        return self.end <= self.start

    @property
    def whole_files(self) -> bool:
        """Every file's offsets lie inside ``[start, end)`` (their exact ``_offset`` statistics):
        the offset filter would keep every row, so the read skips it (Spark then need not read
        the ``_offset`` column to filter: ~0.1 s of a 1M-row backlog step's job)."""
        return all(self.start <= f.min_offset and f.max_offset < self.end for f in self.files)

    @property
    def pruning_pays(self) -> bool:
        """The files hold at least :data:`PRUNING_MIN_ROWS` rows outside the range: a filter with
        literal bounds, which Spark pushes down to the Parquet reader to skip row groups (a
        compacted file's are 16,384 rows), may skip more than compiling the stage again costs
        (``spark_values.py``). Below that, the bounds go in as data."""
        held = sum(f.max_offset - f.min_offset + 1 for f in self.files)
        return held - (self.end - self.start) >= PRUNING_MIN_ROWS


def plan_read(
    queue: QueueHandle,
    *,
    partition: str,
    start: int | None,
    end: int | None,
    isolation: Isolation | str = Isolation.READ_COMMITTED,
    call: str = "Queue.read",
    snapshot: DeltaTable | None = None,
) -> ReadPlan:
    """What a read of ``[start, end)`` touches in ``snapshot`` (default: the newest). ``start``
    None: the partition's start offset (0 until retention removed rows); a ``start`` below it
    raises :class:`OffsetOutOfRangeError` (never a silent gap). A caller that chose ``start`` from
    a start offset passes the snapshot it read that from: retention committing in between then
    cannot put ``start`` below the start the plan sees."""
    queue.check_partition(partition)
    dt = snapshot or queue.refresh()
    first = queue.start_offset(partition, snapshot=dt)
    start, end, isolation = check_range(queue, partition=partition,
                                        start=first if start is None else start, end=end,
                                        isolation=isolation, call=call)
    if start < first:
        raise OffsetOutOfRangeError(
            f"{call}: offset {start} of {queue.name}/{partition} is below the partition's start "
            f"offset {first}: the rows before it were removed by the queue's retention after "
            f"every registered reader had read them; read from {first} (omit start to read from "
            "the start offset)", queue=queue.name, partition=partition, offset=start,
            start_offset=first)
    available = queue.next_offset(partition, snapshot=dt)
    stop = available if end is None else min(end, available)
    files = (
        tuple(queue.files(partition=partition, snapshot=dt, start=start, end=stop))
        if stop > start
        else ()
    )
    hidden: tuple[str, ...] = ()
    if Isolation(isolation) is Isolation.READ_COMMITTED and any(f.txn_rows for f in files):
        stop, hidden = _stable_range(queue, dt, [f for f in files if f.txn_rows], start, stop)
        files = tuple(f for f in files if f.min_offset < stop)
    return ReadPlan(
        queue.name,
        partition,
        start,
        max(stop, start),
        end if end is not None else available,
        files,
        hidden,
    )


def check_range(
    queue: QueueHandle,
    *,
    partition: str,
    start: Any,
    end: Any,
    isolation: Any = Isolation.READ_COMMITTED,
    call: str = "Queue.read",
) -> tuple[int, int | None, Isolation]:
    """``start``, ``end`` and ``isolation`` of a read, checked: offsets are ints >= 0 (NumPy
    integers too; a bool, a float or a string is refused, never truncated) and ``end`` is None or
    not before ``start``. A bad one raises :class:`InvalidRangeError` (an
    :class:`OffsetRangeError`) naming the argument."""
    wanted = "an offset: an int >= 0"
    first = check_int(start, call=call, argument="start", queue=queue.name, expected=wanted,
                      error=InvalidRangeError)
    last = None if end is None else check_int(
        end, call=call, argument="end", queue=queue.name, expected=f"{wanted}, or None for all",
        error=InvalidRangeError)
    if last is not None and last < first:
        raise argument_error(
            call, "end", end, f"before start={first} (partition {partition!r}: invalid range "
            f"[{first}, {last}))", "an end >= start (ranges are half-open, [start, end))",
            queue=queue.name, error=InvalidRangeError, partition=partition, start=first, end=last)
    level = check_choice(isolation, Isolation, call=call, argument="isolation", queue=queue.name)
    return first, last, level


def _stable_range(
    queue: QueueHandle, dt: Any, files: list[FileInfo], start: int, stop: int
) -> tuple[int, tuple[str, ...]]:
    rows = read_files(queue, files, start=start, end=stop, columns=[OFFSET, TXN_ID],
                      where=pc.field(TXN_ID).is_valid())
    txns = sorted(set(rows[TXN_ID].to_pylist()))
    statuses = resolve_statuses(queue, dt, txns)  # aborts those past their deadline
    hidden = tuple(t for t in txns if statuses[t] is TxnStatus.ABORTED)
    undecided = [t for t in txns if statuses[t] is TxnStatus.OPEN]
    if undecided:
        mask = pc.is_in(rows[TXN_ID], pa.array(undecided))
        stop = min(stop, pc.min(rows.filter(mask)[OFFSET]).as_py())
    return stop, hidden


def _dataset(
    queue: QueueHandle, files: list[FileInfo] | tuple[FileInfo, ...], schema: pa.Schema | None = None
) -> ds.Dataset:
    """The Parquet files of a read as one dataset, always read with the queue's own schema: a
    file rewritten by delta-rs (a retention delete through a straddling file) stores its strings
    as Arrow ``string_view``, which inferring the schema would carry into the read (and pyarrow
    cannot filter)."""
    schema = schema or _payload_and_meta_schema(queue)
    if queue.lake.is_local:
        paths = [str(queue.lake.local_path(join_uri(queue.uri, f.path))) for f in files]
        return ds.dataset(paths, format="parquet", schema=schema)
    from deltalake.fs import DeltaStorageHandler
    from pyarrow.fs import PyFileSystem

    filesystem = PyFileSystem(DeltaStorageHandler(queue.uri, queue.lake.options))
    return ds.dataset(
        [f.path for f in files], format="parquet", filesystem=filesystem, schema=schema
    )


def _payload_and_meta_schema(queue: QueueHandle) -> pa.Schema:
    """The columns a data file holds (the partition columns are in the Delta log, not the file)."""
    return pa.schema([f for f in queue.table_schema if f.name not in (PARTITION, BASE)])


def read_files(
    queue: QueueHandle, files: Sequence[FileInfo], *, start: int, end: int,
    columns: list[str] | None = None, where: Any = None,
) -> pa.Table:
    """The rows of ``files`` with absolute offsets in ``[start, end)`` (and ``where``), columns
    ``columns`` (None: every column the files hold), unordered. Files of one base are read as one
    dataset with the range shifted by their base (``based.py``), then their offsets made
    absolute (sort by ``_offset`` where order matters)."""
    schema = _payload_and_meta_schema(queue)
    wanted = schema.names if columns is None else columns
    by_base: dict[int, list[FileInfo]] = {}
    for f in files:
        by_base.setdefault(f.base, []).append(f)
    parts = []
    for base, group in sorted(by_base.items()):
        whole = all(start <= f.min_offset and f.max_offset < end for f in group)
        expr = pc.scalar(True) if whole else (
            (pc.field(OFFSET) >= start - base) & (pc.field(OFFSET) < end - base))
        if where is not None:
            expr &= where
        table = _dataset(queue, group, schema).to_table(columns=wanted, filter=expr)
        if base and OFFSET in table.column_names:
            at = table.column_names.index(OFFSET)
            table = table.set_column(at, table.schema.field(OFFSET), pc.add(table[OFFSET], base))
        parts.append(table)
    if not parts:
        return schema.empty_table().select(wanted)
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def execute_arrow(queue: QueueHandle, plan: ReadPlan, *, columns: list[str] | None = None) -> pa.Table:
    schema = queue.read_schema
    if plan.empty or not plan.files:
        return schema.empty_table() if columns is None else schema.empty_table().select(columns)
    where = None
    if plan.hidden_txns:
        where = ~pc.field(TXN_ID).isin(list(plan.hidden_txns)) | pc.field(TXN_ID).is_null()
    table = read_files(queue, plan.files, start=plan.start, end=plan.end, where=where).sort_by(OFFSET)
    table = table.append_column(
        pa.field(PARTITION, pa.string(), nullable=False),
        pa.repeat(plan.partition, table.num_rows).cast(pa.string()),
    )
    table = table.select(schema.names).cast(schema)
    return table if columns is None else table.select(columns)


def read_arrow(
    queue: QueueHandle,
    *,
    partition: str,
    start: int | None = None,
    end: int | None = None,
    isolation: Isolation | str = Isolation.READ_COMMITTED,
    columns: list[str] | None = None,
) -> pa.Table:
    """Rows of ``partition`` with offsets in ``[start, end)`` (end clamped to what exists; start
    None: from the partition's start offset), in offset order, as one Arrow table. For reads
    that fit comfortably in driver memory."""
    call = "Queue.read_arrow"
    if columns is not None:
        names = queue.read_schema.names
        if (isinstance(columns, str) or not isinstance(columns, list | tuple)
                or not all(isinstance(c, str) and c in names for c in columns)):
            unknown = ([c for c in columns if not isinstance(c, str) or c not in names]
                       if isinstance(columns, list | tuple) else columns)
            raise argument_error(call, "columns", columns, f"not a list of the queue's columns "
                                 f"(unknown: {unknown!r})", f"a list of column names out of {names}, "
                                 "or None for all", queue=queue.name, error=InvalidArgumentError)
        columns = list(columns)
    plan = plan_read(queue, partition=partition, start=start, end=end, isolation=isolation,
                     call=call)
    return execute_arrow(queue, plan, columns=columns)


def read_present(
    queue: QueueHandle,
    *,
    partition: str,
    start: int,
    end: int | None = None,
    newest: int | None = None,
    isolation: Isolation | str = Isolation.READ_COMMITTED,
    columns: list[str] | None = None,
    call: str = "Queue.read_arrow",
) -> tuple[pa.Table, int]:
    """``(rows, first)``: the rows of ``[max(start, first), end)`` that one snapshot holds, where
    ``first`` is that snapshot's start offset of ``partition`` (``newest``: only the last
    ``newest`` offsets before the end). For the platform's own readers that show or count what is
    there (``cues queue tail``, error counts, quarantine): retention removing rows while they
    read is not an error for them; the caller learns which offsets it removed, ``[start,
    first)``. A reader that needs every row uses :func:`read_arrow`, which raises instead."""
    dt = queue.refresh()
    first = queue.start_offset(partition, snapshot=dt)
    if newest is not None:
        start = max(start, queue.next_offset(partition, snapshot=dt) - newest)
    start = max(start, first)
    plan = plan_read(queue, partition=partition, start=start,
                     end=None if end is None else max(end, start), isolation=isolation, call=call,
                     snapshot=dt)
    return execute_arrow(queue, plan, columns=columns), first


def execute_spark(queue: QueueHandle, spark: Any, plan: ReadPlan) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    physical = from_arrow_schema(_payload_and_meta_schema(queue), prefer_timestamp_ntz=False)
    # A classic session makes one Py4J round trip per Column call (a step's read was 88 of them,
    # ~70 ms on two loaded cores): there the filter and the projection are SQL text, two calls
    # (~40 ms). Spark Connect builds Column plans locally, so it keeps the Column API.
    connect = type(spark).__module__.startswith("pyspark.sql.connect")
    bases = bases_by_name(plan.files)
    if plan.empty or not plan.files:
        frame = spark.createDataFrame([], physical)
    else:
        uris = [join_uri(queue.uri, f.path) for f in plan.files]
        frame = spark.read.schema(physical).parquet(*uris)
        if bases:  # files with based offsets (based.py): absolute offsets first, then the range
            frame = frame.withColumn(OFFSET, spark_offset(bases))
        if plan.whole_files:
            pass  # every row of these files is in the range
        else:  # literal bounds (pushed down, pruning row groups) only where pruning pays
            frame = where_offsets(frame, plan.start, plan.end, connect=connect,
                                  as_data=bool(bases) or not plan.pruning_pays)
        if plan.hidden_txns:
            frame = frame.where(
                F.col(TXN_ID).isNull() | ~F.col(TXN_ID).isin(list(plan.hidden_txns))
            )
    if connect:
        return frame.withColumn(PARTITION, F.lit(plan.partition)).select(*queue.read_schema.names)
    partition = validate_partition(plan.partition)  # letters, digits, '_', '-', '.': a safe literal
    return frame.selectExpr(*(f"'{partition}' AS {_quoted(n)}" if n == PARTITION else _quoted(n)
                              for n in queue.read_schema.names))


def where_offsets(frame: Any, start: int, end: int, *, connect: bool, as_data: bool = True) -> Any:
    """``frame``'s rows with ``start <= _offset < end``. ``as_data``: the bounds as data, not code
    (``spark_values.py``: the stage compiled once for every range); else literals, which Spark
    pushes down to the Parquet reader. A classic session takes SQL text (one Py4J call), Spark
    Connect the Column API (built locally)."""
    from pyspark.sql import functions as F  # lazy: Spark is optional for Arrow-only processes

    if connect:
        def bound(v: int) -> Any:
            return step_constant(v, over=OFFSET) if as_data else F.lit(int(v))

        return frame.where((F.col(OFFSET) >= bound(start)) & (F.col(OFFSET) < bound(end)))

    def text(v: int) -> str:
        return step_constant_sql(v, over=OFFSET) if as_data else str(int(v))

    column = _quoted(OFFSET)
    return frame.where(f"{column} >= {text(start)} AND {column} < {text(end)}")


def _quoted(column: str) -> str:
    """A column name as a Spark SQL identifier (backticks; a backtick inside is doubled)."""
    return "`" + column.replace("`", "``") + "`"


def read_spark(
    queue: QueueHandle,
    spark: Any,
    *,
    partition: str,
    start: int | None = None,
    end: int | None = None,
    isolation: Isolation | str = Isolation.READ_COMMITTED,
) -> Any:
    """The same rows as :func:`read_arrow`, as a Spark DataFrame that reads the Parquet files
    directly (unordered; sort by ``_offset`` if order matters)."""
    plan = plan_read(queue, partition=partition, start=start, end=end, isolation=isolation,
                     call="Queue.read_spark")
    return execute_spark(queue, spark, plan)
