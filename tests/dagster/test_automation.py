"""Automation on a drained lake launches nothing, and a run with nothing to do commits nothing
(issue 25, items 2, 3 and 7), on real Delta tables.

Every trigger of a graph (new-data and sink sensors, the on-demand sensor of a source a join
reads, the schedule) keys on the lag read from the Delta logs (``processing/idle.py``), never on
Delta versions: a fencing commit is empty, so it is not new data to anyone.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    Definitions,
    build_schedule_context,
    build_sensor_context,
    materialize,
)
from deltalake import DeltaTable

from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.dagster.check_quarantine import quarantine_runs
from cues_platform.processing import Graph, In, Kind, Options, Out, Processor, QueueDef
from cues_platform.processing.idle import graph_work
from cues_platform.processing.runner import GraphRunner, create_queues
from cues_platform.queues import Lake
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import build_graph, check_exact, load_orders
from tests.support import PAYLOAD, rows

TICKS = 3


def _versions(lake: Lake, graph: Graph) -> dict[str, int]:
    """The Delta version of every queue of ``graph`` and of every backing queue."""
    out = {q: lake.queue(q).version() for q in graph.queues if lake.has_queue(q)}
    for pid in graph.processors:
        uri = lake.system_uri("backing", pid)
        if DeltaTable.is_deltatable(uri, storage_options=lake.options):
            out[f"backing/{pid}"] = DeltaTable(uri, storage_options=lake.options).version()
    return out


def _tick_all(defs: Any, instance: Any, lake_resource: LakeResource,
              cursors: dict[str, str | None]) -> list[Any]:
    """One tick of every sensor of ``defs`` but the recovery sensor (from ``cursors``, updated),
    and one of every schedule; returns every run request they made."""
    repo = defs.get_repository_def()
    requests = []
    for sensor in repo.sensor_defs:
        if sensor.name.endswith("__recovery"):
            continue
        # each context as a `with`: its exit releases the instance it entered (left to the
        # garbage collector, the exit reset Dagster's current defs-state storage to this test's
        # closed instance in a later test)
        with build_sensor_context(instance=instance, cursor=cursors.get(sensor.name),
                                  resources={"lake": lake_resource}) as context:
            tick = sensor.evaluate_tick(context)
        cursors[sensor.name] = tick.cursor or cursors.get(sensor.name)
        requests += [(sensor.name, r) for r in tick.run_requests]
    for schedule in repo.schedule_defs:
        with build_schedule_context(instance=instance, resources={"lake": lake_resource}) as context:
            result = schedule.evaluate_tick(context)
        requests += [(schedule.name, r) for r in result.run_requests or []]
    return requests


def test_a_drained_lake_launches_no_run_and_a_noop_run_commits_nothing(
        spark, lake, lake_resource, defs, graph, instance) -> None:
    load_orders(lake)
    cursors: dict[str, str | None] = {}
    before = _tick_all(defs, instance, lake_resource, cursors)
    assert [name for name, _ in before] == ["shop__enrich__new_data", "shop__schedule"]
    assert materialize(assets_of(defs, checks=False), resources=resources_of(defs), instance=instance).success
    check_exact(lake)
    assert graph_work(lake, graph) == {}
    # drained: several rounds of every trigger request nothing
    for _ in range(TICKS):
        assert _tick_all(defs, instance, lake_resource, cursors) == []
    # a run by hand with nothing to do: it succeeds, says so, and commits nothing anywhere
    versions = _versions(lake, graph)
    again = materialize(assets_of(defs, checks=False), resources=resources_of(defs), instance=instance)
    assert again.success
    stopped = {e.asset_key.to_user_string(): e.materialization.metadata["cues/stopped"].value
               for e in again.get_asset_materialization_events()}
    assert stopped == dict.fromkeys(["enriched", "big", "small", "archive"], "no new input")
    lags = {e.materialization.metadata["cues/lag_total"].value for e in again.get_asset_materialization_events()}
    assert lags == {0}
    assert _versions(lake, graph) == versions
    assert _tick_all(defs, instance, lake_resource, cursors) == []
    # new orders: only the processor that can read them is asked for, once per input state
    lake.queue("orders").append(rows(30, 5), partition="0")
    (request,) = [r for name, r in _tick_all(defs, instance, lake_resource, cursors) if name.endswith("new_data")]
    assert request.run_key == "enrich@orders/0.o35+read.30"


def test_a_fencing_commit_does_not_look_like_new_data_downstream(spark, lake, lake_resource, defs, graph,
                                                                 instance) -> None:
    """What made 16 runs in 4 minutes: a start of ``enrich`` fences (an empty commit to its home
    ``enriched``); ``split``'s trigger reads the lag, which the fence does not move."""
    load_orders(lake)
    assert materialize(assets_of(defs, checks=False), resources=resources_of(defs), instance=instance).success
    cursors: dict[str, str | None] = {}
    assert _tick_all(defs, instance, lake_resource, cursors) == []
    version = lake.queue("enriched").version()
    GraphRunner(graph=graph, lake=lake, spark=spark, only=["enrich"]).recover()
    assert lake.queue("enriched").version() > version  # the fence is a commit...
    assert _tick_all(defs, instance, lake_resource, cursors) == []  # ...that is no new data


