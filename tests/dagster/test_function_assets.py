"""``@processor_asset``: the asset body is the processor function, the step IO manager loads the
step's ranges and delivers its output with the delivery hash.

Proved here: the function face and the runner face (``cues run``) write the same lake, row for
row and hash for hash; a crash at every point of the step protocol (Dagster failing the step, or
the run process SIGKILLed) followed by more materializations delivers every row exactly once
(``tests/processing/graphs.check_exact``, the crash matrix's own check); errors are classified
where they arise; bad declarations are refused with what to do.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import DagsterEventType, materialize

from cues_platform.audit import audit
from cues_platform.dagster import (
    CuesSparkResource,
    LakeResource,
    build_definitions,
    processor_asset,
)
from cues_platform.processing import AssetBody, Graph, GraphError, GraphRunner, Kind, Options
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import build_graph as build_shop
from tests.dagster.graphs import load_orders
from tests.processing import graphs as matrix
from tests.support import ROOT, soak_enabled


def function_face(graph: Graph) -> Graph:
    """The same graph with every processor's asset body set to its function."""
    procs = [dataclasses.replace(p, asset_body=AssetBody.FUNCTION) for p in graph.processors.values()]
    return Graph.build(name=graph.name, queues=list(graph.queues.values()), processors=procs,
                       error_queue=graph.error_queue, options=graph.options)


def materialize_until_idle(defs, instance, *, run_config: dict | None = None,
                           limit: int = 20) -> list[Any]:
    """Materialize every asset until no processor has new input; returns the runs' results."""
    results = []
    for _ in range(limit):
        result = materialize(assets_of(defs, checks=False), resources=resources_of(defs),
                             instance=instance, run_config=run_config or {}, raise_on_error=False)
        results.append(result)
        if not result.success:
            return results
        stopped = {e.materialization.metadata["cues/stopped"].value
                   for e in result.get_asset_materialization_events()}
        if stopped == {"no new input"}:
            return results
    raise AssertionError(f"still stepping after {limit} materializations")


def failure_classes(result) -> list[str]:
    """The exception classes of the run's step failure, outermost first (Dagster wraps what an IO
    manager raises in its own error, with ours as the cause)."""
    [failure] = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    error, names = failure.event_specific_data.error, []
    while error is not None:
        names.append(error.cls_name)
        error = error.cause
    return names


def rows_with_hashes(lake: Lake, queue: str) -> list[tuple]:
    table = lake.queue(queue).read_arrow(partition="0")
    return sorted(zip(table["_offset"].to_pylist(), table["id"].to_pylist(),
                      table["_delivery_hash"].to_pylist(), strict=True))


# -- the same lake from both faces ----------------------------------------------------------------
def test_function_face_and_runner_face_write_the_same_lake(spark, tmp_path, instance) -> None:
    runner_lake, function_lake = Lake(root=str(tmp_path / "runner")), Lake(root=str(tmp_path / "function"))
    GraphRunner(graph=build_shop(), lake=runner_lake, spark=spark).run_until_idle()
    load_orders(runner_lake)
    GraphRunner(graph=build_shop(), lake=runner_lake, spark=spark).run_until_idle()

    graph = function_face(build_shop())
    create_queues(graph, function_lake)
    load_orders(function_lake)
    defs = build_definitions(graph, lake=LakeResource(root=function_lake.root), spark=CuesSparkResource())
    runs = materialize_until_idle(defs, instance)
    assert all(r.success for r in runs)
    assert len(runs) == 4  # 3 steps of enrich and split (30 orders, batches of 10), then idle
    for queue in ("enriched", "big", "small"):
        assert rows_with_hashes(function_lake, queue) == rows_with_hashes(runner_lake, queue), queue
    from tests.dagster.graphs import check_exact, sink_uri

    check_exact(function_lake)
    from deltalake import DeltaTable

    def effects(lake: Lake) -> list[tuple]:
        t = DeltaTable(sink_uri(lake)).to_pyarrow_table()
        return sorted(zip(t["id"].to_pylist(), t["hash"].to_pylist(), strict=True))

    assert effects(function_lake) == effects(runner_lake)
    assert not audit(function_lake).violations


