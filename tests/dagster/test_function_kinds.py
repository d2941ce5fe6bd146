"""Every kind the function face takes, through the step IO manager, under crash points beyond
``test_function_assets.BOUNDED``: a join (two inputs loaded into one step) and a fork (several
outputs handed to the IO manager, delivered together by the step protocol: its attempt record,
then one commit per output queue in the FIRST ``handle_output``; the later outputs report only).

Each case: the run fails at the point (Dagster fails the op), more materializations follow, every
row is in its queue exactly once (``tests/processing/graphs.check_exact``) and the auditor finds
no violation.
"""

from __future__ import annotations

import pytest
from dagster import materialize

from cues_platform.audit import audit
from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.processing.runner import create_queues
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.test_function_assets import (
    failure_classes,
    function_face,
    materialize_until_idle,
)
from tests.processing import graphs as matrix

CASES = [("join", "output", "after_prepare"), ("join", "error", "after_commit"),
         ("fork", "output", "after_attempt"), ("fork", "output", "after_commit")]


@pytest.mark.parametrize(("kind", "outcome", "point"), CASES)
def test_a_crash_of_a_join_or_fork_keeps_exactly_once(spark, lake, instance, kind, outcome, point) -> None:
    graph = function_face(matrix.build_graph(kind, outcome))
    create_queues(graph, lake)
    matrix.load_inputs(lake, kind)
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    config = {"ops": {matrix.PID: {"config": {"inject_failure_at": point, "inject_failure_step": 1}}}}
    runs = materialize_until_idle(defs, instance, run_config=config)
    assert not runs[-1].success, f"the injected failure at {point} never fired"
    assert "InjectedFailure" in failure_classes(runs[-1])
    materialize_until_idle(defs, instance)
    matrix.check_exact(lake, kind, outcome)
    assert not audit(lake).violations


def test_a_fork_commits_every_output_in_its_first_handle_output(spark, lake, instance) -> None:
    """The fork's outputs are committed together: a failure injected at ``after_commit`` (after
    the home commit, the last of the step) fires inside the first output's ``handle_output``, so
    by then every output queue already holds the step."""
    graph = function_face(matrix.build_graph("fork"))
    create_queues(graph, lake)
    matrix.load_inputs(lake, "fork")
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    outs = sorted({o.queue for o in graph.processors[matrix.PID].outputs.values()})
    assert len(outs) > 1
    before = {q: lake.queue(q).version() for q in outs}
    config = {"ops": {matrix.PID: {"config": {"inject_failure_at": "after_commit", "inject_failure_step": 0}}}}
    result = materialize(assets_of(defs, checks=False), resources=resources_of(defs), instance=instance,
                         run_config=config, raise_on_error=False)
    assert not result.success
    handled = [e.step_key for e in result.all_events if e.event_type_value == "HANDLED_OUTPUT"]
    assert matrix.PID not in handled  # the first handle_output failed: no output was handled...
    assert all(lake.queue(q).version() > before[q] for q in outs)  # ...yet every queue has the step
    materialize_until_idle(defs, instance)
    matrix.check_exact(lake, "fork", "output")
    assert not audit(lake).violations
