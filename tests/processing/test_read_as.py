"""``Options.read_as``: a step's inputs as pyarrow Tables read by the driver (``ReadAs.ARROW``).

The rows, their order and columns equal the Spark frame's; the delivery contract is the same
(every crash point of a map, with output and with an isolated error); a runner whose processors
all read Arrow starts no Spark session; a read_as that is not a ReadAs is refused when the graph
is built.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cues_platform.processing import GraphError, GraphRunner, ReadAs, SimulatedCrash
from cues_platform.processing.graph import Graph, In, Kind, Options, Out, Processor, QueueDef
from cues_platform.queues import Lake
from tests.processing.graphs import (
    PID,
    STEP_POINTS,
    Boom,
    CrashAt,
    _special,
    build_graph,
    check_exact,
    load_inputs,
)
from tests.support import PAYLOAD


def arrow_map(outcome: str):  # noqa: ANN201
    """The map of ``graphs.make_fn`` written on Arrow: ``id * 2`` and ``note``; block 1 raises
    (``error``) or returns None (``nil``)."""

    def fn(ctx, src: pa.Table):  # noqa: ANN001, ANN202
        assert isinstance(src, pa.Table), f"read_as=arrow gave {type(src).__name__}"
        if _special(ctx, 10) and outcome == "error":
            raise Boom(f"step {ctx.step} of {ctx.processor_id} fails on purpose")
        if _special(ctx, 10) and outcome == "nil":
            return None
        return pa.table({"id": pc.multiply(src["id"], 2), "note": src["note"]})

    return fn


def test_arrow_input_holds_the_rows_and_columns_of_the_spark_frame(spark, tmp_path):
    seen: dict[ReadAs, pa.Table] = {}
    for read_as in ReadAs:
        def fn(ctx, src, read_as=read_as):  # noqa: ANN001, ANN202
            seen[read_as] = src if isinstance(src, pa.Table) else src.toArrow()

        lake = Lake(root=str(tmp_path / read_as.value))
        graph = build_graph("map", fn=fn, read_as=read_as)
        runner = GraphRunner(graph=graph, lake=lake, spark=spark)
        load_inputs(lake, "map")
        runner.step_once(PID)
    arrow, frame = seen[ReadAs.ARROW], seen[ReadAs.SPARK]
    assert isinstance(arrow, pa.Table) and arrow.column_names == frame.column_names
    # the same types (Arrow keeps the queue's NOT NULL flags, Spark's toArrow drops them)
    assert arrow.schema.types == frame.schema.types
    # the same rows in offset order (_append_time is each lake's own clock: compared apart)
    same = [c for c in arrow.column_names if c != "_append_time"]
    assert arrow.select(same).to_pylist() == frame.sort_by("_offset").select(same).to_pylist()
    assert arrow["_offset"].to_pylist() == list(range(10))


@pytest.mark.parametrize(("outcome", "point"), [
    (o, p) for o in ("output", "error") for p in STEP_POINTS
    if p != "between_commits" and not (o == "output" and p == "after_attempt")])
def test_arrow_map_crash_points_deliver_exactly_once(spark, lake, outcome, point):
    """A crash at each point of step 1 of an Arrow map, then a new runner: every output row once,
    one error row per failing input row (isolation splits the Arrow table), nothing twice."""
    graph = build_graph("map", outcome, fn=arrow_map(outcome), read_as=ReadAs.ARROW)
    hook = CrashAt(point, occurrence=1 if point == "after_attempt" else 2)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook)
    load_inputs(lake, "map")
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    assert hook.fired
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "map", outcome)
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "map", outcome)


def test_a_runner_of_arrow_processors_only_starts_no_spark(lake):
    graph = build_graph("map", "output", fn=arrow_map("output"), read_as=ReadAs.ARROW)
    runner = GraphRunner(graph=graph, lake=lake)  # no spark given
    assert runner._spark is None
    load_inputs(lake, "map")
    runner.run_until_idle()
    check_exact(lake, "map", "output")


def test_read_as_must_be_a_read_as_value():
    proc = Processor("p", Kind.MAP, lambda ctx, src: src, {"src": In("a")}, {"out": Out("b")},
                     options=Options(read_as="arrow"))  # type: ignore[arg-type]
    with pytest.raises(GraphError, match=r"read_as must be a ReadAs \(spark, arrow\)"):
        Graph.build(name="g", queues=[QueueDef("a", PAYLOAD), QueueDef("b", PAYLOAD)],
                    processors=[proc])