def test_metadata_and_checks_of_a_function_asset(spark, lake, instance) -> None:
    """The checks judge what the step delivered; the body sees Dagster's context as ``ctx.host``."""
    seen: list[Any] = []

    @processor_asset(inputs={"src": "orders"}, outputs="enriched",
                     options=Options(batch_size=100))
    def enrich(ctx, src):
        """Doubles every order id."""
        seen.append((type(ctx.host).__name__, ctx.step, ctx.delivery_hash))
        return src.selectExpr("id * 2 AS id", "note")

    shop = build_shop()
    graph = Graph.build(name="shop", queues=[shop.queues[q] for q in ("orders", "enriched", "errors")],
                        processors=[enrich], error_queue="errors")
    create_queues(graph, lake)
    load_orders(lake)
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    assert result.success
    [mat] = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in mat.materialization.metadata.items()}
    assert meta["cues/steps"] == 1 and meta["cues/rows_in"] == 30 and meta["cues/rows_out"] == 30
    assert meta["cues/written_ranges"] == {"0": [0, 30]}
    assert seen == [("AssetExecutionContext", 0, meta["cues/last_delivery_hash"])]
    checks = {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
              for e in result.all_events if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION}
    assert checks["contract"] and checks["exactly_once"]
    # a second materialization has no new input: the function is not called, nothing is written
    again = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    [mat] = again.get_asset_materialization_events()
    assert mat.materialization.metadata["cues/stopped"].value == "no new input" and len(seen) == 1
    assert sorted(lake.queue("enriched").read_arrow(partition="0")["id"].to_pylist()) == \
        [i * 2 for i in range(30)]


def test_the_new_data_sensor_keeps_requesting_until_the_processor_caught_up(spark, lake, instance) -> None:
    """One step per materialization: after the new-data run, the sensor requests catch-up runs
    (one per materialization that left lag) until the lag is 0, then skips."""
    from dagster import build_sensor_context

    graph = function_face(matrix.build_graph("map"))
    create_queues(graph, lake)
    matrix.load_inputs(lake, "map")  # 30 rows, batches of 10: three steps
    resource = LakeResource(root=lake.root)
    defs = build_definitions(graph, lake=resource, spark=CuesSparkResource())
    sensor = defs.get_repository_def().get_sensor_def(f"{graph.name}__{matrix.PID}__new_data")
    cursor, triggers = None, []
    for _ in range(6):
        with build_sensor_context(instance=instance, cursor=cursor,
                                  resources={"lake": resource}) as context:
            tick = sensor.evaluate_tick(context)
        cursor = tick.cursor or cursor
        if not tick.run_requests:
            assert "no new commits" in tick.skip_message
            break
        (request,) = tick.run_requests
        triggers.append(request.tags["cues/trigger"])
        result = materialize(assets_of(defs, checks=False), resources=resources_of(defs),
                             instance=instance, selection=request.asset_selection, tags=request.tags)
        assert result.success
    assert triggers == ["new_data", "catch_up", "catch_up"]
    matrix.check_exact(lake, "map", "output")
    # caught up: a tick from the same cursor requests nothing more
    with build_sensor_context(instance=instance, cursor=cursor, resources={"lake": resource}) as context:
        again = sensor.evaluate_tick(context)
    assert not again.run_requests


@pytest.mark.parametrize("strategy", ["at_least_once", "at_most_once"])
def test_the_faster_strategies_step_through_the_function_face(spark, lake, instance, strategy) -> None:
    from cues_platform.processing import Strategy

    graph = function_face(matrix.build_graph("fork", strategy=Strategy(strategy)))
    create_queues(graph, lake)
    matrix.load_inputs(lake, "fork")
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    runs = materialize_until_idle(defs, instance)
    assert all(r.success for r in runs) and len(runs) == 4
    assert matrix.ids_of(lake, "b") == [i * 2 for i in range(30)]
    assert matrix.ids_of(lake, "d") == [i * 3 for i in range(30)]


# -- crash at every point of the protocol, through Dagster ----------------------------------------
FULL = [(k, o, p) for k in matrix.KINDS for o in matrix.OUTCOMES
        for p in ("recovery_fenced", *matrix.STEP_POINTS)]
# CI: one case per protocol path and per Dagster phase the crash lands in (load_input: a sink's
# after_snapshot; the body: after_function; handle_output: the rest), each path once. A non-sink
# records nothing before its commit, so its after_snapshot/after_read equal after_function (the
# runner-face matrix, tests/processing/test_crash_matrix.py, runs every kind at every point).
# CUES_SOAK=1 runs every kind x outcome x point here too.
BOUNDED = [("map", "output", "after_function"), ("map", "output", "after_prepare"),
           ("map", "error", "after_attempt"), ("fork", "output", "between_commits"),
           ("sink", "output", "after_snapshot"), ("alts", "nil", "after_commit")]