# -- a join and the source it waits for (the reference convert and fx), without Spark -----------------
def _quote(ctx: Any) -> pa.Table | None:
    return rows(1000 + ctx.step, 1)


def _join(ctx: Any, orders: Any, quotes: Any) -> Any:
    return orders


def _join_graph() -> Graph:
    opts = Options(batch_size=10)
    return Graph.build(name="desk", queues=[QueueDef("orders", PAYLOAD), QueueDef("quotes", PAYLOAD),
                                            QueueDef("priced", PAYLOAD)],
                       processors=[
                           Processor("quote", Kind.SOURCE, _quote, outputs={"out": Out("quotes")}, options=opts),
                           Processor("price", Kind.JOIN, _join, {"orders": In("orders"), "quotes": In("quotes")},
                                     {"out": Out("priced")}, options=opts)])


def test_a_join_waiting_for_its_source_runs_the_source_not_the_join(lake, instance) -> None:
    graph = _join_graph()
    create_queues(graph, lake)
    resource = LakeResource(root=lake.root)
    defs = build_definitions(graph, lake=resource, spark=CuesSparkResource(), schedule_cron="* * * * *")
    repo = defs.get_repository_def()
    assert {s.name for s in repo.sensor_defs} == {"desk__price__new_data", "desk__quote__on_demand",
                                                 "desk__recovery"}

    def tick(name: str, cursor: str | None = None) -> Any:
        with build_sensor_context(instance=instance, cursor=cursor,
                                  resources={"lake": resource}) as context:
            return repo.get_sensor_def(name).evaluate_tick(context)

    assert not tick("desk__quote__on_demand").run_requests  # nothing waits: no orders
    lake.queue("orders").append(rows(0, 5), partition="0")
    join = tick("desk__price__new_data")
    assert not join.run_requests and "waits for every input" in join.skip_message
    (wanted,) = tick("desk__quote__on_demand").run_requests
    assert wanted.tags["cues/trigger"] == "on_demand" and wanted.asset_selection == [AssetKey("quotes")]
    assert tick("desk__quote__on_demand").run_requests[0].run_key == wanted.run_key  # same state, same key
    schedule = repo.get_schedule_def("desk__schedule")
    with build_schedule_context(instance=instance, resources={"lake": resource}) as context:
        assert schedule.evaluate_tick(context).run_requests
    lake.queue("quotes").append(rows(1000, 1), partition="0")  # what the source's run publishes
    assert not tick("desk__quote__on_demand").run_requests
    (run,) = tick("desk__price__new_data").run_requests
    assert run.run_key == "price@orders/0.o5+quotes/0.o1+read.0" and json.loads(
        tick("desk__price__new_data").cursor) == {"ends": {"orders/0": 5, "quotes/0": 1}, "read": 0}
    assert graph_work(lake, graph) == {"price": "lag 6 on {'orders': 5, 'quotes': 1}"}


def test_sensor_runs_carry_the_processor_job_name(defs, instance) -> None:
    """(``instance``: Dagster loads definitions against the current instance.)"""
    repo = defs.get_repository_def()
    assert repo.get_sensor_def("shop__split__new_data").job_name == "shop__split"
    job = repo.get_job("shop__split")
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {"big", "small"}
    assert repo.get_sensor_def("shop__recovery").job_name == "shop__recover"
    assert not [j.name for j in repo.get_all_jobs() if j.name.startswith("__anonymous")]


