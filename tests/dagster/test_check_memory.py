"""The ``contract`` check judges what arrived, not what the last run wrote: every row committed
since it last judged (by a step, by recovery rolling an attempt forward, by ``cues run`` outside
Dagster) is judged once, and a failing row keeps it red across no-op runs and re-executions until
it is quarantined or passes. Its memory is its own previous evaluation in Dagster's event log:
deleting those runs makes it judge more, never less."""

from __future__ import annotations

from dataclasses import replace

import pandera.pandas as pap
import pyarrow.compute as pc
from dagster import AssetCheckKey, AssetCheckSeverity, AssetKey, AssetSelection, materialize
from hypothesis import given
from hypothesis import strategies as st

from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.dagster.check_memory import (
    coalesce,
    count,
    from_offsets,
    normalize,
    split_below,
    subtract,
    union,
)
from cues_platform.dagster.check_quarantine import QUARANTINE_PROCESSOR, quarantine, quarantine_runs
from cues_platform.processing.retention import retain
from cues_platform.processing.runner import GraphRunner
from cues_platform.queues.retention import set_policy
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import build_graph, load_orders
from tests.support import rows

CONTRACT = AssetCheckKey(AssetKey("enriched"), "contract")


def _with_contracts(graph, **contracts):
    queues = [replace(q, contract=contracts[q.name]) if q.name in contracts else q for q in graph.queues.values()]
    return type(graph).build(name=graph.name, queues=queues, processors=list(graph.processors.values()),
                             error_queue=graph.error_queue)


def _defs(lake, graph):
    return build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource())


def _contracts(result) -> dict[str, tuple[bool, AssetCheckSeverity, dict]]:
    return {e.asset_key.to_user_string(): (e.passed, e.severity, {k: v.value for k, v in e.metadata.items()})
            for e in result.get_asset_check_evaluations() if e.check_name == "contract"}


def _check_only(defs, instance, *keys: AssetCheckKey):
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         selection=AssetSelection.checks(*(keys or (CONTRACT,))), raise_on_error=False)
    assert not result.get_asset_materialization_events()
    return _contracts(result)


def _strict(limit: int):
    return pap.DataFrameSchema({"id": pap.Column("int64", pap.Check.le(limit)),
                                "note": pap.Column(str, nullable=True)})


# -- offset runs (no Spark) -----------------------------------------------------------------------
spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=8)


@given(a=spans, b=spans, limit=st.integers(1, 4))
def test_offset_runs_are_exact_sets_and_coalescing_only_widens(a, b, limit) -> None:
    def offsets(runs):
        return {o for lo, hi in runs.get("0", []) for o in range(lo, hi)}

    ra, rb = normalize({"0": a}), normalize({"0": b})
    sa = {o for lo, hi in a for o in range(lo, hi)}
    sb = {o for lo, hi in b for o in range(lo, hi)}
    assert offsets(ra) == sa and count(ra) == len(sa)
    assert offsets(union(ra, rb)) == sa | sb and offsets(subtract(ra, rb)) == sa - sb
    kept, below = split_below(ra, {"0": 20})
    assert offsets(kept) == {o for o in sa if o >= 20} and offsets(below) == {o for o in sa if o < 20}
    wide = coalesce(ra, max_runs=limit)
    assert len(wide.get("0", [])) <= limit and offsets(wide) >= sa
    assert from_offsets({"0": sorted(sa)}) == ra


# -- red stays red ---------------------------------------------------------------------------------
def _job_contract(result) -> tuple[bool, AssetCheckSeverity, dict]:
    (ev,) = [e.event_specific_data for e in result.all_events
             if e.event_type_value == "ASSET_CHECK_EVALUATION" and e.event_specific_data.check_name == "contract"
             and e.event_specific_data.asset_key == AssetKey("enriched")]
    return ev.passed, ev.severity, {k: v.value for k, v in ev.metadata.items()}


