"""The transaction coordinator: the decision of record of every transaction, and its markers.

The coordinator is a small Delta table (``_cues/transactions``, a ``positions.SystemTable``)
whose app transactions hold the state (ids in ``layout.py``): ``tid:{transactional id} = epoch``
(fencing), ``cur:{tid} = n`` (the newest transaction of that id) and ``txn:{txn id} = 0 open |
1 committed | 2 aborted``; a row per action names the queues a transaction touched. The protocol
that writes it is the transactional producer's (``transactions.py``, steps 1-4); this module holds
what readers and the sweep need without a producer: resolving a transaction's status
(:func:`resolve_statuses`, ``read_committed`` reads), writing the marker that rolls a decision
forward onto a queue (:func:`write_marker`), and aborting transactions past their deadline
(:func:`abort_expired`) or by an operator (:func:`abort_transaction`).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from cues_platform.clock import now_ms
from cues_platform.queues.appender import app_transaction
from cues_platform.queues.errors import (
    ConcurrentAppendError,
    TransactionStateError,
    UnknownTransactionError,
)
from cues_platform.queues.faults import translated
from cues_platform.queues.handle import QueueHandle
from cues_platform.queues.layout import (
    ABORT_REASON,
    COMMIT_HOOKS,
    DEADLINE,
    TRANSACTIONAL_EPOCH,
    TXN_MARKER,
    TXN_STATUS,
)
from cues_platform.queues.location import LakeLocation
from cues_platform.queues.positions import SystemTable

SCHEMA = pa.schema(
    [
        pa.field("txn_id", pa.string(), nullable=False),
        pa.field("transactional_id", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        pa.field("queues", pa.string(), nullable=True),
        pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


TIMEOUT = "timeout"
OPERATOR_ABORT = "operator-abort"
DECISIONS = ("committed", "aborted")  # the actions of decision rows (the jepsen checker reads them)
# why a transaction was aborted by someone other than its owner: app transaction ``why:{txn id}``
# in the abort's own commit (its row's action stays "aborted")
REASONS = {TIMEOUT: 1, OPERATOR_ABORT: 2}
DEFAULT_TIMEOUT_S = 60.0  # Kafka's transaction.timeout.ms default
DEFAULT_TIMEOUT_MS = int(DEFAULT_TIMEOUT_S * 1000)


class TxnStatus(IntEnum):
    OPEN = 0
    COMMITTED = 1
    ABORTED = 2


class Coordinator:
    """The coordinator's Delta table and race-free guarded commits on it."""

    def __init__(self, lake: LakeLocation) -> None:
        self.lake = lake
        # A SystemTable keeps the handle fresh at a flat cost: re-opened from the newest
        # checkpoint every checkpoint interval of the table, old log entries cleaned (positions.py).
        self.system = SystemTable(lake, "transactions", SCHEMA)

    def snapshot(self) -> DeltaTable:
        return self.system.snapshot()

    def status(self, txn_id: str, dt: DeltaTable | None = None) -> TxnStatus:
        version = (dt or self.snapshot()).transaction_version(TXN_STATUS.id(txn_id))
        return TxnStatus.ABORTED if version is None else TxnStatus(int(version))

    def record(
        self,
        *,
        txn_id: str,
        transactional_id: str,
        epoch: int,
        action: str,
        app_transactions: Sequence[tuple[str, int]]
        | Callable[[DeltaTable], Sequence[tuple[str, int]]],
        guard: Callable[[DeltaTable], None],
        queues: Sequence[str] = (),
        during: str = "commit",
        after_commit: Callable[[], None] | None = None,
    ) -> None:
        """Append one coordinator row with ``app_transactions``, ``guard`` checked on the
        snapshot the commit is built on. A storage fault is one typed error (``faults.py``)
        whose advice is that of ``during``; ``after_commit`` runs right after the commit, inside
        the same translation (an exception there is a lost acknowledgement: crash tests).
        ``app_transactions`` may be a function of that snapshot (called after the guard)."""
        row = pa.table(
            {
                "txn_id": [txn_id],
                "transactional_id": [transactional_id],
                "epoch": [epoch],
                "action": [action],
                "queues": [json.dumps(sorted(queues))],
                "at": [datetime.fromtimestamp(now_ms() / 1000, UTC)],
            },
            schema=SCHEMA,
        )
        delay = 0.002
        for _ in range(200):
            try:
                with self.system.lock, translated(table="the transaction coordinator",
                                                  uri=self.system.uri, during=during):
                    # the guard and the commit see the same snapshot
                    dt = self.snapshot()
                    guard(dt)
                    apps = app_transactions(dt) if callable(app_transactions) else app_transactions
                    write_deltalake(
                        dt,
                        row,
                        mode="append",
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(a, v) for a, v in apps],
                            custom_metadata={"cues.txn": txn_id, "cues.action": action},
                        ),
                        post_commithook_properties=COMMIT_HOOKS,
                    )
                    if after_commit is not None:
                        after_commit()
                return
            except CommitFailedError:
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.25)
        raise ConcurrentAppendError(
            f"transaction {txn_id}: coordinator stayed contended", txn_id=txn_id
        )

    def rows(self, txn_id: str, *actions: str) -> pa.Table:
        """The coordinator's rows of ``txn_id`` whose action is one of ``actions``."""
        return (
            self.snapshot()
            .to_pyarrow_dataset()
            .to_table(filter=(pc.field("txn_id") == txn_id)
                      & pc.is_in(pc.field("action"), pa.array(list(actions), pa.string())))
        )

    def decided_queues(self, txn_id: str) -> list[str]:
        rows = self.rows(txn_id, *DECISIONS)
        return json.loads(rows["queues"][0].as_py()) if rows.num_rows else []

    def registered_queues(self, txn_id: str) -> list[str]:
        """The queues the transaction's sends registered (one ``add`` row per queue)."""
        rows = self.rows(txn_id, "add")
        return sorted({q for cell in rows["queues"].to_pylist() for q in json.loads(cell or "[]")})

    def decision_action(self, txn_id: str) -> str | None:
        """How the transaction was decided: committed, aborted (by its producer), timeout or
        operator-abort; None while undecided."""
        why = self.snapshot().transaction_version(ABORT_REASON.id(txn_id))
        for reason, code in REASONS.items():
            if why is not None and int(why) == code:
                return reason
        rows = self.rows(txn_id, *DECISIONS)
        return rows["action"][0].as_py() if rows.num_rows else None

    @staticmethod
    def deadline_ms(txn_id: str, dt: DeltaTable) -> int | None:
        """The deadline ``begin`` recorded (ms of the platform clock); None before timeouts."""
        version = dt.transaction_version(DEADLINE.id(txn_id))
        return None if version is None else int(version)

    def expire(
        self, txn_id: str, *, reason: str = TIMEOUT, require_expired: bool = True,
        roll_forward: bool = True, default_deadline_ms: int | None = None,
    ) -> TxnStatus:
        return self.decide_abort(
            txn_id, reason=reason, require_expired=require_expired, roll_forward=roll_forward,
            default_deadline_ms=default_deadline_ms)[0]

    def decide_abort(
        self, txn_id: str, *, reason: str, require_expired: bool, roll_forward: bool = True,
        default_deadline_ms: int | None = None,
    ) -> tuple[TxnStatus, bool]:
        """Abort ``txn_id`` if it is still open (and, with ``require_expired``, past its deadline,
        or ``default_deadline_ms`` for a transaction begun before deadlines were recorded); return
        the coordinator's decision, whoever made it. One guarded coordinator commit that sets
        ``txn:`` to aborted and raises the transactional id's ``tid:`` past the transaction's
        epoch (fencing its owner), exactly as a decision of the owner or a newer instance: a
        concurrent decision conflicts and exactly one lands. :meth:`decide_abort` also says
        whether this call made the decision."""
        begun = self.rows(txn_id, "begin")
        if begun.num_rows == 0:
            raise UnknownTransactionError(
                f"transaction {txn_id!r} is unknown to the coordinator (never begun in this lake); "
                "check the id with `cues txn list`", txn_id=txn_id)
        tid = begun["transactional_id"][0].as_py()
        epoch = int(begun["epoch"][0].as_py())
        queues = self.registered_queues(txn_id)
        landed: list[TxnStatus] = []

        def guard(dt: DeltaTable) -> None:
            current = self.status(txn_id, dt)
            if current is not TxnStatus.OPEN:
                landed.append(current)
                raise AlreadyDecided
            if require_expired:
                deadline = self.deadline_ms(txn_id, dt)
                deadline = default_deadline_ms if deadline is None else deadline
                if deadline is None or now_ms() <= deadline:
                    landed.append(TxnStatus.OPEN)
                    raise AlreadyDecided

        def fence(dt: DeltaTable) -> list[tuple[str, int]]:
            newest = dt.transaction_version(TRANSACTIONAL_EPOCH.id(tid))
            bumped = max(epoch + 1, -1 if newest is None else int(newest))
            return [(TRANSACTIONAL_EPOCH.id(tid), bumped), (TXN_STATUS.id(txn_id), int(TxnStatus.ABORTED)),
                    (ABORT_REASON.id(txn_id), REASONS[reason])]

        try:
            self.record(txn_id=txn_id, transactional_id=tid, epoch=epoch, action="aborted",
                        queues=queues, app_transactions=fence, guard=guard, during="decide")
        except AlreadyDecided:
            return landed[-1], False
        if roll_forward:
            for name in queues:
                write_marker(QueueHandle(lake=self.lake, name=name), txn_id, TxnStatus.ABORTED)
        return TxnStatus.ABORTED, True

    def open_transactions(self) -> list[OpenTransaction]:
        """Every transaction the coordinator holds open, oldest first."""
        dt = self.snapshot()
        begun = dt.to_pyarrow_dataset().to_table(filter=pc.field("action") == "begin")
        out = []
        for row in begun.to_pylist():
            txn = row["txn_id"]
            if self.status(txn, dt) is not TxnStatus.OPEN:
                continue
            began = int(row["at"].timestamp() * 1000)
            deadline = self.deadline_ms(txn, dt)
            out.append(OpenTransaction(
                txn_id=txn, transactional_id=row["transactional_id"], epoch=int(row["epoch"]),
                began_ms=began,
                deadline_ms=began + DEFAULT_TIMEOUT_MS if deadline is None else deadline,
                queues=tuple(self.registered_queues(txn))))
        return sorted(out, key=lambda t: t.began_ms)


