"""Instance leases: which instance may act for a slot (publishing) or a role (consuming).

A lease is a row of ``leases``: ``(name, owner, epoch, lease_until)``. Claiming contract:

1. ``SELECT ... FOR UPDATE SKIP LOCKED`` the first lease row (of the wanted names, or matching
   the wanted pattern, e.g. every ``slot:N`` row whatever ``--slots`` says now) that is free or
   expired (``lease_until < now()``) and not already held by the claimer; rows another instance
   is claiming right now are skipped.
2. Set ``owner`` = this instance, ``epoch`` = epoch + 1, ``lease_until`` = now() + ttl; commit.
3. Renew before expiry with ``UPDATE ... WHERE name AND owner AND epoch`` (0 rows: lost).

Every protocol write done under a lease checks ``owner``/``epoch`` in the same transaction
(:func:`check_lease`), so an instance that stalled past its lease (and was replaced) has its
writes refused with :class:`LeaseLostError`. An instance that dies (SIGKILL) simply stops renewing:
its leases expire after ``ttl`` and live instances claim them. A producer instance may hold
several slot leases (:class:`LeaseKeeper` multi mode, fair share by :func:`plan`), so the slots of
instances that are gone for good are served by the ones left.

One clock (issue 23 item 5): every lease time (``lease_until``, ``alive_until``, their expiry
checks) is the PostgreSQL server's ``now()``, never an instance's clock, not even the platform's
``cues_platform.clock.now_ms()`` that the lake's age rules read. A lease is mutual exclusion
between processes on different machines: judged by each claimer's own clock, one running ahead
(a skewed machine, the fault harness's time nemesis) would see a live, renewed lease as expired
and take it while its holder still acts, and one running behind would keep renewing a lease the
others consider gone. The database's clock is one clock that every instance of a participant
shares, read in the same transaction that claims, renews or checks (:func:`check_lease`), so a
lease's validity never depends on which machine asks: an instance whose clock is a year ahead
cannot take a lease another instance holds and renews
(``tests/participants/test_lease_clock.py``). A jump of the database server's own clock moves
every lease at once: forward, leases expire early and the epoch check in every protocol write
(:func:`check_lease`) still refuses the old holder's writes; backward, a dead holder's leases are
taken over later. The other ``now()`` rules of the participants (``publications.retry_at``,
``replay.py``'s replay horizon, audit stamps) use the same database clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import psycopg

from cues_platform.participants.db import Database
from cues_platform.participants.errors import LeaseLostError, ParticipantError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lease:
    name: str
    owner: str
    epoch: int


def ensure_leases(conn: psycopg.Connection, names: Sequence[str]) -> None:
    for name in names:
        conn.execute("INSERT INTO leases (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (name,))


def claim(conn: psycopg.Connection, names: Sequence[str], owner: str, ttl: float, *,
          pattern: str | None = None, exclude: Sequence[str] = (),
          taken_before: bool = False) -> Lease | None:
    """Claim one free or expired lease among ``names`` or the rows whose name matches the regular
    expression ``pattern``, other than ``exclude`` (the ones the claimer holds); call inside a
    transaction. A row still owned by ``owner`` (a restart under the same name) comes first.
    ``taken_before``: only a lease some instance held before (a never claimed slot has no
    publication to finish; leaving it to an instance that holds none avoids a start-up grab)."""
    # Step 1
    row = conn.execute(
        "SELECT name FROM leases WHERE (name = ANY(%s) OR name ~ %s) AND NOT name = ANY(%s) "
        "AND (lease_until < now() OR owner = %s) AND (owner IS NOT NULL OR NOT %s) "
        "ORDER BY (owner = %s) DESC NULLS LAST, length(name), name LIMIT 1 "
        "FOR UPDATE SKIP LOCKED",
        (list(names), pattern or "^$", list(exclude), owner, taken_before, owner),
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


def member_beat(conn: psycopg.Connection, owner: str, ttl: float, names: Sequence[str],
                pattern: str) -> tuple[int, dict[str, int]]:
    """Announce ``owner`` as a live member for ``ttl`` seconds and return the number of leases
    (``names`` and every row matching ``pattern``) and, per live member, how many of them it holds
    (members of dead instances expire after their ``ttl``; long-dead rows are removed)."""
    conn.execute(
        "INSERT INTO members (owner, alive_until) VALUES (%s, now() + make_interval(secs => %s)) "
        "ON CONFLICT (owner) DO UPDATE SET alive_until = EXCLUDED.alive_until", (owner, ttl))
    conn.execute("DELETE FROM members WHERE alive_until < now() - interval '10 minutes'")
    total = conn.execute("SELECT count(*) FROM leases WHERE name = ANY(%s) OR name ~ %s",
                         (list(names), pattern)).fetchone()[0]
    held = dict(conn.execute(
        "SELECT m.owner, count(l.name) FROM members m LEFT JOIN leases l ON l.owner = m.owner "
        "AND l.lease_until >= now() AND (l.name = ANY(%s) OR l.name ~ %s) "
        "WHERE m.alive_until >= now() GROUP BY m.owner", (list(names), pattern)).fetchall())
    return int(total), {k: int(v) for k, v in held.items()}


def leave(conn: psycopg.Connection, owner: str) -> None:
    conn.execute("DELETE FROM members WHERE owner = %s", (owner,))


def plan(total: int, held: dict[str, int], owner: str) -> int:
    """The fair-share rule of a multi-lease keeper: +1 claim one more, -1 release one, 0 keep.

    With ``n`` live members a member wants between ``total // n`` and ``ceil(total / n)`` leases.
    It claims while under its share (below the floor, or below the ceiling when no member holds
    fewer than it: so a lease left over by a dead or departed member is always claimed by one
    of the least loaded; beyond its first lease only one held before, see :func:`claim`), and
    releases one when it holds more than the floor while another
    member holds at least two fewer (scale-up: a new member gets work)."""
    n = max(1, len(held))
    mine = held.get(owner, 0)
    least = min(held.values(), default=mine)
    lo, hi = total // n, -(-total // n)
    if mine < hi and (mine < lo or mine <= least):
        return 1
    if mine > lo and least < mine - 1:
        return -1
    return 0


class LeaseKeeper:
    """Holds leases among ``names`` (and, with ``pattern``, every row whose name matches it) and
    renews them every ``ttl / 3`` from a background thread with its own connection, so a long
    step (a Spark start, a slow publish) never lets them lapse while the process is alive; a
    SIGKILL stops the renewals and the leases expire after ``ttl``.

    Single mode (no ``pattern``, the consumer's role lease): at most one lease, claimed whenever
    none is held. Multi mode (``pattern``, the producer's publishing slots): the keeper is a
    member (``members`` table, renewed like a lease) and, once per beat, claims one more free or
    expired lease or releases one according to :func:`plan`; so every slot whose holder died or
    left is taken over by a live member, whatever the number of live members (>= 1), and a new
    member gets a share. A lease the main thread is using (:meth:`using`) is never released.

    ``leases`` are the held leases; protocol writes still check them in their transactions."""

    def __init__(self, dsn: str, *, app: str, names: Sequence[str], owner: str, ttl: float,
                 pattern: str | None = None) -> None:
        self.db = Database(dsn, app=app, attempts=3, max_delay=ttl / 2)
        self.names, self.owner, self.ttl, self.pattern = list(names), owner, ttl, pattern
        self.leases: dict[str, Lease] = {}
        self.changed = threading.Event()
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{owner}", daemon=True)

    @property
    def lease(self) -> Lease | None:
        """The first held lease (by name), or None."""
        held = self.held()
        return held[0] if held else None

    def held(self) -> list[Lease]:
        with self._lock:
            return sorted(self.leases.values(), key=lambda lease: _order(lease.name))

    @contextmanager
    def using(self, name: str) -> Iterator[Lease | None]:
        """The held lease ``name`` (None if not held), kept from being released meanwhile."""
        with self._lock:
            lease = self.leases.get(name)
            if lease is not None:
                self._busy.add(name)
        try:
            yield lease
        finally:
            with self._lock:
                self._busy.discard(name)

    def start(self) -> LeaseKeeper:
        self._beat()
        self._thread.start()
        return self

    def _drop(self, lease: Lease) -> None:
        with self._lock:
            if self.leases.get(lease.name) == lease:
                del self.leases[lease.name]
        self.changed.set()

    def _claim(self) -> None:
        with self._lock:
            exclude = list(self.leases)
        lease = self.db.run(lambda c: claim(c, self.names, self.owner, self.ttl,
                                            pattern=self.pattern, exclude=exclude,
                                            taken_before=bool(exclude)),
                            what="claim lease")
        if lease is not None:
            with self._lock:
                self.leases[lease.name] = lease
            self.changed.set()

    def _release_one(self) -> None:
        with self._lock:
            free = [n for n in self.leases if n not in self._busy]
            if not free:
                return
            lease = self.leases.pop(max(free, key=_order))
        self.changed.set()
        self.db.run(lambda c: release(c, lease), what="release lease")
        log.info("%s released %s (epoch %s) to a less loaded member", self.owner, lease.name,
                 lease.epoch)

    def _beat(self) -> None:
        try:
            for lease in self.held():  # renew what is held; a lease lost is dropped
                try:
                    self.db.run(lambda c, lease=lease: renew(c, lease, self.ttl),
                                what="renew lease")
                except LeaseLostError:
                    self._drop(lease)
            if self.pattern is None:
                if not self.leases:
                    self._claim()
                return
            total, held = self.db.run(
                lambda c: member_beat(c, self.owner, self.ttl, self.names, self.pattern or ""),
                what="member heartbeat")
            held[self.owner] = len(self.leases)
            step = plan(total, held, self.owner)
            if step > 0:
                self._claim()
            elif step < 0:
                self._release_one()
        except ParticipantError as exc:  # DB unavailable: keep trying; the leases may lapse
            log.warning("lease heartbeat of %s failed: %s", self.owner, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self._beat()

    def lost(self, lease: Lease | None = None) -> None:
        """The main thread saw ``lease`` (default: every lease) refused: drop it (the keeper
        claims again as its share allows)."""
        if lease is None:
            with self._lock:
                self.leases.clear()
            self.changed.set()
        else:
            self._drop(lease)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.ttl)
        for lease in self.held():
            with suppress(ParticipantError, psycopg.Error):  # expiry releases it anyway
                self.db.run(lambda c, lease=lease: release(c, lease), what="release lease")
        with self._lock:
            self.leases.clear()
        if self.pattern is not None:
            with suppress(ParticipantError, psycopg.Error):  # the member row expires anyway
                self.db.run(lambda c: leave(c, self.owner), what="leave")
        self.db.close()


def _order(name: str) -> tuple[str, int]:
    """Sort key: ``slot:10`` after ``slot:9``."""
    head, _, tail = name.rpartition(":")
    return (head, int(tail)) if tail.isdigit() else (name, -1)
