"""Steps 2, 4 and 5 of the producer contract (``producer.py``) on the database side: the
``publications`` of a slot, each written in the caller's transaction under the slot lease
(:func:`~cues_platform.participants.leases.check_lease` first, so a fenced holder writes nothing).

* :func:`take_publication` -- step 2, or the slot's oldest unacked publication, which goes first;
* :func:`postings_tables` -- a publication's rows as the POSTINGS batches of step 3;
* :func:`record_bail` -- step 4, count the bail and set the backoff;
* :func:`record_ack` -- step 5, the ack with its offsets.

Floor: above ``slots`` and ``trail``; below ``producer``, whose instance runs the critical section
(step 3) between these.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import NamedTuple

import psycopg
import pyarrow as pa

from cues_platform.participants import leases
from cues_platform.participants.model import POSTINGS_SCHEMA, Settings
from cues_platform.participants.slots import bail_delay, producer_id, slot_of
from cues_platform.participants.trail import audit_many

log = logging.getLogger(__name__)


class Taken(NamedTuple):
    """A publication to send: its sequence, kind, rows and, for a re-publish after a takeover,
    the epoch of the slot lease it was made or last tried under (-1: unknown)."""

    seq: int
    kind: str
    items: list[tuple]
    previous_epoch: int | None = None


def take_publication(conn: psycopg.Connection, lease: leases.Lease, *, sender: str,
                     instance: str, batch_size: int) -> Taken | None:
    """Step 2 (or the slot's oldest unacked publication, which must go first; None while it
    waits out its bail backoff). A publication made or last tried under an earlier epoch of
    the slot's lease (its holder died, stalled or left) is a re-publish: it gets this epoch,
    and its ack says so. Its content is frozen: the same (producer id, sequence) is always
    sent with the same rows (replays and last_datum as of the publication's creation), so a
    re-publish is deduplicated, never refused as different content."""
    slot, epoch = slot_of(lease), lease.epoch
    next_seq = leases.check_lease(conn, lease)
    row = conn.execute(
        "SELECT seq, kind, coalesce(retry_at > now(), false), epoch FROM publications "
        "WHERE slot = %s AND acked_at IS NULL ORDER BY seq LIMIT 1", (slot,)).fetchone()
    previous: int | None = None
    if row is None:
        ids = [r[0] for r in conn.execute(
            "SELECT message_id FROM messages WHERE ack_status = 'nacked_posting' "
            "AND pub_seq IS NULL ORDER BY created_seq LIMIT %s FOR UPDATE SKIP LOCKED",
            (batch_size,))]
        if not ids:
            return None
        seq, kind = next_seq, "posting"
        conn.execute("UPDATE leases SET next_seq = next_seq + 1 WHERE name = %s",
                     (lease.name,))
        conn.execute("INSERT INTO publications (slot, seq, kind, epoch) "
                     "VALUES (%s, %s, 'posting', %s)", (slot, seq, epoch))
        conn.execute(
            "INSERT INTO publication_items (slot, seq, sender, message_id, replays) "
            "SELECT %s, %s, %s, m, 0 FROM unnest(%s::text[]) AS m", (slot, seq, sender, ids))
        conn.execute(
            "UPDATE messages SET pub_slot = %s, pub_seq = %s, updated_at = now() "
            "WHERE sender = %s AND message_id = ANY(%s)", (slot, seq, sender, ids))
        audit_many(conn, sender, ids, "assigned", instance,
                   {"producer_id": producer_id(sender, slot), "sequence": seq})
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


def postings_tables(sender: str, items: list[tuple]) -> dict[str, pa.Table]:
    """A publication's rows (as :func:`take_publication` reads them) as one POSTINGS batch per
    receiver."""
    by_receiver: dict[str, list[tuple]] = {}
    for item in items:
        by_receiver.setdefault(item[0], []).append(item)
    out = {}
    for receiver, rows in by_receiver.items():
        out[receiver] = pa.table({
            "sender": [sender] * len(rows), "receiver": [receiver] * len(rows),
            "message_id": [r[1] for r in rows], "replays": [r[2] for r in rows],
            "inception_datum": [r[3] for r in rows], "last_datum": [r[4] for r in rows],
            "payload": [r[5] for r in rows]}, schema=POSTINGS_SCHEMA)
    return out


def record_ack(conn: psycopg.Connection, lease: leases.Lease, *, sender: str, instance: str,
               taken: Taken, attempts: int, offsets: dict[str, int], duplicate: bool) -> None:
    """Step 5: mark the publication acked and its postings acked_posting (keeping the
    processing status) with their POSTINGS offsets and retries; audit ``posting_acked`` (a
    replay: ``replay_acked``; a re-publish after a takeover also ``republished``)."""
    slot, seq, kind = slot_of(lease), taken.seq, taken.kind
    leases.check_lease(conn, lease)
    cur = conn.execute(
        "UPDATE publications SET acked_at = now(), attempts = attempts + %s "
        "WHERE slot = %s AND seq = %s AND acked_at IS NULL", (attempts, slot, seq))
    if cur.rowcount == 0:
        return  # already recorded by an earlier try of this transaction
    ids, offs = list(offsets), list(offsets.values())
    detail = {"producer_id": producer_id(sender, slot), "sequence": seq, "attempts": attempts,
              "duplicate": duplicate}
    # a re-publish after a takeover: the earlier holder's attempt counts as one (its
    # real count died with it), so all of this holder's attempts are retries (first
    # postings; a replay's publish attempts are not counted, as before)
    first = 0 if taken.previous_epoch is not None else 1
    if taken.previous_epoch is not None:
        audit_many(conn, sender, ids, "republished", instance,
                   {**detail, "previous_epoch": taken.previous_epoch, "epoch": lease.epoch})
    if kind == "posting":
        conn.execute(
            "UPDATE messages m SET ack_status = CASE WHEN m.ack_status = 'nacked_posting' "
            "THEN 'acked_posting' ELSE m.ack_status END, retries = m.retries + %s - %s, "
            "posting_offset = u.off, updated_at = now() "
            "FROM unnest(%s::text[], %s::bigint[]) AS u(id, off) "
            "WHERE m.sender = %s AND m.message_id = u.id",
            (attempts, first, ids, offs, sender))
        audit_many(conn, sender, ids, "posting_acked", instance, detail)
    else:
        audit_many(conn, sender, ids, "replay_acked", instance, detail)


def record_bail(conn: psycopg.Connection, lease: leases.Lease, *, sender: str, instance: str,
                seq: int, ids: list[str], attempts: int, started: datetime,
                exc: BaseException, settings: Settings) -> tuple[int, float]:
    """Step 4: count the bail and back off; returns (bails so far, seconds to wait).

    The publications row always has the totals (attempts, bails, last error) and messages
    their real retries; the audit trail gets ``publish_bailed`` only at bails 1, 2, 4, 8, ...
    (with the count) and ``publish_stuck`` once, at ``bail_stuck_after`` bails (also logged
    at ERROR), so a publication that keeps bailing adds O(log bails) audit rows, not one per
    bail. The first retry is at once; then the slot waits ``bail_backoff_initial *
    2**(bails - 2)`` seconds, capped at ``bail_backoff_max`` (``retry_at``)."""
    slot = slot_of(lease)
    error = f"{type(exc).__name__}: {exc}"[:500]
    leases.check_lease(conn, lease)
    bails = int(conn.execute(
        "UPDATE publications SET attempts = attempts + %s, last_error = %s, "
        "bails = bails + 1 WHERE slot = %s AND seq = %s RETURNING bails",
        (attempts, repr(exc)[:2000], slot, seq)).fetchone()[0])
    wait = bail_delay(bails, settings)
    conn.execute("UPDATE publications SET retry_at = now() + make_interval(secs => %s) "
                 "WHERE slot = %s AND seq = %s", (wait, slot, seq))
    conn.execute("UPDATE messages SET retries = retries + %s, updated_at = now() "
                 "WHERE sender = %s AND message_id = ANY(%s)", (attempts, sender, ids))
    detail = {"producer_id": producer_id(sender, slot), "sequence": seq, "bails": bails,
              "attempts": attempts, "since": started.isoformat(), "error": error,
              "retry_in": wait}
    if bails & (bails - 1) == 0:
        audit_many(conn, sender, ids, "publish_bailed", instance, detail)
    if bails == settings.bail_stuck_after:
        audit_many(conn, sender, ids, "publish_stuck", instance, detail)
        log.error("%s sequence %s is stuck: %s bails, last error %s; it keeps being "
                  "retried every %g s", producer_id(sender, slot), seq, bails, error,
                  settings.bail_backoff_max)
    return bails, wait
