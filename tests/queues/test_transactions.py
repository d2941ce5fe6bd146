"""Transactional producer: all-or-nothing across queues, isolation levels, crashes and fencing."""

from __future__ import annotations

import signal

import pytest

from cues_platform.queues import ProducerFencedError, TransactionalProducer, TransactionStateError
from tests.support import rows

CHILD = """
import os, signal, sys
from cues_platform.queues import Lake, TransactionalProducer
import pyarrow as pa
lake = Lake(root=sys.argv[1]); crash_at = sys.argv[2]
def hook(step):
    if step == crash_at:
        os.kill(os.getpid(), signal.SIGKILL)
p = TransactionalProducer(lake, transactional_id="payments", hook=hook)
p.init_transactions()
p.begin()
p.send(lake.queue("debits"), {"id": [1, 2], "note": ["d1", "d2"]}, partition="0")
p.send(lake.queue("credits"), {"id": [3], "note": ["c1"]}, partition="0")
if crash_at == "sent":
    os.kill(os.getpid(), signal.SIGKILL)
p.commit()
"""


def _visible(lake, name: str, isolation: str) -> list[int]:
    return lake.queue(name).read_arrow(partition="0", isolation=isolation)["id"].to_pylist()


@pytest.fixture
def two_queues(make_queue):
    return make_queue("debits"), make_queue("credits")


def test_commit_and_abort_visibility_in_both_isolation_levels(lake, two_queues) -> None:
    debits, credits = two_queues
    producer = TransactionalProducer(lake, transactional_id="t1")
    producer.init_transactions()
    producer.begin()
    producer.send(debits, rows(0, 2), partition="0")
    producer.send(credits, rows(10, 1), partition="0")
    debits.append(rows(100, 1), partition="0")  # a plain append after the open transaction
    assert _visible(lake, "debits", "read_uncommitted") == [0, 1, 100]
    assert _visible(lake, "debits", "read_committed") == []  # stops at the last stable offset
    producer.commit()
    assert _visible(lake, "debits", "read_committed") == [0, 1, 100]
    assert _visible(lake, "credits", "read_committed") == [10]

    producer.begin()
    producer.send(debits, rows(200, 2), partition="0")
    producer.abort()
    debits.append(rows(300, 1), partition="0")
    assert _visible(lake, "debits", "read_committed") == [0, 1, 100, 300]
    assert _visible(lake, "debits", "read_uncommitted") == [0, 1, 100, 200, 201, 300]
    with pytest.raises(TransactionStateError):
        producer.commit()


def test_read_committed_tailer_waits_at_an_open_transaction(lake, two_queues) -> None:
    debits, _ = two_queues
    producer = TransactionalProducer(lake, transactional_id="t2")
    producer.init_transactions()
    debits.append(rows(0, 1), partition="0")
    producer.begin()
    producer.send(debits, rows(1, 1), partition="0")
    debits.append(rows(2, 1), partition="0")
    tailer = debits.tailer("reader", partition="0")
    assert tailer.read_arrow(10)["id"].to_pylist() == [0]
    assert tailer.read_arrow(10).num_rows == 0 and tailer.position == 1
    producer.commit()
    assert tailer.read_arrow(10)["id"].to_pylist() == [1, 2]