def test_a_red_contract_stays_red_across_a_no_op_run_and_a_reexecution_until_quarantined(
        lake, spark, instance, monkeypatch) -> None:
    """``enrich`` delivered a row (id -2) before the contract existed. The check finds it and every
    later evaluation re-judges it: a no-op run of the whole job, a re-execution from failure (what
    the daemon's retry runs) and a run with new good rows stay red and blocked; quarantining the
    row closes it: green, downstream runs."""
    from dagster import ReexecutionOptions, execute_job, reconstructable

    from tests.dagster.jobs import all_job

    monkeypatch.setenv("CUES_LAKE", lake.root)
    before = _defs(lake, build_graph(with_contract=False))
    load_orders(lake, start=-1, count=11)
    assert materialize(assets_of(before), resources=resources_of(before), instance=instance,
                       selection=[AssetKey("enriched")]).success
    job = reconstructable(all_job)

    first = execute_job(job, instance=instance, raise_on_error=False)
    assert not first.success
    passed, severity, meta = _job_contract(first)
    assert (passed, severity) == (False, AssetCheckSeverity.ERROR)
    assert meta["judged_ranges"] == {"0": [[0, 11]]} and meta["rows_checked"] == 11
    assert meta["cues/open_failing"] == {"0": [[0, 1]]} and meta["cues/judged_to"] == {"0": 11}
    assert meta["failures_by_check"] == {"id: greater_than_or_equal_to(0)": 1}
    assert "| 0 | 0 | id | greater_than_or_equal_to(0) | -2 |" in meta["failing_rows_sample"]
    assert "quarantine" in meta["what_to_do"]

    # a no-op run: enrich has nothing to read and writes no row; the check re-judges the open row
    noop = execute_job(job, instance=instance, raise_on_error=False)
    assert not noop.success
    passed, _, meta = _job_contract(noop)
    assert not passed and meta["judged_ranges"] == {"0": [[0, 1]]} and meta["rows_checked"] == 1
    assert meta["memory_from_run"] == first.run_id and meta["open_failing_rows"] == 1
    assert not any(e.event_type_value == "ASSET_MATERIALIZATION"
                                        and e.asset_key == AssetKey("big") for e in noop.all_events)

    # re-execute the failed run from failure: still red
    options = ReexecutionOptions.from_failure(noop.run_id, instance)
    with execute_job(job, instance=instance, reexecution_options=options, raise_on_error=False) as again:
        assert not again.success
        passed, _, meta = _job_contract(again)
        assert not passed and meta["memory_from_run"] == noop.run_id and meta["open_failing_rows"] == 1

    # new good rows do not wash it out either
    lake.queue("orders").append(rows(20, 5), partition="0")
    more = execute_job(job, instance=instance, raise_on_error=False)
    passed, _, meta = _job_contract(more)
    assert not passed and meta["judged_ranges"] == {"0": [[0, 1], [11, 16]]}
    assert meta["cues/judged_to"] == {"0": 16} and meta["cues/open_failing"] == {"0": [[0, 1]]}

    written = quarantine_runs(lake, error_queue="errors", queue="enriched", runs=meta["cues/open_failing"],
                              reason="id -2 from before the contract; checked by hand")
    assert written == 1
    assert quarantine(lake, error_queue="errors", queue="enriched", partition="0", start=0, end=1,
                      reason="again") == 0  # a retried call writes nothing
    errors = lake.queue("errors").read_arrow(partition="0")
    mine = errors.filter(pc.equal(errors["processor"], QUARANTINE_PROCESSOR))
    assert mine.num_rows == 1 and '"id": -2' in mine["payload"][0].as_py()

    green = execute_job(job, instance=instance)
    assert green.success
    passed, _, meta = _job_contract(green)
    assert passed and meta["closed_by_quarantine_rows"] == 1 and meta["cues/open_failing"] == {}
    assert meta["judged_ranges"] == {}
    materialized = {e.asset_key for e in green.all_events if e.event_type_value == "ASSET_MATERIALIZATION"}
    assert {AssetKey("big"), AssetKey("small")} <= materialized
    assert _check_only(_defs(lake, build_graph()), instance)["enriched"][0]  # and it stays green


