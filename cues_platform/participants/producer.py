"""The producer side (participant ``n``): record, publish to POSTINGS, apply RESULTS.

Mapping onto the idempotent producer: a participant has ``slots`` publishing slots (default: its
number of instances). An instance publishes only under the lease of a slot (``leases.py``), with
producer id ``{n}.{slot}``; a *publication* is one POSTINGS commit (a batch of postings, possibly
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
4. If it bailed: record the real number of retries, the time and the error in the DB (audit
   ``publish_bailed``); the posting stays (nacked_posting, PENDING) and step 3 is retried later
   with the SAME (producer id, sequence) -- never a second copy.
5. On ack: in one DB transaction set ack_status = acked_posting (keeping the processing status),
   the retries, the POSTINGS offset (audit ``posting_acked``).
6. Subscribe to RESULTS subject n: in one DB transaction, lock the subscription position
   (``FOR UPDATE SKIP LOCKED``: one reader at a time), read the results after it, set
   (acked_result, OK|REJECTED) for each (audit ``result_received``), store a consistency issue
   for a result of an unknown message, a duplicate result or a malformed result, and move the
   position past them. The position commits with the updates: each result applies exactly once.

Crash anywhere: before 1's commit nothing exists; after 1 or 2 the posting is picked up by the
slot's next holder; between 3's commit and 5 the re-publish is deduplicated by the producer
(step 3 returns the original offsets) and 5 runs; a result may even arrive before 5 (step 6 then
records it, and 5 does not downgrade it). Step 6 is all-or-nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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


def slot_names(slots: int) -> list[str]:
    return [f"slot:{i}" for i in range(slots)]


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
        self._replayed = False
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
        return None if self.lease is None else int(self.lease.name.split(":")[1])

    def _hold_lease(self) -> bool:
        if self.keeper is None:
            self.keeper = leases.LeaseKeeper(
                self.db.dsn, app=f"{self.db.app}:lease", names=slot_names(self.slots),
                owner=self.instance, ttl=self.settings.lease_seconds).start()
        lease = self.keeper.lease
        if lease != self.lease:
            self.lease = lease
            self._replayed = False  # replay what is pending each time a slot is taken over
            if lease is not None:
                log.info("%s holds %s epoch %s", self.instance, lease.name, lease.epoch)
        return self.lease is not None

    # -- the loop ----------------------------------------------------------------------------------
    def tick(self) -> bool:
        """One round: lease, replay on start-up, publish one publication, apply results."""
        progressed = False
        if self._hold_lease():
            if not self._replayed:
                from cues_platform.participants.replay import replay_pending

                self.stats["replayed"] += replay_pending(self)
                self._replayed = True
            try:
                progressed |= self.publish_once()
            except LeaseLostError:
                self._lost()
            except PublishBailedError as exc:
                log.warning("%s", exc)
        progressed |= self.apply_results_once() > 0
        return progressed

    # -- Steps 2-5 ---------------------------------------------------------------------------------
    def _take_publication(self, conn: psycopg.Connection) -> tuple[int, str, list[tuple]] | None:
        """Step 2 (or the slot's oldest unacked publication, which must go first)."""
        assert self.lease is not None
        slot = self.slot
        next_seq = leases.check_lease(conn, self.lease)
        row = conn.execute(
            "SELECT seq, kind FROM publications WHERE slot = %s AND acked_at IS NULL "
            "ORDER BY seq LIMIT 1", (slot,)).fetchone()
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
            conn.execute("INSERT INTO publications (slot, seq, kind) VALUES (%s, %s, 'posting')",
                         (slot, seq))
            conn.execute(
                "INSERT INTO publication_items (slot, seq, sender, message_id, replays) "
                "SELECT %s, %s, %s, m, 0 FROM unnest(%s::text[]) AS m", (slot, seq, self.n, ids))
            conn.execute(
                "UPDATE messages SET pub_slot = %s, pub_seq = %s, updated_at = now() "
                "WHERE sender = %s AND message_id = ANY(%s)", (slot, seq, self.n, ids))
            audit_many(conn, self.n, ids, "assigned", self.instance,
                       {"producer_id": producer_id(self.n, slot), "sequence": seq})
        else:
            seq, kind = int(row[0]), row[1]
        items = conn.execute(
            "SELECT m.receiver, m.message_id, i.replays, m.inception_datum, m.last_datum, m.payload "
            "FROM publication_items i JOIN messages m ON m.sender = i.sender AND "
            "m.message_id = i.message_id WHERE i.slot = %s AND i.seq = %s ORDER BY m.message_id",
            (slot, seq)).fetchall()
        return seq, kind, items

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
        seq, kind, items = taken
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
            self._record_bail(seq, items, attempts, started, exc)
            self.stats["bailed"] += 1
            raise PublishBailedError(
                f"{pid} sequence {seq}: not acknowledged after {attempts} attempt(s) "
                f"({type(exc).__name__}: {exc}); kept nacked, will publish again",
                producer_id=pid, sequence=seq, attempts=attempts) from exc
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
            if kind == "posting":
                conn.execute(
                    "UPDATE messages m SET ack_status = CASE WHEN m.ack_status = 'nacked_posting' "
                    "THEN 'acked_posting' ELSE m.ack_status END, retries = m.retries + %s - 1, "
                    "posting_offset = u.off, updated_at = now() "
                    "FROM unnest(%s::text[], %s::bigint[]) AS u(id, off) "
                    "WHERE m.sender = %s AND m.message_id = u.id",
                    (attempts, ids, offs, self.n))
                audit_many(conn, self.n, ids, "posting_acked", self.instance, detail)
            else:
                audit_many(conn, self.n, ids, "replay_acked", self.instance, detail)

        self.db.run(ack, what="record ack")
        self.stats["published"] += len(items)
        return True

    def _record_bail(self, seq: int, items: list[tuple], attempts: int, started: datetime,
                     exc: BaseException) -> None:
        lease, slot = self.lease, self.slot
        ids = [r[1] for r in items]

        def bail(conn: psycopg.Connection) -> None:
            leases.check_lease(conn, lease)
            conn.execute("UPDATE publications SET attempts = attempts + %s, last_error = %s "
                         "WHERE slot = %s AND seq = %s", (attempts, repr(exc)[:2000], slot, seq))
            conn.execute("UPDATE messages SET retries = retries + %s, updated_at = now() "
                         "WHERE sender = %s AND message_id = ANY(%s)", (attempts, self.n, ids))
            audit_many(conn, self.n, ids, "publish_bailed", self.instance,
                       {"sequence": seq, "attempts": attempts, "since": started.isoformat(),
                        "error": f"{type(exc).__name__}: {exc}"[:500]})

        try:
            self.db.run(bail, what="record bail")
        except LeaseLostError:
            self._lost()

    def _lost(self) -> None:
        self.lease = None
        if self.keeper is not None:
            self.keeper.lost()

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
