"""Transactional producer: appends across queues and partitions that commit all or nothing.

Kafka's design on Delta. The coordinator is a small Delta table (``_cues/transactions``) whose app
transactions hold the state: ``tid:{transactional id} = epoch`` (fencing), ``cur:{tid} = n`` (the
newest transaction of that id) and ``txn:{txn id} = 0 open | 1 committed | 2 aborted``.

Delivery contract of one transaction:

1. ``begin``: one coordinator commit records the transaction as open (guard: this instance's epoch
   is still the newest, and the previous transaction is decided).
2. ``send``: ordinary appends (dense offsets, one commit each) whose rows carry ``_txn_id``.
   ``read_uncommitted`` readers see them at once; ``read_committed`` readers stop before them.
   Each send is idempotent (``idempotence.py``) under the producer id ``txn:{transactional id}``
   on that queue: the instance opens its own epoch there on its first send (fencing a zombie
   instance's sends on that queue), numbers its sends, and a send that failed (its commit may have
   landed: a lost acknowledgement) must be resent as is, which writes it at most once; ``commit``
   refuses while such a send is unresolved, ``abort`` forgets it.
3. ``commit`` / ``abort``: ONE coordinator commit sets ``txn:{id}`` to 1 or 2. This is the decision;
   it is atomic, happens once (a concurrent decision on the same id conflicts), and is refused if a
   newer instance has fenced this one.
4. Roll forward: an empty commit on each touched queue sets the marker ``txn:{id}`` there too, so
   readers resolve the status from the queue's own snapshot. Readers that find no marker ask the
   coordinator, so a crash between 3 and 4 changes nothing they see.

On abort (crash) before 3 the transaction stays open; the next ``init_transactions`` of the same
transactional id bumps the epoch (fencing the old instance: its decision fails with
:class:`ProducerFencedError`) and aborts it.

Timeout (Kafka's ``transaction.timeout.ms``, default 60 s): ``begin`` records the transaction's
deadline in the coordinator (``dl:{txn id}`` = deadline in ms of the platform clock,
``cues_platform/clock.py``), and the first send to each queue registers that queue there (an
``add`` row, Kafka's AddPartitionsToTxn). A transaction still open past its deadline is aborted by
whoever next sees it: a ``read_committed`` reader computing the last stable offset, the sweep
(:func:`abort_expired`: maintenance, ``cues txn list``), the next ``init_transactions`` of its
transactional id, or its own owner's ``commit`` (``init_transactions`` of other ids does not
sweep: the sweep scans the coordinator's rows, one small file per coordinator commit, 0.78 s
after 500 transactions). That abort is one guarded coordinator decision like any other (it conflicts
with a concurrent commit: exactly one lands) which also raises ``tid:`` past the transaction's
epoch, so the stalled owner's later send or commit fails with :class:`ProducerFencedError` saying
the transaction timed out. ``cues txn abort`` is the same decision without the deadline. A crash after 3 is finished by rolling the markers
forward. Rows of a transaction id the coordinator never opened can never commit and count as
aborted.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from cues_platform.clock import now_ms
from cues_platform.queues.appender import AppendResult, app_transaction, prepare_batches
from cues_platform.queues.errors import (
    ConcurrentAppendError,
    ProducerFencedError,
    TransactionStateError,
    UnknownTransactionError,
)
from cues_platform.queues.faults import translated
from cues_platform.queues.idempotence import SequenceState
from cues_platform.queues.lake import Lake
from cues_platform.queues.maintenance import COMMIT_HOOKS
from cues_platform.queues.names import validate_id
from cues_platform.queues.positions import SystemTable
from cues_platform.queues.schema import SEND_OPTIONS, argument_error, check_options

if TYPE_CHECKING:
    from cues_platform.queues.queue import Queue

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


def txn_app_id(txn_id: str) -> str:
    return f"txn:{txn_id}"


class Coordinator:
    """The coordinator's Delta table and race-free guarded commits on it."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        # A SystemTable keeps the handle fresh at a flat cost: re-opened from the newest
        # checkpoint every REOPEN_EVERY commits, old log entries cleaned (positions.py).
        self.system = SystemTable(lake, "transactions", SCHEMA)

    def snapshot(self) -> DeltaTable:
        return self.system.snapshot()

    def status(self, txn_id: str, dt: DeltaTable | None = None) -> TxnStatus:
        version = (dt or self.snapshot()).transaction_version(txn_app_id(txn_id))
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
        why = self.snapshot().transaction_version(reason_app_id(txn_id))
        for reason, code in REASONS.items():
            if why is not None and int(why) == code:
                return reason
        rows = self.rows(txn_id, *DECISIONS)
        return rows["action"][0].as_py() if rows.num_rows else None

    @staticmethod
    def deadline_ms(txn_id: str, dt: DeltaTable) -> int | None:
        """The deadline ``begin`` recorded (ms of the platform clock); None before timeouts."""
        version = dt.transaction_version(deadline_app_id(txn_id))
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
                raise _AlreadyDecided
            if require_expired:
                deadline = self.deadline_ms(txn_id, dt)
                deadline = default_deadline_ms if deadline is None else deadline
                if deadline is None or now_ms() <= deadline:
                    landed.append(TxnStatus.OPEN)
                    raise _AlreadyDecided

        def fence(dt: DeltaTable) -> list[tuple[str, int]]:
            newest = dt.transaction_version(f"tid:{tid}")
            bumped = max(epoch + 1, -1 if newest is None else int(newest))
            return [(f"tid:{tid}", bumped), (txn_app_id(txn_id), int(TxnStatus.ABORTED)),
                    (reason_app_id(txn_id), REASONS[reason])]

        try:
            self.record(txn_id=txn_id, transactional_id=tid, epoch=epoch, action="aborted",
                        queues=queues, app_transactions=fence, guard=guard, during="decide")
        except _AlreadyDecided:
            return landed[-1], False
        if roll_forward:
            for name in queues:
                write_marker(self.lake.queue(name), txn_id, TxnStatus.ABORTED)
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


