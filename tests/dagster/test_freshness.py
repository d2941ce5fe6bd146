"""Freshness of processor assets as the age of the oldest unread row, from the Delta logs (issue 25),
on real Delta tables and without Spark.

The known time of a commit is read back with delta-rs' own ``history()`` (not with the code under
test), and the evaluation's clock is given: the age is exactly ``now - that commit's timestamp``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetSelection,
    build_sensor_context,
    materialize,
)
from deltalake import DeltaTable

from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.dagster.freshness import (
    ERROR,
    FRESH,
    WARN,
    Freshness,
    FreshnessConfigError,
    evaluate,
    sensor_report,
)
from cues_platform.processing import Graph, In, Kind, Options, Out, Processor, QueueDef, Strategy
from cues_platform.processing.idle import offset_commit
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from cues_platform.queues.positions import PositionStore
from tests.support import PAYLOAD, rows

MINUTE = 60_000


def _map(ctx: Any, src: Any) -> Any:
    return src


def _join(ctx: Any, bids: Any, quotes: Any) -> Any:
    return bids


def _quote(ctx: Any) -> pa.Table | None:
    return rows(1000 + ctx.step, 1)


def _graph() -> Graph:
    """``orders`` (partitions 0 and 1) -> enrich (at_least_once map, one lane per partition) ->
    ``enriched``; and the join ``price`` of ``bids`` with the fixings of the source ``quote``."""
    alo = Options(batch_size=10, strategy=Strategy.AT_LEAST_ONCE)
    return Graph.build(name="fresh", queues=[
        QueueDef("orders", PAYLOAD, partitions=("0", "1")), QueueDef("enriched", PAYLOAD, partitions=("0", "1")),
        QueueDef("bids", PAYLOAD), QueueDef("quotes", PAYLOAD), QueueDef("priced", PAYLOAD)],
        processors=[
            Processor("enrich", Kind.MAP, _map, {"src": In("orders")}, {"out": Out("enriched")}, options=alo),
            Processor("quote", Kind.SOURCE, _quote, outputs={"out": Out("quotes")}, options=Options(batch_size=10)),
            Processor("price", Kind.JOIN, _join, {"bids": In("bids"), "quotes": In("quotes")},
                      {"out": Out("priced")}, options=Options(batch_size=10))])


def _stamp(lake: Lake, queue: str, version: int) -> int:
    """The commit timestamp (ms) of ``version``, as delta-rs reports it."""
    dt = DeltaTable(lake.queue_uri(queue), storage_options=lake.options)
    return next(int(h["timestamp"]) for h in dt.history() if h["version"] == version)


def _read_to(lake: Lake, partition: str, position: int) -> None:
    """Lane ``partition`` of ``enrich`` (at_least_once) has read ``orders`` up to ``position``."""
    PositionStore(lake).commit(queue="orders", tailer=_lane(partition), partition=partition, position=position)


def _lane(partition: str) -> str:
    return next(p.id for p in _graph().processors.values()
                if p.family == "enrich" and p.inputs["src"].partition == partition)


@pytest.fixture
def fresh(lake: Lake) -> tuple[Graph, Lake]:
    graph = _graph()
    create_queues(graph, lake)
    return graph, lake


def test_the_age_is_now_minus_the_commit_of_the_laggiest_lanes_first_unread_row(fresh) -> None:
    graph, lake = fresh
    orders = lake.queue("orders")
    v1 = orders.append(rows(0, 5), partition="0").version  # offsets 0-4 of partition 0
    v2 = orders.append(rows(5, 3), partition="0").version  # 5-7: the first unread row, 6, is here
    orders.append(rows(8, 2), partition="0")
    v4 = orders.append(rows(0, 4), partition="1").version  # partition 1: newer, read up to 2
    _read_to(lake, "0", 6)
    _read_to(lake, "1", 2)
    assert offset_commit(lake, "orders", "0", 6) == (v2, _stamp(lake, "orders", v2), True)
    assert offset_commit(lake, "orders", "0", 4)[0] == v1 and offset_commit(lake, "orders", "1", 2)[0] == v4
    assert offset_commit(lake, "orders", "0", 10) is None  # not written yet

    at = _stamp(lake, "orders", v2)
    limits = Freshness()  # WARN above 15 minutes, ERROR above 1 hour
    verdict = evaluate(lake, graph, "enrich", limits, now=at + 42_000)
    assert (verdict.age_seconds, verdict.level, verdict.lag) == (42.0, FRESH, 4 + 2)
    meta = verdict.metadata("test")
    assert meta["oldest_unread"] == "orders/0@6" and meta["written_by_version"] == v2 and meta["age_exact"]
    assert meta["lane"] == _lane("0") and meta["clock_skew_seconds"] == 0
    assert evaluate(lake, graph, "enrich", limits, now=at + 16 * MINUTE).level == WARN
    assert evaluate(lake, graph, "enrich", limits, now=at + 61 * MINUTE).level == ERROR
    tight = Freshness(warn_after=timedelta(seconds=10), fail_after=timedelta(seconds=40))
    assert evaluate(lake, graph, "enrich", tight, now=at + 42_000).level == ERROR


def test_a_drained_processor_is_fresh_however_long_it_idled(fresh) -> None:
    graph, lake = fresh
    orders = lake.queue("orders")
    v = orders.append(rows(0, 5), partition="0").version
    _read_to(lake, "0", 5)
    month = 30 * 24 * 60 * MINUTE
    verdict = evaluate(lake, graph, "enrich", Freshness(), now=_stamp(lake, "orders", v) + month)
    assert verdict.oldest is None and verdict.age_seconds == 0 and verdict.level == FRESH and verdict.lag == 0
    assert "has read every input row" in verdict.description


def test_a_writer_clock_ahead_is_clamped_to_zero_and_shown(fresh) -> None:
    graph, lake = fresh
    v = lake.queue("orders").append(rows(0, 5), partition="0").version
    verdict = evaluate(lake, graph, "enrich", Freshness(), now=_stamp(lake, "orders", v) - 5_000)
    assert verdict.age_seconds == 0 and verdict.level == FRESH
    assert verdict.metadata("test")["clock_skew_seconds"] == 5.0  # the commit is 5 s in this clock's future


def test_a_row_whose_commit_entry_was_cleaned_up_ages_from_the_oldest_entry_left(fresh) -> None:
    """Idle for a month behind its input: the log cleanup removed the entry that wrote the first
    unread row (after a checkpoint, as delta-rs' cleanup does); the age is a lower bound, said so."""
    graph, lake = fresh
    orders = lake.queue("orders")
    orders.append(rows(0, 5), partition="0")
    gone = orders.append(rows(5, 5), partition="0").version
    kept = orders.append(rows(10, 5), partition="0").version
    dt = DeltaTable(lake.queue_uri("orders"), storage_options=lake.options)
    dt.create_checkpoint()
    log = Path(lake.queue_uri("orders")) / "_delta_log"
    for version in range(gone + 1):
        (log / f"{version:020d}.json").unlink()
    _read_to(lake, "0", 7)
    first_left = _stamp(lake, "orders", kept)
    assert offset_commit(lake, "orders", "0", 7) == (None, first_left, False)
    verdict = evaluate(lake, graph, "enrich", Freshness(), now=first_left + 30 * 24 * 60 * MINUTE)
    assert verdict.level == ERROR and verdict.age_seconds == 30 * 24 * 3600
    assert "at least" in verdict.description and not verdict.metadata("test")["age_exact"]


def test_a_join_waiting_for_its_source_ages_and_so_does_the_source(fresh) -> None:
    graph, lake = fresh
    v = lake.queue("bids").append(rows(0, 3), partition="0").version
    at = _stamp(lake, "bids", v)
    join = evaluate(lake, graph, "price", Freshness(), now=at + 20 * MINUTE)
    source = evaluate(lake, graph, "quote", Freshness(), now=at + 20 * MINUTE)
    assert join.level == source.level == WARN and join.age_seconds == source.age_seconds == 1200
    assert source.metadata("test")["oldest_unread"] == "bids/0@0"
    lake.queue("quotes").append(rows(1000, 1), partition="0")  # the fixing arrives: nobody waits for quote
    assert evaluate(lake, graph, "quote", Freshness(), now=at + 20 * MINUTE).level == FRESH


def test_the_sensor_reports_the_check_without_a_run(fresh, instance) -> None:
    graph, lake = fresh
    resource = LakeResource(root=lake.root)
    defs = build_definitions(graph, lake=resource, spark=CuesSparkResource(), schedule_cron=None)
    repo = defs.get_repository_def()
    checks = {c for c in repo.asset_graph.asset_check_keys if c.name == "freshness"}
    assert checks == {AssetCheckKey(AssetKey(k), "freshness") for k in ("enriched", "priced", "quotes")}
    assert not any(repo.asset_graph.get_check_spec(c).blocking for c in checks)
    # the graph's jobs leave them out (the sensors report them): a sensor's run takes no extra step
    for job in ("fresh__all", "fresh__enrich", "fresh__quote", "fresh__price", "fresh__recover"):
        steps = {n.name for n in repo.get_job(job).graph.node_defs}
        assert steps and not [s for s in steps if s.endswith("_freshness")], (job, steps)

    def tick(name: str, cursor: str | None) -> Any:
        with build_sensor_context(instance=instance, cursor=cursor, resources={"lake": resource}) as context:
            return repo.get_sensor_def(name).evaluate_tick(context)

    lake.queue("orders").append(rows(0, 5), partition="0")
    _read_to(lake, "0", 5)  # drained
    first = tick("fresh__enrich__new_data", None)
    assert not first.run_requests and first.skip_message
    (event,) = first.asset_events
    assert (event.asset_key, event.check_name, event.passed) == (AssetKey("enriched"), "freshness", True)
    assert event.metadata["age_seconds"].value == 0 and event.metadata["lag_rows"].value == 0
    assert tick("fresh__enrich__new_data", first.cursor).asset_events  # not stored yet: reported again
    # the daemon stores a tick's events; then the same level within report_every is not reported
    # again (no event every tick), and the cursor is the lag's alone
    instance.report_runless_asset_event(event)
    second = tick("fresh__enrich__new_data", first.cursor)
    assert not second.run_requests and not second.asset_events
    assert json.loads(second.cursor) == {"ends": {"orders/0": 5, "orders/1": 0}, "read": 5}
    # the join waits for quotes: the on-demand sensor asks for the source, and reports its check
    lake.queue("bids").append(rows(0, 3), partition="0")
    wanted = tick("fresh__quote__on_demand", None)
    assert len(wanted.run_requests) == 1
    assert [(e.asset_key, e.check_name) for e in wanted.asset_events] == [(AssetKey("quotes"), "freshness")]
    assert instance.get_runs_count() == 0  # a sensor tick launches nothing by itself


def test_a_level_change_is_reported_at_once_and_a_stale_report_refreshed(fresh) -> None:
    graph, lake = fresh
    v = lake.queue("orders").append(rows(0, 5), partition="0").version
    at = _stamp(lake, "orders", v)
    limits = Freshness(report_every=timedelta(minutes=10))
    key = [AssetKey("enriched")]
    events, state = sensor_report(evaluate(lake, graph, "enrich", limits, now=at), key, None, sensor="s")
    assert len(events) == 1 and state == {"level": FRESH, "at": at}
    events, state = sensor_report(evaluate(lake, graph, "enrich", limits, now=at + MINUTE), key, state, sensor="s")
    assert not events and state["at"] == at  # same level, 1 minute later
    events, state = sensor_report(evaluate(lake, graph, "enrich", limits, now=at + 16 * MINUTE), key, state,
                                  sensor="s")
    assert [(e.passed, e.severity) for e in events] == [(False, AssetCheckSeverity.WARN)]  # WARN at once
    events, _ = sensor_report(evaluate(lake, graph, "enrich", limits, now=at + 27 * MINUTE), key, state, sensor="s")
    assert len(events) == 1 and events[0].metadata["age_seconds"].value == 27 * 60  # 11 minutes on: refreshed


def test_the_check_runs_by_hand_with_the_same_verdict(fresh, instance) -> None:
    graph, lake = fresh
    resource = LakeResource(root=lake.root)
    defs = build_definitions(graph, lake=resource, spark=CuesSparkResource(), schedule_cron=None)
    lake.queue("orders").append(rows(0, 5), partition="0")
    result = materialize([*defs.assets, *defs.asset_checks], resources=dict(defs.resources or {}), instance=instance,
                         selection=AssetSelection.checks(AssetCheckKey(AssetKey("enriched"), "freshness")))
    (ev,) = result.get_asset_check_evaluations()
    assert ev.metadata["oldest_unread"].value == "orders/0@0" and ev.metadata["lag_rows"].value == 5
    assert ev.metadata["evaluated_by"].value == f"run {result.run_id}"


def test_thresholds_that_cannot_work_are_refused() -> None:
    with pytest.raises(FreshnessConfigError, match="warn_after <= fail_after"):
        Freshness(warn_after=timedelta(hours=2), fail_after=timedelta(hours=1))
    with pytest.raises(FreshnessConfigError, match="must be positive"):
        Freshness(warn_after=timedelta(0))