@pytest.mark.parametrize("crash_at", ["begun", "sent", "decided"])
def test_sigkill_at_each_point_is_all_or_nothing(lake, two_queues, run_python, crash_at) -> None:
    proc = run_python(CHILD, lake.root, crash_at, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # The restarted producer fences the dead one and finishes what it left.
    TransactionalProducer(lake, transactional_id="payments").init_transactions()
    debits, credits = (
        _visible(lake, "debits", "read_committed"),
        _visible(lake, "credits", "read_committed"),
    )
    if crash_at == "decided":  # the decision was durable: roll forward
        assert (debits, credits) == ([1, 2], [3])
    else:  # undecided: aborted, nothing visible, but the rows remain for read_uncommitted
        assert (debits, credits) == ([], [])
    # Later writes are visible after the recovered transaction either way.
    lake.queue("debits").append(rows(9, 1), partition="0")
    assert _visible(lake, "debits", "read_committed")[-1] == 9


def test_crash_between_decision_and_markers_is_invisible_to_readers(
    lake, two_queues, run_python
) -> None:
    run_python(CHILD, lake.root, "decided", check=False)
    # Nobody restarted the producer: readers resolve the status from the coordinator.
    assert _visible(lake, "debits", "read_committed") == [1, 2]
    assert _visible(lake, "credits", "read_committed") == [3]


def test_newer_instance_fences_the_older(lake, two_queues) -> None:
    debits, _ = two_queues
    old = TransactionalProducer(lake, transactional_id="same")
    old.init_transactions()
    old.begin()
    old.send(debits, rows(0, 1), partition="0")
    new = TransactionalProducer(lake, transactional_id="same")
    assert new.init_transactions() == old.epoch + 1
    with pytest.raises(ProducerFencedError):
        old.commit()
    with pytest.raises(ProducerFencedError):
        old.send(debits, rows(1, 1), partition="0")
    assert _visible(lake, "debits", "read_committed") == []  # the zombie's transaction was aborted
    new.begin()
    new.send(debits, rows(5, 1), partition="0")
    new.commit()
    assert _visible(lake, "debits", "read_committed") == [5]


def test_coordinator_commits_keep_a_bounded_log_and_old_decisions(make_queue, lake) -> None:
    """The coordinator's table is a SystemTable: its handle is reopened from checkpoints and its
    log trimmed as transactions go on, and a decision made long ago is still read."""
    from pathlib import Path

    from cues_platform.queues.coordinator import Coordinator, TxnStatus
    from cues_platform.queues.positions import CHECKPOINT_INTERVAL

    q = make_queue("debits")
    p = TransactionalProducer(lake, transactional_id="many")
    p.init_transactions()
    log = Path(lake.system_uri("transactions")) / "_delta_log"
    txns, opened = [], set()
    for i in range(3 * CHECKPOINT_INTERVAL // 2 + 10):  # two coordinator commits per transaction
        txns.append(p.begin())
        p.send(q, rows(i, 1), partition="0")
        p.commit()
        system = p.coordinator.system
        assert system.snapshot().version() - system.opened_at < system.reopen_every == CHECKPOINT_INTERVAL
        opened.add(system.opened_at)
        assert len(list(log.glob("*.json"))) <= 3 * CHECKPOINT_INTERVAL + 1
    assert len(opened) >= 3  # reopened as it went
    assert Coordinator(lake).status(txns[0]) is TxnStatus.COMMITTED  # kept through the trimming
    assert q.tailer("t", partition="0").read_arrow(1000)["id"].to_pylist() == list(range(len(txns)))


# -- a lost acknowledgement of the decision ------------------------------------------------------------
def _losing_ack_once(step: str, error: str):
    """A hook that fails once, right after ``step`` landed: the store took the commit and its
    answer was lost (delta-rs raises object_store's ``OSError`` in that case)."""
    fired: list[str] = []

    def hook(at: str) -> None:
        if at == step and not fired:
            fired.append(at)
            raise OSError(error)

    return hook, fired


LOST_ACK = "Generic S3 error: Error after 10 retries in 2.1s, max_retries:10, retry_timeout:180s"


@pytest.mark.parametrize("then", ["commit", "abort"])
def test_after_a_lost_ack_of_the_commit_decision_commit_is_idempotent_and_abort_truthful(
    lake, two_queues, then
) -> None:
    from cues_platform.queues.coordinator import Coordinator, TxnStatus
    from cues_platform.queues.errors import CommitOutcomeUnknownError

    debits, credits = two_queues
    hook, fired = _losing_ack_once("decided", LOST_ACK)
    producer = TransactionalProducer(lake, transactional_id="acks", hook=hook)
    producer.init_transactions()
    txn = producer.begin()
    producer.send(debits, rows(0, 2), partition="0")
    producer.send(credits, rows(10, 1), partition="0")
    with pytest.raises(CommitOutcomeUnknownError) as info:
        producer.commit()
    assert fired == ["decided"]
    message = str(info.value)
    assert "\n" not in message and "Generic S3 error" in message and info.value.during == "decide"
    assert "call commit() (or abort()) again on the same producer" in message
    assert "never decides twice" in message and info.value.retryable
    assert Coordinator(lake).status(txn) is TxnStatus.COMMITTED  # it landed
    if then == "commit":
        producer.commit()  # finds the landed decision, rolls it forward, decides nothing again
    else:
        with pytest.raises(TransactionStateError) as told:
            producer.abort()
        assert f"transaction {txn} is already committed" in str(told.value)
        assert "ready for begin()" in str(told.value)
    assert _visible(lake, "debits", "read_committed") == [0, 1]
    assert _visible(lake, "credits", "read_committed") == [10]
    for q in (debits, credits):  # rolled forward: each queue carries the marker
        assert q.refresh().transaction_version(f"txn:{txn}") == int(TxnStatus.COMMITTED)
    decisions = Coordinator(lake).snapshot().to_pyarrow_dataset().to_table().to_pylist()
    # one decision; the two "add" rows register the queues the transaction wrote (a timeout or an
    # operator abort rolls its marker onto them)
    assert sorted(d["action"] for d in decisions if d["txn_id"] == txn) == ["add", "add", "begin", "committed"]
    producer.begin()  # the producer goes on
    producer.send(debits, rows(20, 1), partition="0")
    producer.commit()
    assert _visible(lake, "debits", "read_committed") == [0, 1, 20]


def test_after_a_lost_ack_of_an_abort_abort_again_finishes_it_and_begin_works(lake, two_queues) -> None:
    from cues_platform.queues.errors import StorageUnreachableError

    debits, _ = two_queues
    hook, _ = _losing_ack_once(
        "decided", "Generic S3 error:\n  ↳ error sending request\n  ↳ connection closed before message completed")
    producer = TransactionalProducer(lake, transactional_id="aborts", hook=hook)
    producer.init_transactions()
    producer.begin()
    producer.send(debits, rows(0, 1), partition="0")
    with pytest.raises(StorageUnreachableError) as info:
        producer.abort()
    assert "\n" not in str(info.value) and "call commit() (or abort()) again" in str(info.value)
    with pytest.raises(TransactionStateError) as told:
        producer.commit()  # the abort landed: commit says so, truthfully
    assert "is already aborted" in str(told.value)
    producer.begin()
    producer.send(debits, rows(1, 1), partition="0")
    producer.commit()
    assert _visible(lake, "debits", "read_committed") == [1]
