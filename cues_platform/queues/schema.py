"""A queue's schema: the user's payload columns (its contract) plus reserved metadata columns.

Reserved columns all start with ``_``; payload columns may not, so a payload can never shadow
metadata. ``conform`` turns whatever the user hands in into a table of exactly the payload schema,
or raises a :class:`SchemaError` that names the column and what to change.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar

import pyarrow as pa

from cues_platform.queues.errors import (
    BatchError,
    InvalidArgumentError,
    InvalidRangeError,  # noqa: F401 - defined in errors.py; reader and tailer import it from here
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
# The second partition column of a queue with based offsets (``OffsetLayout.BASED``): the base
# its file's ``_offset`` values are relative to (0 for files with absolute offsets). Never in a
# read's result: readers return ``_base + _offset`` as ``_offset`` (``queues/based.py``).
BASE = "_base"
BASE_FIELD = pa.field(BASE, pa.int64(), nullable=False)

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
RESERVED = frozenset(f.name for f in METADATA_FIELDS) | {BASE}
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


def full_schema(payload: pa.Schema, *, based: bool = False) -> pa.Schema:
    """The Delta table schema: payload columns first, then the metadata columns (and ``_base``
    last for a queue with based offsets)."""
    return pa.schema([*payload, *METADATA_FIELDS, *([BASE_FIELD] if based else [])])


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

    With ``payload``, each row of a list of rows is checked against it (:func:`check_rows`).
    Whatever cannot become a table is a :class:`SchemaError` naming the column (never a raw
    Arrow or Python error)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, Mapping):
        return _from_columns(data, queue=queue, payload=payload)
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    if type(data).__name__ == "DataFrame" and hasattr(data, "to_dict"):
        try:
            return pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            columns = {str(name): data[name] for name in data.columns}
            raise _conversion_error(columns, queue=queue, payload=payload, exc=exc) from exc
    if isinstance(data, Iterable) and not isinstance(data, str | bytes):
        rows = list(data)
        if rows and not all(isinstance(r, Mapping) for r in rows):
            bad = next(r for r in rows if not isinstance(r, Mapping))
            raise SchemaError(
                f"queue {queue!r}: data is a list holding {_kind(bad)} ({bad!r:.60}); "
                "rows must be mappings of column to value (or pass a dict of columns)",
                queue=queue, argument="data",
            )
        if payload is not None:
            check_rows(rows, payload, queue=queue)
        try:
            return pa.Table.from_pylist(rows)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            names = list(payload.names) if payload is not None else list(rows[0]) if rows else []
            columns = {name: [r.get(name) for r in rows] for name in names}
            raise _conversion_error(columns, queue=queue, payload=payload, exc=exc) from exc
    raise SchemaError(
        f"queue {queue!r}: cannot append data={data!r:.60} ({_kind(data)}); pass a "
        "pyarrow Table, a pandas DataFrame, a dict of columns or a list of row dicts",
        queue=queue, argument="data",
    )


def _from_columns(data: Mapping[Any, Any], *, queue: str, payload: pa.Schema | None) -> pa.Table:
    """A dict of columns as a table; a column that is not a list of values of one type, or
    columns of different lengths, are a :class:`SchemaError` naming the column."""
    for name, values in data.items():
        if not isinstance(name, str):
            raise SchemaError(
                f"queue {queue!r}: column name {name!r} is {_kind(name)}; column names "
                "are strings", queue=queue, column=name)
        if isinstance(values, str | bytes | Mapping) or not hasattr(values, "__len__"):
            raise SchemaError(
                f"queue {queue!r}: column {name!r} is {values!r:.60} ({_kind(values)}), "
                "not a list of values; pass a list, an array or a Series per column (one value: "
                f"[{values!r:.40}])", queue=queue, column=name)
    try:
        return pa.table(dict(data))
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise _conversion_error(dict(data), queue=queue, payload=payload, exc=exc) from exc


def _conversion_error(
    columns: Mapping[str, Any], *, queue: str, payload: pa.Schema | None, exc: BaseException
) -> SchemaError:
    """Find the column Arrow could not convert (or the mismatched lengths) behind ``exc``."""
    lengths = {}
    for name, values in columns.items():
        try:
            array = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(
                values, from_pandas=True)
        except (pa.ArrowException, TypeError, ValueError) as inner:
            declared = ""
            if payload is not None and name in payload.names:
                declared = f" (declared {payload.field(name).type})"
            return SchemaError(
                f"queue {queue!r}: column {name!r} cannot be converted to one Arrow type "
                f"({inner}); give it values of one type{declared}",
                queue=queue, column=name)
        lengths[name] = len(array)
    if len(set(lengths.values())) > 1:
        return SchemaError(
            f"queue {queue!r}: columns have different lengths {lengths}; every column needs one "
            "value per row", queue=queue, column=min(lengths, key=lengths.__getitem__),
            lengths=lengths)
    return SchemaError(f"queue {queue!r}: the batch cannot be converted to a table ({exc}); pass "
                       "a pyarrow Table, a dict of columns or a list of row dicts", queue=queue)


def check_batch_rows(rows: int, *, queue: str, max_rows: int) -> None:
    """Raise :class:`BatchError` when one batch of ``rows`` rows exceeds the queue's limit."""
    if rows > max_rows:
        raise BatchError(
            f"queue {queue!r}: the batch has {rows} rows, more than the queue's limit of "
            f"{max_rows}; split it or raise max_batch_rows",
            queue=queue, rows=rows, limit=max_rows)


