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

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deltalake import DeltaTable

from cues_platform.clock import now_ms
from cues_platform.queues.appender import AppendResult, prepare_batches
from cues_platform.queues.coordinator import (
    DEFAULT_TIMEOUT_S,
    OPERATOR_ABORT,
    TIMEOUT,
    AlreadyDecided,
    Coordinator,
    PastDeadline,
    TxnStatus,
    write_marker,
)
from cues_platform.queues.errors import (
    ProducerFencedError,
    TransactionStateError,
)
from cues_platform.queues.handle import QueueHandle
from cues_platform.queues.idempotence import SequenceState
from cues_platform.queues.layout import (
    CURRENT_TXN,
    DEADLINE,
    TRANSACTIONAL_EPOCH,
    TXN_STATUS,
)
from cues_platform.queues.location import LakeLocation
from cues_platform.queues.names import validate_id
from cues_platform.queues.schema import SEND_OPTIONS, argument_error, check_options


class TransactionalProducer:
    """Kafka's transactional producer: ``init_transactions`` once, then begin/send/commit|abort.

    ``hook`` is called with the name of each step ("begun", "sent", "decided", "rolled_forward")
    so crash tests can kill the process at an exact point. ``timeout`` (seconds, default 60:
    Kafka's ``transaction.timeout.ms``) bounds how long a transaction may stay open: past it,
    whoever sees it aborts it and this producer's commit fails with :class:`ProducerFencedError`.
    """

    def __init__(
        self, lake: LakeLocation, *, transactional_id: str, hook: Callable[[str], None] | None = None,
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
        self._touched: dict[str, QueueHandle] = {}
        self._senders: dict[str, SequenceState] = {}
        self._hook = hook or (lambda _step: None)

    @property
    def producer_id(self) -> str:
        """The idempotent producer id of this transactional id's sends on each queue."""
        return f"txn:{self.transactional_id}"

    @property
    def _tid(self) -> str:
        return TRANSACTIONAL_EPOCH.id(self.transactional_id)

    @property
    def _cur(self) -> str:
        return CURRENT_TXN.id(self.transactional_id)

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
            app_transactions=[(self._tid, self.epoch), (self._cur, number), (TXN_STATUS.id(txn), 0),
                              (DEADLINE.id(txn), now_ms() + self.timeout_ms)],
            guard=self._check_epoch,
        )
        self.txn_id, self._touched = txn, {}
        self._hook("begun")
        return txn

    def send(self, queue: QueueHandle, data: Any, *, partition: str, **options: Any) -> AppendResult:
        return self.send_many(queue, {partition: data}, **options)

    def send_many(self, queue: QueueHandle, batches: Mapping[str, Any], **options: Any) -> AppendResult:
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
            raise AlreadyDecided

        try:
            self.coordinator.record(
                txn_id=txn, transactional_id=self.transactional_id, epoch=self.epoch or 0,
                action="add", queues=[name], app_transactions=[(self._tid, self.epoch or 0)],
                guard=guard, during="send")
        except AlreadyDecided:
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
                raise AlreadyDecided
            deadline = self.coordinator.deadline_ms(txn, dt)
            if status is TxnStatus.COMMITTED and deadline is not None and now_ms() > deadline:
                raise PastDeadline

        try:
            self.coordinator.record(
                txn_id=txn,
                transactional_id=self.transactional_id,
                epoch=self.epoch or 0,
                action=status.name.lower(),
                queues=queues,
                app_transactions=[(self._tid, self.epoch or 0), (TXN_STATUS.id(txn), int(status))],
                guard=guard,
                during="decide",
                after_commit=after_commit,
            )
        except AlreadyDecided:
            return landed[-1]
        except PastDeadline:
            self._expired(txn)
        return status

    def _roll_forward(self, txn: str, status: TxnStatus, queues: Sequence[str]) -> None:
        for name in queues:
            queue = self._touched.get(name) or QueueHandle(lake=self.lake, name=name)
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


def new_transactional_id() -> str:
    return f"txn-{uuid.uuid4().hex[:12]}"
