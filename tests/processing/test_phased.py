"""``PhasedStep``: one step in three calls (start, call, deliver), as the Dagster step IO manager
drives it. The crash points are covered through Dagster in tests/dagster/test_function_assets.py;
here: a second instance fences the first between its calls, and misuse is refused."""

from __future__ import annotations

import pytest

from cues_platform.processing import GraphError, ProcessorFencedError
from cues_platform.processing.phased import PhasedStep
from cues_platform.queues import Lake
from tests.processing.graphs import PID, build_graph, check_exact, ids_of, load_inputs


def test_a_second_instance_fences_the_first_between_its_calls(spark, lake: Lake) -> None:
    """A zombie materialization (its run presumed dead, still alive) cannot deliver once a newer
    one has started: its commit is refused, the newer one's is the step."""
    graph = build_graph("map")
    first = PhasedStep.create(graph=graph, processor=graph.processors[PID], lake=lake, spark=spark)
    load_inputs(lake, "map")
    first.start()
    first.call()
    second = PhasedStep.create(graph=graph, processor=graph.processors[PID], lake=lake, spark=spark).start()
    second.call()
    with pytest.raises(ProcessorFencedError):
        first.deliver()
    assert ids_of(lake, "b") == []
    assert second.deliver().step == 0
    assert ids_of(lake, "b") == [i * 2 for i in range(10)]
    for _ in range(3):
        step = PhasedStep.create(graph=graph, processor=graph.processors[PID], lake=lake, spark=spark).start()
        step.call()
        step.deliver()
    check_exact(lake, "map", "output")


def test_no_input_means_no_step_and_misuse_is_refused(spark, lake: Lake) -> None:
    graph = build_graph("map")
    idle = PhasedStep.create(graph=graph, processor=graph.processors[PID], lake=lake, spark=spark).start()
    assert idle.snapshot is None and idle.frames == {}
    idle.call()
    assert idle.deliver() is None
    with pytest.raises(GraphError, match="no open step"):
        idle.context()
    load_inputs(lake, "map")
    step = PhasedStep.create(graph=graph, processor=graph.processors[PID], lake=lake, spark=spark).start()
    with pytest.raises(GraphError, match="before its function was called"):
        step.deliver()
    other = build_graph("map", name="other")
    with pytest.raises(GraphError, match="is not in graph"):
        PhasedStep.create(graph=graph, processor=other.processors[PID], lake=lake, spark=spark)
