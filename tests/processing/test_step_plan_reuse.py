"""Step 2 reads the plans step 1 made (``StepBase._planned``) instead of planning the same ranges
again: what a step reads is still exactly its snapshot's ranges, whatever lands in its input
queues between step 1 and step 2, and a snapshot that step 1 did not plan in the same ``begin``
(a retry of a pending snapshot) is planned afresh.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cues_platform.processing import GraphRunner, ReadAs, SimulatedCrash
from cues_platform.processing.graph import Graph, In, Kind, Options, Out, Processor, QueueDef
from cues_platform.processing.model import SnapshotAt
from cues_platform.queues import Lake, TransactionalProducer
from tests.support import PAYLOAD, rows

PID = "p"


def _graph(fn, *, read_as: ReadAs, batch: int = 10, snapshot_at: SnapshotAt | None = None) -> Graph:  # noqa: ANN001
    opts = Options(batch_size=batch, max_batch_size=batch, read_as=read_as,
                   **({} if snapshot_at is None else {"snapshot_at": snapshot_at}))
    return Graph.build(name="reuse", queues=[QueueDef("a", PAYLOAD), QueueDef("b", PAYLOAD)],
                       processors=[Processor(PID, Kind.MAP, fn, {"src": In("a")}, {"out": Out("b")},
                                             options=opts)])


def _copy(ctx, src):  # noqa: ANN001, ANN202
    if not isinstance(src, pa.Table):
        src = src.toArrow()
    return src.select(["id", "note"])


def _step_snapshots(lake: Lake) -> list[dict]:
    """The ``cues.snapshot`` of every step commit of the home queue ``b``, in step order."""
    history = DeltaTable(lake.queue("b").uri).history()
    found = [json.loads(h["cues.snapshot"]) for h in history if "cues.snapshot" in h]
    return sorted(found, key=lambda s: s["step"])


def _ids(lake: Lake) -> list[int]:
    return sorted(lake.queue("b").read_arrow(partition="0")["id"].to_pylist())


@pytest.mark.parametrize("read_as", list(ReadAs))
def test_rows_landing_between_plan_and_read_wait_for_the_next_step(spark, lake, read_as):
    """Rows appended after step 1 planned (the hook ``after_snapshot``) are not read by that
    step, even where its range was cut short by the end of the queue: each step reads exactly
    the range its commit records, the new rows come in the next step, every row once."""
    added: list[int] = []

    def hook(point: str) -> None:
        if point == "after_snapshot" and not added:
            added.append(1)
            lake.queue("a").append(rows(4, 3), partition="0")  # between step 1 and step 2

    runner = GraphRunner(graph=_graph(_copy, read_as=read_as), lake=lake, spark=spark, hook=hook)
    lake.queue("a").append(rows(0, 4), partition="0")  # step 0 plans [0, 4): the queue ends there
    runner.run_until_idle()
    snaps = _step_snapshots(lake)
    assert [s["inputs"]["src"][2:] for s in snaps] == [[0, 4], [4, 7]]
    assert _ids(lake) == list(range(7))
    per_step = {}
    for row in lake.queue("b").read_arrow(partition="0").to_pylist():
        per_step.setdefault(row["_delivery_hash"], []).append(row["id"])
    assert sorted(sorted(v) for v in per_step.values()) == [[0, 1, 2, 3], [4, 5, 6]]


def test_a_transaction_committed_between_plan_and_read_waits_for_the_next_step(spark, lake):
    """read_committed: step 1 stops before an open producer transaction (the last stable
    offset); the transaction commits between step 1 and step 2: the step still reads only its
    planned range (its plan is as exact as a new one: nothing in the range changed), and the
    transaction's rows come in the next step, once."""
    committed: list[int] = []

    def hook(point: str) -> None:
        if point == "after_snapshot" and not committed:
            committed.append(1)
            producer.commit()

    runner = GraphRunner(graph=_graph(_copy, read_as=ReadAs.ARROW), lake=lake, spark=spark, hook=hook)
    src = lake.queue("a")
    src.append(rows(0, 3), partition="0")
    producer = TransactionalProducer(lake, transactional_id="tx", timeout=3600.0)
    producer.init_transactions()
    producer.begin()
    producer.send(src, rows(3, 4), partition="0")  # offsets 3..6, undecided
    runner.run_until_idle()
    snaps = _step_snapshots(lake)
    assert [s["inputs"]["src"][2:] for s in snaps] == [[0, 3], [3, 7]]
    assert _ids(lake) == list(range(7))


def test_a_retried_snapshot_is_planned_again(spark, lake):
    """A snapshot recorded before the function (``snapshot_at=read``) whose step failed on the
    same runner is retried from its record: the retry plans its ranges afresh (the plans of an
    earlier ``begin`` are never read) and delivers the same rows once."""
    calls: list[list[int]] = []

    def flaky(ctx, src):  # noqa: ANN001, ANN202
        calls.append(sorted(src["id"].to_pylist()))
        if len(calls) == 1:
            raise SimulatedCrash("the first call dies like a crashed process")
        return src.select(["id", "note"])

    graph = _graph(flaky, read_as=ReadAs.ARROW, snapshot_at=SnapshotAt.READ, batch=5)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 5), partition="0")
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    assert runner.steppers[PID]._planned is None  # step 2 took step 1's plans, then died
    lake.queue("a").append(rows(5, 5), partition="0")  # more data: the retry keeps its range
    runner.run_until_idle()  # the same runner: its pending snapshot, planned again
    assert calls[:2] == [list(range(5))] * 2
    assert calls[2:] == [list(range(5, 10))]
    assert _ids(lake) == list(range(10))
