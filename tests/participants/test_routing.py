"""Onboarding (issue 10 item 2): a producer registered while a consumer runs is answered without a
restart, a posting recorded ``routed = false`` is answered exactly once after its sender's
registration, and a consumer crash between its received rows and the RESULTS commit delivers the
new sender's results once. One consumer instance, the session's Spark, real Delta and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import psycopg
import pyarrow as pa
import pytest

from cues_platform.participants.checks import check_consumer, check_producer
from cues_platform.participants.consumer import ConsumerInstance
from cues_platform.participants.model import POSTINGS, POSTINGS_SCHEMA, RESULTS, Settings
from cues_platform.participants.network import register
from cues_platform.participants.postings import Posting, post_many
from cues_platform.participants.producer import ProducerInstance
from cues_platform.queues import Lake

FAST = Settings(lease_seconds=3, replay_after=3600.0, idle_poll=0.01, batch_size=50)


def rows(dsn: str, query: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def drain(*instances: object) -> None:
    while any([i.tick() for i in instances]):  # type: ignore[attr-defined]
        pass


def publish_raw(lake: Lake, sender: str, receiver: str, ids: list[str], replays: int = 0) -> None:
    """What a sender's publish writes to POSTINGS (used for a sender that cannot run a producer
    instance because it is not registered yet, and for its replays)."""
    now = datetime.now(UTC)
    lake.queue(POSTINGS).append(pa.table({
        "sender": [sender] * len(ids), "receiver": [receiver] * len(ids), "message_id": ids,
        "replays": [replays] * len(ids), "inception_datum": [now] * len(ids),
        "last_datum": [now] * len(ids), "payload": ["{}"] * len(ids)}, schema=POSTINGS_SCHEMA),
        partition=receiver)


def results_of(lake: Lake, sender: str) -> list[str]:
    q = lake.queue(RESULTS)
    q.refresh()
    if sender not in q.partitions:
        return []
    return sorted(q.read_arrow(partition=sender)["message_id"].to_pylist())


def test_sender_registered_after_consumer_started_is_answered(
        lake: Lake, make_db: Callable[[str], str], spark: object) -> None:
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn_a, dsn_n, dsn_x = make_db("bank-a"), make_db("bank-n"), make_db("bank-x")
    cons = ConsumerInstance(participant="bank-x", lake=lake, dsn=dsn_x, instance_id="x1",
                            settings=FAST, spark=spark)
    cons.start()
    prod_a = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn_a, instance_id="a1",
                              settings=FAST)
    prod_a.start()
    post_many(prod_a.db, lake, sender="bank-a", postings=[Posting("bank-x", "a1", "{}")])
    drain(prod_a, cons, prod_a)
    assert cons.runner is not None  # the consumer runs: its graph and routes are built

    # onboarding while it runs: a NEW producer registers and posts; nobody restarts
    register(lake, producers=["bank-n"])
    prod_n = ProducerInstance(participant="bank-n", lake=lake, dsn=dsn_n, instance_id="n1",
                              settings=FAST)
    prod_n.start()
    post_many(prod_n.db, lake, sender="bank-n",
              postings=[Posting("bank-x", f"n{i}", json.dumps({"i": i})) for i in range(5)])
    drain(prod_n, cons, prod_n, prod_a)

    assert rows(dsn_n, "SELECT ack_status, processing_status, count(*) FROM messages "
                       "GROUP BY 1, 2") == [("acked_result", "OK", 5)]
    assert results_of(lake, "bank-n") == [f"n{i}" for i in range(5)]
    assert rows(dsn_x, "SELECT count(*) FROM received WHERE NOT routed") == [(0,)]
    assert rows(dsn_x, "SELECT count(*) FROM audit WHERE action = 'unroutable'") == [(0,)]
    with psycopg.connect(dsn_n) as conn:
        assert check_producer(conn, "bank-n", complete=True).passed
    with psycopg.connect(dsn_x) as conn:
        report = check_consumer(conn, "bank-x", lake=lake, complete=True)
    assert report.passed, report.problems
    for inst in (cons, prod_a, prod_n):
        inst.close()


def test_waiting_unroutable_postings_are_answered_once_after_registration(
        lake: Lake, make_db: Callable[[str], str], spark: object) -> None:
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn_x = make_db("bank-x")
    cons = ConsumerInstance(participant="bank-x", lake=lake, dsn=dsn_x, instance_id="x1",
                            settings=FAST, spark=spark)
    cons.start()
    # postings of bank-n arrive before bank-n is registered: recorded, not answered (no subject)
    publish_raw(lake, "bank-n", "bank-x", ["m1", "m2"])
    drain(cons)
    assert rows(dsn_x, "SELECT message_id, routed FROM received ORDER BY 1") == [
        ("m1", False), ("m2", False)]
    assert results_of(lake, "bank-n") == []
    with psycopg.connect(dsn_x) as conn:
        waiting = check_consumer(conn, "bank-x", lake=lake, complete=True)
    assert not waiting.passed and waiting.counts["unrouted"] == 2
    assert any("not registered" in p for p in waiting.problems), waiting.problems

    register(lake, producers=["bank-n"])
    # the replay of m1 (the sender's start-up replay) is no longer suppressed: this step answers
    # m1 and the still waiting m2, exactly once
    publish_raw(lake, "bank-n", "bank-x", ["m1"], replays=1)
    drain(cons)
    assert results_of(lake, "bank-n") == ["m1", "m2"]
    # more replays (and a restart of the consumer) never produce a second result
    publish_raw(lake, "bank-n", "bank-x", ["m1", "m2"], replays=2)
    drain(cons)
    cons.close()
    cons2 = ConsumerInstance(participant="bank-x", lake=lake, dsn=dsn_x, instance_id="x2",
                             settings=FAST, spark=spark)
    cons2.start()
    publish_raw(lake, "bank-n", "bank-x", ["m2"], replays=3)
    drain(cons2)
    assert results_of(lake, "bank-n") == ["m1", "m2"]
    assert rows(dsn_x, "SELECT message_id, array_agg(action ORDER BY id) FROM audit "
                       "GROUP BY 1 ORDER BY 1") == [
        ("m1", ["unroutable", "rerouted", "replay_suppressed"]),
        ("m2", ["unroutable", "rerouted", "replay_suppressed", "replay_suppressed"])]
    assert rows(dsn_x, "SELECT count(*) FROM received WHERE NOT routed") == [(0,)]
    with psycopg.connect(dsn_x) as conn:
        report = check_consumer(conn, "bank-x", lake=lake, complete=True)
    assert report.passed, report.problems
    cons2.close()


class Crash(Exception):
    """Stands for the process dying at a step point (the instance is then abandoned)."""


@pytest.mark.parametrize("point", ["after_function", "after_prepare"])
def test_consumer_crash_before_results_commit_with_new_sender(
        lake: Lake, make_db: Callable[[str], str], spark: object, point: str) -> None:
    """The received rows of a newly registered sender are committed, then the consumer dies
    before (after_function) or while (after_prepare: results prepared, its one commit not made)
    delivering them. A fresh instance (new routes, new runner) retries the recorded snapshot
    (the consumer records it before its function) and delivers exactly the recorded results, once."""
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn_n, dsn_x = make_db("bank-n"), make_db("bank-x")
    fired: list[str] = []

    def hook(p: str) -> None:
        if p == point and not fired:
            fired.append(p)
            raise Crash(p)

    cons = ConsumerInstance(participant="bank-x", lake=lake, dsn=dsn_x, instance_id="x1",
                            settings=FAST, spark=spark, hook=hook)
    cons.start()
    drain(cons)
    cons._ensure_runner()  # built before the registration below
    register(lake, producers=["bank-n"])
    prod = ProducerInstance(participant="bank-n", lake=lake, dsn=dsn_n, instance_id="n1",
                            settings=FAST)
    prod.start()
    post_many(prod.db, lake, sender="bank-n",
              postings=[Posting("bank-x", f"c{i}", "{}") for i in range(3)])
    drain(prod)
    assert cons.tick() is False and fired == [point]  # died after the received rows' commit
    assert rows(dsn_x, "SELECT count(*) FROM received WHERE routed") == [(3,)]
    assert results_of(lake, "bank-n") == []
    cons.close()
    cons2 = ConsumerInstance(participant="bank-x", lake=lake, dsn=dsn_x, instance_id="x2",
                             settings=FAST, spark=spark)
    cons2.start()
    drain(cons2, prod)
    assert results_of(lake, "bank-n") == ["c0", "c1", "c2"]
    res = lake.queue(RESULTS).read_arrow(partition="bank-n")
    assert set(res["_delivery_hash"].to_pylist()) == {
        r[0] for r in rows(dsn_x, "SELECT DISTINCT delivery_hash FROM received")}
    assert rows(dsn_n, "SELECT ack_status, count(*) FROM messages GROUP BY 1") == [
        ("acked_result", 3)]
    assert rows(dsn_n, "SELECT count(*) FROM consistency_issues") == [(0,)]
    for inst in (cons2, prod):
        inst.close()
