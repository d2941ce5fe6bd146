"""The participants' Dagster assets: producer → consumer → producer passes through
``dagster.materialize`` on a real PostgreSQL (``pg_dsn``), a Delta lake in a temporary folder and
the session Spark; counts in the metadata, one result per posting, the consistency check and the
input-queue sensors."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from dagster import AssetKey, RunRequest, build_sensor_context, materialize

from assets.participants import ParticipantConfig, asset_key, participant_defs
from cues_platform.dagster import LakeResource
from cues_platform.participants.checks import check_producer
from cues_platform.participants.db import Database, ensure_database
from cues_platform.participants.model import RESULTS, RESULTS_SCHEMA, Role
from cues_platform.participants.network import register
from cues_platform.participants.postings import Posting, post_many
from cues_platform.queues import Lake

_n = itertools.count()


def fresh_db(server_dsn: str, participant: str) -> str:
    """A new, empty database for ``participant`` on the session's PostgreSQL."""
    dsn = ensure_database(server_dsn, f"dg{os.getpid()}_{next(_n)}_{participant.replace('-', '_')}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    return dsn


def meta(result: Any, key: AssetKey) -> dict[str, Any]:
    [mat] = [m for m in result.asset_materializations_for_node(key.path[-1])]
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


def check_passed(result: Any) -> bool:
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation.passed


def test_producer_consumer_producer_passes(pg_dsn: str, spark: Any, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # every acked posting without a result is due for replay at once: a producer pass must apply
    # the results waiting on RESULTS before its start-up replay, so no posting is replayed here
    monkeypatch.setenv("CUES_PARTICIPANT_REPLAY_AFTER", "0")
    root = str(tmp_path / "lake")
    lake = Lake(root=root)
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn_a, dsn_x = fresh_db(pg_dsn, "bank-a"), fresh_db(pg_dsn, "bank-x")
    defs = participant_defs([ParticipantConfig("bank-a", Role.PRODUCER, dsn_a),
                             ParticipantConfig("bank-x", Role.CONSUMER, dsn_x)])
    by_key = {a.key: a for a in defs.assets}  # type: ignore[union-attr]
    checks = {next(iter(c.check_specs)).asset_key: c for c in defs.asset_checks}  # type: ignore[union-attr]
    ka, kx = asset_key("bank-a"), asset_key("bank-x")
    resources = {"participants_lake": LakeResource(root=root), "spark": spark}

    db = Database(dsn_a)
    db.migrate()
    ids = [f"m-{i:03d}" for i in range(19)]
    post_many(db, lake, sender="bank-a", postings=[
        *(Posting("bank-x", m, json.dumps({"amount": i})) for i, m in enumerate(ids)),
        Posting("bank-x", "m-bad", "not json")])  # REJECTED payload_not_json
    db.close()

    sensors = {s.name: s for s in defs.sensors}  # type: ignore[union-attr]

    def tick(cursor: str | None = None, name: str = "participant__bank_x__new_data") -> Any:
        with build_sensor_context(cursor=cursor,
                                  resources={"participants_lake": LakeResource(root=root)}) as context:
            return sensors[name].evaluate_tick(context)

    assert not tick().run_requests  # nothing published yet

    # 1. producer: publishes the 20 postings (no result yet)
    first = materialize([by_key[ka]], resources=resources)
    m1 = meta(first, ka)
    assert (m1["messages"], m1["acked_posting"], m1["PENDING"], m1["pending"]) == (20, 20, 20, 20)
    assert m1["pass/published"] == 20 and m1["pass/lease"].startswith("slot:0@")
    assert m1["consistency_issues"] == 0

    # the consumer's sensor sees the new POSTINGS version; the same state asks nothing again
    data = tick()
    [request] = data.run_requests
    assert isinstance(request, RunRequest) and request.run_key.startswith(
        "participant__bank-x@postings.v")
    assert request.asset_selection == [kx]
    assert not tick(data.cursor).run_requests and data.cursor

    # 2. consumer: processes its subject until drained, on the session Spark
    second = materialize([by_key[kx]], resources=resources)
    m2 = meta(second, kx)
    assert (m2["received"], m2["OK"], m2["REJECTED"], m2["pending"]) == (20, 19, 1, 0)
    assert m2["pass/rows"] == 20 and m2["consistency_issues"] == 0
    # the producer's sensor sees its RESULTS subject grow
    [request] = tick(name="participant__bank_a__new_data").run_requests
    assert request.run_key.startswith("participant__bank-a@results.v")
    assert request.asset_selection == [ka]

    # 3. producer again: applies the 20 results; the consistency check passes
    third = materialize([by_key[ka], checks[ka]], resources=resources)
    m3 = meta(third, ka)
    assert (m3["acked_result"], m3["OK"], m3["REJECTED"], m3["PENDING"]) == (20, 19, 1, 0)
    assert m3["pass/results"] == 20 and m3["replays"] == 0 and m3["consistency_issues"] == 0
    assert check_passed(third)
    results = lake.queue(RESULTS).read_arrow(partition="bank-a")
    assert sorted(results["message_id"].to_pylist()) == sorted([*ids, "m-bad"])  # one each
    with psycopg.connect(dsn_a) as conn:
        report = check_producer(conn, "bank-a", complete=True)
        reasons = conn.execute("SELECT result_reason FROM messages WHERE message_id = 'm-bad'"
                               ).fetchone()
    assert report.passed, report.problems
    assert reasons == ("payload_not_json",)

    # 4. a result for a message bank-a never sent: a consistency issue, the check fails
    lake.queue(RESULTS).append(pa.table({
        "sender": ["bank-a"], "receiver": ["bank-x"], "message_id": ["ghost"], "replays": [0],
        "status": ["OK"], "reason": [None], "processed_at": [None]}, schema=RESULTS_SCHEMA),
        partition="bank-a")
    fourth = materialize([by_key[ka], checks[ka]], resources=resources)
    m4 = meta(fourth, ka)
    assert m4["consistency_issues"] == 1 and m4["pass/issues"] == 1 and m4["replays"] == 0
    assert not check_passed(fourth)
    with psycopg.connect(dsn_a) as conn:
        assert conn.execute("SELECT kind, message_id FROM consistency_issues").fetchall() == [
            ("unknown_message", "ghost")]


def test_pass_is_safe_next_to_running_instances(pg_dsn: str, tmp_path: Path) -> None:
    """While running instances hold every lease, a pass publishes and consumes nothing (and needs
    no Spark); it never keeps a lease: the next holder claims it at once."""
    from cues_platform.participants import leases
    from cues_platform.participants.consumer import CONSUMER_LEASE
    from cues_platform.participants.model import POSTINGS
    from cues_platform.participants.once import make_instance, run_once

    lake = Lake(root=str(tmp_path / "lake"))
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn_a, dsn_x = fresh_db(pg_dsn, "bank-a"), fresh_db(pg_dsn, "bank-x")
    db = Database(dsn_a)
    db.migrate()
    db.run(lambda c: leases.ensure_leases(c, ["slot:0"]))
    post_many(db, lake, sender="bank-a", postings=[Posting("bank-x", "m1", "{}")])
    dbx = Database(dsn_x)
    dbx.migrate()
    dbx.run(lambda c: leases.ensure_leases(c, [CONSUMER_LEASE]))
    dbx.close()
    held = [leases.LeaseKeeper(dsn, app="t", names=[name], owner="running-instance",
                               ttl=30).start()
            for dsn, name in ((dsn_a, "slot:0"), (dsn_x, CONSUMER_LEASE))]
    assert all(k.lease is not None for k in held)

    producer = run_once(make_instance("bank-a", Role.PRODUCER, lake=lake, dsn=dsn_a,
                                      instance_id="pass-1"))
    assert (producer.lease, producer.stopped, producer.stats["published"]) == (
        None, "lease_held_elsewhere", 0)
    assert producer.counts["nacked_posting"] == 1
    consumer = run_once(make_instance("bank-x", Role.CONSUMER, lake=lake, dsn=dsn_x,
                                      instance_id="pass-2"))
    assert (consumer.lease, consumer.stopped, consumer.stats["steps"]) == (
        None, "lease_held_elsewhere", 0)

    held[0].stop()  # the instance stops: releases its slot
    producer = run_once(make_instance("bank-a", Role.PRODUCER, lake=lake, dsn=dsn_a,
                                      instance_id="pass-3"))
    assert producer.stats["published"] == 1 and producer.lease == "slot:0@2"
    assert lake.queue(POSTINGS).next_offset("bank-x") == 1
    with psycopg.connect(dsn_a) as conn:  # the pass released the slot it took
        owner, until = conn.execute("SELECT owner, lease_until = '-infinity' FROM leases "
                                    "WHERE name = 'slot:0'").fetchone()
    assert owner == "pass-3" and until
    held[1].stop()
    db.close()
