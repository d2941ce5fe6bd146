"""Every public entry of the queue layer checks its arguments before it changes anything (issue 22
item 8): a wrong type or value is one typed error (under ``QueueError``) naming the argument,
nothing is committed, and the producer, the tailer and the queue stay usable with dense offsets."""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cues_platform.queues import (
    InvalidArgumentError,
    InvalidNameError,
    InvalidRangeError,
    NullValueError,
    OffsetRangeError,
    Producer,
    Queue,
    QueueError,
    ReservedColumnError,
    SchemaError,
    Tailer,
    TransactionalProducer,
    UnknownPartitionError,
)
from cues_platform.queues.errors import PositionRangeError
from cues_platform.queues.producer import AsyncProducer
from tests.support import rows


@dataclass(frozen=True)
class Ctx:
    queue: Queue
    producer: Producer
    tailer: Tailer


@dataclass(frozen=True)
class Bad:
    """One public call with one bad argument, the error it must raise and what its message names
    (``shows``: the argument, with its value where the message can show it)."""

    call: Callable[[Ctx], object]
    error: type[QueueError]
    shows: str


def async_send(ctx: Ctx, **kwargs: object) -> object:
    producer = ctx.queue.producer(producer_id="fast", acks="none", linger_seconds=3600)
    try:
        return producer.send(rows(9, 1), partition="0", **kwargs)
    finally:
        producer.close()


def txn_send(ctx: Ctx, *, batches: object = None, **kwargs: object) -> object:
    """A send in an open transaction of a transactional producer; the transaction is aborted after
    (a refused send touched no queue, so the abort writes no marker on it)."""
    producer = TransactionalProducer(ctx.queue.lake, transactional_id="tx")
    producer.init_transactions()
    producer.begin()
    try:
        if batches is not None:
            return producer.send_many(ctx.queue, batches, **kwargs)
        return producer.send(ctx.queue, rows(9, 1), partition="0", **kwargs)
    finally:
        producer.abort()


# The data argument (through Producer.send and Queue.append alike): what each wrong shape must be.
DATA = {
    "not-a-table-int": (5, SchemaError, "data=5"),
    "not-a-table-str": ("abc", SchemaError, "data='abc'"),
    "not-a-table-none": (None, SchemaError, "data=None"),
    "list-of-ints": ([1, 2], SchemaError, "data is a list holding an int"),
    "scalar-column": ({"id": 1, "note": "x"}, SchemaError, "column 'id'"),
    "str-column": ({"id": [1, 2], "note": "ab"}, SchemaError, "column 'note'"),
    "non-str-column-name": ({1: [1], "note": ["x"]}, SchemaError, "column name 1"),
    "ragged-columns": ({"id": [1, 2], "note": ["x"]}, SchemaError, "{'id': 2, 'note': 1}"),
    "mixed-types-column": ({"id": [1, "a"], "note": ["x", "y"]}, SchemaError, "column 'id'"),
    "mixed-types-rows": ([{"id": 1, "note": "x"}, {"id": "a", "note": "y"}], SchemaError, "column 'id'"),
    "missing-column": ({"id": [1]}, SchemaError, "missing: ['note']"),
    "unknown-column": ({"id": [1], "note": ["x"], "z": [1]}, SchemaError, "unexpected: ['z']"),
    "unknown-key-in-row": ([{"id": 1, "note": "x", "z": 1}], SchemaError, "unexpected key(s): ['z']"),
    "wrong-column-type": ({"id": ["one"], "note": ["x"]}, SchemaError, "column 'id'"),
    "fractional-for-int": ({"id": [1.5], "note": ["x"]}, SchemaError, "column 'id'"),
    "null-in-required": ({"id": [None], "note": ["x"]}, NullValueError, "column 'id'"),
    "reserved-column": ({"id": [1], "note": ["x"], "_offset": [0]}, ReservedColumnError, "'_offset'"),
}

