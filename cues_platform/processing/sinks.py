"""Idempotent sink helpers: user side effects that apply exactly once per delivery.

A sink step is delivered at least once: a retry after a crash has the same step and the SAME 128-bit
delivery hash. Each helper records the delivery atomically with the effect, so a retry is a no-op:

- :func:`write_delta_once`: the Delta commit carries the app transaction ``sink:{processor_id}``
  with version = step (steps only grow, so one version per processor is enough).
- :func:`postgres_once`: a ``(delivery_hash PRIMARY KEY, ...)`` row in a dedupe table commits or
  rolls back together with the user's writes. Bad input raises :class:`InvalidSinkInputError`.

The error classes live in :mod:`cues_platform.processing.errors` and are re-exported here.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import psycopg
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import exceptions as dx
from psycopg import errors as pg_errors
from psycopg import sql

from cues_platform.processing.errors import (
    DeliveryHashReusedError,
    InvalidSinkInputError,
    SinkConflictError,
    SinkError,
    SinkSchemaError,
    SinkStorageError,
)
from cues_platform.queues.layout import COMMIT_HOOKS, SINK_STEP

DEFAULT_TABLE = "cues_sink_deliveries"
DEFAULT_MAX_ATTEMPTS = 50
_HASH = re.compile(r"[0-9a-f]{32}")
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class SinkContext(Protocol):
    """What a sink helper needs from the processor's context (read-only)."""

    @property
    def processor_id(self) -> str: ...

    @property
    def step(self) -> int: ...  # 0, 1, 2, ... increasing per processor; same on a retry

    @property
    def delivery_hash(self) -> str: ...  # 32 lowercase hex chars; same on a retry


@dataclass(frozen=True)
class PostgresDelivery:
    """The open delivery of :func:`postgres_once`: write only when ``first_time`` is True."""

    first_time: bool
    processor_id: str
    step: int
    delivery_hash: str


def _check_context(ctx: SinkContext) -> tuple[str, int, str]:
    names = ("processor_id", "step", "delivery_hash")
    processor, step, digest = (getattr(ctx, name, None) for name in names)
    if not isinstance(processor, str) or not processor:
        problem = f"processor_id must be a non-empty string, got {processor!r}"
    elif isinstance(step, bool) or not isinstance(step, int) or step < 0:
        problem = f"step must be an int >= 0, got {step!r}"
    elif not isinstance(digest, str) or not _HASH.fullmatch(digest):
        problem = f"delivery_hash must be 32 lowercase hex characters, got {digest!r}"
    else:
        return processor, step, digest
    raise InvalidSinkInputError(
        f"invalid sink context: {problem}", processor=processor, step=step, hash=digest
    )


def validate_table_name(table: str, **data: Any) -> str:
    """Return ``table`` if it is 1-63 letters, digits or underscores not starting with a digit."""
    if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):
        msg = f"invalid sink table name {table!r}: use 1-63 letters, digits, underscores"
        raise InvalidSinkInputError(f"{msg}; no leading digit", table=table, **data)
    return table


# -- Delta -----------------------------------------------------------------------------------------
def write_delta_once(
    ctx: SinkContext,
    *,
    table_uri: str,
    data: pa.Table,
    storage_options: dict[str, str] | None = None,
    mode: Literal["append", "overwrite"] = "append",
    hash_column: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> bool:
    """Write ``data`` to the Delta table at ``table_uri`` once per (processor, step).

    Returns True when this call committed the batch, False when the step was already applied.
    Delivery contract (every retry of the step starts again at step 1):

    1. Validate the context and the batch; add ``hash_column`` (the delivery hash) if asked.
    2. Open the table, creating it with the batch's schema if missing (a lost creation race just
       opens the winner's table).
    3. Read the app transaction ``sink:{processor_id}``: a version >= ``ctx.step`` means this step
       (or a later one) is committed, so return False.
    4. Write the batch in ONE commit carrying ``sink:{processor_id} = step`` and the hash, step and
       processor in the commit metadata; return True.
    5. If the commit conflicts (another retry of this step committed the same app id since step 3),
       reload the snapshot and go to 3 (with jittered backoff before writing again).

    On abort before step 4's commit nothing is visible (written Parquet files are orphans for
    vacuum); after it the step is durable and any retry returns False. Keep the table's
    ``delta.setTransactionRetentionDuration`` unset or longer than the retry horizon.
    """
    # Step 1
    processor, step, digest = _check_context(ctx)
    info = {"processor": processor, "step": step, "hash": digest, "table_uri": table_uri}
    if mode not in ("append", "overwrite"):
        raise InvalidSinkInputError(f"mode must be 'append' or 'overwrite', got {mode!r}", **info)
    if not isinstance(data, pa.Table):
        raise InvalidSinkInputError(f"data must be a pyarrow.Table, got {type(data)!r}", **info)
    if hash_column is not None:
        if hash_column in data.column_names:
            raise InvalidSinkInputError(f"hash_column {hash_column!r} is already in data", **info)
        data = data.append_column(hash_column, pa.array([digest] * data.num_rows, pa.string()))
    app_id = SINK_STEP.id(processor)
    props = CommitProperties(
        app_transactions=[Transaction(app_id, step)],
        custom_metadata={"cues.sink": processor, "cues.step": str(step), "cues.hash": digest},
    )
    try:
        # Step 2
        dt = _open_or_create(table_uri, data.schema, storage_options)
        delay = 0.002
        for attempt in range(1, max_attempts + 1):
            # Step 3
            done = dt.transaction_version(app_id)
            if done is not None and done >= step:
                return False
            if attempt > 1:
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.25)
            # Step 4
            try:
                write_deltalake(dt, data, mode=mode, commit_properties=props,
                                post_commithook_properties=COMMIT_HOOKS)
                return True
            except dx.CommitFailedError:
                # Step 5
                dt.update_incremental()
    except dx.SchemaMismatchError as exc:
        raise SinkSchemaError(
            f"sink {processor!r} step {step}: batch does not fit {table_uri}: {exc}", **info
        ) from exc
    except dx.DeltaError as exc:
        msg = f"sink {processor!r} step {step}: writing {table_uri} failed ({exc}); retry is safe"
        raise SinkStorageError(msg, **info) from exc
    raise SinkConflictError(
        f"sink {processor!r} step {step}: gave up after {max_attempts} conflicting commits on "
        f"{table_uri}; retry later (the step applies at most once)",
        **info,
    )


