"""Idempotent and asynchronous producers."""

from __future__ import annotations

import pytest

from cues_platform.queues import Acks, SequenceError
from tests.support import rows


def test_resend_after_lost_ack_returns_original_offsets(make_queue) -> None:
    q = make_queue()
    producer = q.producer(producer_id="bank-a")
    first = producer.send(rows(0, 3), partition="0")
    producer.send(rows(3, 2), partition="0")
    # The acknowledgement of sequence 0 was "lost": the producer sends it again.
    again = producer.send(rows(0, 3), partition="0", sequence=0)
    assert again.duplicate and again.ranges == first.ranges
    assert q.read_arrow(partition="0")["id"].to_pylist() == [0, 1, 2, 3, 4]


def test_restarted_producer_continues_its_sequence(make_queue, lake) -> None:
    q = make_queue()
    q.producer(producer_id="bank-a").send(rows(0, 1), partition="0")
    restarted = lake.queue("events").producer(producer_id="bank-a")
    assert restarted.next_sequence == 1
    # the restarted instance replays its unacknowledged batch: a no-op
    assert restarted.send(rows(0, 1), partition="0", sequence=0).duplicate
    assert q.count() == 1


def test_sequence_gap_is_rejected_and_writes_nothing(make_queue) -> None:
    q = make_queue()
    producer = q.producer(producer_id="bank-a")
    producer.send(rows(0, 1), partition="0")
    with pytest.raises(SequenceError) as info:
        producer.send(rows(1, 1), partition="0", sequence=5)
    assert info.value.expected == 1 and info.value.sequence == 5
    assert "gap" in str(info.value)
    assert q.count() == 1


def test_concurrent_instances_of_one_producer_write_a_sequence_once(make_queue, lake) -> None:
    """Four instances of one producer id race on sequence 0: each open fences the ones before it,
    so the fenced ones raise; whoever gets through writes the batch once (issue 9: fencing)."""
    import threading

    from cues_platform.queues import ProducerFencedError

    q = make_queue()
    results, fenced = [], []

    def send() -> None:
        try:
            results.append(
                lake.queue("events")
                .producer(producer_id="p")
                .send(rows(0, 4), partition="0", sequence=0)
            )
        except ProducerFencedError as exc:
            fenced.append(exc)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) + len(fenced) == 4 and results
    assert q.count() == 4
    assert sum(not r.duplicate for r in results) == 1
    assert {tuple(r.ranges["0"]) for r in results} == {(0, 4)}


def test_async_producer_buffers_until_flush(make_queue) -> None:
    q = make_queue()
    producer = q.producer(producer_id="fast", acks=Acks.NONE, linger_seconds=3600)
    pending = [producer.send(rows(i * 2, 2), partition="0") for i in range(3)]
    assert q.count() == 0 and not any(p.done() for p in pending)
    producer.flush()
    assert [p.result().first_offset for p in pending] == [0, 2, 4]
    assert q.read_arrow(partition="0")["id"].to_pylist() == list(range(6))
    producer.close()


def test_async_producer_rejects_bad_input_at_send(make_queue) -> None:
    from cues_platform.queues import SchemaError

    q = make_queue()
    with q.producer(acks="none", linger_seconds=3600) as producer, pytest.raises(SchemaError):
        producer.send({"id": ["not a number"], "note": ["x"]}, partition="0")