CASES: dict[str, Bad] = {
    # Producer.send / send_many
    "send-sequence-float": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", sequence=2.0),
                               InvalidArgumentError, "sequence=2.0"),
    "send-sequence-float-next": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", sequence=1.0),
                                    InvalidArgumentError, "sequence=1.0"),
    "send-sequence-bool": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", sequence=True),
                              InvalidArgumentError, "sequence=True"),
    "send-sequence-negative": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", sequence=-1),
                                  InvalidArgumentError, "sequence=-1"),
    "send-sequence-str": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", sequence="1"),
                             InvalidArgumentError, "sequence='1'"),
    "send-unknown-option": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", acks="all"),
                               InvalidArgumentError, "acks='all'"),
    "send-internal-option": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", producer_id="x"),
                                InvalidArgumentError, "producer_id='x'"),
    "send-message-type-int": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", message_type=5),
                                 InvalidArgumentError, "message_type=5"),
    "send-message-type-empty": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", message_type=""),
                                   InvalidArgumentError, "message_type=''"),
    "send-delivery-hash-int": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", delivery_hash=5),
                                  InvalidArgumentError, "delivery_hash=5"),
    "send-commit-metadata": Bad(lambda c: c.producer.send(rows(2, 1), partition="0",
                                                          commit_metadata={"k": 1}),
                                InvalidArgumentError, "commit_metadata={'k': 1}"),
    "send-max-attempts-zero": Bad(lambda c: c.producer.send(rows(2, 1), partition="0", max_attempts=0),
                                  InvalidArgumentError, "max_attempts=0"),
    "send-partition-int": Bad(lambda c: c.producer.send(rows(2, 1), partition=0),
                              InvalidNameError, "partition 0"),
    "send-partition-unknown": Bad(lambda c: c.producer.send(rows(2, 1), partition="zz"),
                                  UnknownPartitionError, "partition 'zz'"),
    "send-many-not-a-mapping": Bad(lambda c: c.producer.send_many([rows(2, 1)]),
                                   InvalidArgumentError, "batches=["),
    "async-send-sequence": Bad(lambda c: async_send(c, sequence=0), InvalidArgumentError, "sequence=0"),
    "async-send-option": Bad(lambda c: async_send(c, message_type="m"), InvalidArgumentError,
                             "message_type='m'"),
    # Queue.append / append_many
    "append-unknown-option": Bad(lambda c: c.queue.append(rows(2, 1), partition="0", bogus=1),
                                 InvalidArgumentError, "bogus=1"),
    "append-message-type-int": Bad(lambda c: c.queue.append(rows(2, 1), partition="0", message_type=5),
                                   InvalidArgumentError, "message_type=5"),
    "append-max-attempts-zero": Bad(lambda c: c.queue.append(rows(2, 1), partition="0", max_attempts=0),
                                    InvalidArgumentError, "max_attempts=0"),
    "append-guards-not-callable": Bad(lambda c: c.queue.append(rows(2, 1), partition="0", guards=[1]),
                                      InvalidArgumentError, "guards=[1]"),
    "append-sequence-float": Bad(lambda c: c.queue.append(rows(2, 1), partition="0", producer_id="p",
                                                          sequence=1.0),
                                 InvalidArgumentError, "sequence=1.0"),
    "append-many-not-a-mapping": Bad(lambda c: c.queue.append_many([rows(2, 1)]),
                                     InvalidArgumentError, "batches=["),
    # TransactionalProducer.send
    "txn-send-txn-id": Bad(lambda c: txn_send(c, txn_id="mine"), InvalidArgumentError, "txn_id='mine'"),
    "txn-send-after-commit": Bad(lambda c: txn_send(c, after_commit=print), InvalidArgumentError,
                                 "after_commit=<built-in function print>"),
    "txn-send-unknown-option": Bad(lambda c: txn_send(c, acks="all"), InvalidArgumentError, "acks='all'"),
    "txn-send-many-not-a-mapping": Bad(lambda c: txn_send(c, batches=[rows(2, 1)]), InvalidArgumentError,
                                       "batches=["),
    # Queue.producer / Producer() / AsyncProducer()
    "producer-id-empty": Bad(lambda c: c.queue.producer(producer_id=""), InvalidNameError, "producer_id=''"),
    "producer-id-blank": Bad(lambda c: c.queue.producer(producer_id="  "), InvalidNameError,
                             "producer_id='  '"),
    "producer-id-newline": Bad(lambda c: c.queue.producer(producer_id="p\n"), InvalidNameError,
                               "producer_id='p\\n'"),
    "producer-id-int": Bad(lambda c: c.queue.producer(producer_id=5), InvalidNameError, "producer_id=5"),
    "producer-id-empty-async": Bad(lambda c: c.queue.producer(producer_id="", acks="none"),
                                   InvalidNameError, "producer_id=''"),
    "acks-unknown": Bad(lambda c: c.queue.producer(producer_id="x", acks="some"), InvalidArgumentError,
                        "acks='some'"),
    "acks-bool": Bad(lambda c: c.queue.producer(producer_id="x", acks=True), InvalidArgumentError,
                     "acks=True"),
    "producer-unknown-arg": Bad(lambda c: c.queue.producer(producer_id="x", retries=3),
                                InvalidArgumentError, "retries=3"),
    "linger-with-acks-all": Bad(lambda c: c.queue.producer(producer_id="x", linger_seconds=1),
                                InvalidArgumentError, "linger_seconds=1"),
    "linger-negative": Bad(lambda c: c.queue.producer(producer_id="x", acks="none", linger_seconds=-1),
                           InvalidArgumentError, "linger_seconds=-1"),
    "linger-str": Bad(lambda c: c.queue.producer(producer_id="x", acks="none", linger_seconds="1"),
                      InvalidArgumentError, "linger_seconds='1'"),
    "linger-nan": Bad(lambda c: c.queue.producer(producer_id="x", acks="none", linger_seconds=math.nan),
                      InvalidArgumentError, "linger_seconds=nan"),
    "max-buffered-zero": Bad(lambda c: c.queue.producer(producer_id="x", acks="none", max_buffered_rows=0),
                             InvalidArgumentError, "max_buffered_rows=0"),
    "max-buffered-float": Bad(lambda c: c.queue.producer(producer_id="x", acks="none",
                                                         max_buffered_rows=10.0),
                              InvalidArgumentError, "max_buffered_rows=10.0"),
    "hook-not-callable": Bad(lambda c: c.queue.producer(producer_id="x", hook="print"),
                             InvalidArgumentError, "hook='print'"),
    "producer-queue-not-a-queue": Bad(lambda c: Producer("events", producer_id="x"),
                                      InvalidArgumentError, "queue='events'"),
    "async-producer-queue-not-a-queue": Bad(lambda c: AsyncProducer("events", producer_id="x"),
                                            InvalidArgumentError, "queue='events'"),
    # Queue.tailer and Tailer
    "tailer-isolation": Bad(lambda c: c.queue.tailer("t2", partition="0", isolation="dirty"),
                            InvalidArgumentError, "isolation='dirty'"),
    "tailer-name-empty": Bad(lambda c: c.queue.tailer("", partition="0"), InvalidNameError, "tailer name ''"),
    "tailer-partition-int": Bad(lambda c: c.queue.tailer("t2", partition=0), InvalidNameError, "partition 0"),
    "tailer-read-zero": Bad(lambda c: c.tailer.read_arrow(0), InvalidRangeError, "max_messages=0"),
    "tailer-read-float": Bad(lambda c: c.tailer.read_arrow(1.5), InvalidRangeError, "max_messages=1.5"),
    "tailer-read-bool": Bad(lambda c: c.tailer.read_arrow(True), InvalidRangeError, "max_messages=True"),
    "tailer-backward-negative": Bad(lambda c: c.tailer.read_backward(-1), InvalidRangeError, "count=-1"),
    "tailer-blocking-timeout": Bad(lambda c: c.tailer.read_blocking(timeout="1"), InvalidArgumentError,
                                   "timeout='1'"),
    "tailer-blocking-poll": Bad(lambda c: c.tailer.read_blocking(timeout=1, poll_interval=0),
                                InvalidArgumentError, "poll_interval=0"),
    "tailer-seek-float": Bad(lambda c: c.tailer.seek(1.0), InvalidRangeError, "where=1.0"),
    "tailer-seek-bool": Bad(lambda c: c.tailer.seek(True), InvalidRangeError, "where=True"),
    "tailer-seek-word": Bad(lambda c: c.tailer.seek("middle"), InvalidRangeError, "where='middle'"),
    "tailer-commit-float": Bad(lambda c: c.tailer.commit(1.0), PositionRangeError, "position 1.0"),
    # Queue.read_arrow
    "read-start-negative": Bad(lambda c: c.queue.read_arrow(partition="0", start=-1), InvalidRangeError,
                               "start=-1"),
    "read-start-float": Bad(lambda c: c.queue.read_arrow(partition="0", start=1.0), InvalidRangeError,
                            "start=1.0"),
    "read-start-bool": Bad(lambda c: c.queue.read_arrow(partition="0", start=True), InvalidRangeError,
                           "start=True"),
    "read-start-str": Bad(lambda c: c.queue.read_arrow(partition="0", start="1"), InvalidRangeError,
                          "start='1'"),
    "read-end-float": Bad(lambda c: c.queue.read_arrow(partition="0", end=0.5), InvalidRangeError,
                          "end=0.5"),
    "read-end-bool": Bad(lambda c: c.queue.read_arrow(partition="0", end=True), InvalidRangeError,
                         "end=True"),
    "read-end-before-start": Bad(lambda c: c.queue.read_arrow(partition="0", start=2, end=1),
                                 InvalidRangeError, "end=1"),
    "read-isolation": Bad(lambda c: c.queue.read_arrow(partition="0", isolation="dirty"),
                          InvalidArgumentError, "isolation='dirty'"),
    "read-columns-unknown": Bad(lambda c: c.queue.read_arrow(partition="0", columns=["zz"]),
                                InvalidArgumentError, "columns=['zz']"),
    "read-columns-str": Bad(lambda c: c.queue.read_arrow(partition="0", columns="id"),
                            InvalidArgumentError, "columns='id'"),
    "read-partition-unknown": Bad(lambda c: c.queue.read_arrow(partition="zz"), UnknownPartitionError,
                                  "partition 'zz'"),
}
for _name, (_data, _error, _shows) in DATA.items():
    CASES[f"send-data-{_name}"] = Bad(lambda c, d=_data: c.producer.send(d, partition="0"), _error, _shows)
    CASES[f"append-data-{_name}"] = Bad(lambda c, d=_data: c.queue.append(d, partition="0"), _error, _shows)


