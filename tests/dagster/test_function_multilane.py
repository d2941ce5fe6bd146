"""A function asset over every partition of a queue: one step per lane with work, each lane
delivered through its own protocol.

``@processor_asset(inputs={"o": "orders"})`` over a queue of three partitions is three lanes
(``enrich``, ``enrich.eu``, ``enrich.us``; processing/lanes.py), each with its own backing queue,
positions and app transactions. One materialization opens a phased step for each lane with work
(an idle lane is not started: no fence, no backing queue, no commit), calls the function once per
such lane and delivers each lane's step in turn. A platform failure in one lane leaves the lanes
delivered before (and after) it delivered; the op fails, and the next materialization recovers
that lane only. Real Delta tables, the session's Spark, Dagster's ``materialize``; the auditor
judges exactly-once.

The asset is built with ``build_processor_asset`` and the resources of ``build_definitions``
(``lake``, ``spark``, ``backing``, ``cues_step_io``).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from dagster import RetryPolicy, materialize
from deltalake import DeltaTable
from pyspark.sql import functions as F

from cues_platform.audit import audit
from cues_platform.dagster import CuesSparkResource, LakeResource
from cues_platform.dagster.assets import build_processor_asset, external_spec
from cues_platform.dagster.io_manager import CuesIOManager
from cues_platform.dagster.resources import BackingQueueResource
from cues_platform.dagster.step_io import STEP_IO_KEY, CuesStepIOManager
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    GraphError,
    Kind,
    Options,
    QueueDef,
    processor_asset,
)
from cues_platform.processing.idle import lane_work
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from cues_platform.queues.layout import PROCESSOR_EPOCH, PROCESSOR_STEP
from tests.dagster.test_function_assets import failure_classes
from tests.support import PAYLOAD, rows

PARTS = ("0", "eu", "us")
LANES = {"0": "enrich", "eu": "enrich.eu", "us": "enrich.us"}
CALLS: list[tuple[str, int]] = []  # (lane, step) of each call of the function


@processor_asset(inputs={"o": "orders"}, outputs="enriched", error_queue="errors",
                 options=Options(batch_size=1_000))
def enrich(ctx, o):
    """Doubles each id."""
    CALLS.append((ctx.processor_id, ctx.step))
    return o.select((F.col("id") * 2).alias("id"), F.col("note"))


def lanes_graph() -> Graph:
    return Graph.build(name="multilane", processors=[enrich], error_queue="errors",
                       queues=[QueueDef("orders", PAYLOAD, PARTS), QueueDef("enriched", PAYLOAD, PARTS),
                               QueueDef("errors", ERROR_SCHEMA)])


def assets_and_resources(graph: Graph, lake: Lake, *, pid: str = "enrich",
                         retry_policy: RetryPolicy | None = None) -> tuple[list[Any], dict[str, Any]]:
    """The multi-lane function asset ``pid``, its input as an external queue, and the resources
    ``build_definitions`` gives a graph with function assets."""
    res = LakeResource(root=lake.root)
    spark = CuesSparkResource()
    backing = BackingQueueResource(lake=res)
    assets = [external_spec(graph, "orders", prefix=(), group_name=None),
              build_processor_asset(graph, graph.as_declared(pid), retry_policy=retry_policy)]
    return assets, {"lake": res, "spark": spark, "backing": backing,
                    "cues_io_manager": CuesIOManager(lake=res, spark=spark),
                    STEP_IO_KEY: CuesStepIOManager(lake=res, spark=spark, backing=backing)}


def ids(lake: Lake, partition: str) -> list[int]:
    return sorted(lake.queue("enriched").read_arrow(partition=partition)["id"].to_pylist())


def txn(lake: Lake, queue: str, app: str) -> int | None:
    return lake.queue(queue).txn_version(app)


def backing_version(lake: Lake, lane: str) -> int | None:
    uri = lake.system_uri("backing", lane)
    if not DeltaTable.is_deltatable(uri, storage_options=lake.options):
        return None
    return DeltaTable(uri, storage_options=lake.options).version()


def commits_since(lake: Lake, queue: str, version: int) -> list[dict[str, Any]]:
    """The commit infos of ``queue`` after ``version`` (delta-rs history, newest first)."""
    dt = DeltaTable(lake.queue(queue).uri, storage_options=lake.options)
    return [c for c in dt.history() if c["version"] > version]


def lane_state(lake: Lake, lane: str) -> tuple[Any, ...]:
    """Everything a start of ``lane`` would commit to: its step, its epoch, its backing queue."""
    return (txn(lake, "enriched", PROCESSOR_STEP.id(lane)), txn(lake, "enriched", PROCESSOR_EPOCH.id(lane)),
            backing_version(lake, lane))


def meta_of(result: Any) -> dict[str, Any]:
    (mat,) = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]
    return {k: v.value for k, v in mat.metadata.items()}


@pytest.fixture
def setup(spark, lake) -> tuple[Graph, list[Any], dict[str, Any]]:
    graph = lanes_graph()
    create_queues(graph, lake)
    CALLS.clear()
    return graph, *assets_and_resources(graph, lake)


def test_one_materialization_delivers_each_lane_with_work_once_and_commits_nothing_for_an_idle_one(
        setup, lake, instance) -> None:
    graph, assets, res = setup
    orders = lake.queue("orders")
    for i, part in enumerate(PARTS):  # every lane steps once, so each has a backing queue and a home
        orders.append(rows(1000 * i, 3), partition=part)
    assert materialize(assets, resources=res, instance=instance).success
    assert sorted(CALLS) == [("enrich", 0), ("enrich.eu", 0), ("enrich.us", 0)]
    CALLS.clear()

    orders.append(rows(10, 4), partition="0")
    orders.append(rows(1010, 5), partition="eu")  # us: nothing new
    idle_before = lane_state(lake, "enrich.us")
    home_version = lake.queue("enriched").version()
    result = materialize(assets, resources=res, instance=instance)
    assert result.success
    assert CALLS == [("enrich", 1), ("enrich.eu", 1)]  # once per lane with work, in lane order
    # both lanes delivered, each input row once
    assert ids(lake, "0") == sorted(2 * i for i in [*range(3), *range(10, 14)])
    assert ids(lake, "eu") == sorted(2 * i for i in [*range(1000, 1003), *range(1010, 1015)])
    assert ids(lake, "us") == [2 * i for i in range(2000, 2003)]
    # the idle lane: no fence, no step, no backing record; no commit of the home names it
    assert lane_state(lake, "enrich.us") == idle_before
    assert not [c for c in commits_since(lake, "enriched", home_version) if "enrich.us" in json.dumps(c)]
    assert txn(lake, "enriched", PROCESSOR_STEP.id("enrich")) == 1
    assert txn(lake, "enriched", PROCESSOR_STEP.id("enrich.eu")) == 1
    meta = meta_of(result)
    assert meta["cues/steps"] == 2 and meta["cues/rows_in"] == 4 + 5 and meta["cues/lag_total"] == 0
    parts = meta["cues/partitions"]
    assert {p: (v["processor"], v["steps"]) for p, v in parts.items()} == {
        "0": ("enrich", 1), "eu": ("enrich.eu", 1), "us": ("enrich.us", 0)}
    assert meta["cues/stopped"] == "no new input, one step"
    report = audit(lake, graph=graph)
    assert report.ok, report.to_text()

    # a drained lake: a materialization calls nothing and commits nothing anywhere
    versions = {q: lake.queue(q).version() for q in ("enriched", "errors")}
    states = {lane: lane_state(lake, lane) for lane in LANES.values()}
    CALLS.clear()
    assert materialize(assets, resources=res, instance=instance).success
    assert CALLS == []
    assert {q: lake.queue(q).version() for q in versions} == versions
    assert {lane: lane_state(lake, lane) for lane in LANES.values()} == states


@pytest.mark.parametrize("point", ["after_prepare", "after_commit"])
def test_a_failure_in_the_second_lane_leaves_the_others_delivered_and_the_rerun_recovers_it_alone(
        setup, lake, instance, point) -> None:
    """Lane ``eu`` is one step ahead (its step 1 while the others' is 0), so
    ``inject_failure_step: 1`` fires in that lane only, after lane ``0`` delivered and before
    lane ``us`` had its turn."""
    graph, assets, res = setup
    orders = lake.queue("orders")
    orders.append(rows(1000, 2), partition="eu")
    assert materialize(assets, resources=res, instance=instance).success  # eu: step 0
    for i, part in enumerate(PARTS):
        orders.append(rows(1000 * i + 100, 3 + i), partition=part)
    config = {"ops": {"enrich": {"config": {"inject_failure_at": point, "inject_failure_step": 1}}}}
    failed = materialize(assets, resources=res, instance=instance, run_config=config, raise_on_error=False)
    assert not failed.success
    assert "InjectedFailure" in failure_classes(failed)
    # lanes 0 and us delivered in the failed run (their commits are their own), eu did not finish
    assert txn(lake, "enriched", PROCESSOR_STEP.id("enrich")) == 0
    assert txn(lake, "enriched", PROCESSOR_STEP.id("enrich.us")) == 0
    assert not lane_work(lake, graph.processors["enrich"]).has_work
    assert not lane_work(lake, graph.processors["enrich.us"]).has_work
    # after_prepare: eu's rows unread, nothing of its step 1 committed; after_commit: delivered
    assert txn(lake, "enriched", PROCESSOR_STEP.id("enrich.eu")) == (0 if point == "after_prepare" else 1)
    assert lane_work(lake, graph.processors["enrich.eu"]).has_work is (point == "after_prepare")

    delivered = {lane: lane_state(lake, lane) for lane in ("enrich", "enrich.us")}
    CALLS.clear()
    again = materialize(assets, resources=res, instance=instance)  # a new run: no fault configured
    assert again.success
    # only lane eu was started; the delivered lanes were idle: nothing committed for them
    assert {lane: lane_state(lake, lane) for lane in delivered} == delivered
    assert ([("enrich.eu", 1)] if point == "after_prepare" else []) == CALLS
    assert txn(lake, "enriched", PROCESSOR_STEP.id("enrich.eu")) == 1
    # every input row exactly once
    assert ids(lake, "0") == [2 * i for i in range(100, 103)]
    assert ids(lake, "eu") == sorted(2 * i for i in [1000, 1001, *range(1100, 1104)])
    assert ids(lake, "us") == [2 * i for i in range(2100, 2105)]
    assert lake.queue("errors").count() == 0
    report = audit(lake, graph=graph)
    assert report.ok, report.to_text()


def test_an_op_retry_recovers_the_failed_lane_in_the_same_run(setup, lake, instance, tmp_path) -> None:
    """A retry policy re-runs the op: its load_input opens the lanes again, the delivered ones are
    idle, the failed one is recovered; the run succeeds, each row once."""
    graph, _, _ = setup
    assets, res = assets_and_resources(graph, lake, retry_policy=RetryPolicy(max_retries=1))
    orders = lake.queue("orders")
    orders.append(rows(1000, 2), partition="eu")
    assert materialize(assets, resources=res, instance=instance).success  # eu: step 0
    for i, part in enumerate(PARTS):
        orders.append(rows(1000 * i + 100, 3 + i), partition=part)
    CALLS.clear()
    config = {"ops": {"enrich": {"config": {"inject_failure_at": "after_prepare", "inject_failure_step": 1,
                                            "inject_failure_once_file": str(tmp_path / "fired")}}}}
    assert materialize(assets, resources=res, instance=instance, run_config=config).success
    assert (tmp_path / "fired").exists()
    # the first attempt calls the function in the three lanes; the retry in eu alone (with a fault
    # configured every lane is started, and lanes 0 and us find nothing unread: no step, no call)
    assert sorted(CALLS) == [("enrich", 0), ("enrich.eu", 1), ("enrich.eu", 1), ("enrich.us", 0)]
    assert ids(lake, "0") == [2 * i for i in range(100, 103)]
    assert ids(lake, "eu") == sorted(2 * i for i in [1000, 1001, *range(1100, 1104)])
    assert ids(lake, "us") == [2 * i for i in range(2100, 2105)]
    report = audit(lake, graph=graph)
    assert report.ok, report.to_text()


BIG = 1500


@processor_asset(inputs={"o": "orders"}, outputs={"big": "big", "small": "small"})
def split(ctx, o):
    """Routes ids >= 1500 to big, the rest to small (a fork over every partition)."""
    CALLS.append((ctx.processor_id, ctx.step))
    return {"big": o.where(F.col("id") >= BIG), "small": o.where(F.col("id") < BIG)}


def test_a_fork_lane_failing_between_its_commits_is_rolled_forward_alone(spark, lake, instance) -> None:
    """Each lane of a fork commits its outputs through its own attempt record: lane eu fails
    between its two commits (one output queue has its rows, the other not); lanes 0 and us are
    delivered whole; the next materialization rolls eu's attempt forward without calling the
    function again."""
    graph = Graph.build(name="multifork", processors=[split],
                        queues=[QueueDef("orders", PAYLOAD, PARTS), QueueDef("big", PAYLOAD, PARTS),
                                QueueDef("small", PAYLOAD, PARTS)])
    create_queues(graph, lake)
    CALLS.clear()
    assets, res = assets_and_resources(graph, lake, pid="split")
    orders = lake.queue("orders")
    orders.append(rows(1000, 2), partition="eu")
    assert materialize(assets, resources=res, instance=instance).success  # eu: step 0
    for i, part in enumerate(PARTS):
        orders.append(rows(1000 * i + 498, 4), partition=part)  # eu: 1498..1501, both outputs
    config = {"ops": {"split": {"config": {"inject_failure_at": "between_commits", "inject_failure_step": 1}}}}
    failed = materialize(assets, resources=res, instance=instance, run_config=config, raise_on_error=False)
    assert not failed.success and "InjectedFailure" in failure_classes(failed)
    committed = {q: txn(lake, q, PROCESSOR_STEP.id("split.eu")) for q in ("big", "small")}
    assert sorted(committed.values(), key=str) == [0, 1]  # one output of step 1 committed, one not
    CALLS.clear()
    assert materialize(assets, resources=res, instance=instance).success
    assert CALLS == []  # rolled forward from the attempt's prepared files: no re-computation
    for i, part in enumerate(PARTS):
        got = sorted(lake.queue("big").read_arrow(partition=part)["id"].to_pylist()
                     + lake.queue("small").read_arrow(partition=part)["id"].to_pylist())
        expected = sorted([*([1000, 1001] if part == "eu" else []), *range(1000 * i + 498, 1000 * i + 502)])
        assert got == expected, part
    report = audit(lake, graph=graph)
    assert report.ok, report.to_text()


def test_a_source_declared_with_processor_asset_steps_once_per_materialization(spark, lake, instance) -> None:
    ticks = pa.schema([pa.field("n", pa.int64(), nullable=False)])

    @processor_asset(inputs={}, outputs="ticks", kind=Kind.SOURCE)
    def tick(ctx):
        return pa.table({"n": [ctx.step]}, schema=ticks) if ctx.step < 2 else None

    graph = Graph.build(name="ticks", processors=[tick], queues=[QueueDef("ticks", ticks)])
    res_lake = LakeResource(root=lake.root)
    spark_res, backing = CuesSparkResource(), BackingQueueResource(lake=res_lake)
    res = {"lake": res_lake, "spark": spark_res, "backing": backing,
           STEP_IO_KEY: CuesStepIOManager(lake=res_lake, spark=spark_res, backing=backing)}
    asset = build_processor_asset(graph, graph.as_declared("tick"))
    for _ in range(3):
        assert materialize([asset], resources=res, instance=instance).success
    assert sorted(lake.queue("ticks").read_arrow(partition="0")["n"].to_pylist()) == [0, 1]
    with pytest.raises(GraphError, match="not a source"):
        processor_asset(inputs={"x": "a"}, outputs="b", kind=Kind.SOURCE)(lambda ctx, x: x)
    with pytest.raises(GraphError, match="at least one output"):
        processor_asset(inputs={}, outputs=None, kind=Kind.SOURCE)(lambda ctx: None)
