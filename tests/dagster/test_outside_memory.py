"""``outside_protocol`` judges what arrived, with the same memory as ``contract``: every row
committed to an exactly-once output since it last judged (by a step, by recovery rolling an
attempt forward, by ``cues run`` outside Dagster, by a producer appending without a delivery
hash) is looked at once; a row without a hash keeps the check failed (WARN) across no-op runs and
re-executions until it is quarantined (``cues quarantine add``: the reason recorded in the error
queue). Real Delta tables, a Dagster instance in a folder (``DAGSTER_HOME``) and the real CLI."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from click.testing import CliRunner
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetSelection,
    DagsterEventType,
    ReexecutionOptions,
    execute_job,
    instance_for_test,
    materialize,
    reconstructable,
)

from cues_platform.cli import main
from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.dagster.check_memory import union
from cues_platform.dagster.check_quarantine import (
    OUTSIDE_PROTOCOL_EXCEPTION_TYPE,
    QUARANTINE_PROCESSOR,
    quarantine_runs,
)
from cues_platform.processing.retention import retain
from cues_platform.processing.runner import GraphRunner
from cues_platform.queues.retention import set_policy
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import build_graph, load_orders
from tests.dagster.jobs import all_job
from tests.support import rows

OUTSIDE = "outside_protocol"


def _outside(result, asset: str = "enriched") -> tuple[bool, AssetCheckSeverity, dict]:
    (ev,) = [e.event_specific_data for e in result.all_events
             if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
             and e.event_specific_data.check_name == OUTSIDE and e.event_specific_data.asset_key == AssetKey(asset)]
    return ev.passed, ev.severity, {k: v.value for k, v in ev.metadata.items()}


def _rogue(lake, ids: list[int]) -> None:
    """A producer appends straight into ``enriched``: no delivery hash."""
    lake.queue("enriched").append(pa.table({"id": pa.array(ids, pa.int64()),
                                            "note": [f"rogue {i}" for i in ids]}), partition="0")


def _judged_by_every_evaluation(instance, key: AssetCheckKey) -> dict:
    records = instance.event_log_storage.get_asset_check_execution_history(key, limit=1000)
    return union(*(r.event.dagster_event.event_specific_data.metadata["judged_ranges"].value
                   for r in records if r.event is not None
                   and r.event.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"))


def test_rows_appended_outside_the_protocol_stay_failed_across_no_op_runs_and_a_reexecution_until_quarantined(
        lake, spark, tmp_path: Path, monkeypatch) -> None:
    """After a green run, a producer appends two rows into ``enriched``. The next evaluation fails
    on them, a no-op materialization and a re-execution from failure (what the daemon's retry
    runs) stay failed on them, with the check's memory carried from one to the next; rows
    recovery rolled forward are hashed and judged, never held. ``cues quarantine add`` against
    the instance's folder closes them: green, and it stays green. Every committed row of every
    exactly-once output was judged by some evaluation."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("CUES_LAKE", lake.root)
    defs = build_definitions(build_graph(), lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    job = reconstructable(all_job)
    load_orders(lake)

    def noop():
        result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                             selection=[AssetKey("enriched")])
        assert result.success  # WARN: the pipeline goes on
        assert result.asset_materializations_for_node("enrich")[0].metadata["cues/steps"].value == 0
        return _outside(result)

    with instance_for_test(temp_dir=str(home)) as instance:
        first = execute_job(job, instance=instance)
        assert first.success
        passed, _, meta = _outside(first)
        assert passed and meta["cues/judged_to"] == {"0": 30} and meta["rows"] == 0

        _rogue(lake, [7, -4])  # offsets 30, 31; -4 breaks the contract
        passed, severity, red = noop()
        assert (passed, severity) == (False, AssetCheckSeverity.WARN)
        assert red["judged_ranges"] == {"0": [[30, 32]]} and red["offsets"] == {"0": [[30, 32]]}
        assert red["rows"] == 2 and red["rows_breaking_the_contract"] == 1 and "cues quarantine add" in red["what_to_do"]
        passed, _, again = noop()
        assert not passed and again["offsets"] == {"0": [[30, 32]]} and again["judged_ranges"] == {"0": [[30, 32]]}
        assert again["memory_from_run"] != red["memory_from_run"]  # the memory moved on, the rows stayed

        load_orders(lake, start=30, count=10)
        fault = {"ops": {"enrich": {"config": {"inject_failure_at": "after_prepare", "inject_failure_step": 3}}}}
        failed = execute_job(job, instance=instance, run_config=fault, raise_on_error=False)
        assert not failed.success
        options = ReexecutionOptions.from_failure(failed.run_id, instance)
        with execute_job(job, instance=instance, reexecution_options=options, run_config={}) as retry:
            assert retry.success and retry.dagster_run.parent_run_id == failed.run_id
            passed, _, meta = _outside(retry)
            assert not passed and meta["offsets"] == {"0": [[30, 32]]}
            assert meta["judged_ranges"] == {"0": [[30, 42]]}  # the open rows and enrich's step 3
            for asset in ("big", "small"):  # split read the rogue rows: its outputs are hashed
                assert _outside(retry, asset)[0], asset

        env = {"DAGSTER_HOME": str(home)}
        listed = CliRunner().invoke(main, ["quarantine", "list", "enriched", "--lake", lake.root], env=env)
        assert listed.exit_code == 0, listed.output
        assert "enriched: outside_protocol" in listed.output and "partition 0: [30, 32)" in listed.output
        assert '0/31 {"id": -4, "note": "rogue -4"}' in listed.output
        added = CliRunner().invoke(main, ["quarantine", "add", "enriched", "--check", OUTSIDE, "-p", "0",
                                          "--offsets", "30:32", "--reason", "a replay script's rows, checked",
                                          "--lake", lake.root], env=env)
        assert added.exit_code == 0, added.output
        errors = lake.queue("errors").read_arrow(partition="0")
        mine = errors.filter(pc.equal(errors["processor"], QUARANTINE_PROCESSOR))
        assert mine["exception_type"].to_pylist() == [OUTSIDE_PROTOCOL_EXCEPTION_TYPE] * 2

        passed, _, meta = noop()
        assert passed and meta["closed_by_quarantine_rows"] == 2 and meta["cues/open_failing"] == {}
        assert noop()[0]  # and it stays green
        assert lake.queue("enriched").read_arrow(partition="0").num_rows == 42  # the rows stay in the queue

        for q in ("enriched", "big", "small"):
            end = lake.queue(q).end_offsets()["0"]
            key = AssetCheckKey(AssetKey(q), OUTSIDE)
            assert end > 0 and _judged_by_every_evaluation(instance, key) == {"0": [[0, end]]}, q