def _open_or_create(uri: str, schema: pa.Schema, options: dict[str, str] | None) -> DeltaTable:
    with suppress(dx.TableNotFoundError):
        return DeltaTable(uri, storage_options=options)
    try:
        return DeltaTable.create(uri, schema=schema, mode="ignore", storage_options=options)
    except dx.CommitFailedError:  # another writer created it between our two calls
        return DeltaTable(uri, storage_options=options)


# -- PostgreSQL ------------------------------------------------------------------------------------
@contextmanager
def postgres_once(
    ctx: SinkContext, conn: psycopg.Connection, *, table: str = DEFAULT_TABLE
) -> Iterator[PostgresDelivery]:
    """Run the ``with`` block's writes on ``conn`` in one transaction with the delivery's hash row.

    Delivery contract:

    1. Validate the context and the dedupe table name.
    2. Open a transaction (a savepoint if ``conn`` already has one: then the outer commit decides)
       and create the dedupe table if missing.
    3. Insert ``(delivery_hash, processor_id, step, applied_at)`` with ``ON CONFLICT DO NOTHING``;
       ``first_time`` is True when the row is new. A concurrent retry holding the same hash makes
       this insert wait for its outcome: committed -> False, rolled back -> True. An existing row
       for another processor or step raises :class:`DeliveryHashReusedError`.
    4. Yield; the caller writes on ``conn`` only if ``first_time``.
    5. Commit the hash row and the caller's writes together.

    On abort (exception in the block, lost connection, SIGKILL) both roll back and a retry applies
    again. A lost connection in steps 2-5 raises :class:`SinkStorageError`: the commit may or may
    not have happened, and retrying is safe either way.
    """
    # Step 1
    processor, step, digest = _check_context(ctx)
    info = {"processor": processor, "step": step, "hash": digest}
    ident = sql.Identifier(validate_table_name(table, **info))
    in_block = False
    try:
        # Step 2
        with conn.transaction():
            _ensure_table(conn, ident)
            # Step 3
            cur = conn.execute(
                sql.SQL(
                    "INSERT INTO {} (delivery_hash, processor_id, step, applied_at) "
                    "VALUES (%s, %s, %s, now()) ON CONFLICT (delivery_hash) DO NOTHING"
                ).format(ident),
                (digest, processor, step),
            )
            first_time = cur.rowcount == 1
            if not first_time:  # same hash: it must be the same delivery
                query = sql.SQL("SELECT processor_id, step FROM {} WHERE delivery_hash = %s")
                row = conn.execute(query.format(ident), (digest,)).fetchone()
                if row is not None and tuple(row) != (processor, step):
                    raise DeliveryHashReusedError(
                        f"delivery hash {digest} is recorded for processor {row[0]!r} step "
                        f"{row[1]}, not {processor!r} step {step}; hashes must be unique",
                        **info,
                    )
            # Step 4
            in_block = True
            yield PostgresDelivery(first_time, processor, step, digest)
            in_block = False
        # Step 5: the transaction committed on leaving the block above
    except psycopg.OperationalError as exc:
        if in_block:
            raise
        raise SinkStorageError(
            f"sink {processor!r} step {step}: PostgreSQL connection failed: {exc}; the delivery "
            "may or may not be committed, retrying is safe",
            **info,
        ) from exc


def _ensure_table(conn: psycopg.Connection, ident: sql.Identifier) -> None:
    # a savepoint: a lost creation race (a concurrent session created it first) is harmless
    with suppress(pg_errors.UniqueViolation, pg_errors.DuplicateTable), conn.transaction():
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (delivery_hash text PRIMARY KEY, "
                "processor_id text NOT NULL, step bigint NOT NULL, "
                "applied_at timestamptz NOT NULL)"
            ).format(ident)
        )


def applied(conn: psycopg.Connection, delivery_hash: str, *, table: str = DEFAULT_TABLE) -> bool:
    """True if ``delivery_hash`` is committed in the dedupe ``table`` (False if it does not exist)."""
    ident = sql.Identifier(validate_table_name(table, hash=delivery_hash))
    try:
        with conn.transaction():
            row = conn.execute(
                sql.SQL("SELECT 1 FROM {} WHERE delivery_hash = %s").format(ident),
                (delivery_hash,),
            ).fetchone()
    except pg_errors.UndefinedTable:
        return False
    return row is not None


__all__ = [
    "DEFAULT_TABLE", "DeliveryHashReusedError", "InvalidSinkInputError", "PostgresDelivery",
    "SinkConflictError", "SinkContext", "SinkError", "SinkSchemaError", "SinkStorageError", "applied",
    "postgres_once", "validate_table_name", "write_delta_once",
]
