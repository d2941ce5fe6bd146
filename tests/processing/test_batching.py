"""Backlog steps (issue 11): a processor far behind catches up in big steps, up to
``max_batch_size``; one that keeps up reads ``batch_size`` per step. Exactly-once holds either way
(every row once, every step's rows under its own hash, the positions contiguous)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cues_platform.audit import audit
from cues_platform.processing import GraphError, GraphRunner, Options
from cues_platform.processing.batching import BACKLOG_FACTOR, step_size
from cues_platform.processing.history import processor_history
from tests.processing.graphs import PID, build_graph, ids_of
from tests.support import rows


def with_options(graph, **options):
    proc = graph.processors[PID]
    proc = replace(proc, options=replace(proc.options, **options))
    return type(graph).build(name=graph.name, queues=list(graph.queues.values()), processors=[proc],
                             error_queue=graph.error_queue)


@pytest.mark.parametrize(("lag", "expected"), [
    (0, 10), (5, 10), (BACKLOG_FACTOR * 10, 10),  # at most 10 x batch behind: a normal step
    (BACKLOG_FACTOR * 10 + 1, 101),               # further behind: everything available ...
    (5_000, 200),                                 # ... up to max_batch_size
])
def test_step_size_by_lag(lag, expected):
    assert step_size(Options(batch_size=10, max_batch_size=200), start=7, available=7 + lag) == expected


def test_a_backlog_is_caught_up_in_big_steps_then_steps_are_batch_sized(spark, lake):
    graph = with_options(build_graph("map", "output"), batch_size=10, max_batch_size=200)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 500), partition="0")  # 50 x batch_size behind
    stats = runner.run_until_idle()[PID]
    sizes = [r.rows_in for r in stats.results]
    # 500 behind: 200, 200 (max_batch_size); then 100 left is exactly 10 x batch_size, which is
    # not a backlog: ten batch-sized steps
    assert sizes == [200, 200] + [10] * 10
    lake.queue("a").append(rows(500, 25), partition="0")  # keeping up: batch-sized steps
    more = runner.run_until_idle()[PID].results[len(sizes):]
    assert [r.rows_in for r in more] == [10, 10, 5]
    assert ids_of(lake, "b") == [i * 2 for i in range(525)]
    history = [r for r in processor_history(lake, PID) if r.is_attempt]
    ends = [(r.snapshot.inputs["src"].start, r.snapshot.inputs["src"].end) for r in history]
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:], strict=False))
    assert audit(lake).ok


def test_max_batch_size_below_batch_size_is_refused():
    with pytest.raises(GraphError, match=r"max_batch_size \(5\) must be >= batch_size \(10\)"):
        with_options(build_graph("map"), batch_size=10, max_batch_size=5)
