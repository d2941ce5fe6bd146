"""The postings protocol in one process: schema, record/publish/ack, results, replay, bad input."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
import pyarrow as pa
import pytest

from cues_platform.errors import CuesError
from cues_platform.participants.consumer import ConsumerInstance
from cues_platform.participants.db import MIGRATIONS, Database, schema_version
from cues_platform.participants.errors import (
    DuplicateMessageError,
    PayloadTooLargeError,
    UnknownParticipantError,
)
from cues_platform.participants.model import RESULTS, RESULTS_SCHEMA, Settings
from cues_platform.participants.network import register
from cues_platform.participants.postings import Posting, post_many
from cues_platform.participants.producer import ProducerInstance
from cues_platform.queues import Lake

FAST = Settings(lease_seconds=3, replay_after=0.0, idle_poll=0.01, batch_size=50)


def postings(receivers: list[str], count: int, prefix: str = "m") -> list[Posting]:
    return [Posting(receivers[i % len(receivers)], f"{prefix}{i:05d}",
                    json.dumps({"amount": i}) if i % 7 else "not json")
            for i in range(count)]


def rows(dsn: str, query: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def test_migrations_apply_once_and_are_versioned(make_db: Callable[[str], str]) -> None:
    dsn = make_db("a")
    db = Database(dsn)
    assert db.migrate() == [v for v, _, _ in MIGRATIONS]
    assert db.migrate() == []
    assert schema_version(db.connection()) == MIGRATIONS[-1][0]
    # the audit trail is append-only
    db.run(lambda c: c.execute("INSERT INTO audit (sender, message_id, action, instance_id) "
                               "VALUES ('a', 'x', 'recorded', 'i')"))
    db.run(lambda c: c.execute("UPDATE audit SET action = 'tampered'"))
    db.run(lambda c: c.execute("DELETE FROM audit"))
    assert rows(dsn, "SELECT action FROM audit") == [("recorded",)]


def test_round_trip_with_replay(lake: Lake, make_db: Callable[[str], str], spark: object) -> None:
    register(lake, producers=["bank-a"], consumers=["bank-x", "bank-y"])
    dsn_a, dsn_x, dsn_y = make_db("bank-a"), make_db("bank-x"), make_db("bank-y")
    prod = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn_a, instance_id="a1",
                            slots=2, settings=FAST)
    prod.start()
    n = post_many(prod.db, lake, sender="bank-a", postings=postings(["bank-x", "bank-y"], 120))
    assert n == 120
    assert rows(dsn_a, "SELECT ack_status, processing_status, count(*) FROM messages GROUP BY 1, 2"
                ) == [("nacked_posting", "PENDING", 120)]
    while prod.tick():
        pass
    assert rows(dsn_a, "SELECT ack_status, count(*) FROM messages GROUP BY 1") == [
        ("acked_posting", 120)]
    # a restarted instance replays the acked postings still waiting for their result
    prod2 = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn_a, instance_id="a2",
                             slots=2, settings=FAST)
    prod2.start()
    while prod2.tick():
        pass
    assert rows(dsn_a, "SELECT min(replays), max(replays) FROM messages") == [(1, 1)]
    consumers = [ConsumerInstance(participant=p, lake=lake, dsn=d, instance_id=f"{p}-1",
                                  settings=FAST, spark=spark)
                 for p, d in (("bank-x", dsn_x), ("bank-y", dsn_y))]
    for c in consumers:
        c.start()
        while c.tick():
            pass
    while prod.tick() or prod2.tick():
        pass
    res = lake.queue(RESULTS).read_arrow(partition="bank-a")
    assert res.num_rows == 120  # one result per posting, the replays were suppressed
    assert sorted(res["message_id"].to_pylist()) == [f"m{i:05d}" for i in range(120)]
    got = dict(rows(dsn_a, "SELECT processing_status, count(*) FROM messages "
                           "WHERE ack_status = 'acked_result' GROUP BY 1"))
    assert got == {"OK": 120 - 18, "REJECTED": 18}
    suppressed = rows(dsn_x, "SELECT count(*) FROM audit WHERE action = 'replay_suppressed'")[0][0]
    suppressed += rows(dsn_y, "SELECT count(*) FROM audit WHERE action = 'replay_suppressed'")[0][0]
    assert suppressed == 120
    trail = rows(dsn_a, "SELECT array_agg(action ORDER BY id) FROM audit GROUP BY message_id")
    assert {tuple(t[0]) for t in trail} == {
        ("recorded", "assigned", "posting_acked", "replay", "replay_acked", "result_received")}
    assert rows(dsn_a, "SELECT count(*) FROM consistency_issues") == [(0,)]
    for inst in (prod, prod2, *consumers):
        inst.close()


def test_bad_input(lake: Lake, make_db: Callable[[str], str]) -> None:
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    db = Database(make_db("bank-a"))
    db.migrate()
    settings = Settings(max_payload_bytes=100)
    with pytest.raises(PayloadTooLargeError) as err:
        post_many(db, lake, sender="bank-a", postings=[Posting("bank-x", "big", "x" * 101)],
                  settings=settings)
    assert isinstance(err.value, CuesError) and err.value.limit == 100
    with pytest.raises(UnknownParticipantError):
        post_many(db, lake, sender="bank-a", postings=[Posting("bank-zz", "u1", "{}")])
    post_many(db, lake, sender="bank-a", postings=[Posting("bank-x", "d1", "{}")])
    with pytest.raises(DuplicateMessageError) as dup:
        post_many(db, lake, sender="bank-a",
                  postings=[Posting("bank-x", "d2", "{}"), Posting("bank-x", "d1", "{}")])
    assert dup.value.message_ids == ["d1"]
    # all or nothing: d2 was not recorded
    assert [r[0] for r in db.run(lambda c: c.execute("SELECT message_id FROM messages").fetchall())
            ] == ["d1"]


def test_unknown_and_malformed_results_are_consistency_issues(
        lake: Lake, make_db: Callable[[str], str]) -> None:
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn = make_db("bank-a")
    prod = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn, instance_id="a1",
                            settings=FAST)
    prod.start()
    bogus = pa.table({"sender": ["bank-a", "bank-a"], "receiver": ["bank-x", "bank-x"],
                      "message_id": ["never-sent", None], "replays": [0, 0],
                      "status": ["OK", "OK"], "reason": [None, None], "processed_at": [None, None]},
                     schema=RESULTS_SCHEMA)
    lake.queue(RESULTS).append(bogus, partition="bank-a")
    assert prod.apply_results_once() == 2
    assert prod.apply_results_once() == 0  # applied exactly once
    assert sorted(rows(dsn, "SELECT kind, message_id FROM consistency_issues"),
                  key=str) == sorted([("unknown_message", "never-sent"),
                                      ("malformed_result", None)], key=str)
    prod.close()


def test_unregistered_sender_and_empty_network(lake: Lake, make_db: Callable[[str], str]) -> None:
    register(lake)  # no participant yet: the queues exist with a placeholder subject
    db = Database(make_db("bank-q"))
    db.migrate()
    with pytest.raises(UnknownParticipantError, match="not a registered producer"):
        post_many(db, lake, sender="bank-q", postings=[Posting("bank-x", "m1", "{}")])
    register(lake, producers=["bank-q"])
    with pytest.raises(UnknownParticipantError, match="not a registered consumer"):
        post_many(db, lake, sender="bank-q", postings=[Posting("bank-x", "m1", "{}")])
    assert db.run(lambda c: c.execute("SELECT count(*) FROM messages").fetchone()[0]) == 0


def test_publish_bails_then_republishes_the_same_sequence(
        lake: Lake, make_db: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    from cues_platform.errors import TransientStorageError
    from cues_platform.participants.errors import PublishBailedError
    from cues_platform.queues import Producer

    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn = make_db("bank-a")
    prod = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn, instance_id="a1",
                            settings=Settings(publish_attempts=3, backoff_initial=0.001,
                                              backoff_max=0.01, lease_seconds=5))
    prod.start()
    post_many(prod.db, lake, sender="bank-a", postings=postings(["bank-x"], 5))
    assert prod._hold_lease()
    calls: list[int] = []
    real = Producer.send_many

    def flaky(self: Producer, batches: object, **kw: object) -> object:
        calls.append(kw["sequence"])  # type: ignore[arg-type]
        if len(calls) <= 3:
            raise TransientStorageError("injected: storage unavailable")
        return real(self, batches, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Producer, "send_many", flaky)
    with pytest.raises(PublishBailedError) as bailed:
        prod.publish_once()
    assert bailed.value.attempts == 3 and bailed.value.retryable
    assert rows(dsn, "SELECT DISTINCT ack_status, retries FROM messages") == [("nacked_posting", 3)]
    assert rows(dsn, "SELECT count(*) FROM audit WHERE action = 'publish_bailed'") == [(5,)]
    assert prod.publish_once()
    assert calls == [0, 0, 0, 0]  # the same (producer id, sequence) every time
    assert rows(dsn, "SELECT DISTINCT ack_status, retries FROM messages") == [("acked_posting", 3)]
    assert lake.queue("postings").read_arrow(partition="bank-x").num_rows == 5
    prod.close()


def test_a_standby_applies_results_only_every_standby_results_every(
        lake: Lake, make_db: Callable[[str], str]) -> None:
    """A slot holder applies results every round; an instance holding no slot applies them once,
    then not again within ``standby_results_every`` (and never counts them as progress), so it
    does not spin on work the holder does; with the interval 0 it applies at every round."""
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn = make_db("bank-a")
    holder = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn, instance_id="a1",
                              settings=FAST)
    slow = Settings(lease_seconds=3, idle_poll=0.01, standby_results_every=3600.0)
    standby = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn, instance_id="a2",
                               settings=slow)
    for inst in (holder, standby):
        inst.start()
    holder.tick()  # claims the only slot
    assert holder._hold_lease() and not standby._hold_lease()

    def position() -> int:
        return rows(dsn, "SELECT position FROM subscriptions")[0][0]

    def result(mid: str) -> pa.Table:
        return pa.table({"sender": ["bank-a"], "receiver": ["bank-x"], "message_id": [mid],
                         "replays": [0], "status": ["OK"], "reason": [None], "processed_at": [None]},
                        schema=RESULTS_SCHEMA)

    lake.queue(RESULTS).append(result("u1"), partition="bank-a")
    assert standby.tick() is False and position() == 1  # its first round applies, no progress
    lake.queue(RESULTS).append(result("u2"), partition="bank-a")
    assert standby.tick() is False and position() == 1  # within the interval: not again
    assert holder.tick() is True and position() == 2  # the holder: every round, progress
    eager = ProducerInstance(participant="bank-a", lake=lake, dsn=dsn, instance_id="a3",
                             settings=Settings(lease_seconds=3, standby_results_every=0.0))
    eager.start()
    for mid in ("u3", "u4"):
        lake.queue(RESULTS).append(result(mid), partition="bank-a")
        assert eager.tick() is False and position() == int(mid[1:])
    assert rows(dsn, "SELECT count(*) FROM consistency_issues") == [(4,)]  # each applied once
    for inst in (holder, standby, eager):
        inst.close()
