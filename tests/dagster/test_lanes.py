"""A processor over every partition is still one Dagster asset: its materialization steps every
lane, its metadata shows lag and last step per partition, and its checks cover every lane."""

from __future__ import annotations

from dagster import materialize
from deltalake import DeltaTable
from pyspark.sql import functions as F

from cues_platform.audit import audit
from cues_platform.dagster import CuesSparkResource, build_definitions, processor_asset
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
)
from cues_platform.processing.runner import create_queues
from tests.dagster.conftest import assets_of, resources_of
from tests.support import PAYLOAD, rows

PARTS = ("0", "eu", "us")


def double(ctx, o):
    return o.select((F.col("id") * 2).alias("id"), F.col("note"))


def lanes_graph() -> Graph:
    return Graph.build(
        name="lanes",
        queues=[QueueDef("orders", PAYLOAD, PARTS), QueueDef("enriched", PAYLOAD, PARTS),
                QueueDef("errors", ERROR_SCHEMA)],
        processors=[Processor("enrich", Kind.MAP, double, {"o": In("orders")}, {"out": Out("enriched")},
                              options=Options(batch_size=4))],
        error_queue="errors")


def test_one_asset_steps_every_lane_and_reports_each_partition(lake, lake_resource, instance) -> None:
    defs = build_definitions(lanes_graph(), lake=lake_resource, spark=CuesSparkResource())
    assert [a.op.name for a in defs.assets if hasattr(a, "op")] == ["enrich"]  # one asset, not three
    create_queues(lanes_graph(), lake)
    orders = lake.queue("orders")
    for i, part in enumerate(PARTS):
        orders.append(rows(100 * i, 6 + i), partition=part)
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    assert result.success
    (mat,) = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["cues/rows_in"] == 6 + 7 + 8 and meta["cues/steps"] == 2 + 2 + 2
    assert meta["cues/lag"] == {"orders/0": 0, "orders/eu": 0, "orders/us": 0}
    parts = meta["cues/partitions"]
    assert sorted(parts) == sorted(PARTS)
    assert parts["eu"]["processor"] == "enrich.eu" and parts["eu"]["last_step"] == 1
    assert all(p["lag"] == 0 and len(p["last_delivery_hash"]) == 32 for p in parts.values())
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["exactly_once"].passed
    lanes = checks["exactly_once"].metadata["lanes"].value
    assert sorted(lanes) == ["enrich", "enrich.eu", "enrich.us"]
    assert audit(lake, graph=lanes_graph()).ok


def test_a_function_asset_over_every_partition_steps_each_lane_with_work(lake, lake_resource, instance) -> None:
    """The function face over several lanes (tests/dagster/test_function_multilane.py has the
    crash cases): one materialization, one step of each lane with new rows, idle lanes untouched."""
    @processor_asset(inputs={"o": "orders"}, outputs="enriched")
    def enrich(ctx, o):
        return double(ctx, o)

    graph = Graph.build(name="lanes", queues=[QueueDef("orders", PAYLOAD, PARTS),
                                              QueueDef("enriched", PAYLOAD, PARTS)],
                        processors=[enrich])
    defs = build_definitions(graph, lake=lake_resource, spark=CuesSparkResource())
    assert [a.op.name for a in defs.assets if hasattr(a, "op")] == ["enrich"]  # one asset, not three
    create_queues(graph, lake)
    lake.queue("orders").append(rows(0, 3), partition="0")
    lake.queue("orders").append(rows(100, 4), partition="us")
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    assert result.success
    (mat,) = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]
    parts = mat.metadata["cues/partitions"].value
    assert {p: v["steps"] for p, v in parts.items()} == {"0": 1, "eu": 0, "us": 1}
    assert lake.queue("enriched").count() == 7
    # the idle lane was not started: it has no backing queue (creating one is a commit)
    assert not DeltaTable.is_deltatable(lake.system_uri("backing", "enrich.eu"), storage_options=lake.options)
    assert audit(lake, graph=graph).ok
