"""Sensors evaluated with ``build_sensor_context`` on a real instance and a real lake.

New-data and sink sensors: keyed on the lag (the input queues' next offsets and the processor's
positions, read from the Delta logs), run key = the processor, those offsets and its progress (the
same input and progress always give the same key, so Dagster never launches a duplicate).
Recovery sensor: one recovery run per failed run of the graph's assets, cursor = the storage id of
the last RUN_FAILURE event handled, so no failure is ever missed or handled twice.
"""

from __future__ import annotations

import json

import pytest
from dagster import AssetKey, asset, build_sensor_context, instance_for_test, materialize

from cues_platform.dagster import (
    RECOVERY_ATTEMPT_TAG,
    RECOVERY_OF_TAG,
    LakeResource,
)
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import load_orders, rows


def _tick(defs, name: str, instance, lake_resource: LakeResource, cursor: str | None):
    sensor = defs.get_repository_def().get_sensor_def(name)
    # a `with`: its exit releases the instance it entered (tests/dagster/test_automation.py)
    with build_sensor_context(instance=instance, cursor=cursor, resources={"lake": lake_resource}) as context:
        return sensor.evaluate_tick(context)


# -- new data / sinks -----------------------------------------------------------------------------
def test_new_data_sensor_keys_on_the_lag_with_deterministic_run_keys(defs, lake, lake_resource, instance) -> None:
    name = "shop__enrich__new_data"
    empty = _tick(defs, name, instance, lake_resource, None)
    assert not empty.run_requests and "empty" in empty.skip_message
    assert json.loads(empty.cursor) == {"ends": {"orders/0": 0}, "read": 0}  # no queue yet
    load_orders(lake)  # creates the queues, then appends 30 orders
    first = _tick(defs, name, instance, lake_resource, empty.cursor)
    (request,) = first.run_requests
    assert request.run_key == "enrich@orders/0.o30+read.0"
    assert request.asset_selection == [AssetKey("enriched")]
    assert request.tags["cues/trigger"] == "new_data" and request.tags["cues/lag_total"] == "30"
    assert json.loads(first.cursor) == {"ends": {"orders/0": 30}, "read": 0}
    # a tick repeated (its cursor lost or not) asks for the SAME run key: Dagster launches it once
    again = _tick(defs, name, instance, lake_resource, empty.cursor)
    assert [r.run_key for r in again.run_requests] == [request.run_key]
    # new rows: a new run key
    lake.queue("orders").append(rows(30, 5), partition="0")
    newer = _tick(defs, name, instance, lake_resource, first.cursor)
    assert [r.run_key for r in newer.run_requests] == ["enrich@orders/0.o35+read.0"]


def test_sink_sensor_requests_the_sink_asset(defs, lake, lake_resource, instance) -> None:
    load_orders(lake)
    lake.queue("small").append(rows(0, 3), partition="0")
    tick = _tick(defs, "shop__archive__sink", instance, lake_resource, None)
    (request,) = tick.run_requests
    assert request.asset_selection == [AssetKey("archive")]
    assert request.run_key == "archive@small/0.o3+read.0"


# -- recovery ---------------------------------------------------------------------------------------
@asset
def unrelated() -> None:
    raise RuntimeError("a failure outside the graph")


def _fail(defs, instance, keys: list[str], op: str, *, tags: dict | None = None) -> str:
    cfg = {"ops": {op: {"config": {"inject_failure_at": "before_snapshot"}}}}
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         selection=[AssetKey(k) for k in keys], run_config=cfg, tags=tags, raise_on_error=False)
    assert not result.success
    return result.run_id


@pytest.fixture
def recovery(defs, lake_resource, instance):
    def tick(cursor: str | None):
        return _tick(defs, "shop__recovery", instance, lake_resource, cursor)

    return tick


