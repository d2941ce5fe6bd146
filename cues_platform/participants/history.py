"""``cues participant history``: one posting's whole life across the sender's and the receiver's
databases (and, if asked, the POSTINGS/RESULTS queues).

Read only: nothing is written anywhere. The parts, each ``None``/empty when missing:

- ``posting``: the sender's ``messages`` row (status pair, replays, retries, datums, offset);
- ``timeline``: the audit rows of both databases for (sender, message id), by time, each with the
  participant whose database holds it (``recorded``, ``assigned``, ``publish_bailed``,
  ``posting_acked``, ``replay``, ``replay_acked``, ``result_received`` on the sender;
  ``processed``, ``replay_suppressed``, ``unroutable`` on the receiver);
- ``publications``: every publication that carried it (slot, seq, kind, replay number, attempts,
  last error, acked at);
- ``received``: the receiver's ``received`` row (status, reason, routed, step, delivery hash);
- ``issues``: consistency issues about it in either database;
- ``queues`` (with a lake): its POSTINGS rows (subject receiver) and RESULTS rows (subject sender)
  with their offsets — a scan of the two subjects, for inspection rather than hot paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from cues_platform.participants.errors import MessageNotFoundError
from cues_platform.participants.model import POSTINGS, RESULTS
from cues_platform.queues.schema import OFFSET

PUBLICATIONS_SQL = (
    "SELECT i.slot, i.seq, p.kind, i.replays, p.created_at, p.acked_at, p.attempts, p.last_error "
    "FROM publication_items i JOIN publications p ON p.slot = i.slot AND p.seq = i.seq "
    "WHERE i.sender = %s AND i.message_id = %s ORDER BY p.created_at, i.slot, i.seq")


@dataclass
class History:
    sender: str
    message_id: str
    receiver: str | None = None
    posting: dict[str, Any] | None = None
    timeline: list[dict[str, Any]] = field(default_factory=list)
    publications: list[dict[str, Any]] = field(default_factory=list)
    received: dict[str, Any] | None = None
    issues: list[dict[str, Any]] = field(default_factory=list)
    queues: dict[str, list[dict[str, Any]]] | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _rows(conn: psycopg.Connection, query: str, params: tuple) -> list[dict[str, Any]]:
    cur = conn.execute(query, params)  # type: ignore[arg-type]  # static SQL, parameters bound
    names = [d.name for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _side(conn: psycopg.Connection, participant: str, sender: str, message_id: str
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(audit rows, consistency issues) of one database for the message, tagged with ``db``."""
    key = (sender, message_id)
    audit = _rows(conn, "SELECT id, at, action, instance_id, detail FROM audit "
                        "WHERE sender = %s AND message_id = %s ORDER BY id", key)
    issues = _rows(conn, "SELECT id, at, kind, detail, instance_id FROM consistency_issues "
                         "WHERE sender = %s AND message_id = %s ORDER BY id", key)
    for row in (*audit, *issues):
        row["db"] = participant
    return audit, issues