def producer_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("cues-producer-")}


@pytest.fixture
def ctx(make_queue) -> Ctx:
    queue = make_queue()
    producer = queue.producer(producer_id="p")
    assert producer.send(rows(0, 2), partition="0").ranges == {"0": (0, 2)}
    return Ctx(queue, producer, queue.tailer("t", partition="0"))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_bad_argument_is_one_typed_error_and_changes_nothing(ctx, case) -> None:
    q, producer, tailer = ctx.queue, ctx.producer, ctx.tailer
    before, threads = q.version(), producer_threads()
    with pytest.raises(case.error) as info:
        case.call(ctx)
    err = info.value
    assert isinstance(err, QueueError) and not err.retryable
    assert case.shows in str(err), str(err)
    if isinstance(err, InvalidArgumentError):
        assert err.argument in str(err) and "; pass " in str(err)
        assert case.shows.startswith(f"{err.argument}=")
    if isinstance(err, SchemaError):
        assert "'events'" in str(err)  # the queue
    # nothing changed: no commit, no pending send, no thread left behind, no position moved
    assert q.version() == before
    assert producer.pending_sequence is None and producer.next_sequence == 1
    assert producer_threads() == threads
    assert tailer.position == 0 and tailer.committed_position() == 0
    # and everything stays usable: the next good send takes the next offset
    assert producer.send(rows(2, 1), partition="0").ranges == {"0": (2, 3)}
    assert q.append(rows(3, 1), partition="0").ranges == {"0": (3, 4)}
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == [0, 1, 2, 3]
    assert tailer.read_arrow(10)["id"].to_pylist() == [0, 1, 2, 3]