def test_recovery_sensor_one_run_per_failure(defs, instance, recovery) -> None:
    idle = recovery(None)
    assert not idle.run_requests and idle.cursor is None
    failed = _fail(defs, instance, ["enriched"], "enrich")
    first = recovery(None)
    (request,) = first.run_requests
    assert request.run_key == f"recovery:{failed}"
    assert request.asset_selection == [AssetKey("enriched")]
    assert request.tags[RECOVERY_OF_TAG] == failed and request.tags[RECOVERY_ATTEMPT_TAG] == "1"
    # from the returned cursor: nothing new
    assert not recovery(first.cursor).run_requests
    # a failure outside the graph is passed over; a later failure of the graph: only that one
    assert not materialize([unrelated], instance=instance, raise_on_error=False).success
    later = _fail(defs, instance, ["big", "small"], "split")
    second = recovery(first.cursor)
    assert [r.run_key for r in second.run_requests] == [f"recovery:{later}"]
    assert second.run_requests[0].asset_selection == [AssetKey("big"), AssetKey("small")]
    assert not recovery(second.cursor).run_requests


def test_recovery_sensor_never_misses_a_run_created_earlier(defs, instance, recovery) -> None:
    """A run created before an already-handled failure but failing after it is still recovered
    (the cursor is over RUN_FAILURE events, not run ids)."""
    job = defs.resolve_job_def("shop__all")
    early = instance.create_run_for_job(job, asset_selection={AssetKey("enriched")})
    failed = _fail(defs, instance, ["enriched"], "enrich")
    first = recovery(None)
    assert [r.run_key for r in first.run_requests] == [f"recovery:{failed}"]
    instance.report_run_failed(instance.get_run_by_id(early.run_id))
    second = recovery(first.cursor)
    assert [r.run_key for r in second.run_requests] == [f"recovery:{early.run_id}"]


def test_recovery_attempts_are_counted_and_bounded(defs, instance, recovery) -> None:
    retry = _fail(defs, instance, ["enriched"], "enrich",
                  tags={RECOVERY_OF_TAG: "root-run", RECOVERY_ATTEMPT_TAG: "1"})
    (request,) = recovery(None).run_requests
    assert request.run_key == f"recovery:{retry}"
    assert request.tags[RECOVERY_OF_TAG] == "root-run" and request.tags[RECOVERY_ATTEMPT_TAG] == "2"
    cursor = recovery(None).cursor
    last = _fail(defs, instance, ["enriched"], "enrich",
                 tags={RECOVERY_OF_TAG: "root-run", RECOVERY_ATTEMPT_TAG: "3"})
    tick = recovery(cursor)
    assert not tick.run_requests and last in tick.skip_message
    assert not recovery(tick.cursor).run_requests and recovery(tick.cursor).skip_message


def test_recovery_targets_only_what_the_failed_run_did_not_materialize(defs, instance, recovery) -> None:
    """enrich succeeded, split failed and archive was skipped: the recovery run re-runs split's
    and archive's assets, not enrich's."""
    failed = _fail(defs, instance, ["enriched", "big", "small", "archive"], "split")
    (request,) = recovery(None).run_requests
    assert request.run_key == f"recovery:{failed}"
    assert request.asset_selection == [AssetKey("archive"), AssetKey("big"), AssetKey("small")]


def test_with_run_retries_on_the_recovery_sensor_requests_nothing(defs, lake_resource) -> None:
    """One recovery mechanism per instance: where Dagster's run retries are on, they re-execute the
    failed run from failure and the sensor stands by (its cursor moves, so nothing replays later)."""
    with instance_for_test(overrides={"run_retries": {"enabled": True, "max_retries": 3}}) as retrying:
        _fail(defs, retrying, ["enriched"], "enrich")
        tick = _tick(defs, "shop__recovery", retrying, lake_resource, None)
        assert not tick.run_requests and "run retries are on" in tick.skip_message
        assert json.loads(tick.cursor)["after_storage_id"] is not None
