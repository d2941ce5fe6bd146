"""Instance leases: which instance may act for a slot (publishing) or a role (consuming).

A lease is a row of ``leases``: ``(name, owner, epoch, lease_until)``. Claiming contract:

1. ``SELECT ... FOR UPDATE SKIP LOCKED`` the first lease row (of the wanted names) that is free
   or expired (``lease_until < now()``); rows another instance is claiming right now are skipped.
2. Set ``owner`` = this instance, ``epoch`` = epoch + 1, ``lease_until`` = now() + ttl; commit.
3. Renew before expiry with ``UPDATE ... WHERE name AND owner AND epoch`` (0 rows: lost).

Every protocol write done under a lease checks ``owner``/``epoch`` in the same transaction
(:func:`check_lease`), so an instance that stalled past its lease (and was replaced) has its
writes refused with :class:`LeaseLostError`. An instance that dies (SIGKILL) simply stops renewing:
its lease expires after ``ttl`` and another instance claims it. Times are the DB server's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass

import psycopg

from cues_platform.participants.errors import LeaseLostError


@dataclass(frozen=True)
class Lease:
    name: str
    owner: str
    epoch: int


def ensure_leases(conn: psycopg.Connection, names: Sequence[str]) -> None:
    for name in names:
        conn.execute("INSERT INTO leases (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (name,))


def claim(conn: psycopg.Connection, names: Sequence[str], owner: str, ttl: float) -> Lease | None:
    """Claim one free or expired lease among ``names`` (call inside a transaction)."""
    # Step 1
    row = conn.execute(
        "SELECT name FROM leases WHERE name = ANY(%s) AND (lease_until < now() OR owner = %s) "
        "ORDER BY (owner = %s) DESC NULLS LAST, name LIMIT 1 FOR UPDATE SKIP LOCKED",
        (list(names), owner, owner),
    ).fetchone()
    if row is None:
        return None
    # Step 2
    name, epoch = conn.execute(
        "UPDATE leases SET owner = %s, epoch = epoch + 1, "
        "lease_until = now() + make_interval(secs => %s) WHERE name = %s RETURNING name, epoch",
        (owner, ttl, row[0]),
    ).fetchone()
    return Lease(name, owner, int(epoch))


def renew(conn: psycopg.Connection, lease: Lease, ttl: float) -> None:
    """Step 3: extend the lease or raise :class:`LeaseLostError`."""
    cur = conn.execute(
        "UPDATE leases SET lease_until = now() + make_interval(secs => %s) "
        "WHERE name = %s AND owner = %s AND epoch = %s AND lease_until >= now()",
        (ttl, lease.name, lease.owner, lease.epoch),
    )
    if cur.rowcount != 1:
        raise LeaseLostError(f"lease {lease.name!r} (epoch {lease.epoch}) was lost by {lease.owner}",
                             lease=lease.name, owner=lease.owner, epoch=lease.epoch)


def check_lease(conn: psycopg.Connection, lease: Lease) -> int:
    """Lock the lease row and check it is still ours; returns the slot's next sequence."""
    row = conn.execute(
        "SELECT owner, epoch, next_seq FROM leases WHERE name = %s FOR UPDATE", (lease.name,)
    ).fetchone()
    if row is None or row[0] != lease.owner or int(row[1]) != lease.epoch:
        raise LeaseLostError(f"lease {lease.name!r} (epoch {lease.epoch}) is no longer held by "
                             f"{lease.owner}", lease=lease.name, owner=lease.owner, epoch=lease.epoch)
    return int(row[2])


def release(conn: psycopg.Connection, lease: Lease) -> None:
    conn.execute(
        "UPDATE leases SET lease_until = '-infinity' WHERE name = %s AND owner = %s AND epoch = %s",
        (lease.name, lease.owner, lease.epoch),
    )


class LeaseKeeper:
    """Claims one lease among ``names`` and renews it every ``ttl / 3`` from a background thread
    with its own connection, so a long step (a Spark start, a slow publish) never lets it lapse
    while the process is alive; a SIGKILL stops the renewals and the lease expires after ``ttl``.
    ``lease`` is the held lease or None; protocol writes still check it in their transactions."""

    def __init__(self, dsn: str, *, app: str, names: Sequence[str], owner: str, ttl: float) -> None:
        import threading

        from cues_platform.participants.db import Database

        self.db = Database(dsn, app=app, attempts=3, max_delay=ttl / 2)
        self.names, self.owner, self.ttl = list(names), owner, ttl
        self.lease: Lease | None = None
        self.changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{owner}", daemon=True)

    def start(self) -> LeaseKeeper:
        self._beat()
        self._thread.start()
        return self

    def _beat(self) -> None:
        import logging

        from cues_platform.participants.errors import ParticipantError

        lease = self.lease
        try:
            if lease is None:
                self.lease = self.db.run(lambda c: claim(c, self.names, self.owner, self.ttl),
                                         what="claim lease")
                if self.lease is not None:
                    self.changed.set()
            else:
                self.db.run(lambda c: renew(c, lease, self.ttl), what="renew lease")
        except LeaseLostError:
            self.lease = None
            self.changed.set()
        except ParticipantError as exc:  # DB unavailable: keep trying; the lease may lapse
            logging.getLogger(__name__).warning("lease heartbeat failed: %s", exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self._beat()

    def lost(self) -> None:
        """The main thread saw the lease refused: drop it (the keeper claims again)."""
        self.lease = None

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.ttl)
        lease = self.lease
        if lease is not None:
            with suppress(Exception):  # expiry releases it anyway
                self.db.run(lambda c: release(c, lease), what="release lease")
        self.db.close()
