"""The producer side (participant ``n``): record, publish to POSTINGS, apply RESULTS.

Mapping onto the idempotent producer: a participant has publishing slots (every ``slot:N`` lease
row; ``slots``, default its number of instances, creates the missing ones). An instance publishes
only under the lease of a slot (``leases.py``), with producer id ``{n}.{slot}``; it may hold
several slots (fair share among the live instances, so the slots of instances gone for good are
taken over) and serves them in turn; a *publication* is one POSTINGS commit (a batch of postings, possibly
for several receivers) under that producer id with sequence = the slot's ``next_seq`` counter,
assigned in the DB in the same transaction that assigns the postings to it. The platform producer
wants gap-free, increasing sequences per producer id: a slot always (re)publishes its oldest
unacked publication first and only assigns a new one when none is unacked, so sequences are
published in order with no gaps whichever instance holds the slot. A re-publish of the same
(producer id, sequence) after any crash is a no-op that returns the original offsets.

Delivery contract of one posting (the seed's producer protocol):

1. Record M in ONE DB transaction with status (nacked_posting, PENDING), retries 0,
   inception_datum = last_datum = now, and an audit row ``recorded`` (:func:`post_many`).
   A duplicate message id (unique per sender), an oversized payload or an unknown receiver
   raise a typed error and write nothing.
2. Assign: under the slot lease, in one DB transaction, take up to ``batch_size`` unassigned
   nacked postings (``FOR UPDATE SKIP LOCKED``), give them publication (slot, seq) and bump the
   slot's ``next_seq`` (audit ``assigned``). Only the lease holder can do this (epoch checked).
3. CRITICAL SECTION -- publish the publication to POSTINGS, subject = receiver, through the
   idempotent producer ``{n}.{slot}`` with sequence ``seq``; wait for the ack (the Delta commit);
   retry with exponential backoff + jitter until acked, ``publish_timeout`` or
   ``publish_attempts``.
4. If it bailed: record the real number of retries, the time and the error in the DB; the
   posting stays (nacked_posting, PENDING) and step 3 is retried later with the SAME (producer
   id, sequence) and the same content -- never a second copy -- after an exponential, capped
   backoff (``retry_at``); audit ``publish_bailed`` at bails 1, 2, 4, 8, ... and
   ``publish_stuck`` once (:meth:`ProducerInstance._record_bail`).
5. On ack: in one DB transaction set ack_status = acked_posting (keeping the processing status),
   the retries, the POSTINGS offset (audit ``posting_acked``).
6. Subscribe to RESULTS subject n: in one DB transaction, lock the subscription position
   (``FOR UPDATE SKIP LOCKED``: one reader at a time), read the results after it, set
   (acked_result, OK|REJECTED) for each (audit ``result_received``), store a consistency issue
   for a result of an unknown message, a duplicate result or a malformed result, and move the
   position past them. The position commits with the updates: each result applies exactly once.

Crash anywhere: before 1's commit nothing exists; after 1 or 2 the posting is picked up by the
slot's next holder (any live instance once the lease expired; audit ``republished`` on the ack); between 3's commit and 5 the re-publish is deduplicated by the producer
(step 3 returns the original offsets) and 5 runs; a result may even arrive before 5 (step 6 then
records it, and 5 does not downgrade it). Step 6 is all-or-nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg
import pyarrow as pa
from psycopg.types.json import Jsonb
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from cues_platform.errors import CuesError
from cues_platform.participants import leases
from cues_platform.participants.db import Database
from cues_platform.participants.errors import (
    DuplicateMessageError,
    InvalidPostingError,
    LeaseLostError,
    PayloadTooLargeError,
    PublishBailedError,
)
from cues_platform.participants.loop import InstanceLoop
from cues_platform.participants.model import (
    POSTINGS,
    POSTINGS_SCHEMA,
    RESULTS,
    AckStatus,
    Role,
    Settings,
)
from cues_platform.participants.network import require, validate_participant
from cues_platform.queues import Lake, Producer
from cues_platform.queues.errors import SequenceError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Posting:
    receiver: str
    message_id: str
    payload: str | None


SLOT_PATTERN = "^slot:[0-9]+$"  # every slot row, whatever --slots says now: all are drained


def slot_names(slots: int) -> list[str]:
    return [f"slot:{i}" for i in range(slots)]


def _slot_of(lease: leases.Lease) -> int:
    return int(lease.name.split(":")[1])


def producer_id(sender: str, slot: int) -> str:
    return f"{sender}.{slot}"


def audit_many(conn: psycopg.Connection, sender: str, ids: Sequence[str], action: str,
               instance: str, detail: dict[str, Any] | None = None) -> None:
    if ids:
        conn.execute(
            "INSERT INTO audit (sender, message_id, action, instance_id, detail) "
            "SELECT %s, m, %s, %s, %s FROM unnest(%s::text[]) AS m",
            (sender, action, instance, Jsonb(detail or {}), list(ids)),
        )


def record_issue(conn: psycopg.Connection, kind: str, *, instance: str, sender: str | None = None,
                 message_id: str | None = None, **detail: Any) -> None:
    """Store a consistency issue (and log it); the asset check fails while any is open."""
    conn.execute(
        "INSERT INTO consistency_issues (kind, sender, message_id, detail, instance_id) "
        "VALUES (%s, %s, %s, %s, %s)",
        (kind, sender, message_id, Jsonb(detail), instance),
    )
    log.error("consistency issue %s: sender=%s message_id=%s %s", kind, sender, message_id, detail)


# -- Step 1 ----------------------------------------------------------------------------------------
def post_many(db: Database, lake: Lake | None, *, sender: str, postings: Iterable[Posting],
              settings: Settings | None = None, instance: str = "api") -> int:
    """Step 1: record postings (nacked_posting, PENDING) in one transaction; all or nothing."""
    settings = settings or Settings()
    rows = list(postings)
    validate_participant(sender)
    seen: set[str] = set()
    for p in rows:
        if not isinstance(p.message_id, str) or not p.message_id:
            raise InvalidPostingError(f"posting to {p.receiver!r}: the message id must be a "
                                      "non-empty string", message_id=p.message_id)
        if p.payload is not None and not isinstance(p.payload, str):
            raise InvalidPostingError(f"message {p.message_id!r}: the payload must be a string "
                                      "(serialize it first)", message_id=p.message_id)
        size = len(p.payload.encode()) if p.payload else 0
        if size > settings.max_payload_bytes:
            raise PayloadTooLargeError(
                f"message {p.message_id!r}: payload of {size} bytes exceeds max_payload_bytes="
                f"{settings.max_payload_bytes}; nothing was recorded", message_id=p.message_id,
                size=size, limit=settings.max_payload_bytes)
        if p.message_id in seen:
            raise DuplicateMessageError(f"message id {p.message_id!r} appears twice in this call "
                                        f"from {sender!r}; nothing was recorded",
                                        sender=sender, message_id=p.message_id)
        seen.add(p.message_id)
    if lake is not None:
        require(lake, sender, Role.PRODUCER)
        for receiver in {p.receiver for p in rows}:
            require(lake, receiver, Role.CONSUMER)

    def tx(conn: psycopg.Connection) -> int:
        cur = conn.execute(
            "INSERT INTO messages (sender, message_id, receiver, ack_status, processing_status, "
            "inception_datum, last_datum, updated_at, payload) "
            "SELECT %s, m, r, 'nacked_posting', 'PENDING', now(), now(), now(), p "
            "FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(m, r, p) "
            "ON CONFLICT (sender, message_id) DO NOTHING RETURNING message_id",
            (sender, [p.message_id for p in rows], [p.receiver for p in rows],
             [p.payload for p in rows]),
        )
        inserted = {r[0] for r in cur.fetchall()}
        if len(inserted) != len(rows):
            dups = sorted(seen - inserted)
            raise DuplicateMessageError(
                f"sender {sender!r} already recorded message id(s) {dups[:5]}"
                f"{'...' if len(dups) > 5 else ''}; ids are unique per sender; nothing was recorded",
                sender=sender, message_ids=dups)
        audit_many(conn, sender, [p.message_id for p in rows], "recorded", instance)
        return len(rows)

    return db.run(tx, what="record postings")


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, SequenceError):
        return False
    if isinstance(exc, CuesError):
        return exc.retryable
    from deltalake.exceptions import DeltaError

    return isinstance(exc, OSError | DeltaError)


def bail_delay(bails: int, settings: Settings) -> float:
    """Seconds a slot waits after its publication's ``bails``-th bail (0 after the first)."""
    if bails <= 1:
        return 0.0
    return min(settings.bail_backoff_max, settings.bail_backoff_initial * 2.0 ** min(bails - 2, 60))


