"""A result from the wrong participant (issue 10 item 3): bank-a posts to bank-x; results for those
postings written by anyone but bank-x's consumer processor -- an honest wrong ``receiver`` column,
a forged ``receiver`` column, another consumer's processor, a replayed processor commit -- are
consistency issues, leave the posting unchanged, and fail ``check`` and the asset check; bank-x's
real results then apply normally."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import psycopg
import pyarrow as pa

from assets.participants import consistency_result
from cues_platform.participants.checks import check_participant, check_producer
from cues_platform.participants.consumer import ConsumerInstance
from cues_platform.participants.model import POSTINGS, POSTINGS_SCHEMA, RESULTS, RESULTS_SCHEMA
from cues_platform.participants.network import register
from cues_platform.participants.postings import Posting, post_many
from cues_platform.participants.producer import ProducerInstance
from cues_platform.queues import Lake
from cues_platform.queues.appender import append_batches
from tests.participants.test_routing import FAST, drain, rows


def result(mid: str, receiver: str, status: str = "REJECTED") -> pa.Table:
    return pa.table({"sender": ["bank-a"], "receiver": [receiver], "message_id": [mid],
                     "replays": [0], "status": [status], "reason": ["spoofed"],
                     "processed_at": [datetime.now(UTC)]}, schema=RESULTS_SCHEMA)


def statuses(dsn: str) -> list[tuple]:
    return rows(dsn, "SELECT message_id, ack_status, processing_status FROM messages ORDER BY 1")


def test_results_from_the_wrong_publisher_are_issues_and_change_nothing(
        lake: Lake, make_db: Callable[[str], str], spark: object) -> None:
    register(lake, producers=["bank-a"], consumers=["bank-x", "bank-y"])
    dsn_a, dsn_x, dsn_y = make_db("bank-a"), make_db("bank-x"), make_db("bank-y")
    prod = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn_a, instance_id="a1",
                            settings=FAST)
    prod.start()
    post_many(prod.db, lake, sender="bank-a",
              postings=[Posting("bank-x", m, "{}") for m in ("m1", "m2", "m3")])
    drain(prod)
    assert statuses(dsn_a) == [(m, "acked_posting", "PENDING") for m in ("m1", "m2", "m3")]

    results = lake.queue(RESULTS)
    # 1. bank-y appends a result for m1 under its own name
    results.append(result("m1", "bank-y"), partition="bank-a")
    # 2. a writer forges the receiver column: it claims to be bank-x
    results.append(result("m2", "bank-x"), partition="bank-a")
    # 3. bank-y's own consumer processor publishes a result for m3: a posting on bank-y's
    #    subject that claims receiver bank-x (bank-y rejects it as wrong_receiver)
    now = datetime.now(UTC)
    lake.queue(POSTINGS).append(pa.table({
        "sender": ["bank-a"], "receiver": ["bank-x"], "message_id": ["m3"], "replays": [0],
        "inception_datum": [now], "last_datum": [now], "payload": ["{}"]},
        schema=POSTINGS_SCHEMA), partition="bank-y")
    cons_y = ConsumerInstance(participant="bank-y", lake=lake, dsn=dsn_y, instance_id="y1",
                              settings=FAST, spark=spark)
    cons_y.start()
    drain(cons_y)
    assert results.read_arrow(partition="bank-a").num_rows == 3

    assert prod.apply_results_once() == 3
    assert statuses(dsn_a) == [(m, "acked_posting", "PENDING") for m in ("m1", "m2", "m3")]
    issues = rows(dsn_a, "SELECT kind, message_id, detail->>'publisher', "
                         "detail->>'result_receiver' FROM consistency_issues ORDER BY id")
    assert issues == [("wrong_publisher", "m1", None, "bank-y"),
                      ("wrong_publisher", "m2", None, "bank-x"),
                      ("wrong_publisher", "m3", "bank-y", "bank-y")]
    with psycopg.connect(dsn_a) as conn:
        report = check_producer(conn, "bank-a")
        assert check_participant(conn, "bank-a").issues == report.issues
    assert not report.passed and len(report.issues) == 3
    check = consistency_result("bank-a", dsn_a)
    assert not check.passed and check.metadata["issues"].value == 3

    # bank-x's real results still apply, once
    cons_x = ConsumerInstance(participant="bank-x", lake=lake, dsn=dsn_x, instance_id="x1",
                              settings=FAST, spark=spark)
    cons_x.start()
    drain(cons_x, prod)
    assert statuses(dsn_a) == [(m, "acked_result", "OK") for m in ("m1", "m2", "m3")]

    # 4. a forged processor commit: bank-x's processor metadata and app transaction, but a step
    #    it already committed (a replayed commit) -- not a new step of bank-x's processor
    step = int(rows(dsn_x, "SELECT max(step) FROM received")[0][0])
    append_batches(results, {"bank-a": result("m1", "bank-x")},
                   app_transactions=[("proc:consume-bank-x", step)],
                   commit_metadata={"cues.processor": "consume-bank-x", "cues.step": str(step)})
    assert prod.apply_results_once() == 1
    last = rows(dsn_a, "SELECT kind, message_id, detail->>'why' FROM consistency_issues "
                       "ORDER BY id DESC LIMIT 1")[0]
    assert last[:2] == ("wrong_publisher", "m1") and "does not increase" in last[2]
    assert statuses(dsn_a) == [(m, "acked_result", "OK") for m in ("m1", "m2", "m3")]
    assert rows(dsn_a, "SELECT count(*) FROM consistency_issues") == [(4,)]
    for inst in (prod, cons_x, cons_y):
        inst.close()
