"""A lake written by the previous protocol (snapshot + attempt records in the backing queue, output
commits carrying only ``proc:{p}``, no positions in the home queue) is recovered and continued by
the one-commit protocol, and audits clean: recovery takes the positions from the last backing
attempt, and the first new step stores them in the home queue."""

from __future__ import annotations

import pyarrow as pa

from cues_platform.audit import audit
from cues_platform.processing import BackingQueue, GraphRunner, Range, Record, RecordType, Snapshot
from cues_platform.processing.home import read_home
from cues_platform.processing.outputs import commit_once
from cues_platform.processing.runner import create_queues
from tests.processing.graphs import PID, build_graph, check_exact, load_inputs


def old_protocol_step(lake, step: int, *, nil: bool = False) -> None:
    """What the previous version wrote for one map step over ``a`` [10 step, 10 step + 10)."""
    backing = BackingQueue(lake, PID)
    epoch = backing.epoch()
    snap = Snapshot(PID, step, {"src": Range("a", "0", step * 10, step * 10 + 10)})
    backing.append(Record(RecordType.SNAPSHOT, snap, epoch))
    if nil:
        backing.append(Record(RecordType.ATTEMPT_NIL, snap, epoch))
        return
    ids = [i * 2 for i in range(step * 10, step * 10 + 10)]
    table = pa.table({"id": pa.array(ids, pa.int64()), "note": [f"n{i // 2}" for i in ids]})
    backing.append(Record(RecordType.ATTEMPT_OUTPUT, snap, epoch,
                          {"files": {"b": {"0": "(committed by the old version)"}}, "rows": {"b": {"0": 10}}}))
    commit_once(lake.queue("b"), snap, {"0": table}, prepared=False)


def test_a_lake_of_the_previous_protocol_is_continued_exactly_once(spark, lake):
    graph = build_graph("map", "output")
    create_queues(graph, lake)
    load_inputs(lake, "map")  # 30 rows: the old version delivered steps 0 and 1
    BackingQueue(lake, PID).fence()
    old_protocol_step(lake, 0)
    old_protocol_step(lake, 1)
    home = read_home(lake.queue("b"), graph.processors[PID])
    assert home.step == 1 and not home.keyed  # the old version stored no positions
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()[PID]
    assert [(r.step, r.rows_in, r.recovered) for r in stats.results] == [(2, 10, False)]
    home = read_home(lake.queue("b"), graph.processors[PID])
    assert home.step == 2 and home.positions == {"src": 30}
    check_exact(lake, "map", "output", legacy=True)
    assert audit(lake, graph=graph).ok


def test_an_old_nil_attempt_above_the_home_step_is_closed_on_the_home_queue(spark, lake):
    """The previous version's nil step left no output commit: the home queue's step is behind the
    backing's last attempt, which recovery rolls forward (an empty home commit with positions)."""
    graph = build_graph("map", "nil")  # block 1 (step 1) is nil
    create_queues(graph, lake)
    load_inputs(lake, "map")
    BackingQueue(lake, PID).fence()
    old_protocol_step(lake, 0)
    old_protocol_step(lake, 1, nil=True)
    assert read_home(lake.queue("b"), graph.processors[PID]).step == 0
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()[PID]
    assert [(r.step, r.outcome, r.recovered) for r in stats.results] == [(1, "nil", True),
                                                                         (2, "output", False)]
    assert read_home(lake.queue("b"), graph.processors[PID]).positions == {"src": 30}
    check_exact(lake, "map", "nil", legacy=True)
    assert audit(lake, graph=graph).ok