@dataclass(frozen=True)
class OpenTransaction:
    """An open transaction as ``cues txn list`` shows it (times in ms of the platform clock)."""

    txn_id: str
    transactional_id: str
    epoch: int
    began_ms: int
    deadline_ms: int
    queues: tuple[str, ...]

    def age_s(self, now: int | None = None) -> float:
        return ((now_ms() if now is None else now) - self.began_ms) / 1000

    def expired(self, now: int | None = None) -> bool:
        return (now_ms() if now is None else now) > self.deadline_ms


def open_transactions(lake: LakeLocation) -> list[OpenTransaction]:
    """The lake's open transactions (``cues txn list``)."""
    return Coordinator(lake).open_transactions()


def abort_expired(lake: LakeLocation, *, coordinator: Coordinator | None = None) -> list[str]:
    """Abort every open transaction past its deadline (the sweep of maintenance and ``cues txn
    list``); returns the ids this call aborted. It scans the coordinator's ``begin`` rows: its
    cost grows with the transactions ever begun (0.78 s after 500 on a local lake)."""
    coordinator = coordinator or Coordinator(lake)
    aborted = []
    for txn in coordinator.open_transactions():
        if txn.expired() and coordinator.expire(
                txn.txn_id, default_deadline_ms=txn.deadline_ms) is TxnStatus.ABORTED:
            aborted.append(txn.txn_id)
    return aborted


