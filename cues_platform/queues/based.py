"""Based offsets (``OffsetLayout.BASED``): a row's offset is its file's ``_base`` plus its ``_offset``.

A queue created with based offsets has a second partition column, ``_base``. Files the driver
writes (every append of the queue layer) have ``_base = 0`` and absolute ``_offset`` values, as in
an absolute queue. Files Spark's executors write for a step (``processing/executor_output.py``)
hold each row's index in its file, ``0 .. n-1``, and get their base when the step commits: the
partition's next offset plus the rows of the step's files before them (:func:`assign_bases`).
The base is a partition value of the file's add action, so a file is never visible without it
(Delta materializes partition values for every conforming reader, delta-rs' and Spark's
included), and the offsets of a committed file never change: a retention delete through it or a
compaction of base-0 files keeps each row's ``_base + _offset``.

This module is the one place that turns what a file holds into absolute offsets:

* :func:`absolute` for Arrow tables read through delta-rs (``_base`` materialized as a column);
* :func:`file_bases` for the add actions' ``_offset`` statistics (pruning, retention by size, the
  log checks, the auditor's density check);
* :func:`spark_offset` for Spark reads of the files themselves (which carry no partition values):
  ``_offset`` plus the base looked up by the file's name.

What is off by one: a file of ``n`` rows with base ``b`` holds offsets ``[b, b + n)``; the
partition's next offset after the step is ``b_last + n_last``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from cues_platform.queues.errors import QueueError
from cues_platform.queues.schema import BASE, OFFSET


class FileInfo(Protocol):
    """What a based read needs of a planned file (``handle.FileInfo`` is one)."""

    path: str
    base: int


def absolute(table: pa.Table) -> pa.Table:
    """``table`` (rows of a queue's Delta table, ``_base`` materialized) with ``_offset`` absolute
    and no ``_base`` column; a table without ``_base`` (an absolute queue) is returned as is."""
    if BASE not in table.column_names:
        return table
    if OFFSET not in table.column_names:
        return table.drop_columns([BASE])
    at = table.column_names.index(OFFSET)
    offsets = pc.add(table[OFFSET], pc.fill_null(table[BASE], 0).cast(pa.int64()))
    return table.set_column(at, table.schema.field(OFFSET), offsets).drop_columns([BASE])


def file_bases(actions: pa.Table) -> pa.Array:
    """Each add action's ``_base`` (a flattened ``get_add_actions`` table; 0 for an absolute queue
    or a file without one): add it to the ``_offset`` statistics to get the file's offsets."""
    column = f"partition.{BASE}"
    if column not in actions.column_names:
        return pa.repeat(pa.scalar(0, pa.int64()), actions.num_rows)
    return pc.fill_null(actions[column], 0).cast(pa.int64())


def assign_bases(start: int, rows: Sequence[int]) -> list[int]:
    """The base of each file of a step, in the step's file order: ``start`` then each file's
    start plus its rows (``[start, start + sum(rows))`` tiled, no gap, no repeat)."""
    bases, at = [], start
    for n in rows:
        bases.append(at)
        at += n
    return bases


def file_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def bases_by_name(files: Sequence[FileInfo]) -> dict[str, int]:
    """``{file name: base}`` of the files with a base other than 0, for :func:`spark_offset`.

    Raises :class:`QueueError` if two of them share a name (every writer names its files with a
    random UUID, so this means files copied by hand): a lookup by name could not tell them apart."""
    out: dict[str, int] = {}
    for f in files:
        if f.base == 0:
            continue
        name = file_name(f.path)
        if name in out and out[name] != f.base:
            raise QueueError(
                f"two data files of one read are both named {name!r} with different bases "
                f"({out[name]} and {f.base}); a based queue's files must have distinct names: "
                "rename or remove the copied file", file=name)
        out[name] = f.base
    return out


def spark_offset(bases: dict[str, int]) -> Any:
    """A Spark column: the absolute offset of a row read from the files ``bases`` names (absolute
    files, absent from ``bases``, add 0). Uses the file source's ``_metadata.file_name``."""
    from pyspark.sql import functions as F  # lazy: Spark is optional for Arrow-only processes

    if not bases:
        return F.col(OFFSET)
    lookup = F.create_map(*[x for name, base in sorted(bases.items())
                            for x in (F.lit(name), F.lit(base).cast("long"))])
    return F.col(OFFSET) + F.coalesce(lookup[F.col("_metadata.file_name")], F.lit(0).cast("long"))


def read_delta(dt: Any, *, columns: list[str], filter: Any = None) -> pa.Table:
    """``columns`` of every row of a queue's Delta table snapshot ``dt``, read through delta-rs
    (``filter``: a pyarrow dataset expression, never on ``_offset``), with ``_offset`` absolute:
    the way the auditor reads a whole queue whatever its offset layout."""
    based = BASE in dt.metadata().partition_columns and OFFSET in columns
    table = dt.to_pyarrow_dataset().to_table(columns=[*columns, BASE] if based else columns,
                                             filter=filter)
    return absolute(table)
