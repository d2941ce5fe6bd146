"""Issue 9, section 2: the idempotent producer never acknowledges data it did not write.

Lost acknowledgements are real: the commit lands and the caller sees an error (an exception from
the producer's ``committed`` hook, or a child process SIGKILLed right after ``send`` returned).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from cues_platform.queues import (
    PendingSendError,
    ProducerFencedError,
    SequenceError,
    SequenceMismatchError,
    TransactionalProducer,
)
from tests.support import ROOT, rows


class LostAck(Exception):
    """Raised by a hook after the commit: the caller never hears that the batch landed."""


def lose_first_ack(at: str = "committed"):
    calls = []

    def hook(step: str) -> None:
        calls.append(step)
        if step == at and calls.count(at) == 1:
            raise LostAck(step)

    return hook


def ids(q, partition: str = "0") -> list[int]:
    return q.read_arrow(partition=partition)["id"].to_pylist()


def test_after_a_lost_ack_a_different_batch_is_refused_and_the_same_one_is_written_once(
    make_queue,
) -> None:
    q = make_queue()
    producer = q.producer(producer_id="bank-a", hook=lose_first_ack())
    with pytest.raises(LostAck):
        producer.send(rows(0, 3), partition="0")  # committed, but the caller sees an error
    assert producer.pending_sequence == 0
    # the application moves on to its next batch: refused, never matched as a duplicate
    with pytest.raises(PendingSendError) as info:
        producer.send(rows(100, 2), partition="0")
    assert info.value.pending_sequence == 0 and "send that same batch again" in str(info.value)
    with pytest.raises(PendingSendError):
        producer.send(rows(100, 2), partition="0", sequence=0)
    assert ids(q) == [0, 1, 2]
    # the legal call: the same batch again, found with its original offsets
    again = producer.send(rows(0, 3), partition="0")
    assert again.duplicate and again.ranges == {"0": (0, 3)}
    nxt = producer.send(rows(100, 2), partition="0")
    assert not nxt.duplicate and nxt.ranges == {"0": (3, 5)}
    assert ids(q) == [0, 1, 2, 100, 101]


def test_a_resend_with_different_content_under_a_committed_sequence_raises(make_queue) -> None:
    q = make_queue()
    q.producer(producer_id="bank-a").send(rows(0, 3), partition="0")
    restarted = q.producer(producer_id="bank-a")
    with pytest.raises(SequenceMismatchError) as info:
        restarted.send(rows(50, 3), partition="0", sequence=0)
    err = info.value
    assert (err.queue, err.producer_id, err.sequence) == ("events", "bank-a", 0)
    assert err.digest != err.stored_digest and err.stored_digest in str(err)
    assert restarted.pending_sequence is None  # refused before any commit: nothing pending
    assert restarted.send(rows(50, 3), partition="0").ranges == {"0": (3, 6)}
    assert ids(q) == [0, 1, 2, 50, 51, 52]


LOST_ACK_CHILD = """
import os, signal, sys
from cues_platform.queues import Lake
from tests.support import rows
q = Lake(root=sys.argv[1]).queue("events")
p = q.producer(producer_id="gateway")
p.send(rows(0, 2), partition="0")
p.send(rows(10, 2), partition="0")   # sequence 1: committed ...
os.kill(os.getpid(), signal.SIGKILL)  # ... and the process dies before recording the ack
"""


def test_a_new_process_reusing_the_sequence_of_a_lost_ack_is_refused(
    lake, make_queue, run_python
) -> None:
    q = make_queue()
    proc = run_python(LOST_ACK_CHILD, lake.root, check=False)
    assert proc.returncode == -9, proc.stderr
    # the application believes sequence 1 was lost and sends its next batch under it
    producer = lake.queue("events").producer(producer_id="gateway")
    with pytest.raises(SequenceMismatchError) as info:
        producer.send(rows(20, 2), partition="0", sequence=1)
    assert info.value.sequence == 1
    # resending what was really sent is a no-op with the original offsets
    again = producer.send(rows(10, 2), partition="0", sequence=1)
    assert again.duplicate and again.ranges == {"0": (2, 4)}
    assert producer.send(rows(20, 2), partition="0").ranges == {"0": (4, 6)}
    assert ids(q) == [0, 1, 10, 11, 20, 21]


def test_async_producer_resends_a_lost_ack_once_and_keeps_the_duplicate_flag(make_queue) -> None:
    q = make_queue()
    producer = q.producer(
        producer_id="fast", acks="none", linger_seconds=3600, hook=lose_first_ack()
    )
    first = [producer.send(rows(i * 2, 2), partition="0") for i in range(2)]
    with pytest.raises(LostAck):
        producer.flush()  # committed, acknowledgement lost: the futures stay unresolved
    assert not any(f.done() for f in first)
    later = producer.send(rows(100, 1), partition="0")
    producer.flush()  # resends the same merged batch first (found: duplicate), then the new one
    assert [f.result().ranges for f in first] == [{"0": (0, 2)}, {"0": (2, 4)}]
    assert all(f.result().duplicate for f in first)
    assert later.result().ranges == {"0": (4, 5)} and not later.result().duplicate
    producer.close()
    assert ids(q) == [0, 1, 2, 3, 100]


def test_async_producer_that_was_fenced_fails_its_futures(make_queue) -> None:
    q = make_queue()
    old = q.producer(producer_id="fast", acks="none", linger_seconds=3600)
    old.open()
    pending = old.send(rows(0, 1), partition="0")
    new = q.producer(producer_id="fast")
    new.open()  # what its first send would do
    with pytest.raises(ProducerFencedError):
        old.flush()
    with pytest.raises(ProducerFencedError):
        pending.result(timeout=0)
    with pytest.raises(ProducerFencedError):
        old.send(rows(1, 1), partition="0")
    new.send(rows(5, 1), partition="0")
    assert ids(q) == [5]
    old.close()  # nothing is left outstanding: closing a fenced producer is quiet


def test_a_fenced_producer_cannot_send_again(make_queue) -> None:
    q = make_queue()
    old = q.producer(producer_id="p")
    old.send(rows(0, 1), partition="0")
    new = q.producer(producer_id="p")
    assert new.epoch is None  # constructing reads the next sequence only: nobody is fenced yet
    assert old.send(rows(1, 1), partition="0").ranges == {"0": (1, 2)}
    assert new.open() == old.epoch + 1 and new.next_sequence == 2
    for _ in range(2):  # final: not retryable for this instance
        with pytest.raises(ProducerFencedError) as info:
            old.send(rows(2, 1), partition="0")
        assert not info.value.retryable and "open a new producer" in str(info.value)
        assert (info.value.producer_id, info.value.epoch) == ("p", old.epoch)
    assert new.send(rows(2, 1), partition="0").ranges == {"0": (2, 3)}


def test_a_gap_after_a_resend_is_still_a_sequence_error(make_queue) -> None:
    q = make_queue()
    producer = q.producer(producer_id="p")
    with pytest.raises(SequenceError) as info:
        producer.send(rows(0, 1), partition="0", sequence=3)
    assert info.value.expected == 0 and q.count() == 0
    assert producer.pending_sequence is None


FENCE_CHILD = """
import json, os, sys, time
from pathlib import Path
from cues_platform.queues import Lake, ProducerFencedError
import pyarrow as pa
root, name, base, limit, wait_for, signal_file = sys.argv[1:7]
base, limit = int(base), int(limit)
if wait_for != "-":
    while not Path(wait_for).exists():  # start once the other instance has an acknowledged batch
        time.sleep(0.01)