def abort_transaction(lake: LakeLocation, txn_id: str, *, coordinator: Coordinator | None = None) -> None:
    """An operator's abort of an open transaction (``cues txn abort``): the same fenced decision
    as a timeout, without waiting for the deadline. An unknown id raises
    :class:`UnknownTransactionError`, a decided one :class:`TransactionStateError`."""
    coordinator = coordinator or Coordinator(lake)
    status, decided = coordinator.decide_abort(txn_id, reason=OPERATOR_ABORT, require_expired=False)
    if not decided:
        action = coordinator.decision_action(txn_id) or status.name.lower()
        raise TransactionStateError(
            f"transaction {txn_id!r} is already decided ({action}): "
            "there is nothing to abort; `cues txn list` shows the open ones",
            txn_id=txn_id, status=status.name.lower())


def resolve_statuses(queue: QueueHandle, dt: DeltaTable, txn_ids: Sequence[str]) -> dict[str, TxnStatus]:
    """Status of each transaction: the queue's own marker first, else the coordinator. An open
    transaction past its deadline is aborted here (a fenced coordinator decision, no marker
    written: the coordinator answers the next reader), so a read_committed reader behind a
    producer that died mid-transaction waits at most the transaction's timeout."""
    out: dict[str, TxnStatus] = {}
    missing = []
    for txn in txn_ids:
        marker = dt.transaction_version(TXN_MARKER.id(txn))
        if marker is None:
            missing.append(txn)
        else:
            out[txn] = TxnStatus(int(marker))
    if missing:
        coordinator = Coordinator(queue.lake)
        snap = coordinator.snapshot()
        for txn in missing:
            out[txn] = coordinator.status(txn, snap)
            deadline = coordinator.deadline_ms(txn, snap)
            if out[txn] is TxnStatus.OPEN and deadline is not None and now_ms() > deadline:
                out[txn] = coordinator.expire(txn, roll_forward=False)
    return out


def write_marker(queue: QueueHandle, txn_id: str, status: TxnStatus) -> None:
    """Roll a decision forward onto one queue (an empty commit carrying the marker)."""
    dt = queue.refresh()
    if dt.transaction_version(TXN_MARKER.id(txn_id)) == int(status):
        return
    with translated(table=f"queue {queue.name!r}", uri=queue.uri, during="roll-forward"):
        _write_marker(dt, queue, txn_id, status)


def _write_marker(dt: DeltaTable, queue: QueueHandle, txn_id: str, status: TxnStatus) -> None:
    write_deltalake(
        dt,
        queue.table_schema.empty_table(),
        mode="append",
        commit_properties=CommitProperties(
            # the queue's marker may expire (readers then ask the coordinator, whose ``txn:``
            # entries carry no lastUpdated and never expire: an absent one reads as aborted)
            app_transactions=[app_transaction(TXN_MARKER.id(txn_id), int(status), at_ms=now_ms())],
            max_commit_retries=100,
            custom_metadata={"cues.txn": txn_id, "cues.action": status.name.lower()},
        ),
        post_commithook_properties=COMMIT_HOOKS,
    )


class AlreadyDecided(Exception):  # noqa: N818 - internal signal of _decide's guard, never raised out
    """The coordinator already holds a decision for the transaction (see ``_decide``)."""


class PastDeadline(Exception):  # noqa: N818 - internal signal of _decide's guard, never raised out
    """The owner asked to commit a transaction past its deadline (see ``_decide``)."""


