"""Issue 23 item 2: app transactions that expire, and a producer whose id expired.

Delta's ``delta.setTransactionRetentionDuration`` forgets an app transaction only through its
``lastUpdated``; the platform stamps it (from ``cues_platform.clock``) on what may expire and
on nothing else. delta-rs compares ``lastUpdated`` with the real time of each snapshot load, so
these tests age a commit by moving the platform's clock back before it (``clock.advance``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from cues_platform import clock
from cues_platform.queues import ProducerFencedError, SequenceMismatchError, TransactionalProducer
from cues_platform.queues.appender import append_batches
from cues_platform.queues.maintenance import checkpoint, set_app_transaction_retention
from cues_platform.queues.producer import UnknownProducerIdError
from tests.support import rows

DAY_MS = 86_400_000
RETENTION = "delta.setTransactionRetentionDuration"


@pytest.fixture(autouse=True)
def real_clock() -> Iterator[None]:
    clock.reset()
    yield
    clock.reset()


MARGIN_S = 8  # what a test does between its aged commits and their expiry


def age_commits() -> None:
    """Stamp the commits that follow as ``1 day - MARGIN_S`` old: under a 1-day retention they
    expire ``MARGIN_S`` seconds of real time later (delta-rs compares with its own clock)."""
    clock.advance(seconds=-(86_400 - MARGIN_S))


def wait_expired(q, app_id: str) -> None:
    clock.reset()
    deadline = time.monotonic() + MARGIN_S + 30
    while DeltaTable(q.uri).transaction_version(app_id) is not None:
        assert time.monotonic() < deadline, f"delta-rs never expired {app_id}"
        time.sleep(0.2)


def ids(q, partition: str = "0") -> list[int]:
    return q.read_arrow(partition=partition)["id"].to_pylist()


def logged_txns(uri: str) -> dict[str, dict]:
    """Every app transaction in the JSON commits of a table's log, the newest per app id."""
    out: dict[str, dict] = {}
    for entry in sorted(Path(uri, "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                out[action["txn"]["appId"]] = action["txn"]
    return out


def checkpoint_txns(uri: str) -> list[dict]:
    newest = sorted(Path(uri, "_delta_log").glob("*.checkpoint.parquet"))[-1]
    return [t for t in pq.read_table(newest, columns=["txn"])["txn"].to_pylist() if t]


# -- 1. what delta-rs 1.6 does ---------------------------------------------------------------
def test_delta_rs_expires_only_app_transactions_whose_last_updated_is_older_than_the_retention(
    tmp_path: Path,
) -> None:
    """Pinned so that a delta-rs upgrade that changes it fails here: ``Transaction`` takes
    ``last_updated`` (ms); with the retention set, a snapshot (log replay or checkpoint) drops
    an entry whose ``lastUpdated`` is older than the retention, keeps a newer one, and keeps an
    entry without ``lastUpdated`` whatever its age; the checkpoint file no longer holds the
    expired one; a table without the retention keeps everything."""
    one = pa.table({"x": [1]})
    now = int(time.time() * 1000)
    txns = [
        Transaction("old", 1, last_updated=now - 2 * DAY_MS),
        Transaction("recent", 2, last_updated=now - DAY_MS // 2),
        Transaction("unstamped", 3),
    ]
    assert txns[0].last_updated == now - 2 * DAY_MS and txns[2].last_updated is None
    with_retention, without = str(tmp_path / "with"), str(tmp_path / "without")
    write_deltalake(with_retention, one, configuration={RETENTION: "interval 1 days"})
    write_deltalake(without, one)
    for uri in (with_retention, without):
        write_deltalake(uri, one, mode="append",
                        commit_properties=CommitProperties(app_transactions=txns))

    def seen(uri: str) -> dict[str, int | None]:
        dt = DeltaTable(uri)
        return {a: dt.transaction_version(a) for a in ("old", "recent", "unstamped")}

    assert seen(with_retention) == {"old": None, "recent": 2, "unstamped": 3}  # log replay
    DeltaTable(with_retention).create_checkpoint()
    assert seen(with_retention) == {"old": None, "recent": 2, "unstamped": 3}  # checkpoint
    assert sorted(t["appId"] for t in checkpoint_txns(with_retention)) == ["recent", "unstamped"]
    DeltaTable(without).create_checkpoint()
    assert seen(without) == {"old": 1, "recent": 2, "unstamped": 3}
    # a stamped entry written again with a fresh stamp is back (an active producer never expires)
    write_deltalake(with_retention, one, mode="append", commit_properties=CommitProperties(
        app_transactions=[Transaction("old", 5, last_updated=now)]))
    assert DeltaTable(with_retention).transaction_version("old") == 5


# -- 2. what the platform stamps ---------------------------------------------------------------
def test_only_producer_ids_epochs_and_queue_transaction_markers_carry_last_updated(lake) -> None:
    """``prod:``, ``pepoch:`` and a queue's ``txn:`` marker carry the clock's ms; offsets
    (``part:``), a processor's ``proc:``/``pos:``/``epoch:``, tailer positions and the
    coordinator's ``tid:``/``cur:``/``txn:`` carry none (they must never expire)."""
    q = lake.create_queue("events", schema=rows(0, 1).schema, partitions=("0",))
    clock.advance(seconds=-3600)
    before = clock.now_ms()
    q.producer(producer_id="p").send(rows(0, 2), partition="0")
    txp = TransactionalProducer(lake, transactional_id="t1")
    txp.init_transactions()
    txp.begin()
    txp.send(q, rows(10, 1), partition="0")
    txp.commit()
    append_batches(q, {"0": rows(20, 1)}, app_transactions=[("proc:lane", 4), ("pos:lane:x:0", 9),
                                                              ("epoch:lane", 2)])
    q.tailer("billing", partition="0").commit(1)
    after = clock.now_ms()
    assert after < time.time() * 1000 - 3_000_000  # the clock in use is the moved one

    queue_txns = logged_txns(q.uri)
    stamped = {a for a, t in queue_txns.items() if t.get("lastUpdated") is not None}
    markers = {a for a in queue_txns if a.startswith("txn:")}
    assert len(markers) == 1  # the one transaction's marker, rolled forward onto the queue
    assert stamped == {"prod:p", "pepoch:p", "prod:txn:t1", "pepoch:txn:t1", *markers}
    assert all(before <= queue_txns[a]["lastUpdated"] <= after for a in stamped)
    for app in ("part:0", "proc:lane", "pos:lane:x:0", "epoch:lane"):
        assert queue_txns[app].get("lastUpdated") is None, app
    for system in ("positions", "transactions"):
        txns = logged_txns(lake.system_uri(system))
        assert txns and all(t.get("lastUpdated") is None for t in txns.values()), system


def test_a_clock_ahead_never_stamps_a_producer_id_in_delta_rs_future(lake) -> None:
    """A platform clock a year ahead (a skewed machine, the time nemesis) stamps ``lastUpdated``
    with the real time, not the year ahead: delta-rs never expires a stamp in its future, so such
    ids would stay in every checkpoint for ever; with the real stamp they expire at the retention
    like any other. (A clock behind still stamps its own, older, time: see the test above.)"""
    q = lake.create_queue("events", schema=rows(0, 1).schema, partitions=("0",))
    clock.advance(seconds=365 * 86_400)
    before = time.time_ns() // 1_000_000
    q.producer(producer_id="p").send(rows(0, 2), partition="0")
    after = time.time_ns() // 1_000_000
    stamps = {a: t["lastUpdated"] for a, t in logged_txns(q.uri).items() if "lastUpdated" in t}
    assert set(stamps) == {"prod:p", "pepoch:p"}
    assert all(before <= v <= after for v in stamps.values()), stamps


# -- 3. a producer whose id expired ------------------------------------------------------------
def test_an_expired_producer_never_writes_twice_and_a_new_instance_takes_a_new_epoch(lake) -> None:
    q = lake.create_queue("events", schema=rows(0, 1).schema, partitions=("0",))
    set_app_transaction_retention(q, days=1)
    age_commits()
    old = q.producer(producer_id="p")
    for i in range(3):
        old.send(rows(10 * i, 2), partition="0")
    wait_expired(q, "pepoch:p")
    checkpoint(q)
    dt = q.refresh()
    assert dt.transaction_version("prod:p") is None and dt.transaction_version("pepoch:p") is None
    assert dt.transaction_version("part:0") == 6  # offsets never expire
    assert not [t for t in checkpoint_txns(q.uri) if t["appId"].endswith(":p")]
    before = ids(q)

    # the old instance resends its last batch (an acknowledgement it never got): typed, no write
    with pytest.raises(UnknownProducerIdError) as info:
        old.send(rows(20, 2), partition="0", sequence=2)
    err = info.value
    assert (err.queue, err.producer_id, err.sequence, err.epoch) == ("events", "p", 2, old.epoch)
    assert not err.retryable and "open a new producer" in str(err) and "'p'" in str(err)
    with pytest.raises(UnknownProducerIdError):  # final for that instance
        old.send(rows(99, 1), partition="0")
    assert ids(q) == before

    # a new instance: a resend of an old sequence is verified against the log, never rewritten
    new = q.producer(producer_id="p")
    assert new.next_sequence == 0
    again = new.send(rows(20, 2), partition="0", sequence=2)
    assert again.duplicate and again.ranges == {"0": (4, 6)}
    with pytest.raises(SequenceMismatchError):
        new.send(rows(77, 2), partition="0", sequence=2)
    with pytest.raises(UnknownProducerIdError) as info:  # no such commit: cannot be verified
        new.send(rows(30, 2), partition="0", sequence=7)
    assert info.value.data["expired"] is False and "sequence 0" in str(info.value)
    assert ids(q) == before
    # ... its own sequences start again at 0, at an epoch no expired instance held
    assert new.send(rows(40, 1), partition="0").ranges == {"0": (6, 7)}
    assert new.epoch is not None and new.epoch != old.epoch
    assert ids(q) == [*before, 40]


def test_an_instance_whose_epoch_expired_is_fenced_not_revived_by_a_newer_open(lake) -> None:
    """The epoch of an open that finds none is the clock's ms on a table with the retention,
    so it differs from the expired instance's (which would otherwise pass the fence again)."""
    q = lake.create_queue("events", schema=rows(0, 1).schema, partitions=("0",))
    set_app_transaction_retention(q, days=1)
    age_commits()
    zombie = q.producer(producer_id="p")
    zombie.send(rows(0, 1), partition="0")
    wait_expired(q, "pepoch:p")
    newer = q.producer(producer_id="p")
    assert newer.open() > zombie.epoch
    with pytest.raises(ProducerFencedError):
        zombie.send(rows(1, 1), partition="0")
    assert newer.send(rows(5, 1), partition="0").ranges == {"0": (1, 2)}
    assert ids(q) == [0, 5]


def test_an_expired_queue_marker_is_resolved_from_the_coordinator(lake) -> None:
    q = lake.create_queue("events", schema=rows(0, 1).schema, partitions=("0",))
    set_app_transaction_retention(q, days=1)
    age_commits()
    txp = TransactionalProducer(lake, transactional_id="t1")
    txp.init_transactions()
    committed = txp.begin()
    txp.send(q, rows(0, 2), partition="0")
    txp.commit()
    aborted = txp.begin()
    txp.send(q, rows(5, 1), partition="0")
    txp.abort()
    # each id expires MARGIN_S after its own write: the abort's marker is the last one written
    for app_id in ("pepoch:txn:t1", f"txn:{committed}", f"txn:{aborted}"):
        wait_expired(q, app_id)
    checkpoint(q)
    assert not [t for t in checkpoint_txns(q.uri) if t["appId"].startswith("txn:")]
    fresh = lake.queue("events")
    assert fresh.read_arrow(partition="0", isolation="read_committed")["id"].to_pylist() == [0, 1]
    # the same transactional producer, idle past the retention: its epoch on the queue is gone
    txp.begin()
    with pytest.raises(UnknownProducerIdError):
        txp.send(q, rows(7, 1), partition="0")
    txp.abort()
    txp.init_transactions()  # new epochs on the queues at the next send
    txp.begin()
    txp.send(q, rows(8, 1), partition="0")
    txp.commit()
    assert fresh.read_arrow(partition="0", isolation="read_uncommitted")["id"].to_pylist() == [
        0, 1, 5, 8]
    assert fresh.read_arrow(partition="0", isolation="read_committed")["id"].to_pylist() == [0, 1, 8]


# -- 4. the snapshot cache -----------------------------------------------------------------------
def test_the_snapshot_cache_never_answers_an_id_that_may_expire_from_an_old_reading(lake) -> None:
    """delta-rs measures expiry at each load, so one version's answer for ``prod:p`` changes
    with time; a processor's ``proc:`` (never expires) is still cached."""
    q = lake.create_queue("events", schema=rows(0, 1).schema, partitions=("0",))
    q.refresh().alter.set_table_properties({RETENTION: "interval 2 seconds"})
    q.producer(producer_id="p").send(rows(0, 1), partition="0")
    append_batches(q, {"0": rows(1, 1)}, app_transactions=[("proc:lane", 1)])
    dt = q.refresh()
    assert q.txn_version("prod:p", snapshot=dt) == 0 and q.txn_version("proc:lane", snapshot=dt) == 1
    deadline = time.monotonic() + 30
    while DeltaTable(q.uri).transaction_version("prod:p") is not None:  # delta-rs' real clock
        assert time.monotonic() < deadline, "delta-rs never expired prod:p"
        time.sleep(0.2)
    assert dt.version() == q.refresh().version()
    assert q.txn_version("prod:p", snapshot=dt) is None
    assert q.txn_version("proc:lane", snapshot=dt) == 1
