"""Issue 10 items 1, 7 and the bail loop of 6: slots of instances gone for good are taken over,
a re-publish keeps its content (and is deduplicated), a publication that keeps bailing backs off
with a bounded audit trail.

In process: ProducerInstance objects on a real PostgreSQL and a real lake; an instance "dies" like
a SIGKILL (heartbeat stopped, nothing released). As processes: `tests/participants/harness.py`
instances SIGKILLed and never restarted, scaling 3 -> 1 and then to a generation with --slots 1.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from cues_platform.participants.checks import check_producer
from cues_platform.participants.db import Database
from cues_platform.participants.leases import plan
from cues_platform.participants.model import POSTINGS, RESULTS, Settings
from cues_platform.participants.network import register
from cues_platform.participants.postings import Posting, post_many
from cues_platform.participants.replay import replay_pending
from cues_platform.participants.slots import bail_delay, producer_id
from cues_platform.queues import Lake, Producer
from tests.participants.harness import Instance, Network, child_env, wait_until
from tests.participants.takeover_support import (
    all_acked,
    die,
    drive,
    instance,
    query,
    slot_owners,
)
from tests.support import soak_enabled

FAST = Settings(lease_seconds=1.5, batch_size=10, idle_poll=0.01, replay_after=3600.0)


def _post(lake: Lake, dsn: str, count: int, prefix: str) -> int:
    db = Database(dsn)
    try:
        return post_many(db, lake, sender="bank-a", postings=[
            Posting("bank-x", f"{prefix}{i:05d}", json.dumps({"amount": i})) for i in range(count)])
    finally:
        db.close()


def _postings_rows(lake: Lake) -> Counter:
    t = lake.queue(POSTINGS).read_arrow(partition="bank-x").select(["message_id", "replays"])
    return Counter((r["message_id"], r["replays"]) for r in t.to_pylist())


def test_dead_slots_are_taken_over_by_the_last_instance(
        lake: Lake, make_db: Callable[[str], str]) -> None:
    """3 instances, 2 die for good mid-publication (one after assigning, one after its POSTINGS
    commit): the survivor takes both slots over and every posting is acked exactly once."""
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn = make_db("bank-a")
    a, b, c = (instance(lake, dsn, name, slots=3, settings=FAST) for name in "abc")
    assert slot_owners(dsn) == {"slot:0": "a", "slot:1": "b", "slot:2": "c"}
    _post(lake, dsn, 60, "m")
    # b dies after step 2 (its publication assigned, never sent)
    b_taken = b.db.run(b._take_publication)
    # c dies after step 3's commit (on POSTINGS, not acked in its DB)
    c_taken = c.db.run(c._take_publication)
    Producer(c.postings, producer_id=producer_id("bank-a", 2)).send_many(
        c._batches(c_taken[2]), sequence=c_taken[0])
    die(b)
    die(c)
    drive([a], lambda: all_acked(dsn), timeout=60, what="the survivor to drain every slot")

    assert slot_owners(dsn) == {"slot:0": "a", "slot:1": "a", "slot:2": "a"}
    assert _postings_rows(lake) == Counter({(f"m{i:05d}", 0): 1 for i in range(60)})
    republished = dict(query(dsn, "SELECT message_id, detail->>'duplicate' FROM audit "
                                  "WHERE action = 'republished'"))
    assert republished == {**{r[1]: "false" for r in b_taken[2]},
                           **{r[1]: "true" for r in c_taken[2]}}
    # item 7: a re-publish is the same posting: replays and last_datum unchanged (see the doc)
    assert query(dsn, "SELECT count(*) FROM messages WHERE replays <> 0 "
                      "OR last_datum <> inception_datum") == [(0,)]
    # and up again: two new instances join; a hands two slots over (fair share), and all keep
    # publishing
    b2, c2 = (instance(lake, dsn, name, slots=3, settings=FAST, holding=False)
              for name in ("b2", "c2"))
    _post(lake, dsn, 30, "n")
    drive([a, b2, c2], lambda: all_acked(dsn) and set(slot_owners(dsn).values()) == {
        "a", "b2", "c2"}, timeout=60, what="one slot per instance after scaling up")
    assert len(_postings_rows(lake)) == 90 and set(_postings_rows(lake).values()) == {1}
    for inst in (a, b2, c2):
        inst.close()


def test_fair_share_plan() -> None:
    """The keeper's rule: claim under the share, release to a member two below (scale-up)."""
    assert plan(3, {"a": 0}, "a") == 1  # alone: every slot
    assert plan(3, {"a": 1}, "a") == 1
    assert plan(3, {"a": 3}, "a") == 0
    assert plan(3, {"a": 3, "b": 0}, "a") == -1 and plan(3, {"a": 3, "b": 0}, "b") == 1
    assert plan(3, {"a": 2, "b": 1}, "a") == 0  # b would take a free one; a keeps its two
    assert plan(3, {"a": 1, "b": 1}, "a") == 1  # a slot left over: the least loaded take it
    assert plan(3, {"a": 1, "b": 1, "c": 1}, "a") == 0
    assert plan(4, {"a": 2, "b": 2, "c": 0}, "a") == -1  # c gets one of a's
    assert plan(4, {"a": 1, "b": 2, "c": 1}, "b") == 0  # then it is stable
    assert plan(2, {"a": 1, "b": 1, "c": 0}, "a") == 0  # more instances than slots: standbys


