"""Issue 23 item 5, "one clock": leases are judged by the database server's clock (``now()``),
never by an instance's platform clock, so an instance whose clock runs a year ahead cannot take a
lease another instance holds and renews (``participants/leases.py``).

Two real processes against one PostgreSQL database: the holder (this test process) keeps
``slot:0`` with a :class:`LeaseKeeper`; a second process, its platform clock advanced a year
(``cues_platform.clock.advance``), runs a LeaseKeeper for the same slot for several lease TTLs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from cues_platform import clock
from cues_platform.participants import leases
from cues_platform.participants.db import Database
from tests.support import ROOT

TTL = 5.0  # renewed every TTL / 3: a loaded machine must not let the holder's lease lapse
YEAR_S = 365 * 86_400

SKEWED = """
import json, sys, threading, time
from cues_platform import clock
from cues_platform.participants.leases import LeaseKeeper

dsn, ttl, window, year = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
clock.advance(seconds=year)
ahead_s = (clock.now_ms() - time.time_ns() // 1_000_000) / 1000
keeper = LeaseKeeper(dsn, app="skewed", names=["slot:0"], owner="skewed", ttl=ttl).start()
got, stop = None, threading.Event()
deadline = time.monotonic() + window
while time.monotonic() < deadline and got is None:  # polls until it holds the lease or time is up
    lease = keeper.lease
    got = None if lease is None else [lease.owner, lease.epoch]
    stop.wait(0.05)
keeper.stop()
print(json.dumps({"ahead_s": ahead_s, "got": got}))
"""


@pytest.fixture(autouse=True)
def real_clock() -> Iterator[None]:
    clock.reset()
    yield
    clock.reset()


def _skewed_keeper(dsn: str, *, window: float) -> dict:
    proc = subprocess.run([sys.executable, "-c", SKEWED, dsn, str(TTL), str(window), str(YEAR_S)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _row(dsn: str) -> tuple:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT owner, epoch, lease_until FROM leases WHERE name = 'slot:0'"
                            ).fetchone()


def test_an_instance_a_year_ahead_cannot_take_a_lease_another_instance_renews(make_db) -> None:
    dsn = make_db("bank-a")
    db = Database(dsn)
    db.migrate()
    db.run(lambda c: leases.ensure_leases(c, ["slot:0"]))
    db.close()
    holder = leases.LeaseKeeper(dsn, app="holder", names=["slot:0"], owner="holder", ttl=TTL).start()
    try:
        assert holder.lease == leases.Lease("slot:0", "holder", 1)
        first_until = _row(dsn)[2]

        skewed = _skewed_keeper(dsn, window=2 * TTL + 1)  # an unrenewed lease would have expired

        assert skewed["ahead_s"] >= YEAR_S - 1  # its platform clock really was a year ahead
        assert skewed["got"] is None
        owner, epoch, until = _row(dsn)
        assert (owner, epoch) == ("holder", 1) and until > first_until  # renewed, never taken
        assert holder.lease == leases.Lease("slot:0", "holder", 1)
    finally:
        holder.stop()  # releases slot:0

    # the same skewed process claims a lease that is free: its refusal above was the holder's
    taken = _skewed_keeper(dsn, window=30)
    assert taken["got"] == ["skewed", 2]