q = Lake(root=root).queue("events")
p = q.producer(producer_id="shared")
out = open(Path(root).parent / f"{name}.jsonl", "w")
for i in range(limit):
    ids = [base + 2 * i, base + 2 * i + 1]
    try:
        r = p.send({"id": ids, "note": [f"{name}-{i}", f"{name}-{i}"]}, partition="0")
    except ProducerFencedError as exc:
        out.write(json.dumps({"fenced": i, "epoch": exc.epoch}) + "\\n")
        break
    out.write(json.dumps({"ids": ids, "range": r.ranges["0"], "duplicate": r.duplicate}) + "\\n")
    out.flush()
    if i == 0 and signal_file != "-":
        Path(signal_file).touch()
out.close()
"""


def test_two_processes_with_one_producer_id_the_older_is_fenced_and_acks_are_true(
    lake, make_queue, tmp_path
) -> None:
    q = make_queue()
    go = tmp_path / "first-acked"
    args = [sys.executable, "-c", FENCE_CHILD, lake.root]
    # the older instance sends until it is fenced (at most 2,000), the newer one 20 batches
    older = subprocess.Popen([*args, "older", "1000000", "2000", "-", str(go)], cwd=ROOT)
    newer = subprocess.Popen([*args, "newer", "2000000", "20", str(go), "-"], cwd=ROOT)
    assert older.wait(timeout=300) == 0 and newer.wait(timeout=300) == 0
    logs = {
        name: [json.loads(line) for line in Path(tmp_path / f"{name}.jsonl").read_text().splitlines()]
        for name in ("older", "newer")
    }
    assert "fenced" in logs["older"][-1], "the older instance must be fenced"
    assert all("fenced" not in e for e in logs["newer"]) and len(logs["newer"]) == 20
    acked = [e for name in logs for e in logs[name] if "ids" in e]
    stored = q.read_arrow(partition="0").to_pydict()
    by_offset = dict(zip(stored["_offset"], stored["id"], strict=True))
    for e in acked:  # every acknowledged batch is stored, at its offsets, with its own content
        assert not e["duplicate"]
        start, end = e["range"]
        assert [by_offset[o] for o in range(start, end)] == e["ids"]
    # nothing unacknowledged was stored and nothing twice
    assert sorted(stored["id"]) == sorted(i for e in acked for i in e["ids"])
    assert stored["_offset"] == list(range(len(stored["_offset"])))


def test_transactional_resend_after_a_lost_ack_appears_once_read_committed(
    lake, make_queue
) -> None:
    q = make_queue()
    calls = []

    def hook(step: str) -> None:
        calls.append(step)
        if step == "sent" and calls.count("sent") in (1, 3):
            raise LostAck(step)

    producer = TransactionalProducer(lake, transactional_id="mover", hook=hook)
    producer.init_transactions()
    producer.begin()
    for batch in (rows(0, 1), rows(1, 1), rows(2, 1)):
        try:
            producer.send(q, batch, partition="0")
        except LostAck:
            producer.send(q, batch, partition="0")  # the resend after the lost ack
    producer.commit()
    assert q.read_arrow(partition="0", isolation="read_committed")["id"].to_pylist() == [0, 1, 2]


def test_transaction_with_an_unresolved_send_cannot_commit_but_can_abort(
    lake, make_queue
) -> None:
    from cues_platform.queues import TransactionStateError

    q = make_queue()
    producer = TransactionalProducer(lake, transactional_id="mover", hook=lose_first_ack("sent"))
    producer.init_transactions()
    producer.begin()
    with pytest.raises(LostAck):
        producer.send(q, rows(0, 1), partition="0")
    with pytest.raises(PendingSendError):
        producer.send(q, rows(1, 1), partition="0")
    with pytest.raises(TransactionStateError) as info:
        producer.commit()
    assert "resend the same batch, or abort" in str(info.value)
    producer.abort()
    producer.begin()
    producer.send(q, rows(7, 1), partition="0")
    producer.commit()
    assert q.read_arrow(partition="0", isolation="read_committed")["id"].to_pylist() == [7]


def test_digest_ignores_input_form_and_column_order_but_not_content(make_queue) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cues_platform.queues.appender import prepare_batches
    from cues_platform.queues.idempotence import batch_digest

    q = make_queue()
    values = st.lists(
        st.tuples(st.integers(-(2**63), 2**63 - 1), st.none() | st.text(max_size=5)),
        min_size=1,
        max_size=20,
    )

    @settings(max_examples=60, deadline=None)
    @given(values, st.integers(0, 19))
    def check(data: list[tuple[int, str | None]], cut: int) -> None:
        as_rows = [{"note": n, "id": i} for i, n in data]  # other key order
        as_cols = {"note": [n for _, n in data], "id": [i for i, _ in data]}
        cut = min(cut, len(data))
        schema = pa.schema([("note", pa.string()), ("id", pa.int64())])
        chunked = pa.concat_tables(
            [pa.Table.from_pylist(as_rows[:cut], schema), pa.Table.from_pylist(as_rows[cut:], schema)]
        )
        digests = {
            batch_digest(prepare_batches(q, {"0": form}))
            for form in (as_rows, as_cols, chunked, pa.Table.from_pylist(as_rows).to_pandas())
        }
        assert len(digests) == 1
        changed = [{"id": data[0][0] ^ 1, "note": data[0][1]}, *as_rows[1:]]
        assert batch_digest(prepare_batches(q, {"0": changed})) not in digests

    check()


def test_digest_is_the_same_in_another_process(make_queue, run_python) -> None:
    from cues_platform.queues.appender import prepare_batches
    from cues_platform.queues.idempotence import batch_digest

    q = make_queue()
    here = batch_digest(prepare_batches(q, {"0": rows(0, 50)}))
    code = (
        "import sys; from cues_platform.queues import Lake; from tests.support import rows\n"
        "from cues_platform.queues.appender import prepare_batches\n"
        "from cues_platform.queues.idempotence import batch_digest\n"
        "q = Lake(root=sys.argv[1]).queue('events')\n"
        "print(batch_digest(prepare_batches(q, {'0': rows(0, 50)})))\n"
    )
    assert run_python(code, q.lake.root).stdout.strip() == here


def test_digest_of_nulls_does_not_depend_on_the_builder(make_queue) -> None:
    """pandas leaves NaN under a null float slot, a list of rows leaves 0.0: same digest."""
    import pandas as pd

    from cues_platform.queues.appender import prepare_batches
    from cues_platform.queues.idempotence import batch_digest

    schema = pa.schema([("amount", pa.float64()), ("when", pa.timestamp("us", tz="UTC"))])
    q = make_queue("amounts", schema=schema)
    from_rows = [{"amount": None, "when": None}, {"amount": 1.5, "when": None}]
    from_pandas = pd.DataFrame(
        {"amount": [float("nan"), 1.5], "when": pd.to_datetime([None, None], utc=True)}
    )
    a = batch_digest(prepare_batches(q, {"0": from_rows}))
    b = batch_digest(prepare_batches(q, {"0": from_pandas}))
    assert a == b
    zero = [{"amount": 0.0, "when": None}, {"amount": 1.5, "when": None}]  # 0.0 is not null
    assert a != batch_digest(prepare_batches(q, {"0": zero}))


def test_threads_opening_one_producer_id_through_one_handle_get_distinct_epochs(make_queue) -> None:
    """Issue 22 item 4, the epoch's side: the read of ``pepoch:p`` and the commit of the next epoch
    are one step under the handle's lock (``Queue.writing``). Without it two threads read the same
    newest epoch, the second commits on the snapshot the first moved, delta-rs sees no conflict,
    and both instances hold the same epoch: neither is fenced."""
    from tests.queues.test_threads import run_threads

    q = make_queue()
    rounds, threads = 5, 4
    for round_ in range(rounds):
        producers = [q.producer(producer_id="p") for _ in range(threads)]
        run_threads([p.open for p in producers])
        epochs = sorted(p.epoch for p in producers)
        assert epochs == list(range(round_ * threads, (round_ + 1) * threads)), epochs
        assert q.refresh().transaction_version("pepoch:p") == epochs[-1]
        newest = max(producers, key=lambda p: p.epoch)
        for older in producers:
            if older is not newest:
                with pytest.raises(ProducerFencedError) as info:
                    older.send(rows(9, 1), partition="0")
                assert info.value.epoch == older.epoch and info.value.newest == newest.epoch
        assert newest.send(rows(round_, 1), partition="0").ranges == {"0": (round_, round_ + 1)}
    assert ids(q) == list(range(rounds))