def test_send_with_sequence_2_0_is_refused_and_the_next_send_succeeds(make_queue) -> None:
    """The review's reproduction: a float sequence equal to the next one (2 == 2.0) got past the
    guard, failed inside the commit and left every later send raising PendingSendError."""
    q = make_queue()
    producer = q.producer(producer_id="p")
    producer.send(rows(0, 1), partition="0")
    producer.send(rows(1, 1), partition="0")
    assert producer.next_sequence == 2
    before = q.version()
    with pytest.raises(InvalidArgumentError) as info:
        producer.send(rows(2, 1), partition="0", sequence=2.0)
    assert (info.value.argument, info.value.value) == ("sequence", 2.0)
    assert "sequence=2.0" in str(info.value) and "an int >= 0" in str(info.value)
    assert q.version() == before and producer.pending_sequence is None
    result = producer.send(rows(2, 1), partition="0")
    assert result.ranges == {"0": (2, 3)} and not result.duplicate
    # a NumPy integer is a sequence: the same batch under np.int64(2) is the acknowledged resend
    again = producer.send(rows(2, 1), partition="0", sequence=np.int64(2))
    assert again.duplicate and again.ranges == {"0": (2, 3)}
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == [0, 1, 2]
    assert q.table.transaction_version("prod:p") == 2


