"""Durable tailer positions: one small Delta table for the whole lake.

A position commit appends one row (for humans and audits) and sets the app transaction
``pos:{queue}/{tailer}/{partition}`` to the next offset to read, so loading a position is one O(1)
lookup in the snapshot. Seeking backwards is allowed (delta-rs accepts a lower version).

System tables (positions, the transaction coordinator) take one commit per position or decision,
thousands a day: :class:`SystemTable` keeps their handle's cost flat by reopening it from the
newest checkpoint (written every 100 commits) instead of growing one snapshot commit by commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from cues_platform.queues.creation import create_table_once
from cues_platform.queues.errors import PositionConflictError, StorageUnreachableError
from cues_platform.queues.faults import translated
from cues_platform.queues.integrity import (
    TableStorage,
    diagnose_unloadable,
    handle_is_current,
    open_delta_table,
)
from cues_platform.queues.layout import (
    COMMIT_HOOKS,
    NO_LOG_CLEANUP_PROPERTY,
    QUEUE_CHECKPOINT_INTERVAL,
    TAILER_EXPENDABLE,
    TAILER_POSITION,
)
from cues_platform.queues.location import LakeLocation
from cues_platform.queues.maintenance import trim_log

# commits; written by delta-rs' post-commit hook. The queues' interval, for the same reason:
# delta-rs replays the log from the newest checkpoint on every refresh and app-transaction lookup
# (bench/results/checkpoint_interval-2.json: a position commit's p50 at 100 and at 10)
CHECKPOINT_INTERVAL = QUEUE_CHECKPOINT_INTERVAL
CONFLICT_RETRIES = 20  # a position commit refused as a concurrent transaction, made again
# A handle moved forward over one checkpoint interval of its table (the table's own property: 100
# for tables created before 2026-11-29) is replaced by a fresh one opened from the newest
# checkpoint: delta-rs snapshots advanced commit by commit get slower with every commit (a
# position commit measured 12 ms at commit 100 and 100 ms at commit 1,000 without this).

SCHEMA = pa.schema(
    [
        pa.field("queue", pa.string(), nullable=False),
        pa.field("tailer", pa.string(), nullable=False),
        pa.field("partition", pa.string(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


def open_system_table(lake: LakeLocation, name: str, schema: pa.Schema) -> DeltaTable:
    """Open (creating on first use, race-free across processes) a system Delta table.

    A folder with files but no log (the log was lost) raises :class:`MissingLogError` instead of
    becoming a new, empty table: every position or decision it held would be forgotten.
    """
    uri = lake.system_uri(name)
    what = f"system table {name!r}"
    if not DeltaTable.is_deltatable(uri, storage_options=lake.options):
        lake.refuse_lost_log(uri, what=what)
        create_table_once(lake, uri, schema, what=what,
                          configuration={"delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
                                         **NO_LOG_CLEANUP_PROPERTY})
    return _open(lake, uri, what=what)


def _open(lake: LakeLocation, uri: str, *, what: str) -> DeltaTable:
    """Open a system table: a torn or missing checkpoint falls back to the previous one (or the
    log) when every later commit is present; any other damage is a :class:`LogIntegrityError`
    naming the damaged file, judged by the rules of a system table (its healthy commits carry no
    ``cues.ranges`` and are never blamed)."""
    try:
        with translated(table=what, uri=uri, during="open"):
            return open_delta_table(uri, lake.options, what=what)
    except TableNotFoundError:
        return lake.open_table(uri, what=what)  # the typed error for a missing or lost table
    except DeltaError as exc:
        raise diagnose_unloadable(TableStorage(uri, lake.options), what=what, error=exc,
                                  queue_rules=False) from exc


def checkpoint_interval(dt: DeltaTable) -> int:
    """The table's ``delta.checkpointInterval`` (delta-rs' 100 when unset or not a positive number)."""
    value = dt.metadata().configuration.get("delta.checkpointInterval", "")
    return int(value) if value.isdigit() and int(value) > 0 else 100


class SystemTable:
    """A system table's handle, kept fresh at a flat cost (thread-safe).

    :meth:`snapshot` moves the handle to the newest version (``update_incremental``; on a local
    lake only when the next commit entry exists) and replaces it by a fresh one, opened from the
    newest checkpoint, once it has moved one checkpoint interval of the table (``reopen_every``)
    past where it was opened.
    """

    def __init__(self, lake: LakeLocation, name: str, schema: pa.Schema) -> None:
        self.lake = lake
        self.name = name
        self.uri = lake.system_uri(name)
        self.lock = threading.RLock()
        self._dt = open_system_table(lake, name, schema)
        self.opened_at = self._dt.version()
        self.reopen_every = checkpoint_interval(self._dt)
        self._log_dir = lake.local_path(self.uri) / "_delta_log" if lake.is_local else None

    def snapshot(self) -> DeltaTable:
        with self.lock:
            try:
                with translated(table=f"system table {self.name!r}", uri=self.uri, during="refresh"):
                    current = (False if self._log_dir is None
                               else handle_is_current(self._log_dir, self._dt.version()))
                    if current is False:
                        self._dt.update_incremental()
            except StorageUnreachableError:
                raise
            except DeltaError as exc:
                raise diagnose_unloadable(TableStorage(self.uri, self.lake.options),
                                          what=f"system table {self.name!r}", error=exc,
                                          queue_rules=False) from exc
            # None: another handle's cleanup trimmed the log past this one: open it again
            if current is None or self._dt.version() - self.opened_at >= self.reopen_every:
                self.cleanup_log()
                self._dt = _open(self.lake, self.uri, what=f"system table {self.name!r}")
                self.opened_at = self._dt.version()
            return self._dt

    def cleanup_log(self) -> int:
        """Delete the log entries older than the second-newest checkpoint; returns how many.

        delta-rs lists (and stats) the whole ``_delta_log`` folder on every commit, so a commit
        got slower with every commit ever made (12 ms at 100, 26 ms at 1,000). Two checkpoints
        hold everything a system table needs (app transactions are kept in checkpoints), and a
        reader that chose the previous checkpoint still finds its entries; system tables need no
        time travel. Queue tables are not cleaned this way, except a processor's home queue below what
        its digests hold (``processing/home.py``, :func:`trim_home_log`).
        """
        return trim_log(TableStorage(self.uri, self.lake.options))


@dataclass(frozen=True)
class TailerPosition:
    tailer: str
    partition: str
    position: int
    expendable: bool


class PositionStore:
    def __init__(self, lake: LakeLocation) -> None:
        self.lake = lake
        self.table = SystemTable(lake, "positions", SCHEMA)

    def get(self, *, queue: str, tailer: str, partition: str) -> int | None:
        dt = self.table.snapshot()
        version = dt.transaction_version(TAILER_POSITION.id(queue, tailer, partition))
        return None if version is None else int(version)

    def commit(self, *, queue: str, tailer: str, partition: str, position: int,
               expendable: bool | None = None) -> None:
        """Commit one tailer's position (``Tailer.commit``); ``expendable`` (when not None) is
        recorded with it (retention moves an expendable tailer forward instead of keeping rows for
        it). The tailer owns it: a commit refused because retention moved the same tailer
        meanwhile is made again (``commit_many``'s ``retry_conflicts``)."""
        flags = None if expendable is None else [expendable]
        self.commit_many([(queue, tailer, partition, position)], expendable=flags,
                         retry_conflicts=True)

    def tailers(self, queue: str) -> list[TailerPosition]:
        """Every tailer with a committed position on ``queue`` (the rows name them; the app
        transactions hold the positions)."""
        dt = self.table.snapshot()
        rows = dt.to_pyarrow_table(columns=["queue", "tailer", "partition"],
                                   filters=[("queue", "=", queue)])
        out = []
        for tailer, partition in sorted(set(zip(rows["tailer"].to_pylist(),
                                                rows["partition"].to_pylist(), strict=True))):
            version = dt.transaction_version(TAILER_POSITION.id(queue, tailer, partition))
            if version is None:
                continue
            flag = dt.transaction_version(TAILER_EXPENDABLE.id(queue, tailer, partition))
            out.append(TailerPosition(tailer, partition, int(version), bool(flag)))
        return out

    def commit_many(self, positions: list[tuple[str, str, str, int]], *,
                    expendable: list[bool] | None = None, retry_conflicts: bool = False) -> None:
        """Commit several ``(queue, tailer, partition, position)`` in ONE Delta commit (atomic).

        Another writer committing one of the same positions between the snapshot this commit is
        built on and the commit makes delta-rs refuse it (a concurrent transaction of the same app
        id). ``retry_conflicts`` (a tailer, which owns its position; the other writer is
        retention moving it): the commit is made again on the newer snapshot, as Kafka's last
        offset commit wins, and ``CONFLICT_RETRIES`` refusals in a row raise
        :class:`PositionConflictError`. Without it (a processor's positions: only a second
        instance of it writes the same ids) the first refusal raises that error, nothing
        committed (retryable: the next start plans from the positions that won)."""
        if positions:
            self._commit(lambda _dt: (positions, expendable),
                         attempts=CONFLICT_RETRIES if retry_conflicts else 1)

    def move_up(self, positions: list[tuple[str, str, str, int]]) -> list[tuple[str, str, int, int]]:
        """Move each ``(queue, tailer, partition, position)`` up to ``position``, marked expendable,
        only if its committed position is still below it, in ONE commit built on the snapshot the
        positions were compared on (retention's Step 4). A tailer that committed meanwhile is
        compared again, never moved back. Returns ``(tailer, partition, old, new)`` of the moves."""
        moved: list[tuple[str, str, int, int]] = []

        def still_behind(dt: DeltaTable) -> tuple[list[tuple[str, str, str, int]], list[bool]] | None:
            moved.clear()
            chosen = []
            for q, t, p, pos in positions:
                old = dt.transaction_version(TAILER_POSITION.id(q, t, p))
                if old is not None and int(old) < pos:
                    chosen.append((q, t, p, pos))
                    moved.append((t, p, int(old), pos))
            return (chosen, [True] * len(chosen)) if chosen else None

        if positions:
            self._commit(still_behind, attempts=CONFLICT_RETRIES)
        return list(moved)

    def _commit(self, choose: Callable[[DeltaTable], tuple[list[tuple[str, str, str, int]],
                                                           list[bool] | None] | None], *,
                attempts: int) -> None:
        """One commit of what ``choose`` picks on the snapshot it is built on (None: nothing to
        commit), made again on a newer snapshot, up to ``attempts`` in all, while a concurrent
        commit of the same app ids wins."""
        table = f"system table {self.table.name!r}"
        for _ in range(attempts):
            with self.table.lock, translated(table=table, uri=self.table.uri, during="position"):
                dt = self.table.snapshot()
                chosen = choose(dt)
                if chosen is None:
                    return
                positions, expendable = chosen
                try:
                    write_deltalake(dt, _rows(positions), mode="append",
                                    commit_properties=CommitProperties(
                                        app_transactions=_transactions(positions, expendable),
                                        max_commit_retries=50),
                                    post_commithook_properties=COMMIT_HOOKS)
                    return
                except CommitFailedError as exc:
                    if "concurrent transaction" not in str(exc).lower():
                        raise
        raise PositionConflictError(
            f"{table}: another writer committed the same positions meanwhile ({attempts} "
            f"attempt(s) refused as concurrent transactions; a second instance of the same "
            "processor or tailer?); nothing was committed: start again (positions are read anew)",
            table=self.table.uri, attempts=attempts)


def _rows(positions: list[tuple[str, str, str, int]]) -> pa.Table:
    now = datetime.now(UTC)
    return pa.table(
        {
            "queue": [p[0] for p in positions],
            "tailer": [p[1] for p in positions],
            "partition": [p[2] for p in positions],
            "position": [p[3] for p in positions],
            "committed_at": [now] * len(positions),
        },
        schema=SCHEMA,
    )


def _transactions(positions: list[tuple[str, str, str, int]],
                  expendable: list[bool] | None) -> list[Transaction]:
    flags = ([] if expendable is None else
             [Transaction(TAILER_EXPENDABLE.id(q, t, p), int(e))
              for (q, t, p, _), e in zip(positions, expendable, strict=True)])
    return [Transaction(TAILER_POSITION.id(q, t, p), pos) for q, t, p, pos in positions] + flags