def conform(data: Any, payload: pa.Schema, *, queue: str, max_rows: int) -> pa.Table:
    """Return ``data`` as a table of exactly ``payload`` (columns in order, types cast safely)."""
    table = to_table(data, queue=queue, payload=payload)
    if table.num_rows == 0:
        raise BatchError(f"queue {queue!r}: the batch is empty; send at least one row", queue=queue)
    check_batch_rows(table.num_rows, queue=queue, max_rows=max_rows)
    if len(set(table.column_names)) != table.num_columns:
        twice = sorted({n for n in table.column_names if table.column_names.count(n) > 1})
        raise SchemaError(
            f"queue {queue!r}: the batch has column(s) {twice} more than once; keep one of each",
            queue=queue, column=twice[0])
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


# -- arguments -----------------------------------------------------------------------------------
# Every public entry of the queue layer checks its arguments with these before it changes anything
# (no commit, no sequence taken, no pending send, no thread started), so a wrong argument is one
# typed error naming the call, the argument, the value and what to pass, and the object stays
# usable. bool is an int subclass but never a valid count, offset or sequence; NumPy integers are.
E = TypeVar("E", bound=Enum)


def argument_error(
    call: str,
    argument: str,
    value: Any,
    problem: str,
    expected: str,
    *,
    queue: str | None = None,
    error: type[InvalidArgumentError] = InvalidArgumentError,
    **data: Any,
) -> InvalidArgumentError:
    """The typed error for ``call(argument=value)``: ``problem`` says what is wrong, ``expected``
    what to pass instead."""
    where = "" if queue is None else f"queue {queue!r}: "
    return error(
        f"{where}{call}: {argument}={value!r} is {problem}; pass {expected}",
        call=call, argument=argument, value=value, expected=expected, queue=queue, **data,
    )


def is_integer(value: Any) -> bool:
    """An int or a NumPy integer, never a bool (``True`` is an int to Python, not to us)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """``value``'s type with its article: "a float", "an int"."""
    name = type(value).__name__
    kind = ("an " if name[:1].lower() in "aeiou" else "a ") + name
    if isinstance(value, float) and value.is_integer():
        kind += " (write it as an int)"
    return kind


def check_int(
    value: Any,
    *,
    call: str,
    argument: str,
    minimum: int = 0,
    expected: str | None = None,
    queue: str | None = None,
    error: type[InvalidArgumentError] = InvalidArgumentError,
) -> int:
    """``value`` as a Python int if it is an integer ``>= minimum``, else the typed error."""
    wanted = expected or f"an int >= {minimum}"
    if not is_integer(value):
        raise argument_error(call, argument, value, f"{_kind(value)}, not an int", wanted,
                             queue=queue, error=error)
    if value < minimum:
        raise argument_error(call, argument, value, f"below {minimum}", wanted, queue=queue,
                             error=error)
    return int(value)


def check_seconds(
    value: Any,
    *,
    call: str,
    argument: str,
    positive: bool = False,
    optional: bool = False,
    queue: str | None = None,
) -> float | None:
    """A duration in seconds: a finite real number ``>= 0`` (``> 0`` with ``positive``), or None
    with ``optional``."""
    if value is None and optional:
        return None
    wanted = ("a number of seconds " + ("> 0" if positive else ">= 0")
              + (" or None (no limit)" if optional else ""))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise argument_error(call, argument, value, f"{_kind(value)}, not a number", wanted,
                             queue=queue)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise argument_error(call, argument, value, "out of range", wanted, queue=queue)
    return float(value)


