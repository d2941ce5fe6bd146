"""The whole graph materializes in-process, audits clean, and reports its metadata."""

from __future__ import annotations

from dagster import AssetKey, DagsterEventType, materialize

from cues_platform.audit import audit
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import check_exact, load_orders


def _materializations(result) -> dict[str, dict]:
    out = {}
    for ev in result.get_asset_materialization_events():
        mat = ev.event_specific_data.materialization
        out[mat.asset_key.to_user_string()] = {k: v.value for k, v in mat.metadata.items()}
    return out


def test_whole_graph_materializes_and_audits_clean(defs, lake, instance) -> None:
    load_orders(lake)
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    assert result.success
    check_exact(lake)
    meta = _materializations(result)
    assert set(meta) == {"enriched", "big", "small", "archive"}
    enriched = meta["enriched"]
    assert enriched["cues/steps"] == 3 and enriched["cues/stopped"] == "drained"
    assert enriched["cues/rows_in"] == 30 and enriched["cues/rows_out"] == 30
    assert enriched["cues/rows_to_errors"] == 0 and enriched["cues/recovered_attempts"] == 0
    assert enriched["cues/input_ranges"] == {"orders/0": "[0, 30)"}
    assert enriched["cues/lag"] == {"orders/0": 0}
    assert len(enriched["cues/first_delivery_hash"]) == 32
    assert enriched["cues/first_delivery_hash"] != enriched["cues/last_delivery_hash"]
    assert enriched["cues/queue_rows"] == 30 and enriched["dagster/row_count"] == 30
    assert enriched["cues/delta_version"] == lake.queue("enriched").version()
    assert meta["big"]["cues/rows_out_to_queue"] == 15 and meta["small"]["cues/rows_out_to_queue"] == 15
    assert meta["archive"]["cues/steps"] == 2  # 15 small rows, batches of 10
    # checks ran and passed (blocking checks of every output)
    evals = {(e.asset_key.to_user_string(), e.check_name): e.passed
             for e in result.get_asset_check_evaluations()}
    assert evals[("enriched", "contract")] and evals[("enriched", "exactly_once")]
    assert evals[("enriched", "outside_protocol")] and evals[("big", "outside_protocol")]
    assert {(k, c) for (k, c) in evals if c == "freshness"} == {
        (k, "freshness") for k in ("enriched", "big", "small", "archive")}  # drained: fresh
    assert all(evals.values()) and len(evals) == 8 + 4
    assert enriched["cues/written_ranges"] == {"0": [0, 30]} == enriched["cues/arrived_ranges"]
    # a second run with no new data is a no-op: zero steps, same contents
    again = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                        selection=[AssetKey("enriched")])
    assert _materializations(again)["enriched"]["cues/steps"] == 0
    check_exact(lake)


def test_bounds_stop_early_and_the_next_run_goes_on(defs, lake, instance) -> None:
    load_orders(lake)
    cfg = {"ops": {"enrich": {"config": {"max_steps": 1}}}}
    first = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                        selection=[AssetKey("enriched")], run_config=cfg)
    m = _materializations(first)["enriched"]
    assert m["cues/steps"] == 1 and m["cues/stopped"] == "max_steps" and m["cues/lag_total"] == 20
    rows_cfg = {"ops": {"enrich": {"config": {"max_rows": 15}}}}
    second = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         selection=[AssetKey("enriched")], run_config=rows_cfg)
    m = _materializations(second)["enriched"]
    assert m["cues/steps"] == 2 and m["cues/stopped"] == "max_rows"
    assert m["cues/input_ranges"] == {"orders/0": "[10, 30)"} and m["cues/lag_total"] == 0
    secs = {"ops": {"enrich": {"config": {"max_seconds": 0.0}}}}
    third = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                        selection=[AssetKey("enriched")], run_config=secs)
    assert _materializations(third)["enriched"]["cues/stopped"] == "max_seconds"
    assert audit(lake).ok


def test_rows_to_errors_counts_contract_breaks_of_steps_that_also_had_output(defs, lake, instance) -> None:
    """Two orders whose doubled ids break ``enriched``'s contract (id >= 0) go to the error queue
    in a step that delivers its other rows: the metadata counts them (it counted only the rows of
    failed steps), and the rows out are the good ones."""
    load_orders(lake, start=-2, count=32)
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         selection=[AssetKey("enriched")])
    assert result.success
    enriched = _materializations(result)["enriched"]
    assert lake.queue("errors").count() == 2
    assert enriched["cues/rows_to_errors"] == 2
    assert enriched["cues/rows_out"] == 30 and enriched["cues/rows_in"] == 32
    assert enriched["cues/outcomes"] == {"output": 4, "error": 0, "nil": 0}
    # the error queue asset is observed with the lake's counts by processor and reason
    (obs,) = [e.event_specific_data.asset_observation for e in result.all_events
              if e.event_type_value == "ASSET_OBSERVATION"]
    meta = {k: v.value for k, v in obs.metadata.items()}
    assert obs.asset_key == AssetKey("errors") and meta["dagster/row_count"] == 2
    assert meta["cues/by_processor"] == {"enrich": {"cues_platform.ContractViolation": 2}}
    assert meta["cues/rows_from_this_run"] == 2