def history(*, sender_conn: psycopg.Connection, sender: str, message_id: str,
            receiver_conn: psycopg.Connection | None = None, receiver: str | None = None,
            lake: Any = None) -> History:
    """The history of (``sender``, ``message_id``) as described in the module docstring.

    1. The sender's database: the posting, its publications, audit rows and issues.
    2. The receiver (the posting's, else ``receiver``): its database's ``received`` row, audit
       rows and issues, when ``receiver_conn`` is given.
    3. With ``lake``: the POSTINGS and RESULTS rows of the message.
    Raises :class:`MessageNotFoundError` when neither database knows the message.
    """
    h = History(sender=sender, message_id=message_id)
    key = (sender, message_id)
    # Step 1
    found = _rows(sender_conn, "SELECT * FROM messages WHERE sender = %s AND message_id = %s", key)
    h.posting = found[0] if found else None
    if h.posting is not None:
        h.posting.pop("payload", None)  # payloads may hold anything: not shown
    h.publications = _rows(sender_conn, PUBLICATIONS_SQL, key)
    audit, issues = _side(sender_conn, sender, sender, message_id)
    h.receiver = h.posting["receiver"] if h.posting else receiver
    # Step 2
    if receiver_conn is not None and h.receiver is not None:
        got = _rows(receiver_conn, "SELECT sender, message_id, receiver, replays, status, reason, "
                                   "routed, step, delivery_hash, received_at FROM received "
                                   "WHERE sender = %s AND message_id = %s", key)
        h.received = got[0] if got else None
        r_audit, r_issues = _side(receiver_conn, h.receiver, sender, message_id)
        audit, issues = audit + r_audit, issues + r_issues
    h.timeline = sorted(audit, key=lambda r: (r["at"], r["db"] != sender, r["id"]))
    h.issues = sorted(issues, key=lambda r: r["at"])
    if h.posting is None and not h.timeline and not h.issues and h.received is None:
        raise MessageNotFoundError(
            f"no posting {message_id!r} from {sender} in its database (nor any audit row or "
            "consistency issue about it); message ids are per sender: check --id and "
            "--message-id", sender=sender, message_id=message_id)
    # Step 3
    if lake is not None:
        h.queues = _queue_rows(lake, sender, message_id, h.receiver)
    return h


def _queue_rows(lake: Any, sender: str, message_id: str, receiver: str | None
                ) -> dict[str, list[dict[str, Any]]]:
    import pyarrow.compute as pc

    out: dict[str, list[dict[str, Any]]] = {POSTINGS: [], RESULTS: []}
    wanted = {POSTINGS: (receiver, ["sender", "receiver", "message_id", "replays", "last_datum"]),
              RESULTS: (sender, ["sender", "receiver", "message_id", "replays", "status",
                                 "reason"])}
    for name, (subject, columns) in wanted.items():
        if subject is None or not lake.has_queue(name):
            continue
        queue = lake.queue(name)
        if subject not in queue.partitions:
            continue
        table = queue.read_arrow(partition=subject, columns=[OFFSET, *columns])
        mask = pc.and_(pc.equal(table["sender"], sender), pc.equal(table["message_id"], message_id))
        out[name] = table.filter(mask).to_pylist()
    return out


def render(h: History) -> list[str]:
    """Human-readable lines of a history (the CLI's default output)."""
    lines: list[str] = []
    p = h.posting
    if p is None:
        lines.append(f"{h.sender}/{h.message_id}: no posting in {h.sender}'s database")
    else:
        lines.append(f"{h.sender}/{h.message_id} -> {p['receiver']}: {p['ack_status']}/"
                     f"{p['processing_status']} replays={p['replays']} retries={p['retries']} "
                     f"inception={p['inception_datum']} last={p['last_datum']} "
                     f"postings_offset={p['posting_offset']} reason={p['result_reason']}")
    lines.append("timeline:")
    for row in h.timeline:
        detail = f" {row['detail']}" if row["detail"] else ""
        lines.append(f"  {row['at']}  {row['db']:<12} {row['action']:<18} "
                     f"instance={row['instance_id']}{detail}")
    for pub in h.publications:
        lines.append(f"publication slot={pub['slot']} seq={pub['seq']} kind={pub['kind']} "
                     f"replay={pub['replays']} attempts={pub['attempts']} "
                     f"acked_at={pub['acked_at']} last_error={pub['last_error']}")
    if h.received is not None:
        r = h.received
        lines.append(f"received by {r['receiver']}: {r['status']} reason={r['reason']} "
                     f"routed={r['routed']} replays={r['replays']} step={r['step']} "
                     f"at={r['received_at']}")
    elif h.receiver is not None:
        lines.append(f"received by {h.receiver}: no row")
    lines.append(f"consistency issues: {len(h.issues)}")
    for issue in h.issues:
        lines.append(f"  {issue['at']}  {issue['db']}: {issue['kind']} {issue['detail']}")
    if h.queues is not None:
        for name, rows in h.queues.items():
            lines.append(f"{name}: {len(rows)} row(s)")
            lines.extend(f"  {row}" for row in rows)
    lines.extend(f"note: {note}" for note in h.notes)
    return lines