def test_stalled_holder_is_fenced_after_takeover(
        lake: Lake, make_db: Callable[[str], str]) -> None:
    """Lease expiry while publishing: z stalls inside its critical section past its lease; a
    takes the slot over and publishes; when z wakes, its send is fenced on POSTINGS and its DB
    writes are refused: one copy, acked once, by a."""
    from cues_platform.participants.errors import LeaseLostError
    from cues_platform.queues.errors import ProducerFencedError

    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn = make_db("bank-a")
    a, z = (instance(lake, dsn, name, slots=2, settings=FAST) for name in ("a", "z"))
    _post(lake, dsn, 8, "m")
    taken = z.db.run(z._take_publication)  # z's critical section starts...
    stale = Producer(z.postings, producer_id=producer_id("bank-a", z.slot))
    stale.open()
    die(z)  # ... and z stalls: no heartbeat, nothing released
    drive([a], lambda: all_acked(dsn), timeout=60, what="a to take z's slot over")
    with pytest.raises(ProducerFencedError):
        stale.send_many(z._batches(taken[2]), sequence=taken[0])
    with pytest.raises(LeaseLostError):
        z.db.run(z._take_publication)
    assert _postings_rows(lake) == Counter({(f"m{i:05d}", 0): 1 for i in range(8)})
    assert query(dsn, "SELECT DISTINCT instance_id FROM audit WHERE action = 'posting_acked'"
                 ) == [("a",)]
    a.close()


def test_next_generation_with_fewer_slots_drains_every_old_slot(
        lake: Lake, make_db: Callable[[str], str]) -> None:
    """Generation 1 (3 instances, --slots 3) dies with a publication open on every slot;
    generation 2 is ONE instance started with --slots 1: it drains slot:0, slot:1 and slot:2."""
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn = make_db("bank-a")
    gen1 = [instance(lake, dsn, name, slots=3, settings=FAST) for name in ("g1-0", "g1-1", "g1-2")]
    _post(lake, dsn, 45, "m")
    for inst in gen1:
        assert inst.db.run(inst._take_publication) is not None
        die(inst)
    assert query(dsn, "SELECT count(DISTINCT slot) FROM publications WHERE acked_at IS NULL"
                 ) == [(3,)]
    g2 = instance(lake, dsn, "g2-0", slots=1, settings=FAST, holding=False)  # leases unexpired
    drive([g2], lambda: all_acked(dsn), timeout=60, what="generation 2 to drain slots 0-2")
    assert set(slot_owners(dsn).values()) == {"g2-0"}
    assert _postings_rows(lake) == Counter({(f"m{i:05d}", 0): 1 for i in range(45)})
    g2.close()


def test_unacked_replay_publication_keeps_its_content(
        lake: Lake, make_db: Callable[[str], str]) -> None:
    """Item 7: a replay publication committed to POSTINGS just before its holder died is re-sent
    by the next holder with the SAME content (deduplicated): the start-up replay of the new
    holder does not replay those postings again (that changed last_datum/replays under the used
    sequence and the re-publish was refused as different content, forever)."""
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn = make_db("bank-a")
    fast = Settings(lease_seconds=1.5, batch_size=10, idle_poll=0.01, replay_after=0.0)
    a = instance(lake, dsn, "a", slots=1, settings=fast)
    _post(lake, dsn, 5, "m")
    assert a.publish_once()
    assert replay_pending(a) == 5  # acked, no result: replayed (replays 1, new publication)
    taken = a.db.run(a._take_publication)
    assert taken[1] == "replay"
    Producer(a.postings, producer_id=producer_id("bank-a", 0)).send_many(
        a._batches(taken[2]), sequence=taken[0])  # committed; a dies before recording the ack
    die(a)
    b = instance_after_expiry(lake, dsn, "b", fast)
    drive([b], lambda: all_acked(dsn), timeout=60, what="the replay publication to be acked")
    assert _postings_rows(lake) == Counter({(f"m{i:05d}", r): 1 for i in range(5) for r in (0, 1)})
    assert query(dsn, "SELECT DISTINCT replays FROM messages") == [(1,)]
    acts = Counter(a for (a,) in query(dsn, "SELECT action FROM audit"))
    assert (acts["replay"], acts["replay_acked"], acts["republished"]) == (5, 5, 5)
    assert query(dsn, "SELECT count(*) FROM publications WHERE last_error IS NOT NULL") == [(0,)]
    b.close()