# -- the participants: named jobs, and a schedule that skips when no participant has work ---------------
def test_the_participants_schedule_skips_when_no_participant_has_work(pg_dsn: str, tmp_path, instance) -> None:
    """A producer's work is in its database (postings recorded there, no queue shows them; results
    after its subscription position), a consumer's in the lake (its lane's lag): the schedule asks
    both, read-only, and runs only when one has work; a database it cannot ask is a run, said why."""
    import psycopg

    from assets.participants import ParticipantConfig, asset_key, participant_defs
    from cues_platform.participants.db import Database
    from cues_platform.participants.model import RESULTS, RESULTS_SCHEMA, Role
    from cues_platform.participants.network import register
    from cues_platform.participants.postings import Posting, post_many
    from tests.participants.test_dagster_assets import fresh_db

    root = str(tmp_path / "participants-lake")
    lake = Lake(root=root)
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn_a, dsn_x = fresh_db(pg_dsn, "bank-a"), fresh_db(pg_dsn, "bank-x")
    Database(dsn_a).migrate()
    configs = [ParticipantConfig("bank-a", Role.PRODUCER, dsn_a), ParticipantConfig("bank-x", Role.CONSUMER, dsn_x)]
    defs = participant_defs(configs, sensor_interval_seconds=5)
    resources = {"participants_lake": LakeResource(root=root)}
    wired = {**resources, "spark": CuesSparkResource()}  # never started: no consumer pass here
    repo = Definitions.merge(defs, Definitions(resources=wired)).get_repository_def()

    def tick(schedule_defs: Any = repo) -> Any:
        with build_schedule_context(instance=instance, resources=resources) as context:
            return schedule_defs.get_schedule_def("participants__schedule").evaluate_tick(context)

    # sensors' runs carry named jobs, every interval the one given
    assert {s.name: s.job_name for s in repo.sensor_defs} == {
        "participant__bank_a__new_data": "participants__bank_a", "participant__bank_x__new_data": "participants__bank_x"}
    assert {s.minimum_interval_seconds for s in repo.sensor_defs} == {5}
    assert not [j.name for j in repo.get_all_jobs() if j.name.startswith("__anonymous")]

    idle = tick()
    assert not idle.run_requests and "no participant has work" in idle.skip_message
    # a posting recorded in bank-a's database (what an application does): no queue shows it
    db = Database(dsn_a)
    post_many(db, lake, sender="bank-a", postings=[Posting("bank-x", "m-1", '{"amount": 1}')])
    db.close()
    (run,) = tick().run_requests
    assert run.tags["cues/work"] == "producer bank-a: 1 posting(s) recorded and not acked"
    # bank-a's pass publishes it (no Spark for a producer): now bank-x has a posting to read
    producer = next(a for a in defs.assets if a.key == asset_key("bank-a"))
    assert materialize([producer], resources=resources, instance=instance).success
    (run,) = tick().run_requests
    assert run.tags["cues/work"] == "consumer bank-x: 1 unread posting(s)"
    # a result on RESULTS for bank-a after its subscription position: bank-a has work again
    lake.queue(RESULTS).append(pa.table({
        "sender": ["bank-a"], "receiver": ["bank-x"], "message_id": ["m-1"], "replays": [0],
        "status": ["OK"], "reason": [None], "processed_at": [None]}, schema=RESULTS_SCHEMA), partition="bank-a")
    (run,) = tick().run_requests
    assert "producer bank-a: 1 result(s) on results after its position 0" in run.tags["cues/work"]
    # a database the schedule cannot ask: it cannot prove there is nothing to do, so it runs
    with psycopg.connect(pg_dsn) as conn:
        port = conn.info.port
    unreachable = participant_defs([ParticipantConfig("bank-b", Role.PRODUCER,
                                                      f"postgresql://127.0.0.1:{port + 1}/none?connect_timeout=2")])
    (run,) = tick(Definitions.merge(unreachable, Definitions(resources=wired)).get_repository_def()).run_requests
    assert run.tags["cues/work"].startswith("producer bank-b: its database could not be asked (OperationalError)")


def test_a_failing_blocking_check_upstream_holds_the_downstream_sensor_until_it_passes(
        spark, lake, lake_resource, instance) -> None:
    """``enrich`` delivered a row (id -2) before ``enriched`` had its contract; the contract check
    then fails (blocking, ERROR). ``split`` has unread rows, but its sensor does not start it while
    that check is red (Dagster blocks downstream steps only inside the run that evaluated the check,
    and each processor runs in its own run); after the row is quarantined and the check passes, the
    same sensor requests the run."""
    before = build_definitions(build_graph(with_contract=False), lake=lake_resource, spark=CuesSparkResource())
    load_orders(lake, start=-1, count=11)
    assert materialize(assets_of(before, checks=False), resources=resources_of(before), instance=instance,
                       selection=[AssetKey("enriched")]).success
    defs = build_definitions(build_graph(), lake=lake_resource, spark=CuesSparkResource())
    contract = AssetCheckKey(AssetKey("enriched"), "contract")

    def check_contract() -> Any:
        result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                             selection=AssetSelection.checks(contract), raise_on_error=False)
        [evaluation] = result.get_asset_check_evaluations()
        return evaluation

    def tick_split() -> Any:
        sensor = defs.get_repository_def().get_sensor_def("shop__split__new_data")
        with build_sensor_context(instance=instance, resources={"lake": lake_resource}) as context:
            return sensor.evaluate_tick(context)

    red = check_contract()
    assert not red.passed
    held = tick_split()
    assert held.run_requests == []
    assert "waits" in held.skip_message and "enriched" in held.skip_message and "contract" in held.skip_message
    assert lake.queue("big").count() + lake.queue("small").count() == 0

    open_rows = {k: v.value for k, v in red.metadata.items()}["cues/open_failing"]
    assert quarantine_runs(lake, error_queue="errors", queue="enriched", runs=open_rows,
                           reason="id -2 from before the contract") == 1
    assert check_contract().passed
    [request] = tick_split().run_requests
    assert set(request.asset_selection) == {AssetKey("big"), AssetKey("small")}
