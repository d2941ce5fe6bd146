"""Transaction timeout (issue 23 item 3): a transaction open past its deadline is aborted by whoever
sees it (a read_committed reader, any producer's init, its owner's commit, ``cues txn``), as one
fenced coordinator decision; its owner is then fenced. Time is the platform clock, advanced."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from click.testing import CliRunner

from cues_platform import clock
from cues_platform.queues import Lake, ProducerFencedError, TransactionalProducer
from cues_platform.queues.coordinator import (
    Coordinator,
    TxnStatus,
    abort_expired,
    abort_transaction,
    open_transactions,
)
from cues_platform.queues.errors import TransactionStateError, UnknownTransactionError
from cues_platform.queues.schema import InvalidArgumentError
from tests.support import rows


@pytest.fixture(autouse=True)
def _real_clock():
    clock.reset()
    yield
    clock.reset()


def _committed(queue) -> list[int]:
    return queue.read_arrow(partition="0", isolation="read_committed")["id"].to_pylist()


def _stalled(lake, make_queue, *, timeout: float = 60.0):
    """A producer with an open transaction (rows 0, 1) and a plain row (100) after it."""
    q = make_queue("debits")
    owner = TransactionalProducer(lake, transactional_id="stalls", timeout=timeout)
    owner.init_transactions()
    txn = owner.begin()
    owner.send(q, rows(0, 2), partition="0")
    q.append(rows(100, 1), partition="0")
    return q, owner, txn


def test_a_reader_past_the_deadline_aborts_and_the_owner_is_fenced(lake, make_queue) -> None:
    began = clock.now_ms()
    q, owner, txn = _stalled(lake, make_queue)
    deadline = Coordinator.deadline_ms(txn, Coordinator(lake).snapshot())
    assert deadline is not None and began + 60_000 <= deadline <= clock.now_ms() + 60_000
    assert _committed(q) == []  # stopped at the last stable offset
    clock.advance(seconds=59)
    assert _committed(q) == []  # before its deadline nobody aborts it
    assert Coordinator(lake).status(txn) is TxnStatus.OPEN
    clock.advance(seconds=2)
    assert _committed(q) == [100]  # the reader aborted it and moved on
    coordinator = Coordinator(lake)
    assert coordinator.status(txn) is TxnStatus.ABORTED
    assert coordinator.decision_action(txn) == "timeout"
    # one decision row, in the coordinator's vocabulary (the jepsen checker reads committed/aborted)
    assert coordinator.rows(txn, "committed", "aborted")["action"].to_pylist() == ["aborted"]
    with pytest.raises(ProducerFencedError) as info:
        owner.commit()
    assert f"transaction {txn}" in str(info.value) and "timed out" in str(info.value)
    assert "init_transactions()" in str(info.value) and info.value.reason == "timeout"
    assert Coordinator(lake).status(txn) is TxnStatus.ABORTED  # never also committed
    with pytest.raises(ProducerFencedError):
        owner.send(q, rows(5, 1), partition="0")
    assert _committed(q) == [100]
    assert q.read_arrow(partition="0", isolation="read_uncommitted")["id"].to_pylist()[:3] == [0, 1, 100]
    owner.init_transactions()  # a new epoch: the producer goes on
    owner.begin()
    owner.send(q, rows(7, 1), partition="0")
    owner.commit()
    assert _committed(q) == [100, 7]


def test_the_owners_commit_past_its_deadline_is_aborted_and_rolled_forward(lake, make_queue) -> None:
    q, owner, txn = _stalled(lake, make_queue, timeout=5)
    clock.advance(seconds=6)  # nobody read: the owner itself is the first to see it
    with pytest.raises(ProducerFencedError) as info:
        owner.commit()
    assert "timed out" in str(info.value)
    # the registered queue carries the abort marker: readers no longer ask the coordinator
    assert q.refresh().transaction_version(f"txn:{txn}") == int(TxnStatus.ABORTED)
    assert _committed(q) == [100]


def test_the_sweep_and_the_next_init_of_the_same_id_abort_expired_transactions(
    lake, make_queue
) -> None:
    q, _owner, txn = _stalled(lake, make_queue, timeout=10)
    assert abort_expired(lake) == []  # not yet due
    assert Coordinator(lake).status(txn) is TxnStatus.OPEN
    clock.advance(seconds=11)
    assert abort_expired(lake) == [txn]  # maintenance's sweep
    assert Coordinator(lake).decision_action(txn) == "timeout"
    assert q.refresh().transaction_version(f"txn:{txn}") == int(TxnStatus.ABORTED)
    assert open_transactions(lake) == [] and abort_expired(lake) == []

    # a restart of the same id aborts its open transaction (due or not) and, the queues being
    # registered in the coordinator, rolls the abort marker forward onto them
    _q, _owner2, txn2 = _stalled_again(lake, q, timeout=10)
    TransactionalProducer(lake, transactional_id="stalls").init_transactions()
    assert Coordinator(lake).status(txn2) is TxnStatus.ABORTED
    assert q.refresh().transaction_version(f"txn:{txn2}") == int(TxnStatus.ABORTED)
    assert _committed(q) == [100]


def _stalled_again(lake, q, *, timeout: float):
    owner = TransactionalProducer(lake, transactional_id="stalls", timeout=timeout)
    owner.init_transactions()
    txn = owner.begin()
    owner.send(q, rows(50, 1), partition="0")
    return q, owner, txn


def test_timeout_must_be_positive_seconds(lake) -> None:
    for bad in (0, -1, True, "60"):
        with pytest.raises(InvalidArgumentError) as info:
            TransactionalProducer(lake, transactional_id="t", timeout=bad)
        assert "timeout" in str(info.value)


def _meeting_after_the_guard(
    coordinator: Coordinator, barrier: threading.Barrier, *, landed: threading.Event,
    first_to_commit: bool,
) -> None:
    """Make ``coordinator``'s next guarded commit wait, after its guard passed, for the other
    side's: both decisions are then built on the same snapshot. The side that is not
    ``first_to_commit`` then waits until the other's commit landed (``landed``), so its own
    commit is made on a stale snapshot and must lose the Delta conflict."""
    record = coordinator.record
    first = [True]

    def racing(**kwargs):
        guard = kwargs["guard"]

        def guard_then_meet(dt) -> None:
            guard(dt)
            if first:
                first.pop()
                barrier.wait(timeout=60)
                if not first_to_commit:
                    assert landed.wait(timeout=60)

        try:
            return record(**{**kwargs, "guard": guard_then_meet})
        finally:
            if first_to_commit:
                landed.set()

    coordinator.record = racing


def test_commit_racing_an_abort_ends_in_exactly_one_decision(lake, make_queue) -> None:
    """The owner's commit and an abort (two handles: their own Lake, coordinator handle and lock)
    both pass their guard on the same snapshot, then commit; the Delta conflict on ``txn:{id}``
    lets exactly one decision land, and each side says truthfully which one did."""
    q = make_queue("debits")
    outcomes = []
    for round_ in range(4):
        commit_first = round_ % 2 == 0
        owner = TransactionalProducer(Lake(root=lake.root), transactional_id=f"race{round_}")
        owner.init_transactions()
        txn = owner.begin()
        owner.send(q, rows(round_, 1), partition="0")
        other = Coordinator(Lake(root=lake.root))
        barrier, landed = threading.Barrier(2), threading.Event()
        _meeting_after_the_guard(owner.coordinator, barrier, landed=landed,
                                 first_to_commit=commit_first)
        _meeting_after_the_guard(other, barrier, landed=landed, first_to_commit=not commit_first)
        result: dict[str, BaseException | None] = {}

        def commit(owner=owner, result=result) -> None:
            try:
                owner.commit()
                result["commit"] = None
            except ProducerFencedError as exc:
                result["commit"] = exc

        def abort(txn=txn, other=other, result=result) -> None:
            try:
                abort_transaction(lake, txn, coordinator=other)
                result["abort"] = None
            except TransactionStateError as exc:
                result["abort"] = exc

        threads = [threading.Thread(target=commit), threading.Thread(target=abort)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert set(result) == {"commit", "abort"}, result  # both finished, with a known outcome
        status = Coordinator(lake).status(txn)
        committed, aborted = result["commit"] is None, result["abort"] is None
        assert committed != aborted, result  # exactly one side won
        assert committed is commit_first  # the first to commit; the other lost the conflict
        assert status is (TxnStatus.COMMITTED if committed else TxnStatus.ABORTED)
        if committed:
            assert "already decided (committed)" in str(result["abort"])
        else:
            assert "aborted by an operator" in str(result["commit"])
        assert (round_ in _committed(q)) is committed
        decisions = Coordinator(lake).rows(txn, "committed", "aborted")
        assert decisions.num_rows == 1  # one decision row, never both
        outcomes.append(status)
    assert outcomes == [TxnStatus.COMMITTED, TxnStatus.ABORTED] * 2


def _cli():
    from cues_platform.cli import CuesGroup
    from cues_platform.cli.txn import txn

    group = CuesGroup(name="cues")
    group.add_command(txn)
    return group


def test_cues_txn_list_and_abort(lake, make_queue) -> None:
    q, owner, txn = _stalled(lake, make_queue)
    runner = CliRunner()
    listed = runner.invoke(_cli(), ["txn", "list", "--lake", lake.root])
    assert listed.exit_code == 0, listed.output
    line = next(li for li in listed.output.splitlines() if txn in li)
    assert "stalls" in line and "debits" in line
    [open_txn] = open_transactions(lake)
    assert (open_txn.txn_id, open_txn.queues, open_txn.epoch) == (txn, ("debits",), owner.epoch)
    assert open_txn.deadline_ms - open_txn.began_ms == pytest.approx(60_000, abs=1_000)

    refused = runner.invoke(_cli(), ["txn", "abort", txn, "--lake", lake.root])
    assert refused.exit_code == 2 and "--yes" in refused.output
    assert Coordinator(lake).status(txn) is TxnStatus.OPEN

    done = runner.invoke(_cli(), ["txn", "abort", txn, "--yes", "--lake", lake.root])
    assert done.exit_code == 0 and f"aborted {txn}" in done.output
    assert _committed(q) == [100]
    with pytest.raises(ProducerFencedError) as info:
        owner.commit()
    assert "aborted by an operator" in str(info.value)

    again = runner.invoke(_cli(), ["txn", "abort", txn, "--yes", "--lake", lake.root])
    assert again.exit_code == 2 and "already decided" in again.output
    unknown = runner.invoke(_cli(), ["txn", "abort", "nobody#3", "--yes", "--lake", lake.root])
    assert unknown.exit_code == 2 and "unknown to the coordinator" in unknown.output
    with pytest.raises(UnknownTransactionError) as typed:
        abort_transaction(lake, "nobody#3")
    assert typed.value.txn_id == "nobody#3"
    assert "stalls" not in runner.invoke(_cli(), ["txn", "list", "--lake", lake.root]).output


CRASHING = """
import os, signal, sys
from cues_platform.queues import Lake, TransactionalProducer
lake = Lake(root=sys.argv[1])
p = TransactionalProducer(lake, transactional_id="doomed", timeout=float(sys.argv[2]))
p.init_transactions()
p.begin()
p.send(lake.queue("debits"), {"id": [1, 2], "note": ["a", "b"]}, partition="0")
os.kill(os.getpid(), signal.SIGKILL)
"""

TIMEOUT_S = 5.0
MARGIN_S = 3.0


def test_a_reader_behind_a_sigkilled_producer_waits_at_most_the_timeout(
    lake, make_queue, run_python
) -> None:
    """The measurement: a real producer process dies mid-transaction for good; a reader polls
    read_committed until it sees the row appended after the open transaction."""
    q = make_queue("debits")
    proc = run_python(CRASHING, lake.root, str(TIMEOUT_S), check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    killed = clock.now_ms()
    q.append(rows(100, 1), partition="0")
    [stuck] = open_transactions(lake)
    began = stuck.began_ms
    polls, seen = 0, None
    give_up = time.monotonic() + TIMEOUT_S + 60
    while time.monotonic() < give_up:
        polls += 1
        if _committed(q) == [100]:
            seen = clock.now_ms()
            break
        time.sleep(0.05)  # a reader's poll interval, not a timing assumption
    assert seen is not None, "the reader stayed stalled behind the dead transaction"
    stall = (seen - began) / 1000
    print(f"stall {stall:.2f} s after begin ({(seen - killed) / 1000:.2f} s after the kill), "
          f"timeout {TIMEOUT_S} s, {polls} polls")
    assert TIMEOUT_S <= stall <= TIMEOUT_S + MARGIN_S
    assert Coordinator(lake).decision_action(stuck.txn_id) == "timeout"