def test_numpy_integers_are_offsets_and_positions(make_queue) -> None:
    q = make_queue()
    q.append(rows(0, 5), partition="0")
    assert q.read_arrow(partition="0", start=np.int64(1), end=np.int32(3))["_offset"].to_pylist() == [1, 2]
    tailer = q.tailer("t", partition="0")
    assert tailer.seek(np.int64(2)) == 2 and type(tailer.position) is int
    assert tailer.read_arrow(np.int64(2))["_offset"].to_pylist() == [2, 3]
    assert tailer.commit(np.int64(4)) == 4
    assert q.tailer("t", partition="0").position == 4


EXAMPLES = itertools.count()
NOT_A_SEQUENCE = st.one_of(
    st.floats(allow_nan=True),
    st.booleans(),
    st.integers(max_value=-1),
    st.text(max_size=5),
    st.decimals(allow_nan=False),
    st.lists(st.integers(min_value=0), max_size=2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(NOT_A_SEQUENCE, min_size=1, max_size=5))
def test_no_bad_sequence_ever_wedges_a_producer(make_queue, values) -> None:
    """Any run of non-sequences is refused one by one with the typed error; the producer then
    sends under its next sequence and the partition stays dense."""
    q = make_queue(f"q{next(EXAMPLES)}")  # one lake for every example: a queue each
    producer = q.producer(producer_id="p")
    producer.send(rows(0, 1), partition="0")
    before = q.version()
    for value in values:
        with pytest.raises(InvalidArgumentError) as info:
            producer.send(rows(1, 1), partition="0", sequence=value)
        assert info.value.argument == "sequence"
        assert producer.pending_sequence is None
    assert q.version() == before
    assert producer.send(rows(1, 1), partition="0").ranges == {"0": (1, 2)}
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == [0, 1]


def test_invalid_range_errors_are_offset_range_errors(make_queue) -> None:
    """Callers that caught OffsetRangeError for a bad range still do; the classes live in
    queues/errors.py (exported by cues_platform.queues) and schema.py's names are the same."""
    from cues_platform.queues import errors, schema

    assert (schema.InvalidArgumentError, schema.InvalidRangeError) == (
        errors.InvalidArgumentError, errors.InvalidRangeError) == (InvalidArgumentError, InvalidRangeError)
    q = make_queue()
    with pytest.raises(OffsetRangeError) as info:
        q.read_arrow(partition="0", start=5, end=2)
    assert isinstance(info.value, InvalidRangeError)
    assert (info.value.partition, info.value.start, info.value.end) == ("0", 5, 2)