def deadline_app_id(txn_id: str) -> str:
    return f"dl:{txn_id}"


def reason_app_id(txn_id: str) -> str:
    return f"why:{txn_id}"


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


def open_transactions(lake: Lake) -> list[OpenTransaction]:
    """The lake's open transactions (``cues txn list``)."""
    return Coordinator(lake).open_transactions()


def abort_expired(lake: Lake, *, coordinator: Coordinator | None = None) -> list[str]:
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


def abort_transaction(lake: Lake, txn_id: str, *, coordinator: Coordinator | None = None) -> None:
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


def resolve_statuses(queue: Queue, dt: DeltaTable, txn_ids: Sequence[str]) -> dict[str, TxnStatus]:
    """Status of each transaction: the queue's own marker first, else the coordinator. An open
    transaction past its deadline is aborted here (a fenced coordinator decision, no marker
    written: the coordinator answers the next reader), so a read_committed reader behind a
    producer that died mid-transaction waits at most the transaction's timeout."""
    out: dict[str, TxnStatus] = {}
    missing = []
    for txn in txn_ids:
        marker = dt.transaction_version(txn_app_id(txn))
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


def write_marker(queue: Queue, txn_id: str, status: TxnStatus) -> None:
    """Roll a decision forward onto one queue (an empty commit carrying the marker)."""
    dt = queue.refresh()
    if dt.transaction_version(txn_app_id(txn_id)) == int(status):
        return
    with translated(table=f"queue {queue.name!r}", uri=queue.uri, during="roll-forward"):
        _write_marker(dt, queue, txn_id, status)


def _write_marker(dt: DeltaTable, queue: Queue, txn_id: str, status: TxnStatus) -> None:
    write_deltalake(
        dt,
        queue.table_schema.empty_table(),
        mode="append",
        commit_properties=CommitProperties(
            # the queue's marker may expire (readers then ask the coordinator, whose ``txn:``
            # entries carry no lastUpdated and never expire: an absent one reads as aborted)
            app_transactions=[app_transaction(txn_app_id(txn_id), int(status), at_ms=now_ms())],
            max_commit_retries=100,
            custom_metadata={"cues.txn": txn_id, "cues.action": status.name.lower()},
        ),
        post_commithook_properties=COMMIT_HOOKS,
    )