def crash_case(kind: str, outcome: str, point: str) -> bool:
    from tests.processing.test_crash_matrix import reached

    return point == "recovery_fenced" or reached(kind, outcome, point)


@pytest.mark.parametrize(("kind", "outcome", "point"),
                         [c for c in (FULL if soak_enabled() else BOUNDED) if crash_case(*c)])
def test_crash_at_every_point_keeps_exactly_once(spark, lake, instance, kind, outcome, point) -> None:
    graph = function_face(matrix.build_graph(kind, outcome))
    create_queues(graph, lake)
    matrix.load_inputs(lake, kind)
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    # step 1 carries the outcome; a failing function never reaches after_function: crash step 2
    step = None if point == "recovery_fenced" else 2 if (outcome, point) == ("error", "after_function") else 1
    config = {"ops": {matrix.PID: {"config": {"inject_failure_at": point, "inject_failure_step": step}}}}
    runs = materialize_until_idle(defs, instance, run_config=config)
    failed = runs[-1]
    assert not failed.success, f"the injected failure at {point} never fired"
    assert "InjectedFailure" in failure_classes(failed)
    materialize_until_idle(defs, instance)
    matrix.check_exact(lake, kind, outcome)
    assert not audit(lake).violations


CHILD = """
import sys
from dagster import instance_for_test, materialize
from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.queues import Lake
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.test_function_assets import function_face
from tests.processing import graphs as matrix
root, kind, point = sys.argv[1:4]
defs = build_definitions(function_face(matrix.build_graph(kind)), lake=LakeResource(root=root),
                         spark=CuesSparkResource())
config = {"ops": {matrix.PID: {"config": {"inject_failure_at": point, "inject_failure_step": 1,
                                          "inject_failure_mode": "sigkill"}}}}
with instance_for_test() as instance:
    for _ in range(5):
        materialize(assets_of(defs, checks=False), resources=resources_of(defs), instance=instance,
                    run_config=config)
print("NOT KILLED")
"""


KILLS = [("fork", "between_commits"), ("map", "after_prepare"), ("sink", "after_snapshot")]


