"""A ``@processor_asset`` materialization with nothing to do commits nothing.

The step IO manager does not start an exactly-once step whose inputs have no unread row and whose
backing queue has nothing to recover (``processing/idle.py``): no recovery, so no fencing commit
in the home queue or the backing queue, which a downstream trigger could take for new data.
Proved on the shop graph in the function face (a map, a fork and a sink): after the lake is
drained, a by-hand materialization of every asset leaves every queue and backing version as it
was; and a step that crashed on the last batch is still recovered: a sink's pending snapshot (no
unread row left) and a fork's attempt between its commits.
"""

from __future__ import annotations

from typing import Any

import pytest
from dagster import materialize
from deltalake import DeltaTable

from cues_platform.audit import audit
from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.processing import Graph
from cues_platform.processing.idle import graph_work, lane_work
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import N, check_exact, load_orders
from tests.dagster.graphs import build_graph as build_shop
from tests.dagster.test_function_assets import (
    failure_classes,
    function_face,
    materialize_until_idle,
)


def _versions(lake: Lake, graph: Graph) -> dict[str, int]:
    """The Delta version of every queue of ``graph`` and of every backing queue."""
    out = {q: lake.queue(q).version() for q in graph.queues if lake.has_queue(q)}
    for pid in graph.processors:
        uri = lake.system_uri("backing", pid)
        if DeltaTable.is_deltatable(uri, storage_options=lake.options):
            out[f"backing/{pid}"] = DeltaTable(uri, storage_options=lake.options).version()
    return out


def _stopped(result: Any) -> dict[str, tuple[str, int]]:
    return {e.asset_key.to_user_string(): (e.materialization.metadata["cues/stopped"].value,
                                           e.materialization.metadata["cues/lag_total"].value)
            for e in result.get_asset_materialization_events()}


def _setup(lake: Lake, count: int = N) -> tuple[Graph, Any]:
    graph = function_face(build_shop())
    create_queues(graph, lake)
    load_orders(lake, count=count)
    return graph, build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())


def test_a_noop_materialization_of_function_assets_commits_nothing(spark, lake, instance) -> None:
    graph, defs = _setup(lake)
    assert all(r.success for r in materialize_until_idle(defs, instance))
    check_exact(lake)
    assert graph_work(lake, graph) == {}
    versions = _versions(lake, graph)
    assert {"backing/enrich", "backing/split", "backing/archive"} <= versions.keys()
    for _ in range(2):  # by hand, twice: each succeeds, says so, and commits nothing anywhere
        again = materialize(assets_of(defs, checks=False), resources=resources_of(defs), instance=instance)
        assert again.success
        assert _stopped(again) == dict.fromkeys(["enriched", "big", "small", "archive"], ("no new input", 0))
        assert _versions(lake, graph) == versions
    check_exact(lake)


@pytest.mark.parametrize(("pid", "point"), [("archive", "after_snapshot"), ("split", "between_commits")])
def test_a_step_that_crashed_on_the_last_batch_is_still_recovered(spark, lake, instance, pid, point) -> None:
    """A sink that recorded its last snapshot has no unread row (its positions are that snapshot's
    ends) but a snapshot to deliver; a fork that crashed between its commits has an attempt to
    roll forward. The idle shortcut must not skip either recovery. 20 orders: two steps, the last
    one (step 1) writes both ``big`` and ``small``."""
    graph, defs = _setup(lake, count=20)
    config = {"ops": {pid: {"config": {"inject_failure_at": point, "inject_failure_step": 1}}}}
    runs = materialize_until_idle(defs, instance, run_config=config)
    assert not runs[-1].success and "InjectedFailure" in failure_classes(runs[-1])
    work = lane_work(lake, graph.processors[pid])
    assert work.pending, work
    if pid == "archive":
        assert work.unread == {"src": 0}  # only the pending snapshot says there is work
    materialize_until_idle(defs, instance)
    check_exact(lake, 20)
    assert not audit(lake).violations
    versions = _versions(lake, graph)
    materialize(assets_of(defs, checks=False), resources=resources_of(defs), instance=instance)
    assert _versions(lake, graph) == versions