def test_cues_run_and_producer_rows_are_judged_next_and_retention_never_turns_them_green(
        lake, spark, instance) -> None:
    """While Dagster is idle, ``cues run`` (a GraphRunner) delivers rows and a producer appends one
    without a hash: the next evaluation judges exactly what arrived and holds the producer's row.
    Retention then removes it and a row no evaluation saw: both stay open (the one never judged
    as ``retained_away``), never green, until quarantined (an acknowledgement: no payload left)."""
    graph = build_graph()
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())
    key = AssetCheckKey(AssetKey("enriched"), OUTSIDE)

    def check() -> tuple[bool, AssetCheckSeverity, dict]:
        result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                             selection=AssetSelection.checks(key), raise_on_error=False)
        assert not result.get_asset_materialization_events()
        return _outside(result)

    load_orders(lake)
    assert materialize(assets_of(defs), resources=resources_of(defs), instance=instance).success

    lake.queue("orders").append(rows(30, 10), partition="0")
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()  # enriched 30..39, hashed
    _rogue(lake, [5])  # offset 40
    passed, _, meta = check()
    assert not passed and meta["judged_ranges"] == {"0": [[30, 41]]} and meta["offsets"] == {"0": [[40, 41]]}

    _rogue(lake, [6])  # offset 41: no evaluation sees it before retention removes it
    lake.queue("orders").append(rows(40, 10), partition="0")
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()  # split reads both: 42..51
    enriched = lake.queue("enriched")
    set_policy(enriched, ms=0, bytes=None)
    retain(enriched)
    assert lake.queue("enriched").start_offset("0") == 52
    passed, severity, meta = check()
    assert (passed, severity) == (False, AssetCheckSeverity.WARN)
    assert meta["cues/open_failing"] == {"0": [[40, 41]]}  # held, then removed: still held
    # 41..51 were removed before any evaluation looked at them (split's rows too: hashed or not,
    # nobody can tell now): never green on them
    assert meta["cues/open_unjudged"] == {"0": [[41, 52]]} == meta["retained_away"]
    assert meta["rows"] == 1 and "never judged" in meta["note"]

    for runs in (meta["cues/open_failing"], meta["cues/open_unjudged"]):
        assert quarantine_runs(lake, error_queue="errors", queue="enriched", runs=runs, reason="gone") == 1
    passed, _, meta = check()
    assert passed and meta["closed_by_quarantine_rows"] == 12 and meta["cues/judged_to"] == {"0": 52}
