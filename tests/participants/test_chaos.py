"""Chaos (issue 10, "Done when"): scale-down for good, scale-up, a sender onboarded mid-run,
spoofed results and SIGKILLs -- and every posting still ends at a final status exactly once.

The network runs as real processes (``python -m cues_platform.participants.instance``) on a real
PostgreSQL (one database per participant) and a real lake: producers bank-a and bank-b with 3
instances each, the consumer bank-x with 2; bank-y is a registered consumer without instances (the
spoofer). Onboarding and the final checks go through the ``cues participant`` CLI. Phases, each
gated by a condition on the databases (never a sleep):

1. warm-up: both producers have results (the consumer's Spark session runs);
2. crash: an instance of each producer SIGKILLed and restarted at once;
3. onboarding: ``cues participant register --producer bank-n`` WHILE the consumer runs, then
   ``migrate``, ``post`` and two bank-n instances; wait until bank-x has received its postings;
4. scale-down for good: two bank-a instances SIGKILLed while a publication of theirs is in flight
   (frozen with SIGSTOP, checked in the audit trail, killed), two bank-b instances and the
   consumer's lease holder SIGKILLed; none is ever started again (bank-a runs on ONE instance to
   the end, bank-x on one until phase 5); wait until the last consumer instance processes;
5. scale-up: two new bank-b instances, a new bank-x instance, then the consumer's lease holder
   SIGKILLed and restarted (the new or the restarted instance takes over) and a producer crash;
6. drain: wait (bounded) until every posting has its result and the consumer has processed every
   copy on its POSTINGS subject (a replay that follows its answered original too).

Spoofed results, appended to RESULTS subject n before the real result exists (the sender's
instances apply them first): (A) bank-a's posting to bank-x answered REJECTED with receiver
bank-y, through a commit that says it comes from bank-y's processor; (B) bank-b's posting
answered REJECTED with the receiver column FORGED to bank-x, through a plain append (not bank-x's
processor); (C) like A for the late sender bank-n, injected mid-run before its instances start.
Wanted: each is a stored consistency issue and does not change its posting.

In the end: every posting acked_result with the consumer's verdict and exactly one
``result_received``; exactly one consumer result per posting in RESULTS; no (posting, replay
number) published twice; each producer's ``cues participant check --complete`` clean except for
its spoof issue. All failures are collected and reported together, by issue item.
CI: ~180 postings per producer and 30 from the late sender, about 1-3 minutes;
``CUES_SOAK=1``: 10x the postings, 6 rounds of crashes and consumer takeovers.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from cues_platform.participants.checks import postings_not_processed
from cues_platform.participants.db import Database
from cues_platform.participants.model import POSTINGS, RESULTS, RESULTS_SCHEMA
from cues_platform.participants.network import register
from cues_platform.participants.postings import post_many
from cues_platform.queues import Lake
from tests.participants.harness import (
    Network,
    child_env,
    expected_status,
    final_count,
    make_postings,
    statuses,
    wait_until,
)
from tests.support import soak_enabled

PRODUCERS = ["bank-a", "bank-b"]
LATE = "bank-n"  # the sender registered while the consumer runs
CONSUMER = "bank-x"
SPOOFER = "bank-y"  # a registered consumer that is never the receiver of a posting here
SEED = 20100


def _spoof(lake: Lake, sender: str, message_id: str, *, receiver: str,
           as_processor: str | None) -> int:
    """Append a REJECTED result for ``message_id`` to RESULTS subject ``sender`` (not through the
    receiver's processor); returns its offset."""
    table = pa.table({"sender": [sender], "receiver": [receiver], "message_id": [message_id],
                      "replays": [0], "status": ["REJECTED"], "reason": ["spoofed"],
                      "processed_at": [None]}, schema=RESULTS_SCHEMA)
    meta = {"cues.processor": as_processor, "cues.step": "1"} if as_processor else {}
    res = lake.queue(RESULTS).append(table, partition=sender, commit_metadata=meta)
    return res.ranges[sender][0]


def _received(dsn: str, sender: str | None = None) -> int:
    """Postings the consumer has recorded as received (from ``sender``, or from anyone)."""
    with psycopg.connect(dsn) as conn:
        if sender is None:
            return conn.execute("SELECT count(*) FROM received").fetchone()[0]
        return conn.execute("SELECT count(*) FROM received WHERE sender = %s",
                            (sender,)).fetchone()[0]


def _unprocessed(lake: Lake, dsn: str) -> int | None:
    """Copies on the consumer's POSTINGS subject that it has not processed yet (what ``check
    --complete`` counts): a replayed copy whose original already has its result is still processed
    (suppressed) by the consumer, after the producer's count is complete."""
    with psycopg.connect(dsn) as conn:
        return postings_not_processed(conn, lake, CONSUMER)  # None (no subject) never drains


def _check(net: Network, participant: str, role: str, failures: list[str]) -> dict | None:
    """``cues participant check --complete --json`` of one role: its report and exit code."""
    out = net.cli("check", "--id", participant, "--role", role, "--lake", net.lake, "--dsn",
                  net.dsns[participant], "--complete", "--json")
    try:
        report = json.loads(out.stdout)
    except ValueError:
        failures.append(f"{participant}: check --json printed no JSON (exit {out.returncode}): "
                        f"{out.stdout[-300:]} {out.stderr[-300:]}")
        return None
    return {**report["roles"][role], "exit": out.returncode}


@pytest.mark.soak
@pytest.mark.timeout(2400 if soak_enabled() else 900)  # over pyproject's 600 s: the waits' own bounds rule
def test_chaos_scale_onboard_spoof(tmp_path: Path, make_db: Callable[[str], str]) -> None:
    soak = soak_enabled()
    scale = 10 if soak else 1
    rounds = 6 if soak else 1
    rng = random.Random(SEED)
    lake = Lake(root=str(tmp_path / "lake"))
    register(lake, producers=PRODUCERS, consumers=[CONSUMER, SPOOFER])
    dsns = {p: make_db(p) for p in [*PRODUCERS, CONSUMER, LATE]}
    dbs = {p: Database(dsns[p]) for p in [*PRODUCERS, CONSUMER]}
    for db in dbs.values():
        db.migrate()
    recorded = {p: 0 for p in PRODUCERS}

    def feed(p: str, n: int) -> None:
        post_many(dbs[p], lake, sender=p,
                  postings=make_postings(p, [CONSUMER], n, start=recorded[p]))
        recorded[p] += n

    for p in PRODUCERS:
        feed(p, 80 * scale)
    # spoofs A and B land in RESULTS before any instance runs: they are applied first
    spoofs = {  # (sender, message id) -> offset of the spoofed result in RESULTS subject sender
        ("bank-a", "bank-a-000001"): _spoof(lake, "bank-a", "bank-a-000001", receiver=SPOOFER,
                                            as_processor=f"consume-{SPOOFER}"),
        ("bank-b", "bank-b-000002"): _spoof(lake, "bank-b", "bank-b-000002", receiver=CONSUMER,
                                            as_processor=None),
    }

    logs = tmp_path / "logs"
    logs.mkdir()
    net = Network(lake=lake.root, dsns=dsns, logs=logs, env=child_env(
        lease_seconds=3, replay_after=1, batch_size=10, consumer_batch=300, idle_poll=0.02,
        publish_timeout=1.5))
    for p in PRODUCERS:
        for i in range(3):
            net.add(p, "producer", f"{p}-{i}", slots=3)
    for i in range(2):
        net.add(CONSUMER, "consumer", f"{CONSUMER}-{i}")
    late_ids: list[str] = []
    stranded = 0
    drain_error = None
    started, timings = time.monotonic(), []

    def done(phase: str) -> None:
        timings.append(f"{phase} {time.monotonic() - started:.0f}s")
        print(f"chaos: {timings[-1]}", flush=True)

    try:
        # 1. warm-up
        wait_until(lambda: all(final_count(dsns[p]) > 0 for p in PRODUCERS), timeout=240,
                   what="the first results (the consumer's Spark session running)")
        done("1 warm-up")

        # 2. crash and recover
        for _ in range(rounds):
            for p in PRODUCERS:
                feed(p, 20 * scale)
                net.restart(rng.choice(net.live(p)))
            before = _received(dsns[CONSUMER])
            wait_until(lambda b=before: _received(dsns[CONSUMER]) > b, timeout=120,
                       what="the consumer to receive postings after the crashes")
        done("2 crash")

        # 3. onboarding a sender while the consumer runs (its processor was built before this)
        out = net.cli("register", "--lake", lake.root, "--producer", LATE)
        assert out.returncode == 0, out.stdout + out.stderr
        out = net.cli("migrate", "--id", LATE, "--dsn", dsns[LATE])
        assert out.returncode == 0, out.stdout + out.stderr
        late_count = 30 * scale
        out = net.cli("post", "--id", LATE, "--lake", lake.root, "--dsn", dsns[LATE], "--to",
                      CONSUMER, "--count", str(late_count), "--prefix", LATE)
        assert out.returncode == 0 and f"recorded {late_count}" in out.stdout, out.stderr
        late_ids = [f"{LATE}-{i:08d}" for i in range(late_count)]
        spoofs[(LATE, late_ids[3])] = _spoof(lake, LATE, late_ids[3], receiver=SPOOFER,
                                             as_processor=f"consume-{SPOOFER}")
        for i in range(2):
            net.add(LATE, "producer", f"{LATE}-{i}", slots=2)
        wait_until(lambda: _received(dsns[CONSUMER], LATE) == late_count, timeout=120,
                   what=f"{CONSUMER} to receive the postings of the late sender {LATE}")
        done("3 onboarding")

        # 4. scale-down for good: bank-a 3 -> 1 (killed with publications in flight),
        #    bank-b 3 -> 1, the consumer 2 -> 1 (its lease holder)
        for p in PRODUCERS:
            feed(p, 40 * scale)
        for victim in net.live("bank-a")[:2]:
            stranded += net.kill_in_flight(victim, timeout=90, feed=lambda: feed("bank-a", 20))
        assert stranded > 0  # the lost instances left postings they had assigned but not acked
        for victim in net.live("bank-b")[:2]:
            victim.retire()
        holder = wait_until(lambda: net.consumer_holder(CONSUMER), timeout=60,
                            what="a consumer lease holder")
        holder.retire()
        assert [len(net.live(p)) for p in ("bank-a", "bank-b", CONSUMER)] == [1, 1, 1]
        last = net.live(CONSUMER)[0]
        for p in PRODUCERS:
            feed(p, 20 * scale)
        before = _received(dsns[CONSUMER])
        wait_until(lambda: _received(dsns[CONSUMER]) > before, timeout=120,
                   what=f"the last {CONSUMER} instance {last.owner} to take over and process")
        done("4 scale-down")

        # 5. scale-up again, with crashes
        for r in range(rounds):
            for p in PRODUCERS:
                feed(p, 20 * scale)
            for i in range(3 - len(net.live("bank-b"))):
                net.add("bank-b", "producer", f"bank-b-up{r}.{i}", slots=3)
            if len(net.live(CONSUMER)) < 2:
                net.add(CONSUMER, "consumer", f"{CONSUMER}-up{r}")
            holder = wait_until(lambda: net.consumer_holder(CONSUMER), timeout=60,
                                what="a consumer lease holder")
            net.restart(holder)
            net.restart(rng.choice(net.live("bank-b")))
            before = _received(dsns[CONSUMER])
            wait_until(lambda b=before: _received(dsns[CONSUMER]) > b, timeout=120,
                       what="the consumer to process after the scale-up")
        done("5 scale-up")

        # 6. drain (bounded; what is left undone is reported below with everything else)
        want = {**recorded, LATE: late_count}
        try:
            wait_until(lambda: all(final_count(dsns[p]) == n for p, n in want.items())
                       and _unprocessed(lake, dsns[CONSUMER]) == 0,
                       timeout=600 if soak else 120,
                       what="every posting to have its result and every copy on "
                            f"{POSTINGS}/{CONSUMER} (replays too) to be processed")
        except AssertionError as exc:
            drain_error = str(exc)
        done("6 drain")
    finally:
        net.stop_all()
        for db in dbs.values():
            db.close()

    failures: list[str] = []
    if drain_error:
        failures.append(f"drain: {drain_error}")
    expected = {p: {f"{p}-{i:06d}": expected_status(f"{p}-{i:06d}") for i in range(recorded[p])}
                for p in PRODUCERS}
    expected[LATE] = dict.fromkeys(late_ids, "OK")

    # every posting final, with the consumer's verdict (items 1-3)
    for p, want_status in expected.items():
        got = statuses(dsns[p])
        assert set(got) == set(want_status), p
        stuck = sorted(m for m, (a, _) in got.items() if a == "nacked_posting")
        if stuck:
            failures.append(f"{p}: {len(stuck)}/{len(got)} posting(s) stranded nacked_posting, "
                            f"e.g. {stuck[:3]} (item 1: no takeover of a lost instance's slot)")
        unanswered = sorted(m for m, (a, _) in got.items() if a == "acked_posting")
        if unanswered:
            failures.append(f"{p}: {len(unanswered)}/{len(got)} posting(s) acked_posting without "
                            f"a result, e.g. {unanswered[:3]}"
                            + (" (item 2: the late sender is never answered)" if p == LATE else ""))
        wrong = sorted(m for m, (a, s) in got.items() if a == "acked_result" and s != want_status[m])
        if wrong:
            failures.append(f"{p}: {len(wrong)} posting(s) with a status the consumer did not give: "
                            f"{[(m, got[m][1]) for m in wrong[:5]]} (item 3 spoof)")

    # RESULTS: exactly one consumer result per posting (the spoofs excluded by their offsets)
    results = lake.queue(RESULTS)
    for p, want_status in expected.items():
        table = results.read_arrow(partition=p).select(["message_id", "status", "_offset"])
        got = Counter(r["message_id"] for r in table.to_pylist()
                      if spoofs.get((p, r["message_id"])) != r["_offset"])
        missing = sorted(set(want_status) - set(got))
        twice = sorted(m for m, n in got.items() if n > 1)
        if missing:
            failures.append(f"{p}: {len(missing)} posting(s) without a consumer result in "
                            f"RESULTS, e.g. {missing[:3]}")
        if twice:
            failures.append(f"{p}: results published twice: {twice[:5]}")
        assert set(got) <= set(want_status), p

    # POSTINGS: never two copies of one (posting, replay number); replays are 0..replays
    copies = Counter((r["sender"], r["message_id"], r["replays"]) for r in lake.queue(POSTINGS)
                     .read_arrow(partition=CONSUMER)
                     .select(["sender", "message_id", "replays"]).to_pylist())
    twice = [k for k, n in copies.items() if n > 1]
    if twice:
        failures.append(f"POSTINGS copies published twice: {twice[:5]}")
    for p in expected:
        with psycopg.connect(dsns[p]) as conn:
            replays = dict(conn.execute("SELECT message_id, replays FROM messages "
                                        "WHERE ack_status <> 'nacked_posting'").fetchall())
        published: dict[str, set[int]] = {}
        for (s, m, r) in copies:
            if s == p:
                published.setdefault(m, set()).add(r)
        bad = sorted(m for m, r in replays.items() if published.get(m) != set(range(r + 1)))
        if bad:
            failures.append(f"{p}: replay numbers published != 0..replays for {bad[:5]}")

    # each producer's `check --complete` (the CLI): clean but for its spoof issue (item 3)
    for p in expected:
        report = _check(net, p, "producer", failures)
        if report is None:
            continue
        if report["problems"]:
            failures.append(f"{p}: check --complete: {len(report['problems'])} problem(s), e.g. "
                            f"{report['problems'][:3]}")
        issues = sorted((i["kind"], i["message_id"]) for i in report["issues"])
        spoofed = {m for (s, m) in spoofs if s == p}
        if {m for _, m in issues} != spoofed or any(k == "duplicate_result" for k, _ in issues):
            failures.append(f"{p}: consistency issues {issues}, wanted exactly one (not a "
                            f"duplicate_result) for each spoofed posting {sorted(spoofed)} "
                            "(item 3 spoof)")
        if report["exit"] != (1 if issues or report["problems"] else 0):
            failures.append(f"{p}: check exited {report['exit']} with {len(issues)} issue(s)")
    # the consumer's `check --complete`: every received posting has its published result (item 6)
    report = _check(net, CONSUMER, "consumer", failures)
    if report is not None and (report["exit"] != 0 or report["issues"] or report["problems"]):
        failures.append(f"{CONSUMER}: consumer check --complete exited {report['exit']}: "
                        f"{report['issues'][:3]} {report['problems'][:3]}")

    # the spoofed postings: detected, never changed by the spoof (item 3)
    for (p, mid) in spoofs:
        with psycopg.connect(dsns[p]) as conn:
            applied = [r[0] for r in conn.execute(
                "SELECT detail->>'status' FROM audit WHERE sender = %s AND message_id = %s AND "
                "action = 'result_received' ORDER BY id", (p, mid))]
            stored = [r[0] for r in conn.execute(
                "SELECT kind FROM consistency_issues WHERE message_id = %s", (mid,))]
        if applied != ["OK"]:
            failures.append(f"{p}/{mid}: results applied {applied}, wanted only the consumer's "
                            "['OK'] (item 3: the spoof changed the posting)")
        if not [k for k in stored if k != "duplicate_result"]:
            failures.append(f"{p}/{mid}: spoofed result not stored as its own consistency "
                            f"issue (issues for it: {stored}) (item 3)")

    # the consumer: one received row per posting (no posting processed twice)
    with psycopg.connect(dsns[CONSUMER]) as conn:
        n, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT (sender, message_id)) FROM received").fetchone()
    total = sum(len(v) for v in expected.values())
    if (n, distinct) != (total, total):
        failures.append(f"{CONSUMER}: received {n} rows, {distinct} distinct, wanted {total}")

    assert not failures, (f"{len(failures)} failure(s) (bank-a ran on one instance after losing "
                          f"{stranded} posting(s) in flight; phases ended at {timings}):\n"
                          + "\n".join(failures) + "\n" + net.log_tails(5))
