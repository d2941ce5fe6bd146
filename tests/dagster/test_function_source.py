"""A source through the function face: its asset body opens the step (it has no input for the
step IO manager to load), calls ``fn(ctx)``, and the step IO manager delivers what it returned:
one commit per output queue guarded by ``proc:{processor} = step``, then the step counter.

Proved here on real Delta tables: a source with two outputs and a function-face map downstream
delivers every row exactly once, also after a failure between its two commits or after its
function (the retry calls the function again with the same ``ctx.step``); a materialization with
nothing to produce commits nothing; the source writes the same lake as ``cues run``.
"""

from __future__ import annotations

from typing import Any

import pytest
from dagster import materialize

from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.processing import (
    AssetBody,
    Graph,
    GraphRunner,
    In,
    Kind,
    Out,
    Processor,
    QueueDef,
)
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.test_function_assets import failure_classes, materialize_until_idle
from tests.dagster.test_function_idle import _versions
from tests.support import PAYLOAD, rows

STEPS, PER_STEP = 3, 10


def feed(ctx: Any) -> dict[str, Any] | None:
    """Deterministic in ``ctx.step``: steps 0..2 publish 10 ids to ``a`` and their evens to
    ``b``; then nothing to produce."""
    if ctx.step >= STEPS:
        return None
    table = rows(ctx.step * PER_STEP, PER_STEP)
    return {"a": table, "b": table.filter(pa_even(table))}


def pa_even(table: Any) -> Any:
    import pyarrow.compute as pc

    return pc.equal(pc.bit_wise_and(table["id"], 1), 0)


def copy(ctx: Any, src: Any) -> Any:
    return src.select("id", "note")


def _graph(body: AssetBody = AssetBody.FUNCTION) -> Graph:
    return Graph.build(name="feeds", queues=[QueueDef(q, PAYLOAD) for q in ("a", "b", "c")], processors=[
        Processor("feed", Kind.SOURCE, feed, outputs={"a": Out("a"), "b": Out("b")}, asset_body=body),
        Processor("copy", Kind.MAP, copy, {"src": In("a")}, {"out": Out("c")}, asset_body=body),
    ])


def _ids(lake: Lake, queue: str) -> list[int]:
    return sorted(lake.queue(queue).read_arrow(partition="0")["id"].to_pylist())


def _check_exact(lake: Lake) -> None:
    every = list(range(STEPS * PER_STEP))
    assert _ids(lake, "a") == every
    assert _ids(lake, "b") == [i for i in every if i % 2 == 0]
    assert _ids(lake, "c") == every


def _defs(lake: Lake) -> Any:
    graph = _graph()
    create_queues(graph, lake)
    return graph, build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())


def test_a_source_steps_through_the_io_manager_and_writes_what_cues_run_writes(spark, lake, instance,
                                                                               tmp_path) -> None:
    graph, defs = _defs(lake)
    runs = materialize_until_idle(defs, instance)
    assert all(r.success for r in runs)
    _check_exact(lake)
    steps = [{e.asset_key.to_user_string(): e.materialization.metadata["cues/steps"].value
              for e in r.get_asset_materialization_events()}["a"] for r in runs]
    assert steps == [1, 1, 1, 0]  # one source step per materialization, then nothing to produce
    versions = _versions(lake, graph)
    again = materialize(assets_of(defs, checks=False), resources=resources_of(defs), instance=instance)
    assert again.success and _versions(lake, graph) == versions  # nothing to produce: no commit
    runner_lake = Lake(root=str(tmp_path / "runner"))
    GraphRunner(graph=_graph(AssetBody.RUNNER), lake=runner_lake, spark=spark).run_until_idle()
    for q in ("a", "b"):  # the same rows under the same delivery hashes
        mine, theirs = (sorted(zip(*(x.queue(q).read_arrow(partition="0")[c].to_pylist()
                                     for c in ("id", "_delivery_hash")), strict=True))
                        for x in (lake, runner_lake))
        assert mine == theirs, q


@pytest.mark.parametrize("point", ["between_commits", "after_function"])
def test_a_source_failing_mid_step_delivers_each_row_once(spark, lake, instance, point) -> None:
    _, defs = _defs(lake)
    config = {"ops": {"feed": {"config": {"inject_failure_at": point, "inject_failure_step": 1}}}}
    runs = materialize_until_idle(defs, instance, run_config=config)
    assert not runs[-1].success and "InjectedFailure" in failure_classes(runs[-1])
    if point == "between_commits":  # the first queue ("a") has step 1, "b" not yet
        assert _ids(lake, "a") == list(range(2 * PER_STEP))
        assert _ids(lake, "b") == [i for i in range(PER_STEP) if i % 2 == 0]
    assert all(r.success for r in materialize_until_idle(defs, instance))
    _check_exact(lake)