def instance_after_expiry(lake: Lake, dsn: str, name: str, settings: Settings):  # noqa: ANN201
    """An instance started once the dead holder's lease has expired (bounded wait)."""
    wait_until(lambda: query(dsn, "SELECT bool_and(lease_until < now()) FROM leases "
                                  "WHERE name LIKE 'slot:%%'")[0][0],
               timeout=30, poll=0.1, what="the dead instance's lease to expire")
    return instance(lake, dsn, name, slots=1, settings=settings)


def test_bailing_publication_backs_off_and_thins_its_audit(
        lake: Lake, make_db: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 6: a publication that keeps bailing waits longer and longer (capped) between rounds
    and writes publish_bailed at bails 1, 2, 4, 8, 16 and publish_stuck once, not one audit row
    per bail; it is then published with the same sequence once the storage is back."""
    from cues_platform.errors import TransientStorageError
    from cues_platform.participants.errors import PublishBailedError

    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn = make_db("bank-a")
    cfg = Settings(lease_seconds=5, publish_attempts=1, backoff_initial=0.001, backoff_max=0.01,
                   bail_backoff_initial=0.05, bail_backoff_max=0.2, bail_stuck_after=5)
    assert [bail_delay(n, cfg) for n in range(1, 7)] == [0.0, 0.05, 0.1, 0.2, 0.2, 0.2]
    prod = instance(lake, dsn, "a", slots=1, settings=cfg)
    _post(lake, dsn, 3, "m")
    sequences: list[int] = []
    storage_down = True
    real = Producer.send_many

    def flaky(self: Producer, batches: object, **kw: object) -> object:
        sequences.append(kw["sequence"])  # type: ignore[arg-type]
        if storage_down:
            raise TransientStorageError("injected: storage unavailable")
        return real(self, batches, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Producer, "send_many", flaky)
    waited, bailed_at, bail_began = 0, [], []
    for bail in range(1, 21):
        while True:
            began = time.monotonic()
            try:
                assert not prod.publish_once()  # backing off: nothing is sent
            except PublishBailedError as exc:
                assert exc.bails == bail and exc.retry_in == bail_delay(bail, cfg)
                bailed_at.append(time.monotonic())
                bail_began.append(began)
                break
            waited += 1
            prod.stop_event.wait(0.01)
    assert waited > 0 and len(sequences) == 20
    # retry_at is set inside the bail's transaction (DB clock, which runs at the same rate): the
    # next bail comes no earlier than the start of the call that bailed plus the delay, however
    # long that call took on a loaded machine (a bound, not a timing assumption)
    waits = [nxt - began for began, nxt in zip(bail_began, bailed_at[1:], strict=False)]
    assert all(w >= bail_delay(n, cfg) - 0.005 for n, w in enumerate(waits, start=1)), waits
    assert query(dsn, "SELECT bails, attempts FROM publications") == [(20, 20)]
    assert query(dsn, "SELECT DISTINCT retries FROM messages") == [(20,)]
    audit = query(dsn, "SELECT action, (detail->>'bails')::int, count(*) FROM audit "
                       "WHERE action LIKE 'publish_%%' GROUP BY 1, 2 ORDER BY 1, 2")
    assert audit == [("publish_bailed", n, 3) for n in (1, 2, 4, 8, 16)] + [
        ("publish_stuck", 5, 3)]
    storage_down = False
    while not _due(dsn):
        prod.stop_event.wait(0.02)
    assert prod.publish_once()
    assert set(sequences) == {0}  # the same (producer id, sequence) every time
    assert all_acked(dsn)
    assert lake.queue(POSTINGS).read_arrow(partition="bank-x").num_rows == 3
    prod.close()


def _due(dsn: str) -> bool:
    return query(dsn, "SELECT coalesce(bool_and(retry_at IS NULL OR retry_at <= now()), true) "
                      "FROM publications WHERE acked_at IS NULL")[0][0]


# -- real processes, SIGKILL, never restarted -------------------------------------------------------
def _counts(dsn: str) -> dict[str, int]:
    return dict(query(dsn, "SELECT ack_status, count(*) FROM messages GROUP BY 1"))


def _done(dsn: str, total: int) -> bool:
    row = query(dsn, "SELECT count(*) FILTER (WHERE ack_status = 'acked_result'), "
                     "(SELECT count(*) FROM publications WHERE acked_at IS NULL) FROM messages")[0]
    return row == (total, 0)


def _published(dsn: str, prefix: str) -> int:
    return query(dsn, "SELECT count(*) FROM messages WHERE message_id LIKE %s "
                      "AND ack_status <> 'nacked_posting'", (f"{prefix}%",))[0][0]


def _owners(dsn: str) -> set[str]:
    """Live slot holders (instance names without the restart suffix)."""
    return {o.split("#")[0] for (o,) in query(
        dsn, "SELECT owner FROM leases WHERE name LIKE 'slot:%%' AND lease_until >= now()")}


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.skipif(not soak_enabled(), reason="CUES_SOAK=1: ~110 s in CI; phase 4 of "
                    "test_chaos.py::test_chaos_scale_onboard_spoof kills slot and lease holders for good")
def test_scale_down_for_good_real_processes(tmp_path: Path, make_db: Callable[[str], str]) -> None:
    """3 producer instances publishing; 2 are SIGKILLed for good (and the consumer's lease
    holder): the last one serves all three slots. Then it is SIGKILLed mid-flow too and a new
    generation of ONE instance with --slots 1 drains every slot. Every posting ends acked_result
    exactly once and `check --complete` passes."""
    lake = Lake(root=str(tmp_path / "lake"))
    register(lake, producers=["bank-a"], consumers=["bank-x"])
    dsn_a, dsn_x = make_db("bank-a"), make_db("bank-x")
    for dsn in (dsn_a, dsn_x):
        Database(dsn).migrate()
    total = _post(lake, dsn_a, 30, "w0-")
    logs = tmp_path / "logs"
    logs.mkdir()
    net = Network(lake=lake.root, dsns={"bank-a": dsn_a, "bank-x": dsn_x}, env=child_env(
        lease_seconds=2, replay_after=60, batch_size=4, consumer_batch=500, idle_poll=0.02,
        publish_timeout=1.5))
    producers = [Instance("bank-a", "producer", f"bank-a-{i}", dsn_a, 3, logs / f"a{i}.log")
                 for i in range(3)]
    consumers = [Instance("bank-x", "consumer", f"bank-x-{i}", dsn_x, 1, logs / f"x{i}.log")
                 for i in range(2)]
    gen2 = Instance("bank-a", "producer", "bank-a-gen2", dsn_a, 1, logs / "gen2.log")
    net.instances = [*producers, *consumers, gen2]
    for inst in (*producers, *consumers):
        inst.start(lake.root, net.env)
    try:
        # phase 1: each of the 3 instances holding a slot, the consumer answering; then a wave
        # of postings, and 2 instances die for good while it flows
        wait_until(lambda: _owners(dsn_a) == {p.name for p in producers}
                   and _done(dsn_a, total), timeout=180,
                   what="3 slot holders and the results of wave 0")
        total += _post(lake, dsn_a, 300, "w1-")
        wait_until(lambda: _published(dsn_a, "w1-") >= 10, timeout=60, what="wave 1 flowing")
        assert _published(dsn_a, "w1-") < 300, "wave 1 must still be flowing"
        producers[1].kill()
        producers[2].kill()
        owner = query(dsn_x, "SELECT owner FROM leases WHERE name = 'consumer'")[0][0]
        holder = next(c for c in consumers if owner.startswith(f"{c.name}#"))
        holder.kill()
        total += _post(lake, dsn_a, 50, "w2-")
        wait_until(lambda: _done(dsn_a, total), timeout=240, what="phase 1 to complete")
        assert _owners(dsn_a) == {"bank-a-0"}
        # phase 2: the last instance of generation 1 dies mid-flow; generation 2 has --slots 1
        total += _post(lake, dsn_a, 150, "w3-")
        wait_until(lambda: _published(dsn_a, "w3-") >= 10, timeout=60, what="wave 3 flowing")
        producers[0].kill()
        assert _published(dsn_a, "w3-") < 150, "wave 3 must still be flowing"
        gen2.start(lake.root, net.env)
        wait_until(lambda: _done(dsn_a, total), timeout=240, what="generation 2 to drain")
        assert _owners(dsn_a) == {"bank-a-gen2"}
        assert query(dsn_a, "SELECT count(*) FROM leases WHERE name LIKE 'slot:%%'") == [(3,)]
    finally:
        net.stop_all()
    assert [p.kills for p in producers] == [1, 1, 1] and holder.kills == 1
    with Database(dsn_a).connection() as conn:
        report = check_producer(conn, "bank-a", complete=True)
    assert (report.problems[:10], report.issues) == ([], [])
    results = Counter(lake.queue(RESULTS).read_arrow(partition="bank-a")["message_id"].to_pylist())
    assert len(results) == total and set(results.values()) == {1}
    copies = _postings_rows(lake)
    assert set(copies.values()) == {1}  # never published twice: one row per (message, replay)
