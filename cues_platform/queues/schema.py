"""A queue's schema: the user's payload columns (its contract) plus reserved metadata columns.

Reserved columns all start with ``_``; payload columns may not, so a payload can never shadow
metadata. ``conform`` turns whatever the user hands in into a table of exactly the payload schema,
or raises a :class:`SchemaError` that names the column and what to change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from cues_platform.queues.errors import (
    BatchError,
    NullValueError,
    ReservedColumnError,
    SchemaError,
)

PARTITION = "_partition"
OFFSET = "_offset"
PRODUCER_ID = "_producer_id"
PRODUCER_SEQ = "_producer_seq"
DELIVERY_HASH = "_delivery_hash"
MESSAGE_TYPE = "_message_type"
APPEND_TIME = "_append_time"
TXN_ID = "_txn_id"

METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field(PARTITION, pa.string(), nullable=False),
    pa.field(OFFSET, pa.int64(), nullable=False),
    pa.field(PRODUCER_ID, pa.string(), nullable=True),
    pa.field(PRODUCER_SEQ, pa.int64(), nullable=True),
    pa.field(DELIVERY_HASH, pa.string(), nullable=True),
    pa.field(MESSAGE_TYPE, pa.string(), nullable=False),
    pa.field(APPEND_TIME, pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field(TXN_ID, pa.string(), nullable=True),
)
RESERVED = frozenset(f.name for f in METADATA_FIELDS)
DEFAULT_MESSAGE_TYPE = "message"


def validate_payload_schema(schema: pa.Schema, *, queue: str) -> pa.Schema:
    """Check a user-declared payload schema and return it."""
    if not isinstance(schema, pa.Schema):
        raise SchemaError(
            f"queue {queue!r}: the payload schema must be a pyarrow.Schema, got {type(schema).__name__}",
            queue=queue,
        )
    if len(schema) == 0:
        raise SchemaError(f"queue {queue!r}: declare at least one payload column", queue=queue)
    seen: set[str] = set()
    for field in schema:
        if field.name.startswith("_"):
            raise ReservedColumnError(
                f"queue {queue!r}: payload column {field.name!r} starts with '_', which is "
                f"reserved for queue metadata ({', '.join(sorted(RESERVED))}); rename it",
                queue=queue,
                column=field.name,
            )
        if field.name in seen:
            raise SchemaError(f"queue {queue!r}: column {field.name!r} declared twice", queue=queue)
        seen.add(field.name)
    return schema


def full_schema(payload: pa.Schema) -> pa.Schema:
    """The Delta table schema: payload columns first, then the metadata columns."""
    return pa.schema([*payload, *METADATA_FIELDS])


def payload_schema_of(table_schema: pa.Schema) -> pa.Schema:
    """Recover the payload schema from a queue table's schema."""
    return pa.schema([f for f in table_schema if f.name not in RESERVED])


def check_rows(rows: list[Mapping[str, Any]], payload: pa.Schema, *, queue: str) -> None:
    """Every row dict must have exactly the payload's keys (no typo, no extra, none missing)."""
    expected = set(payload.names)
    for index, row in enumerate(rows):
        keys = row.keys()
        if keys == expected:
            continue
        missing = [n for n in payload.names if n not in keys]
        extra = sorted(str(k) for k in keys if k not in expected)
        if any(k.startswith("_") for k in extra):
            raise ReservedColumnError(
                f"queue {queue!r}: row {index} sets reserved key(s) "
                f"{[k for k in extra if k.startswith('_')]}; the queue fills metadata itself, "
                "drop them",
                queue=queue,
                row=index,
                column=next(k for k in extra if k.startswith("_")),
            )
        raise SchemaError(
            f"queue {queue!r}: row {index} does not match the queue's schema (missing key(s): "
            f"{missing or 'none'}; unexpected key(s): {extra or 'none'}); every row needs exactly "
            f"the keys {payload.names} (a missing value is None, not a missing key)",
            queue=queue,
            row=index,
            missing=missing,
            unexpected=extra,
        )


def to_table(data: Any, *, queue: str, payload: pa.Schema | None = None) -> pa.Table:
    """Accept a pyarrow Table/RecordBatch, a pandas DataFrame, a dict of columns or a list of rows.

    With ``payload``, each row of a list of rows is checked against it (:func:`check_rows`)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, Mapping):
        return pa.table(dict(data))
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    if type(data).__name__ == "DataFrame" and hasattr(data, "to_dict"):
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, Iterable) and not isinstance(data, str | bytes):
        rows = list(data)
        if rows and not all(isinstance(r, Mapping) for r in rows):
            raise SchemaError(
                f"queue {queue!r}: rows must be mappings of column to value", queue=queue
            )
        if payload is not None:
            check_rows(rows, payload, queue=queue)
        return pa.Table.from_pylist(rows)
    raise SchemaError(
        f"queue {queue!r}: cannot append a {type(data).__name__}; pass a pyarrow Table, a pandas "
        "DataFrame, a dict of columns or a list of row dicts",
        queue=queue,
    )


def conform(data: Any, payload: pa.Schema, *, queue: str, max_rows: int) -> pa.Table:
    """Return ``data`` as a table of exactly ``payload`` (columns in order, types cast safely)."""
    table = to_table(data, queue=queue, payload=payload)
    if table.num_rows == 0:
        raise BatchError(f"queue {queue!r}: the batch is empty; send at least one row", queue=queue)
    if table.num_rows > max_rows:
        raise BatchError(
            f"queue {queue!r}: the batch has {table.num_rows} rows, more than the queue's limit of "
            f"{max_rows}; split it or raise max_batch_rows",
            queue=queue,
            rows=table.num_rows,
            limit=max_rows,
        )
    names = set(table.column_names)
    reserved = sorted(names & RESERVED) or sorted(n for n in names if n.startswith("_"))
    if reserved:
        raise ReservedColumnError(
            f"queue {queue!r}: the batch sets reserved column(s) {reserved}; the queue fills "
            "metadata itself, drop them",
            queue=queue,
            column=reserved[0],
        )
    missing = [f.name for f in payload if f.name not in names]
    extra = sorted(names - {f.name for f in payload})
    if missing or extra:
        raise SchemaError(
            f"queue {queue!r}: batch columns do not match the queue's schema "
            f"(missing: {missing or 'none'}; unexpected: {extra or 'none'}); "
            f"expected {payload.names}",
            queue=queue,
            missing=missing,
            unexpected=extra,
        )
    columns = []
    for field in payload:
        column = table.column(field.name)
        if not column.type.equals(field.type):
            try:
                column = column.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(
                    f"queue {queue!r}: column {field.name!r} has type {column.type}, which does "
                    f"not convert safely to the declared {field.type} ({exc})",
                    queue=queue,
                    column=field.name,
                ) from exc
        if not field.nullable and column.null_count:
            first = next(i for i, v in enumerate(column.is_null().to_pylist()) if v)
            raise NullValueError(
                f"queue {queue!r}: required column {field.name!r} has {column.null_count} null(s), "
                f"the first at row {first}; fill them or declare the column nullable",
                queue=queue,
                column=field.name,
                row=first,
            )
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=payload)