def check_choice(
    value: Any, choices: type[E], *, call: str, argument: str, queue: str | None = None
) -> E:
    """``value`` as a member of the string enum ``choices`` (the member or its value)."""
    if isinstance(value, choices):
        return value
    if isinstance(value, str):
        for member in choices:
            if member.value == value:
                return member
    names = ", ".join(repr(m.value) for m in choices)
    raise argument_error(call, argument, value, f"not one of {names}",
                         f"one of {names} (or {choices.__name__}.<member>)", queue=queue)


def check_text(
    value: Any,
    *,
    call: str,
    argument: str,
    optional: bool = False,
    queue: str | None = None,
) -> str | None:
    """A non-empty string (or None with ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, str) and value.strip():
        return value
    wanted = "a non-empty string" + (" or None" if optional else "")
    problem = "an empty string" if isinstance(value, str) else f"{_kind(value)}, not a string"
    raise argument_error(call, argument, value, problem, wanted, queue=queue)


def check_callable(
    value: Any, *, call: str, argument: str, optional: bool = True, queue: str | None = None
) -> Callable[..., Any] | None:
    if (value is None and optional) or callable(value):
        return value
    raise argument_error(call, argument, value, f"{_kind(value)}, not callable",
                         "a function" + (" or None" if optional else ""), queue=queue)


def check_app_transactions(
    value: Any, *, call: str, argument: str = "app_transactions", queue: str | None = None
) -> list[tuple[str, int]]:
    """A sequence of ``(app id, version)`` pairs: a non-empty string and an int >= 0 each."""
    wanted = "a list of (app id, version) pairs: a non-empty string and an int >= 0 each"
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise argument_error(call, argument, value, f"{_kind(value)}, not a list", wanted,
                             queue=queue)
    out = []
    for item in value:
        if (not isinstance(item, Sequence) or isinstance(item, str | bytes) or len(item) != 2
                or not isinstance(item[0], str) or not item[0] or not is_integer(item[1])
                or item[1] < 0):
            raise argument_error(call, argument, value, f"holding {item!r}, not a pair", wanted,
                                 queue=queue)
        out.append((item[0], int(item[1])))
    return out


def _check_guards(value: Any, *, call: str, argument: str, queue: str | None) -> list[Any]:
    if (isinstance(value, str | bytes) or not isinstance(value, Sequence)
            or not all(callable(g) for g in value)):
        raise argument_error(call, argument, value, "not a list of functions",
                             "a list of guard functions (snapshot -> AppendResult | None)",
                             queue=queue)
    return list(value)


def _check_metadata(value: Any, *, call: str, argument: str, queue: str | None) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise argument_error(call, argument, value, "not a mapping of strings to strings",
                             "a dict of str -> str", queue=queue)
    return dict(value)


# What each append/send option must be: a checker returning the value to use.
_OPTION_CHECKS: dict[str, Callable[..., Any]] = {
    "delivery_hash": lambda v, **k: check_text(v, optional=True, **k),
    "message_type": lambda v, **k: check_text(v, **k),
    "txn_id": lambda v, **k: check_text(v, optional=True, **k),
    "commit_metadata": lambda v, **k: _check_metadata(v, **k),
    "max_attempts": lambda v, **k: check_int(v, minimum=1, **k),
    "app_transactions": lambda v, **k: check_app_transactions(v, **k),
    "guards": lambda v, **k: _check_guards(v, **k),
    "producer_id": lambda v, **k: check_text(v, optional=True, **k),
    "sequence": lambda v, **k: None if v is None else check_int(v, **k),
    "digest": lambda v, **k: check_text(v, optional=True, **k),
    "prepared": lambda v, **k: _check_flag(v, **k),
    "allow_empty": lambda v, **k: _check_flag(v, **k),
}
SEND_OPTIONS = ("delivery_hash", "message_type", "txn_id", "commit_metadata", "max_attempts")
APPEND_OPTIONS = (*SEND_OPTIONS, "app_transactions", "guards", "producer_id", "sequence",
                  "digest", "prepared", "allow_empty")


def _check_flag(value: Any, *, call: str, argument: str, queue: str | None) -> bool:
    if isinstance(value, bool):
        return value
    raise argument_error(call, argument, value, f"{_kind(value)}, not a bool", "True or False",
                         queue=queue)


def check_options(
    options: Mapping[str, Any],
    *,
    call: str,
    allowed: Iterable[str] = SEND_OPTIONS,
    queue: str | None = None,
) -> dict[str, Any]:
    """Keyword options of an append or a send, each checked (unknown ones refused by name)."""
    allowed = tuple(allowed)
    out = {}
    for name, value in options.items():
        if name not in allowed:
            raise argument_error(call, name, value, "not an option of this call",
                                 f"only {', '.join(allowed)}", queue=queue)
        out[name] = _OPTION_CHECKS[name](value, call=call, argument=name, queue=queue)
    return out
