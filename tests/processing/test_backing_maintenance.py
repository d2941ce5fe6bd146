"""The backing queue stays small as steps pile up: compacted every N steps, log and tombstones kept
for a short retention, and nothing a recovery or the auditor reads ever changes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from deltalake import DeltaTable

from cues_platform.audit import audit
from cues_platform.processing import BackingQueue, Graph, GraphRunner
from cues_platform.processing.backing import BACKING_RETENTION
from cues_platform.processing.errors import GraphError
from tests.processing.graphs import PID, build_graph, check_exact, load_inputs

N, BATCH = 30, 5  # 6 steps


def with_maintenance(graph: Graph, every: int) -> Graph:
    proc = graph.processors[PID]
    proc = replace(proc, options=replace(proc.options, backing_maintenance_every=every))
    return Graph.build(name=graph.name, queues=list(graph.queues.values()), processors=[proc],
                       error_queue="errors")


def test_backing_queue_is_compacted_every_n_steps_and_recovery_reads_the_same(lake, spark) -> None:
    graph = with_maintenance(build_graph("fork", batch=BATCH), every=2)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "fork", n=N)
    runner.run_until_idle()
    backing = BackingQueue(lake, PID)
    dt = backing.queue.refresh()
    # 6 steps = 6 attempt records (a fork folds its snapshot into the attempt); compacted after
    # steps 2, 4 and 6: one file holds them all
    assert len(dt.file_uris()) == 1
    assert dt.metadata().configuration["delta.logRetentionDuration"] == BACKING_RETENTION
    check_exact(lake, "fork", "output", n=N, batch=BATCH)
    # a restart recovers from the compacted queue: its last attempt (step 5) is closed by the home
    # queue's commit, so there is nothing to roll forward and no new step to run
    assert backing.last_record().step == N // BATCH - 1
    again = GraphRunner(graph=graph, lake=lake, spark=spark)
    stats = again.run_until_idle()[PID]
    assert stats.steps == stats.recovered == 0
    assert again.steppers[PID].next_step == N // BATCH
    check_exact(lake, "fork", "output", n=N, batch=BATCH)
    assert audit(lake).ok


def test_no_maintenance_when_disabled_and_negative_is_rejected(lake, spark) -> None:
    graph = with_maintenance(build_graph("fork", batch=BATCH), every=0)
    GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "fork", n=N)
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    files = DeltaTable(BackingQueue(lake, PID).queue.uri).file_uris()
    assert len(files) == N // BATCH  # one file per attempt record
    with pytest.raises(GraphError, match="backing_maintenance_every must be >= 0"):
        with_maintenance(build_graph("map", batch=BATCH), every=-1)
