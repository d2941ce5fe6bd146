"""The replay facility: on start-up, replay what is pending.

Contract (run by an instance each time it takes a slot lease -- at start-up, and when it takes
over the slot of an instance that died or left -- before it publishes anything new under it):

1. Unacked postings (nacked_posting) need nothing special: the slot loop always publishes the
   oldest unacked publication first, with its ORIGINAL (producer id, sequence), so a posting that
   was in fact committed before the crash is deduplicated by the idempotent producer; postings
   not yet assigned are assigned by whichever instance gets them first.
2. Acked postings still PENDING (no result yet) whose ``last_datum`` is older than
   ``replay_after`` and whose latest publication is acked (a replay publication not acked yet
   is still to be published by its slot, with its frozen content: replaying again meanwhile
   would only add a copy) are replayed: in ONE DB transaction (under the lease; rows taken with
   ``FOR UPDATE SKIP LOCKED`` so two starting instances never replay the same message),
   ``replays`` += 1, ``last_datum`` = now, audit ``replay`` and a new publication of kind
   ``replay`` on this slot (the next sequence) carrying the posting with its new replay count.
3. The slot loop publishes (oldest unacked publication first, so sequences stay in order) the replay publication like any other (critical section included);
   on ack the audit gets ``replay_acked``. The ack status does not change (already acked).

The consumer records every (sender, message id) it has processed: a replayed posting it has
already processed produces NO second result (audit ``replay_suppressed`` on its side), so every
posting still has exactly one result; a replay of a posting it has not seen (impossible while
POSTINGS keeps its data) is processed normally.
"""

from __future__ import annotations

import psycopg

from cues_platform.participants import leases
from cues_platform.participants.errors import LeaseLostError
from cues_platform.participants.slots import ProducerSide
from cues_platform.participants.trail import audit_many


def replay_pending(inst: ProducerSide, *, limit: int | None = None) -> int:
    """Step 2 for up to ``limit`` (default: batch_size) messages per publication, repeated until
    no eligible message is left; returns how many messages were replayed."""
    lease, slot = inst.lease, inst.slot
    if lease is None or slot is None:
        return 0
    limit = limit or inst.settings.batch_size

    # the cut-off is fixed once: what this start-up finds pending, not what it replays itself
    cutoff = inst.db.run(lambda c: c.execute(
        "SELECT now() - make_interval(secs => %s)", (inst.settings.replay_after,)).fetchone()[0],
        what="replay cut-off")

    def tx(conn: psycopg.Connection) -> int:
        seq = leases.check_lease(conn, lease)
        ids = [r[0] for r in conn.execute(
            "SELECT m.message_id FROM messages m WHERE m.ack_status = 'acked_posting' AND "
            "m.processing_status = 'PENDING' AND m.last_datum < %s AND NOT EXISTS ("
            "  SELECT 1 FROM publications p WHERE p.slot = m.pub_slot AND p.seq = m.pub_seq "
            "  AND p.acked_at IS NULL) "
            "ORDER BY m.last_datum LIMIT %s FOR UPDATE OF m SKIP LOCKED", (cutoff, limit))]
        if not ids:
            return 0
        conn.execute("UPDATE leases SET next_seq = next_seq + 1 WHERE name = %s", (lease.name,))
        conn.execute("INSERT INTO publications (slot, seq, kind, epoch) "
                     "VALUES (%s, %s, 'replay', %s)", (slot, seq, lease.epoch))
        rows = conn.execute(
            "UPDATE messages SET replays = replays + 1, last_datum = now(), updated_at = now(), "
            "pub_slot = %s, pub_seq = %s WHERE sender = %s AND message_id = ANY(%s) "
            "RETURNING message_id, replays", (slot, seq, inst.n, ids)).fetchall()
        conn.execute(
            "INSERT INTO publication_items (slot, seq, sender, message_id, replays) "
            "SELECT %s, %s, %s, m, r FROM unnest(%s::text[], %s::int[]) AS u(m, r)",
            (slot, seq, inst.n, [r[0] for r in rows], [r[1] for r in rows]))
        audit_many(conn, inst.n, ids, "replay", inst.instance, {"sequence": seq, "slot": slot})
        return len(ids)

    total = 0
    try:
        while True:
            n = inst.db.run(tx, what="replay")
            if n == 0:
                return total
            total += n
    except LeaseLostError:
        inst._lost()
        return total