@pytest.mark.parametrize(("kind", "point"), KILLS if soak_enabled() else KILLS[:1])
def test_sigkill_of_the_run_process_keeps_exactly_once(spark, lake, instance, kind, point) -> None:
    """The run process SIGKILLs itself at the point (no ``finally``, Dagster never hears back)."""
    create_queues(function_face(matrix.build_graph(kind)), lake)
    matrix.load_inputs(lake, kind)
    child = subprocess.run([sys.executable, "-c", CHILD, lake.root, kind, point], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stdout + child.stderr
    defs = build_definitions(function_face(matrix.build_graph(kind)), lake=LakeResource(root=lake.root),
                             spark=CuesSparkResource())
    materialize_until_idle(defs, instance)
    matrix.check_exact(lake, kind, "output")
    assert not audit(lake).violations


# -- errors: whose they are -------------------------------------------------------------------------
def test_user_error_goes_to_the_error_queue_and_platform_error_fails_the_op(spark, lake, instance,
                                                                            tmp_path: Path) -> None:
    graph = function_face(matrix.build_graph("map", "error"))
    create_queues(graph, lake)
    matrix.load_inputs(lake, "map")
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    materialize_until_idle(defs, instance)
    matrix.check_exact(lake, "map", "error")  # step 1's Boom: an error row per row (isolated), the op succeeded
    # a platform failure: an input file gone. Nothing is delivered and no error row is written.
    lake.queue("a").append(matrix.rows(1000, 5), partition="0")
    part = [f for f in Path(lake.local_path(lake.queue("a").uri)).rglob("*.parquet")]
    newest = max(part, key=lambda f: f.stat().st_mtime_ns)
    newest.rename(tmp_path / "moved.parquet")
    errors_before = lake.queue("errors").count()
    [failed] = materialize_until_idle(defs, instance)
    assert not failed.success
    assert "PlatformStepError" in failure_classes(failed)
    assert lake.queue("errors").count() == errors_before
    (tmp_path / "moved.parquet").rename(newest)
    materialize_until_idle(defs, instance)
    assert sorted(matrix.ids_of(lake, "b"))[-5:] == [i * 2 for i in range(1000, 1005)]


def test_without_an_error_queue_a_user_error_fails_the_op_and_a_retry_policy_retries(
        spark, lake, instance, tmp_path: Path) -> None:
    """No error queue: the function's error stops the processor (UnhandledStepError), nothing
    delivered. An op retry in the same process opens a new step (the IO manager keys its open
    steps by attempt), so an injected failure once, then the retry, delivers every row once."""
    from dagster import RetryPolicy

    graph = function_face(matrix.build_graph("map", "error", error_queue=False))
    create_queues(graph, lake)
    matrix.load_inputs(lake, "map")
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    runs = materialize_until_idle(defs, instance)
    assert "UnhandledStepError" in failure_classes(runs[-1])
    assert matrix.ids_of(lake, "b") == [i * 2 for i in range(10)]  # step 0 only

    graph = function_face(matrix.build_graph("map"))
    other = Lake(root=str(tmp_path / "retried"))
    create_queues(graph, other)
    matrix.load_inputs(other, "map")
    defs = build_definitions(graph, lake=LakeResource(root=other.root), spark=CuesSparkResource(),
                             retry_policy=RetryPolicy(max_retries=1))
    once = tmp_path / "fired"
    config = {"ops": {matrix.PID: {"config": {"inject_failure_at": "after_prepare",
                                              "inject_failure_once_file": str(once)}}}}
    result = materialize(assets_of(defs, checks=False), resources=resources_of(defs),
                         instance=instance, run_config=config)
    assert result.success and once.exists()
    assert [e.step_key for e in result.all_events
            if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY] == [matrix.PID]
    materialize_until_idle(defs, instance)
    matrix.check_exact(other, "map", "output")


def test_a_plain_downstream_asset_reads_the_whole_queue(spark, lake, instance) -> None:
    from dagster import AssetIn, asset

    graph = function_face(matrix.build_graph("map"))
    create_queues(graph, lake)
    matrix.load_inputs(lake, "map")
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    materialize_until_idle(defs, instance)

    @asset(ins={"b": AssetIn(key="b")})
    def report(b: pa.Table) -> None:
        assert sorted(b["id"].to_pylist()) == [i * 2 for i in range(30)]

    result = materialize([*assets_of(defs, checks=False), report], resources=resources_of(defs),
                         instance=instance, selection=["report"])
    assert result.success


# -- bad declarations -----------------------------------------------------------------------------
def test_declarations_infer_the_kind_and_refuse_what_cannot_work() -> None:
    def fn(ctx, src):
        return src

    assert processor_asset(inputs={"src": "a"}, outputs="b")(fn).kind is Kind.MAP
    assert processor_asset(inputs={"x": "a", "y": "c"}, outputs="b")(fn).kind is Kind.JOIN
    assert processor_asset(inputs={"src": "a"}, outputs={"l": "b", "r": "d"})(fn).kind is Kind.FORK
    assert processor_asset(inputs={"src": "a"}, outputs=None)(fn).kind is Kind.SINK
    with pytest.raises(GraphError, match="must be a Python identifier"):
        processor_asset(inputs={"my-input": "a"}, outputs="b")(fn)
    with pytest.raises(GraphError, match="not one of"):
        processor_asset(inputs={"context": "a"}, outputs="b")(fn)
    with pytest.raises(GraphError, match="not a source"):
        processor_asset(inputs={"src": "a"}, outputs="b", kind=Kind.SOURCE)(fn)
    with pytest.raises(GraphError, match="at least one input"):
        processor_asset(inputs={}, outputs="b")(fn)


def test_a_function_asset_reading_arrow_materializes_without_starting_spark(lake, instance) -> None:
    """The step IO manager of a lane whose input is read as Arrow asks for no Spark session: its
    resource points at a master nobody listens on (creating the session would fail in one line)
    and every step still delivers exactly once."""
    import socket

    from cues_platform.processing import ReadAs
    from tests.processing.test_read_as import arrow_map

    with socket.socket() as probe:  # a port nobody listens on (bound, never listened)
        probe.bind(("127.0.0.1", 0))
        graph = function_face(matrix.build_graph("map", fn=arrow_map("output"), read_as=ReadAs.ARROW))
        create_queues(graph, lake)
        matrix.load_inputs(lake, "map")
        master = f"spark://127.0.0.1:{probe.getsockname()[1]}"
        defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource(master=master))
        results = materialize_until_idle(defs, instance)
    assert all(r.success for r in results), failure_classes(results[-1])
    matrix.check_exact(lake, "map", "output")
