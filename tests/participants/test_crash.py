"""3 producers × 3 instances and 2 consumers (2 instances each) as real processes, with seeded
random SIGKILLs of instances and pg_terminate_backend of their sessions mid-transaction.

In the end: every posting has exactly one result, the right status and replays, a complete audit
trail, and no consistency issue except the one injected on purpose (a result for an unknown
message). CI runs a bounded size; ``CUES_SOAK=1`` runs 10k postings.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from cues_platform.participants.checks import check_producer
from cues_platform.participants.db import Database
from cues_platform.participants.model import POSTINGS, RESULTS, RESULTS_SCHEMA
from cues_platform.participants.network import register
from cues_platform.participants.postings import post_many
from cues_platform.queues import Lake
from tests.participants.harness import (
    Instance,
    Network,
    child_env,
    make_postings,
    wait_until,
)
from tests.support import soak_enabled

PRODUCERS = ["bank-a", "bank-b", "bank-c"]
CONSUMERS = ["bank-x", "bank-y"]
SEED = 20020


def _done(dsns: dict[str, str], total: dict[str, int]) -> bool:
    for p in PRODUCERS:
        with psycopg.connect(dsns[p]) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE ack_status = 'acked_result'), "
                "(SELECT count(*) FROM publications WHERE acked_at IS NULL) FROM messages"
            ).fetchone()
            if row[0] != total[p] or row[1] != 0:
                return False
    return True


def _lease_holder(net: Network, consumer: str) -> Instance:
    with psycopg.connect(net.dsns[consumer]) as conn:
        row = conn.execute("SELECT owner FROM leases WHERE name = 'consumer'").fetchone()
    owner = row[0] if row and row[0] else ""
    for inst in net.instances:
        if inst.participant == consumer and owner.startswith(f"{inst.name}#"):
            return inst
    return next(i for i in net.instances if i.participant == consumer)


@pytest.mark.soak
def test_crash_network(tmp_path: Path, make_db: Callable[[str], str]) -> None:
    per_producer = 3_400 if soak_enabled() else 150
    kills_wanted = 40 if soak_enabled() else 8
    rng = random.Random(SEED)
    lake = Lake(root=str(tmp_path / "lake"))
    register(lake, producers=PRODUCERS, consumers=CONSUMERS)
    dsns = {p: make_db(p) for p in PRODUCERS + CONSUMERS}
    for c in CONSUMERS:
        Database(dsns[c]).migrate()
    total = {}
    for p in PRODUCERS:
        db = Database(dsns[p])
        db.migrate()
        total[p] = post_many(db, lake, sender=p, postings=make_postings(p, CONSUMERS, per_producer))
        db.close()
    # the injected consistency issue: a result for a message bank-a never sent
    lake.queue(RESULTS).append(pa.table(
        {"sender": ["bank-a"], "receiver": ["bank-x"], "message_id": ["bank-a-never-sent"],
         "replays": [0], "status": ["OK"], "reason": [None], "processed_at": [None]},
        schema=RESULTS_SCHEMA), partition="bank-a")

    net = Network(lake=lake.root, dsns=dsns, env=child_env(
        lease_seconds=3, replay_after=1, batch_size=25, consumer_batch=300, idle_poll=0.02,
        publish_timeout=1.5))
    logs = tmp_path / "logs"
    logs.mkdir()
    for p in PRODUCERS:
        for i in range(3):
            net.instances.append(Instance(p, "producer", f"{p}-{i}", dsns[p], 3,
                                          logs / f"{p}-{i}.log"))
    for c in CONSUMERS:
        for i in range(2):
            net.instances.append(Instance(c, "consumer", f"{c}-{i}", dsns[c], 1,
                                          logs / f"{c}-{i}.log"))
    net.start_all()
    try:
        # chaos: seeded random SIGKILLs (restarted at once) and terminated DB sessions
        kills = terminations = 0
        deadline = time.monotonic() + (1200 if soak_enabled() else 150)
        while (kills < kills_wanted or terminations < kills_wanted // 2) and (
                time.monotonic() < deadline):
            time.sleep(rng.uniform(0.3, 1.2))  # chaos pacing, not a correctness wait
            action = rng.random()
            if kills >= kills_wanted:
                action = 1.0  # enough kills: only drop DB sessions now
            if action >= 0.65:
                terminations += net.terminate_backends(rng, rng.choice(PRODUCERS + CONSUMERS))
                continue
            if kills == 2:  # at least once: the consumer instance that holds the lease
                victim = _lease_holder(net, rng.choice(CONSUMERS))
            elif action < 0.55:
                victim = rng.choice([i for i in net.instances if i.role == "producer"])
            else:
                victim = rng.choice([i for i in net.instances if i.role == "consumer"])
            victim.kill()
            victim.start(lake.root, net.env)
            kills += 1
        wait_until(lambda: _done(dsns, total), timeout=900 if soak_enabled() else 150,
                   what="every posting to have its result")
    finally:
        net.stop_all()
    assert kills > 0 and terminations > 0

    # RESULTS: exactly one result per posting (+ the injected one)
    results = lake.queue(RESULTS)
    got: Counter = Counter()
    status: dict[tuple[str, str], str] = {}
    for p in PRODUCERS:
        table = results.read_arrow(partition=p)
        for r in table.select(["sender", "message_id", "status"]).to_pylist():
            got[(r["sender"], r["message_id"])] += 1
            status[(r["sender"], r["message_id"])] = r["status"]
    expected = {(p, f"{p}-{i:06d}") for p in PRODUCERS for i in range(per_producer)}
    assert set(got) == expected | {("bank-a", "bank-a-never-sent")}
    assert [k for k, n in got.items() if n != 1] == []
    for (p, mid) in expected:
        i = int(mid.rsplit("-", 1)[1])
        assert status[(p, mid)] == ("REJECTED" if i % 11 == 5 else "OK"), mid

    # POSTINGS: never published twice: one row per (sender, message, replay number)
    postings = lake.queue(POSTINGS)
    copies: Counter = Counter()
    for c in CONSUMERS:
        t = postings.read_arrow(partition=c).select(["sender", "message_id", "replays"])
        copies.update((r["sender"], r["message_id"], r["replays"]) for r in t.to_pylist())
    assert [k for k, n in copies.items() if n != 1] == []

    # producer DBs: statuses, replays, audit trails, consistency issues
    for p in PRODUCERS:
        with psycopg.connect(dsns[p]) as conn:
            report = check_producer(conn, p, complete=True)
            assert report.problems == [], report.problems[:10]
            kinds = [(i["kind"], i["message_id"]) for i in report.issues]
            assert kinds == ([("unknown_message", "bank-a-never-sent")] if p == "bank-a" else [])
            db_status = dict(conn.execute(
                "SELECT message_id, processing_status FROM messages").fetchall())
            replays = dict(conn.execute("SELECT message_id, replays FROM messages").fetchall())
        published: dict[str, set[int]] = {}
        for (s, m, r) in copies:
            if s == p:
                published.setdefault(m, set()).add(r)
        for mid, st in db_status.items():
            assert st == status[(p, mid)]
            assert published[mid] == set(range(replays[mid] + 1)), mid
    # consumer DBs: one received row per posting addressed to them
    for c in CONSUMERS:
        with psycopg.connect(dsns[c]) as conn:
            n = conn.execute("SELECT count(*), count(DISTINCT (sender, message_id)) FROM received"
                             ).fetchone()
        want = sum(1 for (p, mid) in expected
                   if CONSUMERS[int(mid.rsplit("-", 1)[1]) % 2] == c)
        assert n == (want, want)