class TransactionalProducer:
    """Kafka's transactional producer: ``init_transactions`` once, then begin/send/commit|abort.

    ``hook`` is called with the name of each step ("begun", "sent", "decided", "rolled_forward")
    so crash tests can kill the process at an exact point. ``timeout`` (seconds, default 60:
    Kafka's ``transaction.timeout.ms``) bounds how long a transaction may stay open: past it,
    whoever sees it aborts it and this producer's commit fails with :class:`ProducerFencedError`.
    """

    def __init__(
        self, lake: Lake, *, transactional_id: str, hook: Callable[[str], None] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.lake = lake
        self.transactional_id = validate_id(transactional_id, kind="transactional id")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise argument_error(
                "TransactionalProducer", "timeout", timeout, "not a positive number of seconds",
                f"a timeout > 0 in seconds (default {DEFAULT_TIMEOUT_S:g}, Kafka's)")
        self.timeout_ms = max(1, round(timeout * 1000))
        self.coordinator = Coordinator(lake)
        self.epoch: int | None = None
        self.txn_id: str | None = None
        self._touched: dict[str, Queue] = {}
        self._senders: dict[str, SequenceState] = {}
        self._hook = hook or (lambda _step: None)

    @property
    def producer_id(self) -> str:
        """The idempotent producer id of this transactional id's sends on each queue."""
        return f"txn:{self.transactional_id}"

    @property
    def _tid(self) -> str:
        return f"tid:{self.transactional_id}"

    @property
    def _cur(self) -> str:
        return f"cur:{self.transactional_id}"

    def _check_epoch(self, dt: DeltaTable) -> None:
        newest = dt.transaction_version(self._tid)
        if newest is not None and self.epoch is not None and int(newest) > self.epoch:
            how = (self.coordinator.decision_action(self.txn_id)
                   if self.txn_id is not None
                   and self.coordinator.status(self.txn_id, dt) is TxnStatus.ABORTED else None)
            if how in (TIMEOUT, OPERATOR_ABORT):
                raise ProducerFencedError(
                    f"transaction {self.txn_id} of transactional id {self.transactional_id!r} "
                    + (f"timed out (open longer than its timeout of {self.timeout_ms / 1000:g} s) "
                       "and was aborted" if how == TIMEOUT
                       else "was aborted by an operator (`cues txn abort`)")
                    + f"; epoch {self.epoch} is fenced: call init_transactions() and redo the "
                    + ("transaction (shorter, or with a longer timeout)" if how == TIMEOUT
                       else "transaction"),
                    transactional_id=self.transactional_id, epoch=self.epoch,
                    newest=int(newest), txn_id=self.txn_id, reason=how)
            raise ProducerFencedError(
                f"transactional id {self.transactional_id!r}: epoch {self.epoch} was fenced by a newer "
                f"instance (epoch {newest}); stop this producer",
                transactional_id=self.transactional_id,
                epoch=self.epoch,
                newest=int(newest),
            )

    def init_transactions(self) -> int:
        """Fence older instances, finish the last transaction they left, and return the epoch."""
        self._senders = {}  # a re-init opens new epochs on the queues at its first send
        self.txn_id, self._touched = None, {}
        dt = self.coordinator.snapshot()
        current = dt.transaction_version(self._tid)
        self.epoch = 0 if current is None else int(current) + 1
        self.coordinator.record(
            txn_id="-",
            transactional_id=self.transactional_id,
            epoch=self.epoch,
            action="init",
            app_transactions=[(self._tid, self.epoch)],
            guard=self._check_epoch,
        )
        dt = self.coordinator.snapshot()
        last = dt.transaction_version(self._cur)
        if last is not None:
            txn = f"{self.transactional_id}#{int(last)}"
            status = self.coordinator.status(txn, dt)
            if status is TxnStatus.OPEN:
                queues = self.coordinator.registered_queues(txn)
                self._roll_forward(txn, self._decide(txn, TxnStatus.ABORTED, queues=queues), queues)
            else:
                self._roll_forward(txn, status, self.coordinator.decided_queues(txn))
        return self.epoch

    def begin(self) -> str:
        if self.epoch is None:
            raise TransactionStateError("call init_transactions() before begin()")
        if self.txn_id is not None:
            raise TransactionStateError(
                f"transaction {self.txn_id} is still open: commit or abort it"
            )
        dt = self.coordinator.snapshot()
        last = dt.transaction_version(self._cur)
        number = 0 if last is None else int(last) + 1
        txn = f"{self.transactional_id}#{number}"
        self.coordinator.record(
            txn_id=txn,
            transactional_id=self.transactional_id,
            epoch=self.epoch,
            action="begin",
            app_transactions=[(self._tid, self.epoch), (self._cur, number), (txn_app_id(txn), 0),
                              (deadline_app_id(txn), now_ms() + self.timeout_ms)],
            guard=self._check_epoch,
        )
        self.txn_id, self._touched = txn, {}
        self._hook("begun")
        return txn

    def send(self, queue: Queue, data: Any, *, partition: str, **options: Any) -> AppendResult:
        return self.send_many(queue, {partition: data}, **options)

    def send_many(self, queue: Queue, batches: Mapping[str, Any], **options: Any) -> AppendResult:
        """Send ``{partition: batch}`` to ``queue`` in the open transaction (one commit).

        ``options``: ``delivery_hash``, ``message_type``, ``commit_metadata``, ``max_attempts``
        (and ``sequence``, ``guards``, ``app_transactions`` as :meth:`Producer.send_many`). Every
        argument is checked before anything is read or written: ``txn_id`` is the open
        transaction's, set by the producer, so passing one is an
        :class:`~cues_platform.queues.errors.InvalidArgumentError`, as is an unknown option."""
        _check_send_options(options, queue=getattr(queue, "name", None))
        if self.txn_id is None:
            raise TransactionStateError("send() outside a transaction: call begin() first")
        tables = prepare_batches(queue, batches, call=SEND_CALL)
        if queue.name not in self._touched:
            self._register(queue.name)  # checks the epoch and the deadline too
        else:
            self._check_epoch(self.coordinator.snapshot())
        sender = self._senders.get(queue.name)
        if sender is None:
            sender = SequenceState(queue, producer_id=self.producer_id)
            self._senders[queue.name] = sender
        self._touched[queue.name] = queue
        return sender.send(
            tables, txn_id=self.txn_id, after_commit=lambda: self._hook("sent"), **options
        )

    def _register(self, name: str) -> None:
        """Record in the coordinator that the open transaction writes to queue ``name`` (before
        its first row there), so a timeout or operator abort rolls its marker forward."""
        txn = self.txn_id
        assert txn is not None

        def guard(dt: DeltaTable) -> None:
            self._check_epoch(dt)
            if self.coordinator.status(txn, dt) is TxnStatus.OPEN:
                deadline = self.coordinator.deadline_ms(txn, dt)
                if deadline is None or now_ms() <= deadline:
                    return
            raise _AlreadyDecided

        try:
            self.coordinator.record(
                txn_id=txn, transactional_id=self.transactional_id, epoch=self.epoch or 0,
                action="add", queues=[name], app_transactions=[(self._tid, self.epoch or 0)],
                guard=guard, during="send")
        except _AlreadyDecided:
            self._expired(txn)

    def _expired(self, txn: str) -> None:
        """The open transaction is past its deadline: abort it (fenced) and raise why."""
        self.coordinator.expire(txn)
        self._check_epoch(self.coordinator.snapshot())  # raises: the abort raised tid
        raise TransactionStateError(  # unreachable unless the coordinator lost the abort
            f"transaction {txn} is past its deadline but could not be aborted; retry",
            txn_id=txn)

    def commit(self) -> None:
        self._finish(TxnStatus.COMMITTED)

    def abort(self) -> None:
        self._finish(TxnStatus.ABORTED)

    def _finish(self, status: TxnStatus) -> None:
        """Decide ``status`` for the open transaction and roll it forward.

        Idempotent after a failure: a decision whose acknowledgement was lost (the coordinator
        took it, the answer never came) is found in the coordinator, never made twice, and its
        roll-forward is completed; asking for the other decision then raises
        :class:`TransactionStateError` saying what was decided, after rolling *that* decision
        forward, and the producer is ready for ``begin()``."""
        if self.txn_id is None:
            raise TransactionStateError("no open transaction to commit or abort")
        txn, queues = self.txn_id, sorted(self._touched)
        unresolved = {
            name: state.pending[0] for name, state in self._senders.items() if state.pending
        }
        if unresolved and status is TxnStatus.COMMITTED:
            raise TransactionStateError(
                f"transaction {txn}: a send failed and may or may not have been written "
                f"(queue: pending sequence {unresolved}); resend the same batch, or abort",
                txn_id=txn,
                pending=unresolved,
            )
        decided = self._decide(txn, status, queues=queues, after_commit=lambda: self._hook("decided"))
        if decided is status:
            for name in unresolved:
                self._senders[name].reset()
        self._roll_forward(txn, decided, queues)  # this instance's queues, whichever call decided
        self._hook("rolled_forward")
        self.txn_id, self._touched = None, {}
        if decided is not status:
            raise TransactionStateError(
                f"transaction {txn} is already {decided.name.lower()} (an earlier "
                f"{'commit' if decided is TxnStatus.COMMITTED else 'abort'}() landed though it "
                f"reported a failure) and cannot be {status.name.lower()}; its outcome is rolled "
                "forward onto its queues and the producer is ready for begin()",
                txn_id=txn, status=decided.name.lower())

    def _decide(
        self, txn: str, status: TxnStatus, *, queues: Sequence[str],
        after_commit: Callable[[], None] | None = None,
    ) -> TxnStatus:
        """Record ``status`` for ``txn`` once; return the decision the coordinator holds: ours,
        or one that landed earlier (a lost acknowledgement of this producer's own decision: only
        this instance's epoch decides its transactions, a newer instance fences it first)."""
        landed: list[TxnStatus] = []

        def guard(dt: DeltaTable) -> None:
            self._check_epoch(dt)
            current = self.coordinator.status(txn, dt)
            if current is not TxnStatus.OPEN:
                landed.append(current)
                raise _AlreadyDecided
            deadline = self.coordinator.deadline_ms(txn, dt)
            if status is TxnStatus.COMMITTED and deadline is not None and now_ms() > deadline:
                raise _PastDeadline

        try:
            self.coordinator.record(
                txn_id=txn,
                transactional_id=self.transactional_id,
                epoch=self.epoch or 0,
                action=status.name.lower(),
                queues=queues,
                app_transactions=[(self._tid, self.epoch or 0), (txn_app_id(txn), int(status))],
                guard=guard,
                during="decide",
                after_commit=after_commit,
            )
        except _AlreadyDecided:
            return landed[-1]
        except _PastDeadline:
            self._expired(txn)
        return status

    def _roll_forward(self, txn: str, status: TxnStatus, queues: Sequence[str]) -> None:
        for name in queues:
            queue = self._touched.get(name) or self.lake.queue(name)
            write_marker(queue, txn, status)


SEND_CALL = "TransactionalProducer.send"
# the send options a caller may pass (txn_id and after_commit are the producer's own)
SEND_ARGUMENTS = (*(o for o in SEND_OPTIONS if o != "txn_id"), "sequence", "guards",
                  "app_transactions")


def _check_send_options(options: Mapping[str, Any], *, queue: str | None) -> None:
    """Refuse ``txn_id`` (the producer sets it: Python would raise "got multiple values for
    keyword argument") and any option a send does not take, each by name, before anything."""
    if "txn_id" in options:
        raise argument_error(
            SEND_CALL, "txn_id", options["txn_id"],
            "set by the producer (its rows carry the open transaction's id)",
            "no txn_id: begin() opens the transaction whose id every send carries", queue=queue)
    check_options(options, call=SEND_CALL, allowed=SEND_ARGUMENTS, queue=queue)


class _AlreadyDecided(Exception):  # noqa: N818 - internal signal of _decide's guard, never raised out
    """The coordinator already holds a decision for the transaction (see ``_decide``)."""


class _PastDeadline(Exception):  # noqa: N818 - internal signal of _decide's guard, never raised out
    """The owner asked to commit a transaction past its deadline (see ``_decide``)."""


def new_transactional_id() -> str:
    return f"txn-{uuid.uuid4().hex[:12]}"
