"""Per-step values in Spark plans that do not change the code Spark compiles.

Spark's whole-stage codegen writes numeric literals (long, timestamp, ...) into the Java source it
compiles, and keeps compiled classes by their source. A plan that differs from the previous
step's only in such a value (a step's offset range, its append time) therefore compiles its
stage again: on 2 local cores, 0.2-0.3 s for a 1M-row step, paid every step
(``bench/bench_write_cost.py``; docs/benchmarks.md). String, array and map literals reach the
compiled code as references instead. So a per-step long goes into a one-element array literal,
read at an index Spark cannot fold (zero times a column: ``ConstantFolding`` would turn an
all-literal read back into a long literal): the source, hence the compiled class, is the same
from step to step.

The zero is zero times a column of the frame that holds no null (``over``: ``_offset``), so
that a filter on the value stays deterministic: Spark pushes the filters a user's function adds
above it down to the Parquet reader only through deterministic ones. The column must be one
Spark reads from files, which it types as nullable: Spark folds zero times a column it knows
to be non-nullable into the literal 0 (a ``spark.range`` id, measured), and the value would be
code again. Without such a column (a projection for a write), zero times the partition id,
which is not deterministic.

What it costs: a filter on such a value is not itself pushed down to the Parquet reader (no
row-group pruning by it); :func:`cues_platform.queues.reader.execute_spark` keeps a plain literal
where pruning pays.
"""

from __future__ import annotations

from typing import Any


def step_constant(value: int, *, over: str | None = None) -> Any:
    """A Spark column holding the long ``value`` in every row, with ``value`` out of the code.
    ``over``: a non-null numeric column of the frame to take the zero index from (module
    docstring); None: the partition id."""
    from pyspark.sql import functions as F  # lazy: Spark is optional for Arrow-only processes

    zero = (F.spark_partition_id() * 0 if over is None else (F.col(over) * 0)).cast("int")
    return F.get(F.array(F.lit(int(value)).cast("long")), zero)


def step_constant_sql(value: int, *, over: str) -> str:
    """:func:`step_constant` as Spark SQL text (one Py4J call for a whole filter on a classic
    session, where each Column call is a round trip); ``over`` is a column name."""
    quoted = "`" + over.replace("`", "``") + "`"
    return f"get(array(CAST({int(value)} AS BIGINT)), CAST({quoted} * 0 AS INT))"