# -- rows from outside Dagster, retention, a lost memory -----------------------------------------
def test_rows_cues_run_wrote_are_judged_next_and_retention_or_a_lost_memory_never_turn_them_green(
        lake, spark, instance) -> None:
    """While Dagster is idle, ``cues run`` (a GraphRunner) delivers rows: the next check judges
    exactly them. Retention then removes failing rows and rows no evaluation saw: they stay open
    (ERROR, WARN) until quarantined, and rows judged before are not claimed again. Deleting the runs
    keeps the memory; wiping the asset deletes it and the check judges from offset 0, claiming no
    row it cannot see."""
    graph = build_graph()
    defs = _defs(lake, graph)
    load_orders(lake)
    assert materialize(assets_of(defs), resources=resources_of(defs), instance=instance).success

    lake.queue("orders").append(rows(30, 10), partition="0")  # enriched ids 60..78 at offsets 30..39
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    strict = _defs(lake, _with_contracts(graph, enriched=_strict(70)))  # a contract made stricter
    passed, severity, meta = _check_only(strict, instance)["enriched"]
    assert (passed, severity) == (False, AssetCheckSeverity.ERROR)
    assert meta["judged_ranges"] == {"0": [[30, 40]]} and meta["rows_checked"] == 10
    assert meta["cues/open_failing"] == {"0": [[36, 40]]}  # ids 72, 74, 76, 78

    lake.queue("orders").append(rows(40, 10), partition="0")  # offsets 40..49, read by split
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    enriched = lake.queue("enriched")
    set_policy(enriched, ms=0, bytes=None)
    retain(enriched)
    assert lake.queue("enriched").start_offset("0") == 50
    passed, severity, meta = _check_only(strict, instance)["enriched"]
    assert (passed, severity, meta["rows_checked"]) == (False, AssetCheckSeverity.ERROR, 0)
    assert meta["cues/open_failing"] == {"0": [[36, 40]]}  # failing, then removed: still open
    assert meta["cues/open_unjudged"] == {"0": [[40, 50]]} == meta["retained_away"]  # never judged
    assert "never judged" in meta["note"]

    for runs in (meta["cues/open_failing"], meta["cues/open_unjudged"]):
        assert quarantine_runs(lake, error_queue="errors", queue="enriched", runs=runs, reason="gone") == 1
    passed, severity, meta = _check_only(strict, instance)["enriched"]
    assert passed and meta["closed_by_quarantine_rows"] == 14 and meta["cues/judged_to"] == {"0": 50}

    for run in instance.get_runs():  # deleting runs keeps the check's execution records
        instance.delete_run(run.run_id)
    assert _check_only(strict, instance)["enriched"][0]
    instance.wipe_assets([AssetKey("enriched")])  # wiping the asset deletes them: the memory is lost
    passed, severity, meta = _check_only(strict, instance)["enriched"]
    assert (passed, severity) == (False, AssetCheckSeverity.WARN)
    assert meta["memory_from_run"].startswith("none")
    assert meta["cues/open_unjudged"] == {"0": [[0, 36]]}  # what is gone and was not quarantined


# -- recovery's rows, and every row covered --------------------------------------------------------
def _judged_by_every_evaluation(instance, key: AssetCheckKey) -> dict:
    records = instance.event_log_storage.get_asset_check_execution_history(key, limit=1000)
    judged = [r.event.dagster_event.event_specific_data.metadata["judged_ranges"].value
              for r in records if r.event is not None and r.event.dagster_event.event_type_value
              == "ASSET_CHECK_EVALUATION"]
    return union(*judged)


def test_rows_recovery_rolled_forward_are_judged_and_every_committed_row_is_covered(lake, spark, instance) -> None:
    """A run fails between the fork's commits (``small`` has step 1, ``big`` not); the next run's
    recovery rolls ``big`` forward. Every committed row of every checked queue is judged by some
    evaluation, the rows the failed attempt committed included."""
    ok = pap.DataFrameSchema({"id": pap.Column("int64", pap.Check.ge(0)), "note": pap.Column(str, nullable=True)})
    graph = _with_contracts(build_graph(), big=ok, small=ok)
    defs = _defs(lake, graph)
    load_orders(lake)
    fault = {"ops": {"split": {"config": {"inject_failure_at": "between_commits", "inject_failure_step": 1}}}}
    failed = materialize(assets_of(defs), resources=resources_of(defs), instance=instance, run_config=fault,
                         raise_on_error=False)
    assert not failed.success
    small_before = lake.queue("small").end_offsets()
    assert small_before["0"] > 0 and 30 not in [i for i in lake.queue("big").read_arrow(partition="0")["id"].to_pylist()]

    again = materialize(assets_of(defs), resources=resources_of(defs), instance=instance)
    assert again.success
    small = _contracts(again)["small"][2]
    assert small["judged_ranges"] == {"0": [[0, small_before["0"]]]}  # the failed attempt's rows too
    for q in ("enriched", "big", "small"):
        end = lake.queue(q).end_offsets()["0"]
        assert end > 0
        assert _judged_by_every_evaluation(instance, AssetCheckKey(AssetKey(q), "contract")) == {"0": [[0, end]]}, q
