"""``Options(snapshot_at=SnapshotAt.READ)``: a map whose function has effects keyed by the delivery
hash records its snapshot before the function, so a retry after a crash sees the same ranges and
hash even when more input arrived meanwhile (the default, ``commit``, plans the step again)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cues_platform.audit import audit
from cues_platform.processing import GraphRunner, RecordType, SimulatedCrash, SnapshotAt
from cues_platform.processing.history import processor_history
from tests.processing.graphs import PID, CrashAt, build_graph, ids_of
from tests.support import rows


def graph_with(snapshot_at: SnapshotAt, seen: list[str]):
    def fn(ctx, src):
        seen.append(ctx.delivery_hash)  # an "effect" keyed by the hash
        return src

    graph = build_graph("map", fn=fn)
    proc = graph.processors[PID]
    proc = replace(proc, options=replace(proc.options, batch_size=10, max_batch_size=100,
                                         snapshot_at=snapshot_at))
    return type(graph).build(name=graph.name, queues=list(graph.queues.values()), processors=[proc],
                             error_queue=graph.error_queue)


@pytest.mark.parametrize("snapshot_at", list(SnapshotAt))
def test_a_retry_after_new_input_keeps_the_hash_only_when_recorded_at_read(spark, lake, snapshot_at):
    seen: list[str] = []
    graph = graph_with(snapshot_at, seen)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=CrashAt("after_function", 1))
    lake.queue("a").append(rows(0, 5), partition="0")
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    lake.queue("a").append(rows(5, 5), partition="0")  # more input before the restart
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()[PID]
    crashed, first = seen[0], stats.results[0]
    if snapshot_at is SnapshotAt.READ:
        assert first.delivery_hash == crashed and first.rows_in == 5  # the same snapshot, retried
        assert [r.rows_in for r in stats.results] == [5, 5]
    else:
        assert first.delivery_hash != crashed and first.rows_in == 10  # planned again, longer
    assert ids_of(lake, "b") == list(range(10))
    records = processor_history(lake, PID)
    snapshots = [r for r in records if r.type is RecordType.SNAPSHOT]
    assert bool(snapshots) is (snapshot_at is SnapshotAt.READ)
    assert [r.step for r in records if r.is_attempt] == list(range(len(stats.results)))
    assert audit(lake).ok
