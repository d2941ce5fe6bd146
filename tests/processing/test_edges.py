"""Graph edges of issue 9: signatures and duplicate bindings checked at build, a function that reads
the metadata columns, a source whose output is empty for a step, at_least_once re-runs. (The
README's processor example runs as printed in tests/docs/test_readme_examples.py.)"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    GraphError,
    GraphRunner,
    In,
    Kind,
    Out,
    Processor,
    QueueDef,
    SimulatedCrash,
    Strategy,
)
from cues_platform.processing.runner import create_queues
from tests.processing.graphs import PID, CrashAt, build_graph, ids_of, sink_rows
from tests.support import PAYLOAD, rows

QUEUES = [QueueDef(n, PAYLOAD) for n in ("a", "b", "c")] + [QueueDef("errors", ERROR_SCHEMA)]


# -- signatures ------------------------------------------------------------------------------------
def map_with(fn) -> Graph:
    return Graph.build(name="g", queues=QUEUES,
                       processors=[Processor("m", Kind.MAP, fn, {"orders": In("a")}, {"out": Out("b")})])


@pytest.mark.parametrize("fn", [
    lambda ctx, src: src,               # the parameter is not named after the binding
    lambda ctx: None,                   # no parameter for the binding
    lambda ctx, orders, extra: orders,  # a required parameter that no binding fills
    lambda *, orders: orders,           # no positional parameter for the context
])
def test_a_function_that_does_not_fit_its_bindings_is_a_graph_error(fn):
    with pytest.raises(GraphError, match=r"does not fit its input bindings \['orders'\]") as info:
        map_with(fn)
    assert info.value.processor == "m"


@pytest.mark.parametrize("fn", [
    lambda ctx, orders: orders,
    lambda context, orders, extra=1: orders,
    lambda ctx, **frames: frames["orders"],
    lambda *args, **frames: None,
])
def test_functions_that_fit_their_bindings(fn):
    assert map_with(fn).processors["m"].fn is fn


def test_source_functions_take_only_the_context():
    src = Processor("s", Kind.SOURCE, lambda ctx, rows: None, {}, {"out": Out("a")})
    with pytest.raises(GraphError, match=r"does not fit its input bindings \[\]"):
        Graph.build(name="g", queues=QUEUES, processors=[src])


# -- duplicate output bindings ---------------------------------------------------------------------
@pytest.mark.parametrize("outputs", [
    {"left": Out("b"), "right": Out("b")},
    {"left": Out("b"), "right": Out("b", partition=None, partition_column="note")},
])
def test_a_fork_with_two_bindings_to_the_same_queue_partition_is_rejected(outputs):
    fork = Processor("f", Kind.FORK, lambda ctx, src: None, {"src": In("a")}, outputs)
    with pytest.raises(GraphError, match=r"outputs 'left' and 'right' both write .* of queue 'b'") as info:
        Graph.build(name="g", queues=QUEUES, processors=[fork])
    assert info.value.processor == "f" and {info.value.binding, info.value.other} == {"left", "right"}


def test_a_fork_may_write_two_partitions_of_one_queue():
    parts = QueueDef("p", PAYLOAD, partitions=("x", "y"))
    fork = Processor("f", Kind.FORK, lambda ctx, src: None, {"src": In("a")},
                     {"left": Out("p", "x"), "right": Out("p", "y")})
    Graph.build(name="g", queues=[*QUEUES, parts], processors=[fork])


def test_a_function_may_still_read_the_metadata_columns(spark, lake):
    def fn(ctx, src):
        return src.select((F.col("_offset") + 1000).alias("id"), F.col("note"))

    graph = build_graph("map", fn=fn)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 5), partition="0")
    runner.run_until_idle()
    assert ids_of(lake, "b") == [1000 + i for i in range(5)]


# -- a source whose output is empty for a step -----------------------------------------------------
def source_graph(plan: dict[int, tuple[int, int]]) -> Graph:
    """A source with two outputs; step s writes plan[s] = (rows to b, rows to c), ids 100*s + i."""

    def fn(ctx):
        if ctx.step not in plan:
            return None
        nb, nc = plan[ctx.step]
        return {"left": rows(100 * ctx.step, nb), "right": rows(100 * ctx.step + 50, nc)}

    return Graph.build(name="src", queues=QUEUES,
                       processors=[Processor("s", Kind.SOURCE, fn, {}, {"left": Out("b"), "right": Out("c")})])


def test_a_source_output_empty_for_one_step_leaves_no_gap(spark, lake):
    plan = {0: (2, 2), 1: (0, 3), 2: (2, 0), 3: (1, 1)}
    stats = GraphRunner(graph=source_graph(plan), lake=lake, spark=spark).run_until_idle()
    assert [r.step for r in stats["s"].results] == [0, 1, 2, 3]
    assert ids_of(lake, "b") == [0, 1, 200, 201, 300]
    assert ids_of(lake, "c") == [50, 51, 150, 151, 152, 350]
    # A restart neither repeats nor skips a step.
    plan[4] = (1, 0)
    stats = GraphRunner(graph=source_graph(plan), lake=lake, spark=spark).run_until_idle()
    assert [r.step for r in stats["s"].results] == [4]
    assert ids_of(lake, "b") == [0, 1, 200, 201, 300, 400]
    assert ids_of(lake, "c") == [50, 51, 150, 151, 152, 350]


def test_a_source_crashing_between_its_outputs_delivers_each_once(spark, lake):
    plan = {0: (2, 2), 1: (0, 3), 2: (2, 2)}
    hook = CrashAt("between_commits", 4)  # step 2 after b's commit, before c's
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=source_graph(plan), lake=lake, spark=spark, hook=hook).run_until_idle()
    assert ids_of(lake, "b") == [0, 1, 200, 201] and ids_of(lake, "c") == [50, 51, 150, 151, 152]
    GraphRunner(graph=source_graph(plan), lake=lake, spark=spark).run_until_idle()
    assert ids_of(lake, "b") == [0, 1, 200, 201]
    assert ids_of(lake, "c") == [50, 51, 150, 151, 152, 250, 251]


# -- at_least_once: a re-run covers exactly the first run's range ----------------------------------
def test_at_least_once_rerun_covers_the_first_runs_range(spark, lake):
    """Step 1 of an at_least_once sink reads the 5 rows there are (batch 10), applies its side
    effect (write_delta_once, keyed by step) and crashes before saving its positions; 10 more rows
    arrive. The re-run must read the same 5 rows (skipped by the sink: already applied) and step 2
    the new ones, not read 15..20 as step 1 (which the sink would skip: rows lost)."""
    graph = build_graph("sink", strategy=Strategy.AT_LEAST_ONCE)
    create_queues(graph, lake)
    lake.queue("a").append(rows(0, 10), partition="0")
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()  # step 0: ids 0..9
    lake.queue("a").append(rows(10, 5), partition="0")
    hook = CrashAt("after_commit", 1)  # after the sink's effect, before the positions
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook).run_until_idle()
    assert sorted(sink_rows(lake)["id"].to_pylist()) == [i * 2 for i in range(15)]
    lake.queue("a").append(rows(15, 10), partition="0")
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    steps = [(r.step, r.inputs["src"].start, r.inputs["src"].end) for r in stats[PID].results]
    assert steps[0] == (1, 10, 15)
    assert sorted(sink_rows(lake)["id"].to_pylist()) == [i * 2 for i in range(25)]
