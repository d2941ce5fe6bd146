"""The whole graph materializes in-process, audits clean, and reports its metadata."""

from __future__ import annotations

from dagster import AssetKey, materialize

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
    assert all(evals.values()) and len(evals) == 8
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