class Taken(NamedTuple):
    """A publication to send: its sequence, kind, rows and, for a re-publish after a takeover,
    the epoch of the slot lease it was made or last tried under (-1: unknown)."""

    seq: int
    kind: str
    items: list[tuple]
    previous_epoch: int | None = None


class ProducerInstance(InstanceLoop):
    """One of the x instances of producer participant ``n`` (see the module docstring)."""

    def __init__(self, *, participant: str, lake: Lake, dsn: str, instance_id: str,
                 slots: int = 1, settings: Settings | None = None) -> None:
        self.n = validate_participant(participant)
        self.lake, self.instance = lake, instance_id
        self.settings = settings or Settings()
        self.db = Database(dsn, app=f"cues-participant:{self.n}:{instance_id}")
        self.slots = slots
        self.lease: leases.Lease | None = None
        self.keeper: leases.LeaseKeeper | None = None
        self._producers: dict[int, Producer] = {}
        self._replayed: set[tuple[str, int]] = set()  # (slot lease, epoch) replayed on taking it
        self._known: set[str] = set()
        self.stop_event = threading.Event()
        self.stats = {"published": 0, "bailed": 0, "results": 0, "issues": 0, "replayed": 0}

    # -- start-up --------------------------------------------------------------------------------
    def start(self) -> None:
        self.db.migrate()
        require(self.lake, self.n, Role.PRODUCER)
        self.postings = self.lake.queue(POSTINGS)
        self.results = self.lake.queue(RESULTS)

        def init(conn: psycopg.Connection) -> None:
            leases.ensure_leases(conn, slot_names(self.slots))
            conn.execute("INSERT INTO subscriptions (queue, partition) VALUES (%s, %s) "
                         "ON CONFLICT DO NOTHING", (RESULTS, self.n))

        self.db.run(init, what="init")

    @property
    def slot(self) -> int | None:
        return None if self.lease is None else _slot_of(self.lease)

    def _hold_lease(self) -> bool:
        """Start the lease keeper (multi mode: every ``slot:N`` row, fair share) on first use and
        sync with what it holds; ``self.lease`` is the slot worked on (or the first held)."""
        if self.keeper is None:
            self.keeper = leases.LeaseKeeper(
                self.db.dsn, app=f"{self.db.app}:lease", names=slot_names(self.slots),
                owner=self.instance, ttl=self.settings.lease_seconds, pattern=SLOT_PATTERN).start()
        held = self.keeper.held()
        slots = {_slot_of(lease) for lease in held}
        for slot in [s for s in self._producers if s not in slots]:
            del self._producers[slot]  # a later holder fenced it: a fresh producer if it returns
        for lease in held:
            if lease.name not in self._known:
                log.info("%s holds %s epoch %s", self.instance, lease.name, lease.epoch)
        self._known = {lease.name for lease in held}
        if self.lease not in held:
            self.lease = held[0] if held else None
        return bool(held)

    # -- the loop ----------------------------------------------------------------------------------
    def tick(self) -> bool:
        """One round: sync the held slots; for each in turn, the start-up replay when it was just
        taken, then one publication; then apply results."""
        progressed = False
        if self._hold_lease():
            assert self.keeper is not None
            for lease in self.keeper.held():
                with self.keeper.using(lease.name) as current:
                    if current is None:  # released or lost meanwhile
                        continue
                    self.lease = current
                    progressed |= self._serve_slot()
        progressed |= self.apply_results_once() > 0
        return progressed

    def _serve_slot(self) -> bool:
        """Replay what is pending when the slot was just taken, then publish once under it."""
        assert self.lease is not None
        key = (self.lease.name, self.lease.epoch)
        if key not in self._replayed:
            from cues_platform.participants.replay import replay_pending

            self.stats["replayed"] += replay_pending(self)
            self._replayed.add(key)
            if self.lease is None:
                return False  # lost while replaying
        try:
            return self.publish_once()
        except LeaseLostError:
            self._lost()
        except PublishBailedError as exc:
            log.warning("%s", exc)
        return False

    # -- Steps 2-5 ---------------------------------------------------------------------------------
    def _take_publication(self, conn: psycopg.Connection) -> Taken | None:
        """Step 2 (or the slot's oldest unacked publication, which must go first; None while it
        waits out its bail backoff). A publication made or last tried under an earlier epoch of
        the slot's lease (its holder died, stalled or left) is a re-publish: it gets this epoch,
        and its ack says so. Its content is frozen: the same (producer id, sequence) is always
        sent with the same rows (replays and last_datum as of the publication's creation), so a
        re-publish is deduplicated, never refused as different content."""
        assert self.lease is not None
        slot, epoch = self.slot, self.lease.epoch
        next_seq = leases.check_lease(conn, self.lease)
        row = conn.execute(
            "SELECT seq, kind, coalesce(retry_at > now(), false), epoch FROM publications "
            "WHERE slot = %s AND acked_at IS NULL ORDER BY seq LIMIT 1", (slot,)).fetchone()
        previous: int | None = None
        if row is None:
            ids = [r[0] for r in conn.execute(
                "SELECT message_id FROM messages WHERE ack_status = 'nacked_posting' "
                "AND pub_seq IS NULL ORDER BY created_seq LIMIT %s FOR UPDATE SKIP LOCKED",
                (self.settings.batch_size,))]
            if not ids:
                return None
            seq, kind = next_seq, "posting"
            conn.execute("UPDATE leases SET next_seq = next_seq + 1 WHERE name = %s",
                         (self.lease.name,))
            conn.execute("INSERT INTO publications (slot, seq, kind, epoch) "
                         "VALUES (%s, %s, 'posting', %s)", (slot, seq, epoch))
            conn.execute(
                "INSERT INTO publication_items (slot, seq, sender, message_id, replays) "
                "SELECT %s, %s, %s, m, 0 FROM unnest(%s::text[]) AS m", (slot, seq, self.n, ids))
            conn.execute(
                "UPDATE messages SET pub_slot = %s, pub_seq = %s, updated_at = now() "
                "WHERE sender = %s AND message_id = ANY(%s)", (slot, seq, self.n, ids))
            audit_many(conn, self.n, ids, "assigned", self.instance,
                       {"producer_id": producer_id(self.n, slot), "sequence": seq})
        else:
            seq, kind, waiting, made_under = int(row[0]), row[1], bool(row[2]), row[3]
            if waiting:
                return None  # bail backoff: the slot publishes nothing before this one
            if made_under != epoch:
                previous = -1 if made_under is None else int(made_under)
                conn.execute("UPDATE publications SET epoch = %s WHERE slot = %s AND seq = %s",
                             (epoch, slot, seq))
        items = conn.execute(
            "SELECT m.receiver, m.message_id, i.replays, m.inception_datum, "
            "CASE WHEN p.kind = 'replay' THEN p.created_at ELSE m.inception_datum END, m.payload "
            "FROM publication_items i JOIN publications p ON p.slot = i.slot AND p.seq = i.seq "
            "JOIN messages m ON m.sender = i.sender AND m.message_id = i.message_id "
            "WHERE i.slot = %s AND i.seq = %s ORDER BY m.message_id",
            (slot, seq)).fetchall()
        return Taken(seq, kind, items, previous)

    def _batches(self, items: list[tuple]) -> dict[str, pa.Table]:
        by_receiver: dict[str, list[tuple]] = {}
        for item in items:
            by_receiver.setdefault(item[0], []).append(item)
        out = {}
        for receiver, rows in by_receiver.items():
            out[receiver] = pa.table({
                "sender": [self.n] * len(rows), "receiver": [receiver] * len(rows),
                "message_id": [r[1] for r in rows], "replays": [r[2] for r in rows],
                "inception_datum": [r[3] for r in rows], "last_datum": [r[4] for r in rows],
                "payload": [r[5] for r in rows]}, schema=POSTINGS_SCHEMA)
        return out

    def publish_once(self) -> bool:
        taken = self.db.run(self._take_publication, what="take publication")
        if taken is None:
            return False
        seq, kind, items = taken.seq, taken.kind, taken.items
        slot = self.slot
        assert slot is not None and self.lease is not None
        pid = producer_id(self.n, slot)
        if slot not in self._producers:
            self._producers[slot] = Producer(self.postings, producer_id=pid)
        producer = self._producers[slot]
        batches = self._batches(items)
        started = datetime.now(UTC)
        attempts = 0
        # Step 3: CRITICAL SECTION
        try:
            for attempt in Retrying(
                retry=retry_if_exception(_retryable),
                stop=stop_after_attempt(self.settings.publish_attempts)
                | stop_after_delay(self.settings.publish_timeout),
                wait=wait_exponential_jitter(multiplier=self.settings.backoff_initial,
                                             max=self.settings.backoff_max),
                reraise=True,
            ):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    result = producer.send_many(batches, sequence=seq)
        except Exception as exc:
            # Step 4: a failed send leaves the producer pinned to this batch (or fenced by another
            # instance that took the slot): the next publication opens a fresh producer (new epoch).
            self._producers.pop(slot, None)
            bails, wait = self._record_bail(seq, items, attempts, started, exc)
            self.stats["bailed"] += 1
            raise PublishBailedError(
                f"{pid} sequence {seq}: not acknowledged after {attempts} attempt(s) "
                f"({type(exc).__name__}: {exc}); kept nacked, bail #{bails}, will publish the "
                f"same sequence again in {wait:g} s", producer_id=pid, sequence=seq,
                attempts=attempts, bails=bails, retry_in=wait) from exc
        # Step 5
        offsets: dict[str, int] = {}
        for receiver, table in batches.items():
            start = result.ranges[receiver][0]
            for i, mid in enumerate(table["message_id"].to_pylist()):
                offsets[mid] = start + i
        lease = self.lease

        def ack(conn: psycopg.Connection) -> None:
            leases.check_lease(conn, lease)
            cur = conn.execute(
                "UPDATE publications SET acked_at = now(), attempts = attempts + %s "
                "WHERE slot = %s AND seq = %s AND acked_at IS NULL", (attempts, slot, seq))
            if cur.rowcount == 0:
                return  # already recorded by an earlier try of this transaction
            ids, offs = list(offsets), list(offsets.values())
            detail = {"producer_id": pid, "sequence": seq, "attempts": attempts,
                      "duplicate": result.duplicate}
            # a re-publish after a takeover: the earlier holder's attempt counts as one (its
            # real count died with it), so all of this holder's attempts are retries (first
            # postings; a replay's publish attempts are not counted, as before)
            first = 0 if taken.previous_epoch is not None else 1
            if taken.previous_epoch is not None:
                audit_many(conn, self.n, ids, "republished", self.instance,
                           {**detail, "previous_epoch": taken.previous_epoch,
                            "epoch": lease.epoch})
            if kind == "posting":
                conn.execute(
                    "UPDATE messages m SET ack_status = CASE WHEN m.ack_status = 'nacked_posting' "
                    "THEN 'acked_posting' ELSE m.ack_status END, retries = m.retries + %s - %s, "
                    "posting_offset = u.off, updated_at = now() "
                    "FROM unnest(%s::text[], %s::bigint[]) AS u(id, off) "
                    "WHERE m.sender = %s AND m.message_id = u.id",
                    (attempts, first, ids, offs, self.n))
                audit_many(conn, self.n, ids, "posting_acked", self.instance, detail)
            else:
                audit_many(conn, self.n, ids, "replay_acked", self.instance, detail)

        self.db.run(ack, what="record ack")
        self.stats["published"] += len(items)
        return True

    def _record_bail(self, seq: int, items: list[tuple], attempts: int, started: datetime,
                     exc: BaseException) -> tuple[int, float]:
        """Step 4: count the bail and back off; returns (bails so far, seconds to wait).

        The publications row always has the totals (attempts, bails, last error) and messages
        their real retries; the audit trail gets ``publish_bailed`` only at bails 1, 2, 4, 8, ...
        (with the count) and ``publish_stuck`` once, at ``bail_stuck_after`` bails (also logged
        at ERROR), so a publication that keeps bailing adds O(log bails) audit rows, not one per
        bail. The first retry is at once; then the slot waits ``bail_backoff_initial *
        2**(bails - 2)`` seconds, capped at ``bail_backoff_max`` (``retry_at``)."""
        lease, slot, cfg = self.lease, self.slot, self.settings
        ids = [r[1] for r in items]
        error = f"{type(exc).__name__}: {exc}"[:500]

        def bail(conn: psycopg.Connection) -> tuple[int, float]:
            leases.check_lease(conn, lease)
            bails = int(conn.execute(
                "UPDATE publications SET attempts = attempts + %s, last_error = %s, "
                "bails = bails + 1 WHERE slot = %s AND seq = %s RETURNING bails",
                (attempts, repr(exc)[:2000], slot, seq)).fetchone()[0])
            wait = bail_delay(bails, cfg)
            conn.execute("UPDATE publications SET retry_at = now() + make_interval(secs => %s) "
                         "WHERE slot = %s AND seq = %s", (wait, slot, seq))
            conn.execute("UPDATE messages SET retries = retries + %s, updated_at = now() "
                         "WHERE sender = %s AND message_id = ANY(%s)", (attempts, self.n, ids))
            detail = {"producer_id": producer_id(self.n, slot), "sequence": seq, "bails": bails,
                      "attempts": attempts, "since": started.isoformat(), "error": error,
                      "retry_in": wait}
            if bails & (bails - 1) == 0:
                audit_many(conn, self.n, ids, "publish_bailed", self.instance, detail)
            if bails == cfg.bail_stuck_after:
                audit_many(conn, self.n, ids, "publish_stuck", self.instance, detail)
                log.error("%s sequence %s is stuck: %s bails, last error %s; it keeps being "
                          "retried every %g s", producer_id(self.n, slot), seq, bails, error,
                          cfg.bail_backoff_max)
            return bails, wait

        try:
            return self.db.run(bail, what="record bail")
        except LeaseLostError:
            self._lost()
            return 0, 0.0

    def _lost(self) -> None:
        lease, self.lease = self.lease, None
        if self.keeper is not None and lease is not None:
            self.keeper.lost(lease)

    # -- Step 6 ------------------------------------------------------------------------------------
    def apply_results_once(self) -> int:
        """Apply the next RESULTS of subject n, exactly once; returns how many were read."""
        from cues_platform.participants.results import apply_results_once

        return apply_results_once(self)


def pending_counts(db: Database) -> dict[str, int]:
    def tx(conn: psycopg.Connection) -> dict[str, int]:
        return {f"{a}/{p}": int(c) for a, p, c in conn.execute(
            "SELECT ack_status, processing_status, count(*) FROM messages GROUP BY 1, 2")}

    return db.run(tx, what="counts")


__all__ = ["AckStatus", "Posting", "ProducerInstance", "post_many", "record_issue"]
