"""A graph becomes Dagster definitions: assets, lineage, external queues, checks, sensors, schedule."""

from __future__ import annotations

import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInvalidDefinitionError, EnvVar, materialize

from cues_platform.dagster import LakeResource, build_definitions, build_processor_asset
from cues_platform.dagster.resources import CuesSparkResource
from cues_platform.errors import ConfigurationError
from tests.dagster.graphs import build_graph


def test_definitions_load_with_assets_lineage_checks_sensors_schedule() -> None:
    graph = build_graph()
    defs = build_definitions(graph, group_name="shop")
    repo = defs.get_repository_def()
    ag = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in ag.get_all_asset_keys()}
    assert keys == {"orders", "enriched", "big", "small", "archive", "errors"}
    # external input queue: a source asset; processor outputs are materializable
    assert ag.get(AssetKey("orders")).is_external
    # the error queue: not materializable, an edge from every processor that writes it
    errors = ag.get(AssetKey("errors"))
    assert errors.is_external and errors.tags["cues/role"] == "error_queue"
    assert {p.to_user_string() for p in errors.parent_keys} == {"enriched", "big", "small", "archive"}
    assert all(ag.get(AssetKey(k)).is_materializable for k in ("enriched", "big", "small", "archive"))
    # lineage from the topology
    parents = {k: {p.to_user_string() for p in ag.get(AssetKey(k)).parent_keys}
               for k in ("enriched", "big", "small", "archive")}
    assert parents == {"enriched": {"orders"}, "big": {"enriched"}, "small": {"enriched"},
                       "archive": {"small"}}
    # the fork is ONE multi-asset with two outputs; the sink one asset named after the processor
    split = defs.resolve_assets_def(AssetKey("big"))
    assert set(split.keys) == {AssetKey("big"), AssetKey("small")}
    assert split.op.name == "split"
    assert split.op.pool == "cues__shop__split"  # one concurrency pool per processor
    node = ag.get(AssetKey("enriched"))
    assert node.group_name == "shop"
    assert node.kinds == {"spark", "delta", "enrich"}  # the processor's name shows on the graph node
    assert ag.get(AssetKey("big")).kinds == {"spark", "delta", "split"}
    assert node.tags["cues/kind"] == "map" and node.tags["cues/strategy"] == "exactly_once"
    assert "Doubles every order id" in (node.description or "")
    assert ag.get(AssetKey("archive")).tags["cues/kind"] == "sink"
    # checks: blocking contract on the queue with a contract, exactly-once on every output
    checks = set(ag.asset_check_keys)
    assert AssetCheckKey(AssetKey("enriched"), "contract") in checks
    for k in ("enriched", "big", "small", "archive"):
        assert AssetCheckKey(AssetKey(k), "exactly_once") in checks
    platform = AssetCheckKey(AssetKey("errors"), "no_platform_errors")
    assert platform in checks and not ag.get_check_spec(platform).blocking  # nothing to block
    outside = {c for c in checks if c.name == "outside_protocol"}  # a warning: the pipeline goes on
    assert {c.asset_key for c in outside} == {AssetKey(k) for k in ("enriched", "big", "small")}
    assert not any(ag.get_check_spec(c).blocking for c in outside)
    fresh = {c for c in checks if c.name == "freshness"}  # reported by the sensors, never blocking
    assert {c.asset_key for c in fresh} == {AssetKey(k) for k in ("enriched", "big", "small", "archive")}
    assert not any(ag.get_check_spec(c).blocking for c in fresh)
    assert all(ag.get_check_spec(c).blocking for c in checks - {platform} - outside - fresh)
    # sensors, job, schedule, resources
    assert {s.name for s in repo.sensor_defs} == {
        "shop__enrich__new_data", "shop__split__new_data", "shop__archive__sink", "shop__recovery"}
    assert [s.name for s in repo.schedule_defs] == ["shop__schedule"]
    assert repo.get_schedule_def("shop__schedule").cron_schedule == "*/15 * * * *"
    job = defs.resolve_job_def("shop__all")
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} >= {
        "enriched", "big", "small", "archive"}
    resources = set(repo.get_top_level_resources())
    # runner-face processors only: they reach their backing queues through ``backing`` (both faces
    # do); only the step IO manager, which function assets alone use, is not listed
    assert {"lake", "spark", "cues_io_manager", "backing"} <= resources and "cues_step_io" not in resources


def test_no_schedule_and_key_prefix() -> None:
    defs = build_definitions(build_graph(), schedule_cron=None, key_prefix=["cues"])
    repo = defs.get_repository_def()
    assert not repo.schedule_defs
    assert AssetKey(["cues", "enriched"]) in defs.resolve_asset_graph().get_all_asset_keys()


def test_lake_resource_from_env_var_and_secret_options(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CUES_TEST_LAKE", str(tmp_path / "lake"))
    resource = LakeResource(root=EnvVar("CUES_TEST_LAKE")).process_config_and_initialize()
    assert resource.lake().root.rstrip("/").endswith("lake")
    secret = LakeResource(root=str(tmp_path), secret_options_env={"AWS_SECRET_ACCESS_KEY": "NO_SUCH_VAR"})
    with pytest.raises(ConfigurationError) as info:
        secret.lake()
    assert info.value.env == "NO_SUCH_VAR" and "NO_SUCH_VAR" in str(info.value)
    monkeypatch.setenv("NO_SUCH_VAR", "s3cr3t")
    assert secret.lake().options == {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}


def test_producers_draw_lineage_into_external_queues_and_nothing_else() -> None:
    graph = build_graph()
    defs = build_definitions(graph, producers={"orders": [AssetKey("shop_frontend")]})
    assert defs.resolve_asset_graph().get(AssetKey("orders")).parent_keys == {AssetKey("shop_frontend")}
    from cues_platform.processing.errors import GraphError

    with pytest.raises(GraphError, match=r"producers given for \['enriched'\], which are not external"):
        build_definitions(graph, producers={"enriched": [AssetKey("x")]})


def test_a_runner_face_processor_asset_needs_the_backing_resource(tmp_path) -> None:
    """The ``backing`` resource is the one way a step reaches its backing queue, in the runner face
    too: materializing a runner-face processor asset without it is refused before any step."""
    graph = build_graph()
    asset = build_processor_asset(graph, graph.as_declared("enrich"))
    with pytest.raises(DagsterInvalidDefinitionError, match="backing"):
        materialize([asset], resources={"lake": LakeResource(root=str(tmp_path / "lake")),
                                        "spark": CuesSparkResource()})
    assert not (tmp_path / "lake" / "_cues" / "backing").exists()