# -- failure headlines (issue 25, item 7) ------------------------------------------------------------
def _step_failure(result):
    [failure] = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    return failure.event_specific_data


def _causes(error) -> list[str]:
    names = []
    while error is not None:
        names.append(error.cls_name)
        error = error.cause
    return names


def test_a_failed_step_headline_is_its_cause_in_one_line(defs, lake, instance) -> None:
    """The runner face: a failure between the fork's commits fails the op with the cause's class
    and first line as Dagster's failure description (the UI's and the console's headline), not
    "Error occurred while executing op 'split'"; the cause stays chained under it, and the
    metadata carries the processor and the error's data."""
    load_orders(lake)
    config = {"ops": {"split": {"config": {"inject_failure_at": "between_commits",
                                           "inject_failure_step": 1}}}}
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         run_config=config, raise_on_error=False)
    assert not result.success
    data = _step_failure(result)
    description = data.user_failure_data.description
    assert description.startswith("InjectedFailure: injected failure at between_commits of step 1"), description
    assert "\n" not in description and "Error occurred while executing" not in description
    assert data.error.cls_name == "Failure" and "InjectedFailure" in _causes(data.error)
    assert "Error occurred while executing" not in data.error.message
    meta = {k: v.value for k, v in data.user_failure_data.metadata.items()}
    assert meta["cues/processor"] == "split" and meta["cues/retryable"] is True
    assert meta["cues/error"] == "cues_platform.dagster.materialize.InjectedFailure"
    assert meta["cues/error_data"] == {"point": "between_commits", "processor": "split", "step": 1}
    # a run after the failure (no injection) recovers and delivers every row exactly once
    again = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    assert again.success
    check_exact(lake)


def test_the_function_face_headline_is_its_cause_in_one_line(spark, lake, instance) -> None:
    """The step IO manager (``@processor_asset``): a failure in ``handle_output`` (between a
    fork's commits) gives the same one-line headline, not Dagster's "Error occurred while
    handling output"."""
    from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
    from cues_platform.processing.runner import create_queues
    from tests.dagster.test_function_assets import function_face, materialize_until_idle
    from tests.processing import graphs as matrix

    graph = function_face(matrix.build_graph("fork", "output"))
    create_queues(graph, lake)
    matrix.load_inputs(lake, "fork")
    fdefs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    config = {"ops": {matrix.PID: {"config": {"inject_failure_at": "between_commits",
                                              "inject_failure_step": 1}}}}
    failed = materialize_until_idle(fdefs, instance, run_config=config)[-1]
    assert not failed.success
    data = _step_failure(failed)
    description = data.user_failure_data.description
    assert description.startswith("InjectedFailure: injected failure at between_commits of step 1"), description
    assert data.error.cls_name == "Failure" and "InjectedFailure" in _causes(data.error)
    materialize_until_idle(fdefs, instance)
    matrix.check_exact(lake, "fork", "output")


def test_a_processor_reading_arrow_materializes_without_starting_spark(lake, instance) -> None:
    """Its Spark resource points at a master nobody listens on: creating the session would fail
    in one line (SparkMasterUnreachableError). A processor whose input is read as Arrow never
    asks for the session, as under ``cues run``: it materializes, exactly once, and its function
    sees ``ctx.spark`` None."""
    import socket

    from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
    from cues_platform.processing import ReadAs
    from cues_platform.processing.runner import create_queues
    from tests.processing import graphs
    from tests.processing.test_read_as import arrow_map

    with socket.socket() as probe:  # a port nobody listens on (bound, never listened)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        seen: list[object] = []
        inner = arrow_map("output")

        def fn(ctx, src):  # noqa: ANN001, ANN202
            seen.append(ctx.spark)
            return inner(ctx, src)

        graph = graphs.build_graph("map", fn=fn, read_as=ReadAs.ARROW)
        create_queues(graph, lake)
        graphs.load_inputs(lake, "map")
        defs = build_definitions(graph, lake=LakeResource(root=lake.root),
                                 spark=CuesSparkResource(master=f"spark://127.0.0.1:{port}"))
        result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    assert result.success
    assert seen and all(s is None for s in seen)
    graphs.check_exact(lake, "map", "output")
